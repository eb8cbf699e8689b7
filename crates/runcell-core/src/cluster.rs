//! Several servers behind one address: session ids that name the server ("pod") holding the
//! session, and the boot of that server, authenticated with a key the servers share.
//!
//! A session lives in one process (its interpreter is a process there), but a request can
//! reach any server behind a Kubernetes Service. So an id says where its session lives: the
//! server's name, its boot epoch (a random nonce drawn when the process starts) and random
//! bits, plus an HMAC-SHA256 tag over them with the cluster key. A server that receives an id:
//!
//! * with a bad tag (forged, tampered, another cluster's): the session does not exist; no peer
//!   is contacted, since the peer's address is derived only from a name the tag vouches for;
//! * naming itself and its own epoch: the session is looked up here;
//! * naming itself and another epoch: the server restarted since, and the session is gone
//!   ([`ErrorKind::SessionLost`](crate::ErrorKind::SessionLost));
//! * naming another server: the request is forwarded there once (runcell-server).
//!
//! Ids are lowercase letters and digits only (E2B's sandbox id alphabet, `^[a-z0-9]+$`), at
//! most 57 characters: safe in URLs, and as an E2B sandbox id inside a host name label
//! (`{port}-{sandboxID}.{domain}`, 63 at most). The server's name keeps its letters and
//! digits, with `9` escaping: `-` is written `98` and `9` is written `99`.
//!
//! ```text
//! clustered:    {pod}{epoch:6}{random:16}{tag:13}     runcell980k3x9q2…  (runcell-0)
//! one server:   ses{epoch:6}{random:16}
//! ```
//!
//! (base32, RFC 4648's alphabet in lowercase: 30 bits of epoch, 80 random bits, 65 bits of
//! tag). A single server has no key: its ids carry the epoch only, so that after a restart it
//! too answers "lost" instead of "not found" for the ids it handed out before.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// The longest server name an id can carry, written (57 characters in all): at most 22
/// letters and digits, each `-` and `9` counting twice.
pub const MAX_POD_LEN: usize = 22;
/// The shortest cluster key accepted (bytes).
pub const MIN_KEY_LEN: usize = 32;

const EPOCH_CHARS: usize = 6;
const RANDOM_CHARS: usize = 16;
const TAG_CHARS: usize = 13;
/// What precedes the random part of a single server's ids.
const LOCAL_PREFIX: &str = "ses";
/// Mixed into every tag, so that a tag made for something else with the same key is no id.
const TAG_CONTEXT: &[u8] = b"runcell session id v1\0";

/// How a clustered server is set up (`cluster.*` settings).
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    /// This server's name: a DNS-1123 label of at most [`MAX_POD_LEN`] characters.
    pub pod: String,
    /// The key the servers share, at least [`MIN_KEY_LEN`] bytes.
    pub key: Vec<u8>,
    /// The base URL of a peer, with `{pod}` in it
    /// (`http://{pod}.runcell-pods.default.svc.cluster.local:8080`).
    pub peer_url: Option<String>,
    /// Base URLs of named peers, over the template.
    pub peers: BTreeMap<String, String>,
}

impl std::fmt::Debug for ClusterSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSettings")
            .field("pod", &self.pod)
            .field("key", &"<redacted>")
            .field("peer_url", &self.peer_url)
            .field("peers", &self.peers)
            .finish()
    }
}

/// Why cluster settings were refused (the binary names the setting).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    #[error(
        "{0:?} is not a DNS-1123 label of at most {MAX_POD_LEN} characters (lowercase \
         letters, digits and '-', starting and ending with a letter or digit; each '-' and \
         '9' counts twice)"
    )]
    PodName(String),
    #[error("the cluster key must be at least {MIN_KEY_LEN} bytes")]
    KeyTooShort,
    #[error("{0:?} is not an http:// URL with {{pod}} in it")]
    Template(String),
    #[error("{0:?} is not an http://host:port URL")]
    PeerUrl(String),
    #[error("no peer address: set cluster.peer_url (a template with {{pod}}) or cluster.peers")]
    NoPeers,
}

