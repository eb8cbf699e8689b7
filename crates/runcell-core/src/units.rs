//! Human-friendly sizes and durations ("256M", "1.5G", "30s", "500ms") for the CLI and config.

use std::time::Duration;

/// Parse a size: a non-negative number with an optional binary unit (K, M, G, T; "KB", "KiB",
/// "MiB" and lowercase are accepted and all mean powers of 1024). Plain numbers are bytes, and
/// so is "bytes", which [`format_size`] writes below 1 KiB.
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
        "" | "b" | "byte" | "bytes" => 1,
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

    /// Found by the property tests: `format_size` writes "12 bytes" below 1 KiB, which
    /// `parse_size` refused ("unknown size unit 'bytes'"), so a size runcell printed (a limit
    /// in a message, `runcell doctor`) could not be given back to it.
    #[test]
    fn small_formatted_sizes_read_back() {
        assert_eq!(parse_size(&format_size(12)).unwrap(), 12);
        assert_eq!(parse_size("1 byte").unwrap(), 1);
        assert_eq!(parse_size("0 bytes").unwrap(), 0);
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

/// Property tests: whatever text a flag, a config file or a request carries, parsing never
/// panics and never overflows, and what we format reads back as the same amount.
#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    /// Text that looks like a size or duration more often than arbitrary strings do.
    fn amount_text() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[ ]{0,2}[0-9.]{0,30}[ ]{0,2}(|b|k|K|kb|KiB|m|M|MiB|g|G|gb|t|T|TiB|ms|s|sec|min|h|x|é)[ ]{0,2}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn parsing_never_panics_and_refuses_what_does_not_fit(s in amount_text()) {
            if let Ok(bytes) = parse_size(&s) {
                prop_assert!(bytes <= u64::MAX / 2 + 1, "{s:?} gave {bytes}");
            }
            if let Ok(d) = parse_duration(&s) {
                prop_assert!(d.as_secs() <= 1_000_000_000, "{s:?} gave {d:?}");
            }
        }

        #[test]
        fn a_formatted_size_reads_back_within_rounding(bytes in prop_oneof![
            0u64..4096,
            0u64..1 << 20,
            any::<u64>().prop_map(|b| b >> 2),
        ]) {
            let text = format_size(bytes);
            let back = parse_size(&text).map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
            // One decimal of the unit is kept, and "within 0.05 of a whole number" is written
            // whole: at most 5% of the unit off.
            let unit = if bytes >= 1 << 10 { 1u64 << (10 * ((63 - bytes.leading_zeros()) / 10)) } else { 1 };
            let tolerance = unit as f64 * 0.05 + 1.0;
            prop_assert!((back as f64 - bytes as f64).abs() <= tolerance, "{bytes} -> {text:?} -> {back}");
        }

        #[test]
        fn a_formatted_duration_reads_back_within_rounding(ms in prop_oneof![
            0u64..10_000_000,
            0u64..1_000_000_000_000,
        ]) {
            let d = Duration::from_millis(ms);
            let text = format_duration(d);
            let back = parse_duration(&text).map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
            let diff = back.as_secs_f64() - d.as_secs_f64();
            prop_assert!(diff.abs() <= 0.0005 + d.as_secs_f64() * 1e-12, "{d:?} -> {text:?} -> {back:?}");
        }

        #[test]
        fn sizes_and_durations_grow_with_the_number(
            a in 0u64..1 << 40,
            b in 0u64..1 << 40,
            frac in 0u32..1000,
            size_unit in prop::sample::select(vec!["", "K", "M", "G", "T"]),
            time_unit in prop::sample::select(vec!["", "ms", "s", "m", "h"]),
        ) {
            let (lo, hi) = (a.min(b), a.max(b));
            let text = |n: u64, unit: &str| format!("{n}.{frac:03}{unit}");
            match (parse_size(&text(lo, size_unit)), parse_size(&text(hi, size_unit))) {
                (Ok(x), Ok(y)) => prop_assert!(x <= y),
                // Too large: a larger number is refused too.
                (Err(_), r) => prop_assert!(r.is_err()),
                (Ok(_), Err(_)) => {}
            }
            match (parse_duration(&text(lo, time_unit)), parse_duration(&text(hi, time_unit))) {
                (Ok(x), Ok(y)) => prop_assert!(x <= y),
                (Err(_), r) => prop_assert!(r.is_err()),
                (Ok(_), Err(_)) => {}
            }
        }

        #[test]
        fn huge_numbers_are_refused_not_wrapped(digits in "[1-9][0-9]{20,400}", unit in "(|K|M|G|T|ms|s|m|h)") {
            let s = format!("{digits}{unit}");
            prop_assert!(parse_size(&s).is_err(), "{s}");
            prop_assert!(parse_duration(&s).is_err(), "{s}");
        }
    }
}
