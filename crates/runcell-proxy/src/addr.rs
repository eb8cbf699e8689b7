//! Addresses a run never reaches by a name: loopback, private, shared (CGNAT), link-local,
//! unique-local, multicast, unspecified, reserved, the cloud metadata addresses, and the
//! host's own addresses. A connection to one of them goes through only when the operator's
//! policy and the run both name that exact address and port literally.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

/// The cloud metadata services (AWS, GCP, Azure, ...; AWS's IPv6 one).
const METADATA_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);

/// Why `ip` is special, in words a model can read; `None` for an ordinary public address.
pub fn special(ip: IpAddr, own: &OwnAddresses) -> Option<&'static str> {
    if own.contains(ip) {
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

/// The host's own addresses: every prefix the kernel delivers to the host itself. A
/// configured address is one (a /32 or /128); an AnyIP route (`ip route add local
/// 10.99.0.0/24 dev lo`) makes a whole prefix the host's own, each of its addresses answered
/// by the host's listeners.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnAddresses {
    /// Prefix length to the prefixes of that length, masked.
    v4: BTreeMap<u8, BTreeSet<u32>>,
    v6: BTreeMap<u8, BTreeSet<u128>>,
}

impl OwnAddresses {
    /// Add `ip/len` (a length past the family's width is taken as the whole address).
    pub fn insert(&mut self, ip: IpAddr, len: u8) {
        match ip {
            IpAddr::V4(a) => {
                let len = len.min(32);
                self.v4
                    .entry(len)
                    .or_default()
                    .insert(u32::from(a) & mask_v4(len));
            }
            IpAddr::V6(a) => {
                let len = len.min(128);
                self.v6
                    .entry(len)
                    .or_default()
                    .insert(u128::from(a) & mask_v6(len));
            }
        }
    }

    /// Whether `ip` is in one of the prefixes.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(a) => {
                let a = u32::from(a);
                self.v4
                    .iter()
                    .any(|(len, set)| set.contains(&(a & mask_v4(*len))))
            }
            IpAddr::V6(a) => {
                let a = u128::from(a);
                self.v6
                    .iter()
                    .any(|(len, set)| set.contains(&(a & mask_v6(*len))))
            }
        }
    }

    /// Every prefix, as its first address and its length.
    pub fn prefixes(&self) -> impl Iterator<Item = (IpAddr, u8)> + '_ {
        let v4 = self.v4.iter().flat_map(|(len, set)| {
            set.iter()
                .map(move |a| (IpAddr::V4(Ipv4Addr::from(*a)), *len))
        });
        let v6 = self.v6.iter().flat_map(|(len, set)| {
            set.iter()
                .map(move |a| (IpAddr::V6(Ipv6Addr::from(*a)), *len))
        });
        v4.chain(v6)
    }

    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }
}

/// Single addresses (a /32 or a /128 each).
impl FromIterator<IpAddr> for OwnAddresses {
    fn from_iter<I: IntoIterator<Item = IpAddr>>(iter: I) -> Self {
        let mut own = OwnAddresses::default();
        for ip in iter {
            own.insert(ip, 128);
        }
        own
    }
}

fn mask_v4(len: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
}

fn mask_v6(len: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
}

/// `ipv6_route` flags: a route to the host itself (`ip -6 route add local ...`, and each
/// configured address's /128), and a subnet-router anycast address the host answers.
const RTF_LOCAL: u32 = 0x8000_0000;
const RTF_ANYCAST: u32 = 0x0010_0000;

/// The host's own addresses (see [`own_addresses_checked`]); nothing when the tables cannot
/// be read.
pub fn own_addresses(fib_trie: &Path, if_inet6: &Path) -> OwnAddresses {
    own_addresses_checked(fib_trie, if_inet6).unwrap_or_default()
}

/// The host's own addresses from the kernel's tables: every `LOCAL` prefix of every IPv4
/// routing table in `fib_trie` (normally `/proc/net/fib_trie`), the configured IPv6 addresses
/// of `if_inet6` (normally `/proc/net/if_inet6`) and the IPv6 local routes of the
/// `ipv6_route` beside it (`/proc/net/ipv6_route`: `if_inet6` lists configured addresses
/// only, not AnyIP prefixes). `None` when the IPv4 table cannot be read: then the host's own
/// addresses are unknown, and a proxy must refuse what it cannot tell apart from them.
pub fn own_addresses_checked(fib_trie: &Path, if_inet6: &Path) -> Option<OwnAddresses> {
    let mut own = OwnAddresses::default();
    parse_fib_trie(&std::fs::read_to_string(fib_trie).ok()?, &mut own);
    if let Ok(text) = std::fs::read_to_string(if_inet6) {
        parse_if_inet6(&text, &mut own);
    }
    let ipv6_route = if_inet6.with_file_name("ipv6_route");
    if let Ok(text) = std::fs::read_to_string(ipv6_route) {
        parse_ipv6_route(&text, &mut own);
    }
    Some(own)
}

/// `fib_trie` lists each table ("Main:", "Local:", "Id 100:") as a trie whose leaves
/// (`|-- 10.99.0.0`) carry one line per route of that key (`/24 host LOCAL`: length, scope,
/// type). A `LOCAL` route of any length and scope is the host's own prefix.
fn parse_fib_trie(text: &str, own: &mut OwnAddresses) {
    let mut leaf: Option<Ipv4Addr> = None;
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("|-- ") {
            leaf = rest.trim().parse().ok();
        } else if t.starts_with("+-- ") || !t.starts_with('/') {
            leaf = None;
        } else if let Some(a) = leaf {
            let mut f = t[1..].split_whitespace();
            let (Some(len), Some(_scope), Some(kind)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            if kind == "LOCAL" {
                if let Ok(len) = len.parse::<u8>() {
                    own.insert(IpAddr::V4(a), len);
                }
            }
        }
    }
}