/// Whether `name` is a DNS-1123 label short enough to be carried by an id.
pub fn valid_pod_name(name: &str) -> bool {
    let b = name.as_bytes();
    let ok = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && encode_pod(name).len() <= MAX_POD_LEN
        && ok(&b[0])
        && ok(&b[b.len() - 1])
        && b.iter().all(|c| ok(c) || *c == b'-')
}

/// A server name in an id's alphabet: `-` as `98`, `9` as `99`, letters and digits as they are.
fn encode_pod(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        match c {
            '-' => out.push_str("98"),
            '9' => out.push_str("99"),
            c => out.push(c),
        }
    }
    out
}

/// The server name written by [`encode_pod`]; `None` for anything it cannot have written.
fn decode_pod(written: &str) -> Option<String> {
    let mut out = String::with_capacity(written.len());
    let mut chars = written.chars();
    while let Some(c) = chars.next() {
        match c {
            '9' => match chars.next()? {
                '8' => out.push('-'),
                '9' => out.push('9'),
                _ => return None,
            },
            c if c.is_ascii_lowercase() || c.is_ascii_digit() => out.push(c),
            _ => return None,
        }
    }
    Some(out)
}

/// `http://host[:port]` without path, query or credentials (a peer's base URL).
fn valid_base_url(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    !rest.is_empty()
        && rest
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b':' | b'[' | b']'))
}

impl ClusterSettings {
    /// Check the settings: a valid name, a long enough key, a way to reach every peer.
    pub fn validate(&self) -> Result<(), ClusterError> {
        if !valid_pod_name(&self.pod) {
            return Err(ClusterError::PodName(self.pod.clone()));
        }
        if self.key.len() < MIN_KEY_LEN {
            return Err(ClusterError::KeyTooShort);
        }
        if let Some(t) = &self.peer_url {
            if !t.contains("{pod}") || !valid_base_url(&t.replace("{pod}", "p")) {
                return Err(ClusterError::Template(t.clone()));
            }
        }
        for (pod, url) in &self.peers {
            if !valid_pod_name(pod) {
                return Err(ClusterError::PodName(pod.clone()));
            }
            if !valid_base_url(url) {
                return Err(ClusterError::PeerUrl(url.clone()));
            }
        }
        if self.peer_url.is_none() && self.peers.is_empty() {
            return Err(ClusterError::NoPeers);
        }
        Ok(())
    }

    /// The base URL of peer `pod` (`http://host:port`, no trailing slash): its entry in
    /// `peers`, else the template. `pod` must come from an authenticated id.
    pub fn peer_base(&self, pod: &str) -> Option<String> {
        if !valid_pod_name(pod) {
            return None;
        }
        let url = match self.peers.get(pod) {
            Some(u) => u.clone(),
            None => self.peer_url.as_ref()?.replace("{pod}", pod),
        };
        Some(url.trim_end_matches('/').to_string())
    }
}

/// Where the session an id names lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// Here, in this process (if it still exists).
    Here,
    /// Here, in an earlier process: the server restarted and the session is gone.
    Restarted,
    /// On the named peer.
    Peer(String),
    /// Nowhere: not an id this cluster made (malformed, forged, tampered).
    Unknown,
}

/// Mints and reads the session ids of one server process.
#[derive(Clone)]
pub struct SessionIds {
    cluster: Option<std::sync::Arc<ClusterSettings>>,
    epoch: String,
}

impl std::fmt::Debug for SessionIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionIds")
            .field("pod", &self.pod())
            .field("epoch", &self.epoch)
            .finish()
    }
}

