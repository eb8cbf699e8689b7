//! The forward proxy of one run. It accepts on a listening socket that lives in the sandbox's
//! network namespace (made there by the sandbox's pid 1, served from here, outside it), reads
//! one request per connection, `CONNECT host:port` (a tunnel, for TLS) or an absolute-URI
//! request (`GET http://host/path`, plain HTTP), decides, and then connects from the host's
//! network and copies bytes both ways. It resolves names itself; the sandbox has no resolver
//! and no route.
//!
//! A refusal is an HTTP 403 whose reason phrase and body say which destination was refused
//! and why (Python's `Tunnel connection failed: 403 ...` shows the reason phrase). Every
//! connection, allowed or refused, is recorded with its bytes each way.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use serde::Serialize;

use crate::addr::{special, OwnAddresses};
use crate::rules::{Destination, NetRule};

/// What one run may reach, and how much.
#[derive(Debug, Clone)]
pub struct Permit {
    /// The run's entries (each covered by one of `policy`).
    pub allow: Vec<NetRule>,
    /// The operator's entries: a special address must be named literally here too.
    pub policy: Vec<NetRule>,
    /// Connections per run (refused beyond).
    pub max_connections: u32,
    /// Bytes per run, both ways together (connections are cut beyond).
    pub max_bytes: u64,
    /// How long connecting to a destination may take.
    pub connect_timeout: Duration,
    /// The host's own addresses (see [`crate::addr::own_addresses_checked`]); `None` when
    /// they could not be read: then only addresses named literally are reachable.
    pub own: Option<OwnAddresses>,
}

/// One connection the run made (or tried).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Connection {
    /// As the run asked for it.
    pub host: String,
    pub port: u16,
    pub allowed: bool,
    /// The address connected to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Why it was refused, failed, or cut.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Bytes from the sandbox to the destination, and back.
    pub bytes_out: u64,
    pub bytes_in: u64,
    pub duration_seconds: f64,
}

/// The longest request head read (request line and headers).
const MAX_HEAD: usize = 16 << 10;
/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest reason kept in a record.
const MAX_REASON: usize = 300;
/// How long [`ProxyHandle::finish`] waits for connections to wind down.
const FINISH_GRACE: Duration = Duration::from_secs(2);

struct Shared {
    permit: Permit,
    stop: AtomicBool,
    accepted: AtomicU32,
    /// Connections refused in the accept loop once the cap was reached (no thread, no
    /// record each: one summary record at the end).
    over_cap: AtomicU64,
    bytes: AtomicU64,
    /// Sockets of open connections, to shut down at the end of the run.
    live: Mutex<Vec<TcpStream>>,
    records: Mutex<Vec<Connection>>,
    handlers: Mutex<Vec<JoinHandle<()>>>,
}

impl Shared {
    fn record(&self, c: Connection) {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(c);
    }

