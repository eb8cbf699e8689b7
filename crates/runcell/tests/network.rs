//! Network isolation: the sandbox has its own network namespace with only `lo`. Host
//! services on loopback (TCP, UDP, abstract unix sockets) are unreachable, the outside world
//! is unreachable, and loopback inside the sandbox works.

mod common;
use common::*;

use std::io::ErrorKind;
use std::net::{TcpListener, UdpSocket};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::time::Duration;

/// The host listener must never have seen a connection.
fn assert_no_connection(l: &TcpListener) {
    l.set_nonblocking(true).unwrap();
    match l.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the host listener saw a connection from the sandbox: {other:?}"),
    }
}

#[test]
fn host_loopback_tcp_port_is_unreachable() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let l6 = TcpListener::bind("[::1]:0").ok();
    let port6 = l6
        .as_ref()
        .map(|l| l.local_addr().unwrap().port())
        .unwrap_or(1);
    let r = run(
        "python",
        &py(&format!(
            r#"
attempt("v4", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=3))
attempt("v4_localhost", lambda: socket.create_connection(("localhost", {port}), timeout=3))
attempt("v6", lambda: socket.create_connection(("::1", {port6}), timeout=3))
"#
        )),
        &[],
    );
    r.assert_ok();
    r.expect(&[
        ("v4", "ECONNREFUSED"),
        ("v4_localhost", "ECONNREFUSED"),
        ("v6", "ECONNREFUSED"),
    ]);
    assert_no_connection(&l);
    if let Some(l6) = &l6 {
        assert_no_connection(l6);
    }
}

#[test]
fn host_loopback_udp_port_receives_nothing() {
    let u = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = u.local_addr().unwrap().port();
    let r = run(
        "python",
        &py(&format!(
            r#"
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(5):
    attempt("send%d" % i, lambda: s.sendto(b"from-the-sandbox", ("127.0.0.1", {port})))
"#
        )),
        &[],
    );
    r.assert_ok();
    // The first datagram goes to the sandbox's own empty loopback; later sends may report
    // the ICMP port-unreachable as ECONNREFUSED. Either way nothing reaches the host.
    for i in 0..5 {
        let o = r.out(&format!("send{i}"));
        assert!(matches!(o.as_str(), "OK" | "ECONNREFUSED"), "send{i}: {o}");
    }
    u.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = [0u8; 64];
    match u.recv_from(&mut buf) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("the host UDP socket received from the sandbox: {other:?}"),
    }
}

#[test]
fn host_abstract_unix_socket_is_unreachable() {
    let name = format!("runcell-test-{}", unique_digits());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let l = UnixListener::bind_addr(&addr).unwrap();
    let r = run(
        "python",
        &py(&format!(
            r#"
u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
attempt("abstract", lambda: u.connect("\0{name}"))
print("in_proc_net_unix=" + str("@{name}" in open("/proc/net/unix").read()))
"#
        )),
        &[],
    );
    r.assert_ok();
    r.expect(&[("abstract", "ECONNREFUSED"), ("in_proc_net_unix", "False")]);
    l.set_nonblocking(true).unwrap();
    match l.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the host unix listener saw a connection: {other:?}"),
    }
}

#[test]
fn only_the_loopback_interface_exists_and_it_is_up() {
    let r = run(
        "python",
        r#"
import socket, json
names = [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]]
print("ifaces=" + json.dumps(names))
print("if_nameindex=" + json.dumps([n for _, n in socket.if_nameindex()]))
print("routes=%d" % (len(open("/proc/net/route").read().splitlines()) - 1))
import fcntl, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0)))[1]
print("lo_up=" + str(bool(flags & 1)))
"#,
        &[],
    );
    r.assert_ok();
    r.expect(&[
        ("ifaces", r#"["lo"]"#),
        ("if_nameindex", r#"["lo"]"#),
        ("routes", "0"),
        ("lo_up", "True"),
    ]);
}

#[test]
fn the_outside_world_and_dns_are_unreachable() {
    let r = run(
        "python",
        &py(r#"
def dns(name):
    try:
        socket.getaddrinfo(name, 80)
        return "RESOLVED"
    except socket.gaierror as e:
        return "GAIERROR"
print("dns_example=" + dns("example.com"))
print("dns_google=" + dns("google.com"))
attempt("tcp_1111", lambda: socket.create_connection(("1.1.1.1", 443), timeout=3))
attempt("tcp_8888_dns", lambda: socket.create_connection(("8.8.8.8", 53), timeout=3))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
attempt("udp_dns", lambda: u.sendto(b"\x00" * 12, ("8.8.8.8", 53)))
attempt("tcp_v6", lambda: socket.create_connection(("2606:4700:4700::1111", 443), timeout=3))
read("resolv_conf", "/etc/resolv.conf")
"#),
        &["--timeout", "20"],
    );
    r.assert_ok();
    r.expect(&[
        ("dns_example", "GAIERROR"),
        ("dns_google", "GAIERROR"),
        ("tcp_1111", "ENETUNREACH"),
        ("tcp_8888_dns", "ENETUNREACH"),
        ("udp_dns", "ENETUNREACH"),
        ("tcp_v6", "ENETUNREACH"),
        ("resolv_conf", "ENOENT"),
    ]);
    // Fails fast (no route), it does not hang on timeouts.
    assert!(
        r.execution_time() < LOADED_MARGIN.as_secs_f64(),
        "{:#}",
        r.verdict
    );
}

#[test]
fn loopback_inside_the_sandbox_works() {
    let r = run(
        "python",
        r#"
import socket, threading
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
port = srv.getsockname()[1]
def serve():
    c, _ = srv.accept()
    c.sendall(c.recv(100).upper())
    c.close()
t = threading.Thread(target=serve)
t.start()
c = socket.create_connection(("127.0.0.1", port), timeout=5)
c.sendall(b"ping")
print("reply=" + c.recv(100).decode())
t.join()
a, b = socket.socketpair()
a.sendall(b"pair")
print("socketpair=" + b.recv(10).decode())
u = socket.socket(socket.AF_UNIX)
u.bind("/tmp/sock")
u.listen()
v = socket.socket(socket.AF_UNIX)
v.connect("/tmp/sock")
print("unix_path=ok")
"#,
        &[],
    );
    r.assert_ok();
    r.expect(&[
        ("reply", "PING"),
        ("socketpair", "pair"),
        ("unix_path", "ok"),
    ]);
}

#[test]
fn a_server_in_the_sandbox_is_not_reachable_from_the_host() {
    let tag = unique_digits();
    // The port is chosen by the test, so the host can try it while the sandbox listens.
    let probe = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = probe.local_addr().unwrap().port();
    drop(probe);
    let p = spawn(
        "python",
        &format!(
            r#"
import socket, os, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {port}))
s.listen()
s.settimeout(1.5)
print("listening", flush=True)
if os.fork() == 0:
    os.execvp("sleep", ["sleep", "1.{tag}"])
try:
    s.accept()
    print("accepted=yes")
except socket.timeout:
    print("accepted=no")
"#
        ),
        &[],
    );
    assert!(
        wait_for_marker(&tag, START_WITHIN),
        "the sandbox never started listening"
    );
    let host_connect = std::net::TcpStream::connect_timeout(
        &format!("127.0.0.1:{port}").parse().unwrap(),
        Duration::from_millis(500),
    );
    let r = p.finish();
    r.assert_ok();
    r.expect(&[("accepted", "no")]);
    assert!(
        host_connect.is_err(),
        "the host reached a server inside the sandbox"
    );
    assert_marker_gone(&tag, LOADED_MARGIN);
}