const BASE32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// `bytes` in lowercase base32 without padding, cut to `chars` characters.
fn base32(bytes: &[u8], chars: usize) -> String {
    let mut out = String::with_capacity(chars);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &b in bytes {
        if out.len() == chars {
            break;
        }
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 && out.len() < chars {
            bits -= 5;
            out.push(BASE32[((acc >> bits) & 31) as usize] as char);
        }
        acc &= (1 << bits) - 1;
    }
    if bits > 0 && out.len() < chars {
        out.push(BASE32[((acc << (5 - bits)) & 31) as usize] as char);
    }
    out
}

fn is_base32(s: &str) -> bool {
    s.bytes().all(|c| BASE32.contains(&c))
}

fn random(chars: usize) -> String {
    let mut b = vec![0u8; chars.div_ceil(8) * 5];
    fill_random(&mut b);
    base32(&b, chars)
}

/// Fill `buf` from the kernel's random source. Ids and keys made of anything less than
/// random bytes would be guessable, so this fails closed: a kernel that gives none (no
/// getrandom(2), a seccomp refusal) stops the server with a clear message instead.
fn fill_random(buf: &mut [u8]) {
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(0) => panic!("getrandom(2) returned no random bytes"),
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => panic!("getrandom(2) failed ({e}): the kernel gives no random bytes"),
        }
    }
}