    /// Shut down every open connection (the handlers then see their sockets end).
    fn cut_all(&self) {
        for s in self
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn track(&self, s: &TcpStream) {
        if let Ok(c) = s.try_clone() {
            self.live.lock().unwrap_or_else(|e| e.into_inner()).push(c);
        }
    }
}

/// A running proxy; [`ProxyHandle::finish`] ends it and returns what it recorded.
pub struct ProxyHandle {
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

/// Serve `listener` (a socket in the sandbox's network namespace) for one run.
pub fn start(listener: TcpListener, permit: Permit) -> io::Result<ProxyHandle> {
    listener.set_nonblocking(true)?;
    let shared = Arc::new(Shared {
        permit,
        stop: AtomicBool::new(false),
        accepted: AtomicU32::new(0),
        over_cap: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        live: Mutex::new(Vec::new()),
        records: Mutex::new(Vec::new()),
        handlers: Mutex::new(Vec::new()),
    });
    let s = shared.clone();
    let accept = std::thread::Builder::new()
        .name("runcell-proxy".into())
        .spawn(move || accept_loop(listener, s))?;
    Ok(ProxyHandle {
        shared,
        accept: Some(accept),
    })
}

impl ProxyHandle {
    /// Stop accepting, cut every open connection, and return the connections in the order
    /// they ended.
    pub fn finish(mut self) -> Vec<Connection> {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
        self.shared.cut_all();
        let over = self.shared.over_cap.load(Ordering::Acquire);
        if over > 0 {
            self.shared.record(Connection {
                host: "*".into(),
                port: 0,
                allowed: false,
                address: None,
                reason: Some(format!(
                    "{over} more connection(s) refused: this run had used its {} connections",
                    self.shared.permit.max_connections
                )),
                bytes_out: 0,
                bytes_in: 0,
                duration_seconds: 0.0,
            });
        }
        let handlers = std::mem::take(
            &mut *self
                .shared
                .handlers
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        let deadline = Instant::now() + FINISH_GRACE;
        for h in handlers {
            // A handler stuck resolving a name is left behind; its socket is shut down.
            while !h.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if h.is_finished() {
                let _ = h.join();
            }
        }
        std::mem::take(
            &mut *self
                .shared
                .records
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        )
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.cut_all();
    }
}

/// Answers connections past the cap, one at a time on one thread: a run's flood of them
/// costs the supervisor that thread and a bounded queue, nothing per connection.
fn refuser(rx: std::sync::mpsc::Receiver<TcpStream>, max_connections: u32) {
    let why = format!("this run has used its {max_connections} connections");
    for mut c in rx {
        // Read what the client sent first (briefly): closing a socket with unread data
        // resets it, and the client would lose the answer.
        let _ = c.set_read_timeout(Some(Duration::from_millis(200)));
        let mut buf = [0u8; 4096];
        let _ = c.read(&mut buf);
        refuse(&mut c, 403, &why);
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let (over_tx, over_rx) = std::sync::mpsc::sync_channel::<TcpStream>(64);
    let max = shared.permit.max_connections;
    let _ = std::thread::Builder::new()
        .name("runcell-proxy-refuse".into())
        .stack_size(128 << 10)
        .spawn(move || refuser(over_rx, max));
    while !shared.stop.load(Ordering::Acquire) {
        let mut fds = [PollFd::new(&listener, PollFlags::IN)];
        let tick = Timespec {
            tv_sec: 0,
            tv_nsec: 50_000_000,
        };
        match poll(&mut fds, Some(&tick)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => {}
            Err(_) => return,
        }
        let client = match listener.accept() {
            Ok((c, _)) => c,
            Err(_) => {
                // Out of descriptors (or another passing failure): do not spin.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let n = shared.accepted.fetch_add(1, Ordering::AcqRel) + 1;
        if n > shared.permit.max_connections {
            // Over the cap: answered by the one refuser thread, without a thread or a record
            // of its own, so that a run cannot turn connections into the supervisor's
            // threads, descriptors and memory. A full queue closes the connection at once.
            shared.over_cap.fetch_add(1, Ordering::AcqRel);
            if client.set_nonblocking(false).is_ok() {
                let _ = over_tx.try_send(client);
            }
            continue;
        }
        if client.set_nonblocking(false).is_err() {
            continue;
        }
        shared.track(&client);
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("runcell-proxy-conn".into())
            .stack_size(256 << 10)
            .spawn(move || handle(client, &s));
        if let Ok(h) = spawned {
            shared
                .handlers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(h);
        }
    }
}

/// A parsed request head.
struct Head {
    connect: bool,
    host: String,
    port: u16,
    /// What goes to the destination first: nothing for CONNECT, the rewritten request for
    /// plain HTTP; then whatever the client sent after its head.
    forward: Vec<u8>,
}

/// Read the request head, within [`HEAD_TIMEOUT`] in all; the bytes after it are returned
/// with it.
fn read_head(client: &mut TcpStream) -> Result<(Vec<u8>, Vec<u8>), &'static str> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let deadline = Instant::now() + HEAD_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || client.set_read_timeout(Some(left)).is_err() {
            return Err("no complete request head in time");
        }
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(i + 4);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err("the request head is too long");
        }
        match client.read(&mut chunk) {
            Ok(0) => return Err("the client closed the connection"),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Err("no complete request head in time"),
        }
    }
}

/// Split `host:port` (`[v6]:port`); `default` when there is no port.
fn split_authority(a: &str, default: Option<u16>) -> Option<(String, u16)> {
    if let Some(rest) = a.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => default?,
            None => return None,
        };
        return Some((format!("[{h}]"), port));
    }
    match a.rsplit_once(':') {
        Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
        None => Some((a.to_string(), default?)),
    }
}

