//! Addresses a run never reaches by a name: loopback, private, shared (CGNAT), link-local,
//! unique-local, multicast, unspecified, reserved, the cloud metadata addresses, and the
//! host's own addresses. A connection to one of them goes through only when the operator's
//! policy and the run both name that exact address and port literally.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

/// The cloud metadata services (AWS, GCP, Azure, ...; AWS's IPv6 one).
const METADATA_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);

/// Why `ip` is special, in words a model can read; `None` for an ordinary public address.
pub fn special(ip: IpAddr, own: &BTreeSet<IpAddr>) -> Option<&'static str> {
    if own.contains(&ip) {
        return Some("an address of the runcell host itself");
    }
    match ip {
        IpAddr::V4(a) => special_v4(a),
        IpAddr::V6(a) => {
            if a == METADATA_V6 {
                return Some("the cloud metadata service");
            }
            if let Some(v4) = a.to_ipv4_mapped() {
                return special(IpAddr::V4(v4), own).or(Some("an IPv4-mapped address"));
            }
            let s = a.segments();
            if a.is_loopback() {
                Some("a loopback address")
            } else if a.is_unspecified() {
                Some("the unspecified address")
            } else if s[0] & 0xfe00 == 0xfc00 {
                Some("a unique-local (private) address")
            } else if s[0] & 0xffc0 == 0xfe80 || s[0] & 0xffc0 == 0xfec0 {
                Some("a link-local address")
            } else if s[0] & 0xff00 == 0xff00 {
                Some("a multicast address")
            } else if s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1 {
                Some("a local-use NAT64 address")
            } else if s[0] == 0x64 && s[1] == 0xff9b {
                // NAT64 (the well-known prefix, and the local-use one 64:ff9b:1::/48): the
                // IPv4 address it translates to decides, the host's own among them.
                let v4 =
                    Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
                special(IpAddr::V4(v4), own)
            } else if s[0] == 0x2001 && s[1] == 0x0db8 {
                Some("a documentation address")
            } else {
                None
            }
        }
    }
}

fn special_v4(a: Ipv4Addr) -> Option<&'static str> {
    let o = a.octets();
    if a == METADATA_V4 {
        Some("the cloud metadata service")
    } else if a.is_loopback() {
        Some("a loopback address")
    } else if a.is_unspecified() || o[0] == 0 {
        Some("the unspecified address")
    } else if a.is_private() {
        Some("a private address")
    } else if o[0] == 100 && o[1] & 0xc0 == 64 {
        Some("a shared (carrier-grade NAT) address")
    } else if a.is_link_local() {
        Some("a link-local address")
    } else if a.is_multicast() {
        Some("a multicast address")
    } else if a.is_broadcast() || o[0] >= 240 {
        Some("a reserved address")
    } else if o[0] == 198 && (o[1] & 0xfe) == 18 {
        Some("a benchmarking address")
    } else if (o[0], o[1], o[2]) == (192, 0, 0) {
        Some("an IETF protocol assignment address")
    } else if matches!(
        (o[0], o[1], o[2]),
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113)
    ) {
        Some("a documentation (TEST-NET) address")
    } else {
        None
    }
}

/// The host's own addresses: the local IPv4 routes of `fib_trie` (normally
/// `/proc/net/fib_trie`, "/32 host LOCAL" leaves) and the IPv6 addresses of `if_inet6`
/// (normally `/proc/net/if_inet6`). Files that cannot be read give nothing.
pub fn own_addresses(fib_trie: &Path, if_inet6: &Path) -> BTreeSet<IpAddr> {
    own_addresses_checked(fib_trie, if_inet6).unwrap_or_default()
}