/// One IPv6 address in 32 hex digits, as `/proc/net` prints them.
fn hex_v6(hex: &str) -> Option<Ipv6Addr> {
    if hex.len() != 32 {
        return None;
    }
    u128::from_str_radix(hex, 16).ok().map(Ipv6Addr::from)
}

/// `if_inet6`: one configured address per line, first field.
fn parse_if_inet6(text: &str, own: &mut OwnAddresses) {
    for line in text.lines() {
        if let Some(a) = line.split_whitespace().next().and_then(hex_v6) {
            own.insert(IpAddr::V6(a), 128);
        }
    }
}

/// `ipv6_route`: destination, its length (hex), source, its length, next hop, metric,
/// references, use, flags (hex), device; the routes of every table.
fn parse_ipv6_route(text: &str, own: &mut OwnAddresses) {
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 9 {
            continue;
        }
        let (Some(dest), Ok(len), Ok(flags)) = (
            hex_v6(f[0]),
            u8::from_str_radix(f[1], 16),
            u32::from_str_radix(f[8], 16),
        ) else {
            continue;
        };
        if flags & (RTF_LOCAL | RTF_ANYCAST) != 0 {
            own.insert(IpAddr::V6(dest), len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sp(a: &str) -> Option<&'static str> {
        special(a.parse().unwrap(), &OwnAddresses::default())
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
        let own: OwnAddresses = ["151.101.0.1".parse().unwrap()].into_iter().collect();
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
        let want: OwnAddresses = ["10.0.2.15", "127.0.0.1", "::1", "fe80::1"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(own, want);
        assert!(own_addresses(&dir.path().join("no"), &dir.path().join("no")).is_empty());
        assert!(own_addresses_checked(&dir.path().join("no"), &v6).is_none());
    }

    /// Regression (attack pass): an AnyIP route (`ip route add local 11.22.33.0/24 dev lo`)
    /// makes every address of the /24 the host's own, but only "/32 host LOCAL" leaves were
    /// read, so a name resolving to 11.22.33.77 reached the host itself. Every `LOCAL` prefix
    /// of any table counts, and so do IPv6 local routes (`ipv6_route`, flag RTF_LOCAL), which
    /// `if_inet6` (configured addresses only) does not show.
    #[test]
    fn local_routes_wider_than_one_address_are_the_hosts_own() {
        let dir = tempfile::tempdir().unwrap();
        let fib = dir.path().join("fib_trie");
        // As Linux 6.x prints it after `ip route add local 11.22.33.0/24 dev lo` and
        // `ip route add table 100 local 11.22.40.0/22 dev lo`.
        std::fs::write(
            &fib,
            "Id 100:\n  |-- 11.22.40.0\n     /22 host LOCAL\nMain:\n  +-- 0.0.0.0/1 2 0 2\n     \
             |-- 11.22.33.0\n        /24 host LOCAL\n     +-- 127.0.0.0/8 2 0 2\n        \
             +-- 127.0.0.0/31 1 0 0\n           |-- 127.0.0.0\n              /8 host LOCAL\n           \
             |-- 127.0.0.1\n              /32 host LOCAL\n        |-- 127.255.255.255\n           \
             /32 link BROADCAST\n     |-- 11.22.50.0\n        /24 universe UNICAST\n",
        )
        .unwrap();
        let v6 = dir.path().join("if_inet6");
        std::fs::write(
            &v6,
            "00000000000000000000000000000001 01 80 10 80       lo\n",
        )
        .unwrap();
        // After `ip -6 route add local 2a01:4f8:1::/64 dev lo`: the local route (flags
        // 0x80000001, RTF_LOCAL | RTF_UP), an address's own /128 (0x80200001), a plain route
        // (0x00000001) and the unreachable default (0x00200200).
        std::fs::write(
            dir.path().join("ipv6_route"),
            "2a0104f8000100000000000000000000 40 00000000000000000000000000000000 00 \
             00000000000000000000000000000000 00000400 00000001 00000000 80000001       lo\n\
             2a0104f8000900000000000000000007 80 00000000000000000000000000000000 00 \
             00000000000000000000000000000000 00000000 00000003 00000000 80200001     eth0\n\
             2a0104f8000200000000000000000000 40 00000000000000000000000000000000 00 \
             00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n\
             00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
             00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n",
        )
        .unwrap();
        let own = own_addresses(&fib, &v6);
        for a in [
            "11.22.33.0",
            "11.22.33.77",
            "11.22.33.255",
            "11.22.41.9",
            "2a01:4f8:1::5",
            "2a01:4f8:1::ffff:1",
            "2a01:4f8:9::7",
            "::ffff:11.22.33.77",
        ] {
            let why = special(a.parse().unwrap(), &own);
            assert_eq!(why, Some("an address of the runcell host itself"), "{a}");
        }
        for a in ["11.22.34.1", "11.22.50.1", "2a01:4f8:2::1", "2a01:4f8:9::8"] {
            assert_eq!(special(a.parse().unwrap(), &own), None, "{a}");
        }
    }
}