fn parse_head(head: &[u8], rest: Vec<u8>) -> Result<Head, String> {
    let text = std::str::from_utf8(head).map_err(|_| "the request head is not text".to_string())?;
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("not an HTTP request line: {line:?}"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(format!("unsupported protocol {version:?}"));
    }
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(target, None)
            .ok_or_else(|| format!("CONNECT needs host:port, got {target:?}"))?;
        return Ok(Head {
            connect: true,
            host,
            port,
            forward: rest,
        });
    }
    let Some(after) = target.strip_prefix("http://") else {
        return Err(if target.starts_with("https://") {
            "an https:// URL must be fetched through CONNECT (the client does this when \
             HTTPS_PROXY is set)"
                .into()
        } else {
            format!("this is a forward proxy: ask for an absolute http:// URL, got {target:?}")
        });
    };
    let (authority, path) = match after.find('/') {
        Some(i) => (&after[..i], &after[i..]),
        None => (after, "/"),
    };
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let (host, port) = split_authority(authority, Some(80))
        .ok_or_else(|| format!("not a host and port: {authority:?}"))?;
    // The request as the destination expects it: origin-form, one request per connection,
    // without the headers meant for the proxy.
    let mut out = format!("{method} {path} {version}\r\n");
    for h in lines.filter(|l| !l.is_empty()) {
        let name = h.split(':').next().unwrap_or_default().trim();
        if [
            "proxy-connection",
            "proxy-authorization",
            "connection",
            "keep-alive",
        ]
        .iter()
        .any(|n| name.eq_ignore_ascii_case(n))
        {
            continue;
        }
        out.push_str(h);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    let mut forward = out.into_bytes();
    forward.extend_from_slice(&rest);
    Ok(Head {
        connect: false,
        host,
        port,
        forward,
    })
}

/// Where a connection may go: the addresses to try, or why not.
fn decide(permit: &Permit, dest: &Destination, port: u16) -> Result<Vec<SocketAddr>, String> {
    if !permit.allow.iter().any(|r| r.matches(dest, port)) {
        let list: Vec<String> = permit.allow.iter().map(|r| r.to_string()).collect();
        return Err(format!(
            "{}:{port} is not on this run's network allowlist ({})",
            dest,
            list.join(", ")
        ));
    }
    let literal = |ip: IpAddr| {
        permit.allow.iter().any(|r| r.names_literally(ip, port))
            && permit.policy.iter().any(|r| r.names_literally(ip, port))
    };
    let Some(own) = &permit.own else {
        // Fail closed: what cannot be told apart from the host's own addresses is refused.
        return match dest {
            Destination::Ip(ip) if literal(*ip) => Ok(vec![SocketAddr::new(*ip, port)]),
            _ => Err(
                "runcell cannot read this host's own addresses (/proc/net/fib_trie), so it \
                 reaches only addresses its operator names literally with their port"
                    .into(),
            ),
        };
    };
    match dest {
        Destination::Ip(ip) => {
            if let Some(why) = special(*ip, own) {
                let literal = literal(*ip);
                if !literal {
                    return Err(format!(
                        "{ip} is {why}: it is reachable only when the operator's policy names \
                         {ip} with its port literally"
                    ));
                }
            }
            Ok(vec![SocketAddr::new(*ip, port)])
        }
        Destination::Name(name) => {
            let addrs: Vec<SocketAddr> = (name.as_str(), port)
                .to_socket_addrs()
                .map_err(|e| format!("{name} does not resolve ({e})"))?
                .collect();
            let (fine, special_ones): (Vec<SocketAddr>, Vec<SocketAddr>) = addrs
                .into_iter()
                .partition(|a| special(a.ip(), own).is_none());
            if fine.is_empty() {
                return Err(match special_ones.first() {
                    Some(a) => format!(
                        "{name} resolves to {}, {}: a name never grants such an address",
                        a.ip(),
                        special(a.ip(), own).unwrap_or("special")
                    ),
                    None => format!("{name} has no address"),
                });
            }
            Ok(fine)
        }
    }
}