/// [`own_addresses`], or `None` when the IPv4 table cannot be read: then the host's own
/// addresses are unknown, and a proxy must refuse what it cannot tell apart from them.
pub fn own_addresses_checked(fib_trie: &Path, if_inet6: &Path) -> Option<BTreeSet<IpAddr>> {
    let mut own = BTreeSet::new();
    {
        let text = std::fs::read_to_string(fib_trie).ok()?;
        let mut last: Option<Ipv4Addr> = None;
        for line in text.lines() {
            let t = line.trim_start();
            if let Some(rest) = t.strip_prefix("|-- ").or_else(|| t.strip_prefix("+-- ")) {
                last = rest.split('/').next().and_then(|a| a.trim().parse().ok());
            } else if t.starts_with("/32 host LOCAL") {
                if let Some(a) = last {
                    own.insert(IpAddr::V4(a));
                }
            }
        }
    }
    if let Ok(text) = std::fs::read_to_string(if_inet6) {
        for line in text.lines() {
            let Some(hex) = line.split_whitespace().next() else {
                continue;
            };
            if hex.len() != 32 {
                continue;
            }
            let mut seg = [0u16; 8];
            let ok = seg.iter_mut().enumerate().all(|(i, s)| {
                u16::from_str_radix(&hex[i * 4..i * 4 + 4], 16)
                    .map(|v| *s = v)
                    .is_ok()
            });
            if ok {
                own.insert(IpAddr::V6(Ipv6Addr::from(seg)));
            }
        }
    }
    Some(own)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sp(a: &str) -> Option<&'static str> {
        special(a.parse().unwrap(), &BTreeSet::new())
    }

    #[test]
    fn special_addresses_are_named() {
        for (a, why) in [
            ("127.0.0.1", "loopback"),
            ("127.0.0.2", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("192.168.1.1", "private"),
            ("100.64.0.1", "carrier-grade"),
            ("169.254.169.254", "metadata"),
            ("169.254.1.1", "link-local"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "reserved"),
            ("0.0.0.0", "unspecified"),
            ("0.1.2.3", "unspecified"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fd00:ec2::254", "metadata"),
            ("fd12::1", "unique-local"),
            ("fe80::1", "link-local"),
            ("ff02::1", "multicast"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:8.8.8.8", "IPv4-mapped"),
            ("64:ff9b::a00:1", "private"),
        ] {
            let got = sp(a).unwrap_or_else(|| panic!("{a} is not special"));
            assert!(got.contains(why), "{a}: {got}");
        }
        for (a, why) in [
            ("192.0.2.1", "documentation"),
            ("198.51.100.7", "documentation"),
            ("203.0.113.9", "documentation"),
            ("192.0.0.8", "IETF"),
            ("64:ff9b:1::1", "NAT64"),
        ] {
            let got = sp(a).unwrap_or_else(|| panic!("{a} is not special"));
            assert!(got.contains(why), "{a}: {got}");
        }
        for a in [
            "8.8.8.8",
            "1.1.1.1",
            "151.101.0.223",
            "2606:4700::1111",
            "172.32.0.1",
        ] {
            assert_eq!(sp(a), None, "{a}");
        }
        let own: BTreeSet<IpAddr> = ["151.101.0.1".parse().unwrap()].into();
        assert!(special("151.101.0.1".parse().unwrap(), &own)
            .unwrap()
            .contains("host itself"));
        // Through NAT64 too.
        assert!(special("64:ff9b::9765:1".parse().unwrap(), &own)
            .unwrap()
            .contains("host itself"));
    }

    #[test]
    fn the_hosts_own_addresses_come_from_proc() {
        let dir = tempfile::tempdir().unwrap();
        let fib = dir.path().join("fib_trie");
        std::fs::write(
            &fib,
            "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n     \
             +-- 10.0.2.0/24 2 0 2\n        |-- 10.0.2.15\n           /32 host LOCAL\n        \
             |-- 10.0.2.255\n           /32 link BROADCAST\n     |-- 127.0.0.1\n        \
             /32 host LOCAL\n",
        )
        .unwrap();
        let v6 = dir.path().join("if_inet6");
        std::fs::write(
            &v6,
            "00000000000000000000000000000001 01 80 10 80       lo\n\
             fe800000000000000000000000000001 02 40 20 80     eth0\n",
        )
        .unwrap();
        let own = own_addresses(&fib, &v6);
        let want: BTreeSet<IpAddr> = ["10.0.2.15", "127.0.0.1", "::1", "fe80::1"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(own, want);
        assert!(own_addresses(&dir.path().join("no"), &dir.path().join("no")).is_empty());
        assert!(own_addresses_checked(&dir.path().join("no"), &v6).is_none());
    }
}