/// HMAC-SHA256 (RFC 2104) of `msg` with `key`.
pub fn hmac_sha256(key: &[u8], msg: &[&[u8]]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    for m in msg {
        inner.update(m);
    }
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// Equal, in a time that depends on the lengths only.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

impl SessionIds {
    /// The ids of a single server (no cluster), with a new boot epoch.
    pub fn local() -> SessionIds {
        SessionIds {
            cluster: None,
            epoch: random(EPOCH_CHARS),
        }
    }

    /// The ids of this process: clustered when `cluster` is set (validated by the caller).
    pub fn new(cluster: Option<ClusterSettings>) -> SessionIds {
        SessionIds {
            cluster: cluster.map(std::sync::Arc::new),
            epoch: random(EPOCH_CHARS),
        }
    }

    /// With a given epoch (tests: a "restarted" server).
    pub fn with_epoch(mut self, epoch: &str) -> SessionIds {
        self.epoch = base32(epoch.as_bytes(), EPOCH_CHARS);
        self
    }

    /// This server's name when clustered.
    pub fn pod(&self) -> Option<&str> {
        self.cluster.as_deref().map(|c| c.pod.as_str())
    }

    pub fn cluster(&self) -> Option<&ClusterSettings> {
        self.cluster.as_deref()
    }

    /// This process's boot epoch.
    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    fn tag(key: &[u8], unsigned: &str) -> String {
        base32(
            &hmac_sha256(key, &[TAG_CONTEXT, unsigned.as_bytes()]),
            TAG_CHARS,
        )
    }

    /// A new id for a session created here.
    pub fn mint(&self) -> String {
        let body = format!("{}{}", self.epoch, random(RANDOM_CHARS));
        match self.cluster.as_deref() {
            None => format!("{LOCAL_PREFIX}{body}"),
            Some(c) => {
                let unsigned = format!("{}{body}", encode_pod(&c.pod));
                let tag = Self::tag(&c.key, &unsigned);
                format!("{unsigned}{tag}")
            }
        }
    }

    /// Where the session `id` lives. Only an id with a valid tag can name a peer.
    pub fn owner(&self, id: &str) -> Owner {
        if !id
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        {
            return Owner::Unknown;
        }
        // The body has a fixed length: what precedes it is the server's name (or "ses").
        let body_len = match self.cluster {
            None => EPOCH_CHARS + RANDOM_CHARS,
            Some(_) => EPOCH_CHARS + RANDOM_CHARS + TAG_CHARS,
        };
        if id.len() <= body_len {
            return Owner::Unknown;
        }
        let (written, body) = id.split_at(id.len() - body_len);
        if !is_base32(body) {
            return Owner::Unknown;
        }
        match self.cluster.as_deref() {
            None => {
                if written != LOCAL_PREFIX {
                    return Owner::Unknown;
                }
                if body[..EPOCH_CHARS] == self.epoch {
                    Owner::Here
                } else {
                    Owner::Restarted
                }
            }
            Some(c) => {
                let Some(prefix) = decode_pod(written).filter(|p| valid_pod_name(p)) else {
                    return Owner::Unknown;
                };
                let (unsigned, tag) = id.split_at(id.len() - TAG_CHARS);
                if !ct_eq(Self::tag(&c.key, unsigned).as_bytes(), tag.as_bytes()) {
                    return Owner::Unknown;
                }
                if prefix != c.pod {
                    Owner::Peer(prefix)
                } else if body[..EPOCH_CHARS] == self.epoch {
                    Owner::Here
                } else {
                    Owner::Restarted
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(pod: &str, key: &[u8]) -> ClusterSettings {
        ClusterSettings {
            pod: pod.into(),
            key: key.to_vec(),
            peer_url: Some("http://{pod}.runcell-pods.default.svc.cluster.local:8080".into()),
            peers: BTreeMap::new(),
        }
    }

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2.
        assert_eq!(
            hex(&hmac_sha256(
                b"Jefe",
                &[b"what do ya want ", b"for nothing?"]
            )),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block.
        assert_eq!(
            hex(&hmac_sha256(
                &[0xaa; 131],
                &[b"Test Using Larger Than Block-Size Key - Hash Key First"]
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn base32_follows_rfc_4648() {
        assert_eq!(base32(b"foobar", 10), "mzxw6ytboi");
        assert_eq!(base32(b"f", 2), "my");
        assert_eq!(base32(b"fooba", 3), "mzx");
    }

    #[test]
    fn ids_are_dns_labels_that_fit_an_e2b_host_name() {
        let longest = "a".repeat(MAX_POD_LEN);
        for ids in [
            SessionIds::local(),
            SessionIds::new(Some(cluster("runcell-0", KEY))),
            SessionIds::new(Some(cluster(&longest, KEY))),
        ] {
            let id = ids.mint();
            assert!(id.len() <= 57, "{id}");
            // `{port}-{id}` is one label of a host name.
            assert!(format!("65535-{id}").len() <= 63);
            // E2B's sandbox id alphabet.
            assert!(id
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
            assert_eq!(ids.owner(&id), Owner::Here, "{id}");
            assert_ne!(ids.mint(), id);
        }
    }

    #[test]
    fn peers_restarts_and_forgeries() {
        let zero = SessionIds::new(Some(cluster("runcell-0", KEY)));
        let two = SessionIds::new(Some(cluster("runcell-2", KEY)));
        let id = zero.mint();
        assert_eq!(two.owner(&id), Owner::Peer("runcell-0".into()));
        // The same name after a restart: another epoch.
        let restarted = SessionIds::new(Some(cluster("runcell-0", KEY))).with_epoch("other");
        assert_eq!(restarted.owner(&id), Owner::Restarted);
        // Another cluster's key: unknown everywhere.
        let foreign = SessionIds::new(Some(cluster("runcell-0", &[7u8; 32])));
        assert_eq!(two.owner(&foreign.mint()), Owner::Unknown);
        // Any change to the id breaks its tag: the pod renamed, a character flipped.
        assert!(id.starts_with("runcell980"), "{id}");
        let renamed = id.replacen("runcell980", "runcell981", 1);
        assert_eq!(two.owner(&renamed), Owner::Unknown);
        for i in 10..id.len() {
            let mut b = id.clone().into_bytes();
            b[i] = if b[i] == b'a' { b'b' } else { b'a' };
            let flipped = String::from_utf8(b).unwrap();
            assert_eq!(two.owner(&flipped), Owner::Unknown, "{flipped}");
        }
        for bad in [
            "",
            "-",
            "ses_0a1b",
            "runcell-0-",
            "runcell980",
            "x",
            &id.to_uppercase(),
        ] {
            assert_eq!(two.owner(bad), Owner::Unknown, "{bad}");
        }
        // A single server's ids mean nothing to a cluster, and the reverse.
        assert_eq!(two.owner(&SessionIds::local().mint()), Owner::Unknown);
        assert_eq!(SessionIds::local().owner(&id), Owner::Unknown);
    }

    /// Regression: ids had a `-` after the server's name, which E2B's sandbox id alphabet
    /// (`^[a-z0-9]+$`) has not: the E2B SDKs' checks refused them.
    #[test]
    fn server_names_are_written_in_letters_and_digits() {
        for name in ["runcell-0", "a-9-b", "9", "pod-99-x", "abc"] {
            let written = encode_pod(name);
            assert!(written
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
            assert_eq!(decode_pod(&written).as_deref(), Some(name), "{written}");
        }
        assert_eq!(encode_pod("runcell-0"), "runcell980");
        for bad in ["9", "97", "a9", "A", "a-b"] {
            assert_eq!(decode_pod(bad), None, "{bad}");
        }
        let ids = SessionIds::new(Some(cluster("pod-9", KEY)));
        let id = ids.mint();
        assert!(id.starts_with("pod9899"), "{id}");
        assert_eq!(
            SessionIds::new(Some(cluster("pod-8", KEY))).owner(&id),
            Owner::Peer("pod-9".into())
        );
    }

    #[test]
    fn a_single_server_knows_its_own_restarts() {
        let ids = SessionIds::local();
        let id = ids.mint();
        assert_eq!(ids.owner(&id), Owner::Here);
        let later = SessionIds::local().with_epoch("later");
        assert_eq!(later.owner(&id), Owner::Restarted);
        assert_eq!(later.owner("sesshort"), Owner::Unknown);
        assert_eq!(later.owner(&id.replacen("ses", "sex", 1)), Owner::Unknown);
    }

    #[test]
    fn settings_are_checked() {
        let ok = cluster("runcell-0", KEY);
        assert_eq!(ok.validate(), Ok(()));
        let bad = |f: &dyn Fn(&mut ClusterSettings)| {
            let mut c = ok.clone();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(matches!(
            bad(&|c| c.pod = "Runcell_0".into()),
            ClusterError::PodName(_)
        ));
        assert!(matches!(
            bad(&|c| c.pod = "a".repeat(MAX_POD_LEN + 1)),
            ClusterError::PodName(_)
        ));
        assert_eq!(
            bad(&|c| c.key = b"short".to_vec()),
            ClusterError::KeyTooShort
        );
        assert!(matches!(
            bad(&|c| c.peer_url = Some("http://runcell:8080".into())),
            ClusterError::Template(_)
        ));
        assert!(matches!(
            bad(&|c| c.peer_url = Some("https://{pod}.x/path?q".into())),
            ClusterError::Template(_)
        ));
        assert_eq!(bad(&|c| c.peer_url = None), ClusterError::NoPeers);
        assert!(matches!(
            bad(&|c| {
                c.peers
                    .insert("runcell-1".into(), "http://u:p@evil/x".into());
            }),
            ClusterError::PeerUrl(_)
        ));
    }

    #[test]
    fn peer_addresses_come_from_the_map_then_the_template() {
        let mut c = cluster("runcell-0", KEY);
        c.peers
            .insert("runcell-1".into(), "http://127.0.0.2:9000/".into());
        assert_eq!(
            c.peer_base("runcell-1").as_deref(),
            Some("http://127.0.0.2:9000")
        );
        assert_eq!(
            c.peer_base("runcell-2").as_deref(),
            Some("http://runcell-2.runcell-pods.default.svc.cluster.local:8080")
        );
        assert_eq!(c.peer_base("evil.com:80/x"), None);
    }
}