/// Refuse with a 403 (or another status) whose reason phrase says why.
fn refuse(client: &mut TcpStream, status: u16, why: &str) {
    let phrase: String = format!("runcell refused: {why}")
        .chars()
        .map(|c| {
            if c.is_ascii() && !c.is_ascii_control() {
                c
            } else {
                ' '
            }
        })
        .take(400)
        .collect();
    let body = format!("{phrase}\n");
    let res = format!(
        "HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client.write_all(res.as_bytes());
    let _ = client.shutdown(Shutdown::Both);
}

fn handle(mut client: TcpStream, shared: &Shared) {
    let started = Instant::now();
    let mut rec = Connection {
        host: String::new(),
        port: 0,
        allowed: false,
        address: None,
        reason: None,
        bytes_out: 0,
        bytes_in: 0,
        duration_seconds: 0.0,
    };
    let finish = |mut rec: Connection| {
        rec.duration_seconds = (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
        // What the run sent can be in a reason (a request line): kept short.
        if let Some(r) = rec.reason.as_mut() {
            if r.len() > MAX_REASON {
                let mut cut = MAX_REASON;
                while !r.is_char_boundary(cut) {
                    cut -= 1;
                }
                r.truncate(cut);
                r.push('…');
            }
        }
        let mut cut = rec.host.len().min(255);
        while !rec.host.is_char_boundary(cut) {
            cut -= 1;
        }
        rec.host.truncate(cut);
        shared.record(rec);
    };
    let head = match read_head(&mut client)
        .map_err(str::to_string)
        .and_then(|(h, rest)| parse_head(&h, rest))
    {
        Ok(h) => h,
        Err(why) => {
            refuse(&mut client, 400, &why);
            rec.reason = Some(why);
            return finish(rec);
        }
    };
    rec.host = head.host.clone();
    rec.port = head.port;
    let permit = &shared.permit;
    let Some(dest) = Destination::parse(&head.host) else {
        let why = format!("{:?} is not a host name or address", head.host);
        refuse(&mut client, 400, &why);
        rec.reason = Some(why);
        return finish(rec);
    };
    rec.host = dest.to_string();
    let addrs = match decide(permit, &dest, head.port) {
        Ok(a) => a,
        Err(why) => {
            refuse(&mut client, 403, &why);
            rec.reason = Some(why);
            return finish(rec);
        }
    };
    rec.allowed = true;
    let mut last_err = String::new();
    let mut upstream = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, permit.connect_timeout) {
            Ok(s) => {
                rec.address = Some(a.ip().to_string());
                upstream = Some(s);
                break;
            }
            Err(e) => last_err = format!("{a}: {e}"),
        }
    }
    let Some(mut upstream) = upstream else {
        let why = format!("could not connect to {}:{} ({last_err})", dest, head.port);
        refuse(&mut client, 502, &why);
        rec.reason = Some(why);
        return finish(rec);
    };
    shared.track(&upstream);
    let _ = client.set_read_timeout(None);
    let opened = if head.connect {
        client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .and_then(|()| upstream.write_all(&head.forward))
    } else {
        upstream.write_all(&head.forward)
    };
    if opened.is_err() {
        rec.reason = Some("the connection closed while opening".into());
        return finish(rec);
    }
    let first_out = head.forward.len() as u64;
    rec.bytes_out = first_out;
    let cut = Arc::new(AtomicBool::new(false));
    shared.bytes.fetch_add(first_out, Ordering::AcqRel);
    // Sandbox to destination on a thread of its own; back on this one.
    let (Ok(c2), Ok(u2)) = (client.try_clone(), upstream.try_clone()) else {
        return finish(rec);
    };
    let cut2 = cut.clone();
    let out = std::thread::scope(|scope| {
        let out = scope.spawn(|| copy(c2, u2, shared, &cut2));
        let back = copy(upstream, client, shared, &cut);
        (out.join().unwrap_or(0), back)
    });
    rec.bytes_out += out.0;
    rec.bytes_in = out.1;
    if cut.load(Ordering::Acquire) {
        rec.reason = Some(format!(
            "cut: this run has used its {} bytes of network traffic",
            permit.max_bytes
        ));
    }
    finish(rec)
}

