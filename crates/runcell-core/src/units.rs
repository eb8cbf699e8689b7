//! Human-friendly sizes and durations ("256M", "1.5G", "30s", "500ms") for the CLI and config.

use std::time::Duration;

/// Parse a size: a non-negative number with an optional binary unit (K, M, G, T; "KB", "KiB",
/// "MiB" and lowercase are accepted and all mean powers of 1024). Plain numbers are bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "'{s}' is not a size (expected e.g. 256M, 1G, 65536)"
        ));
    }
    let value: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (expected e.g. 256M, 1G, 65536)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "unknown size unit '{other}' in '{s}' (use K, M, G or T)"
            ))
        }
    };
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes > u64::MAX as f64 / 2.0 {
        return Err(format!("'{s}' is too large"));
    }
    Ok(bytes.round() as u64)
}

/// Parse a duration: seconds by default ("30", "0.5"), or with a unit: ms, s, m, h.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a duration (expected e.g. 30, 2.5, 500ms, 2m)"))?;
    let secs = match unit.trim() {
        "" | "s" | "sec" => value,
        "ms" => value / 1000.0,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!(
                "unknown duration unit '{other}' in '{s}' (use ms, s, m or h)"
            ))
        }
    };
    if !secs.is_finite() || secs > 1e9 {
        return Err(format!("'{s}' is too long"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// "256 MiB", "1.5 GiB", "512 KiB", "100 bytes".
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, size) in UNITS {
        if bytes >= size {
            let v = bytes as f64 / size as f64;
            return if (v - v.round()).abs() < 0.05 {
                format!("{} {name}", v.round() as u64)
            } else {
                format!("{v:.1} {name}")
            };
        }
    }
    format!("{bytes} bytes")
}

/// "30 s", "0.5 s", "2 min".
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 120.0 && (s / 60.0).fract() == 0.0 {
        format!("{} min", s as u64 / 60)
    } else if s.fract() == 0.0 {
        format!("{} s", s as u64)
    } else {
        format!("{} s", (s * 1000.0).round() / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("1.5K").unwrap(), 1536);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("-5M").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("1e400").is_err());
        assert!(parse_size("99999999999999T").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("0.5").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(format_size(256 << 20), "256 MiB");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(12), "12 bytes");
        assert_eq!(format_duration(Duration::from_secs(30)), "30 s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(format_duration(Duration::from_secs(600)), "10 min");
    }
}