/// Copy `from` to `to` until either ends or the run's byte budget is spent; the bytes copied.
fn copy(mut from: TcpStream, mut to: TcpStream, shared: &Shared, cut: &AtomicBool) -> u64 {
    let mut buf = vec![0u8; 32 << 10];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let used = shared.bytes.fetch_add(n as u64, Ordering::AcqRel) + n as u64;
        if used > shared.permit.max_bytes {
            cut.store(true, Ordering::Release);
            break;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        total += n as u64;
    }
    // Half-close the way this copy served, so that the other direction sees the end too; a
    // cut ends both.
    if cut.load(Ordering::Acquire) {
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    } else {
        let _ = to.shutdown(Shutdown::Write);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::parse_rules;

    fn permit(allow: &[&str], policy: &[&str]) -> Permit {
        Permit {
            allow: parse_rules(allow).unwrap(),
            policy: parse_rules(policy).unwrap(),
            max_connections: 4,
            max_bytes: 1 << 20,
            connect_timeout: Duration::from_secs(5),
            own: Some(OwnAddresses::default()),
        }
    }

    #[test]
    fn heads_are_parsed_and_plain_requests_rewritten() {
        let h = parse_head(
            b"CONNECT api.github.com:443 HTTP/1.1\r\nHost: x\r\n\r\n",
            vec![],
        )
        .unwrap();
        assert!(h.connect);
        assert_eq!((h.host.as_str(), h.port), ("api.github.com", 443));
        let h = parse_head(
            b"GET http://127.0.0.2:8080/a?b=1 HTTP/1.1\r\nHost: 127.0.0.2:8080\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n",
            b"body".to_vec(),
        )
        .unwrap();
        assert!(!h.connect);
        assert_eq!((h.host.as_str(), h.port), ("127.0.0.2", 8080));
        assert_eq!(
            String::from_utf8(h.forward).unwrap(),
            "GET /a?b=1 HTTP/1.1\r\nHost: 127.0.0.2:8080\r\nAccept: */*\r\nConnection: close\r\n\r\nbody"
        );
        let h = parse_head(b"GET http://[::1]/ HTTP/1.0\r\n\r\n", vec![]).unwrap();
        assert_eq!((h.host.as_str(), h.port), ("[::1]", 80));
        for bad in [
            &b"GET /relative HTTP/1.1\r\n\r\n"[..],
            b"GET https://x.com/ HTTP/1.1\r\n\r\n",
            b"CONNECT x.com HTTP/1.1\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\n",
            b"garbage\r\n\r\n",
        ] {
            assert!(
                parse_head(bad, vec![]).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn decisions_name_what_was_refused_and_why() {
        let p = permit(
            &["example.com:443", "127.0.0.2:8080", "localhost:8080"],
            &["example.com:443", "127.0.0.2:8080", "localhost:8080"],
        );
        let d = |s: &str| Destination::parse(s).unwrap();
        let e = decide(&p, &d("other.com"), 443).unwrap_err();
        assert!(
            e.contains("other.com:443 is not on this run's network allowlist"),
            "{e}"
        );
        assert!(e.contains("example.com:443"), "{e}");
        assert_eq!(
            decide(&p, &d("127.0.0.2"), 8080).unwrap(),
            vec!["127.0.0.2:8080".parse().unwrap()]
        );
        let e = decide(&p, &d("localhost"), 8080).unwrap_err();
        assert!(e.contains("a name never grants"), "{e}");
        // Literal in the run's list but not in the operator's: refused.
        let p = permit(&["169.254.169.254:80"], &["*.example.com"]);
        let e = decide(&p, &d("169.254.169.254"), 80).unwrap_err();
        assert!(e.contains("cloud metadata"), "{e}");
    }

    fn local_echo_server() -> (u16, JoinHandle<Vec<u8>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let h = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut got = vec![0u8; 5];
            s.read_exact(&mut got).unwrap();
            s.write_all(b"world").unwrap();
            got
        });
        (port, h)
    }

    #[test]
    fn a_tunnel_to_an_allowed_literal_address_counts_bytes_and_others_are_refused() {
        let (port, server) = local_echo_server();
        let entry = format!("127.0.0.1:{port}");
        let mut p = permit(&[&entry], &[&entry]);
        p.max_connections = 2;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy_addr = listener.local_addr().unwrap();
        let handle = start(listener, p).unwrap();

        let mut c = TcpStream::connect(proxy_addr).unwrap();
        write!(c, "CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").unwrap();
        let mut ok = [0u8; 39];
        c.read_exact(&mut ok).unwrap();
        assert_eq!(&ok[..], b"HTTP/1.1 200 Connection established\r\n\r\n");
        c.write_all(b"hello").unwrap();
        let mut back = [0u8; 5];
        c.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"world");
        drop(c);
        assert_eq!(server.join().unwrap(), b"hello");

        let mut c = TcpStream::connect(proxy_addr).unwrap();
        c.write_all(b"CONNECT example.com:443 HTTP/1.1\r\n\r\n")
            .unwrap();
        let mut res = String::new();
        c.read_to_string(&mut res).unwrap();
        assert!(
            res.starts_with("HTTP/1.1 403 runcell refused: example.com:443 is not on"),
            "{res}"
        );

        // The third connection is over the cap of two.
        let mut c = TcpStream::connect(proxy_addr).unwrap();
        write!(c, "CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").unwrap();
        let mut res = String::new();
        c.read_to_string(&mut res).unwrap();
        assert!(res.contains("used its 2 connections"), "{res}");

        let records = handle.finish();
        assert_eq!(records.len(), 3, "{records:?}");
        let tunnel = records.iter().find(|r| r.allowed).unwrap();
        assert_eq!((tunnel.bytes_out, tunnel.bytes_in), (5, 5));
        assert_eq!(tunnel.address.as_deref(), Some("127.0.0.1"));
        assert!(records
            .iter()
            .filter(|r| !r.allowed)
            .all(|r| r.reason.is_some()));
    }

    #[test]
    fn the_byte_budget_cuts_a_connection() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let chunk = vec![7u8; 64 << 10];
            while s.write_all(&chunk).is_ok() {}
        });
        let entry = format!("127.0.0.1:{port}");
        let mut p = permit(&[&entry], &[&entry]);
        p.max_bytes = 200 << 10;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy_addr = listener.local_addr().unwrap();
        let handle = start(listener, p).unwrap();
        let mut c = TcpStream::connect(proxy_addr).unwrap();
        write!(c, "CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").unwrap();
        let mut got = Vec::new();
        let _ = c.read_to_end(&mut got);
        assert!(got.len() < (300 << 10), "{} bytes came through", got.len());
        let records = handle.finish();
        assert!(
            records[0].reason.as_deref().unwrap().contains("cut"),
            "{records:?}"
        );
    }

    /// Connections past the cap cost the supervisor no thread and no record each: a run
    /// cannot turn a flood of connections into the supervisor's threads, descriptors or
    /// memory (found by our red team: the server aborted at 20,000 descriptors).
    #[test]
    fn a_flood_of_connections_past_the_cap_costs_no_thread_and_one_record() {
        let mut p = permit(&["127.0.0.1:9"], &["127.0.0.1:9"]);
        p.max_connections = 2;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = start(listener, p).unwrap();
        let mut answers = 0;
        for _ in 0..200 {
            let mut c = TcpStream::connect(addr).unwrap();
            let _ = c.write_all(b"CONNECT 127.0.0.1:9 HTTP/1.1\r\n\r\n");
            let mut res = String::new();
            let _ = c.read_to_string(&mut res);
            if res.contains("used its 2 connections") {
                answers += 1;
            }
        }
        assert!(answers >= 190, "{answers} over-cap answers");
        let handlers = handle.shared.handlers.lock().unwrap().len();
        assert!(
            handlers <= 2,
            "{handlers} handler threads for 2 allowed connections"
        );
        let records = handle.finish();
        assert!(records.len() <= 3, "{} records", records.len());
        let summary = records.iter().find(|r| r.host == "*").unwrap();
        assert!(summary
            .reason
            .as_deref()
            .unwrap()
            .contains("more connection(s) refused"));
    }

    #[test]
    fn reasons_and_hosts_from_the_run_are_kept_short() {
        let p = permit(&["example.com:443"], &["example.com:443"]);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = start(listener, p).unwrap();
        let mut c = TcpStream::connect(addr).unwrap();
        let long = "a".repeat(10_000);
        write!(c, "GET /{long} HTTP/1.1\r\n\r\n").unwrap();
        let mut res = String::new();
        let _ = c.read_to_string(&mut res);
        let records = handle.finish();
        assert!(
            records[0].reason.as_ref().unwrap().len() <= 310,
            "{:?}",
            records[0]
        );
    }
}
