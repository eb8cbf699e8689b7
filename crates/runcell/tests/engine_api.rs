//! The library API the HTTP and MCP servers build on: a sandbox is created, handed several
//! programs, and torn down; live output reaches a sink; a kill switch stops a run from another
//! thread.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use runcell_core::error::chain;
use runcell_core::{Engine, EngineConfig, ExecRequest};
use runcell_jail::{
    CgroupLimits, End, ExitStatus, InputFile, KillSwitch, NoSink, OutputSink, Program, Rlimits,
    Sandbox, SandboxSpec, Stream,
};

fn spec() -> SandboxSpec {
    let rt =
        runcell_runtimes::locate(runcell_runtimes::Language::Bash, &Default::default()).unwrap();
    SandboxSpec {
        hostname: "runcell".into(),
        root: rt.root_entries(),
        scratch_bytes: 16 << 20,
        scratch_inodes: 4096,
        cgroup: CgroupLimits {
            memory_bytes: Some(128 << 20),
            pids_max: Some(32),
            cpu_millis: Some(1000),
            io: None,
        },
        setup_timeout: Duration::from_secs(20),
        helper_exe: common::runcell_bin(),
        overlays: Vec::new(),
        all_runs_memory_bytes: None,
        proxy_port: None,
        templated: false,
    }
}

fn bash(script: &str, timeout: Duration) -> Program {
    Program {
        argv: vec!["/bin/bash".into(), "-c".into(), script.into()],
        env: runcell_runtimes::base_env(),
        cwd: PathBuf::from("/workspace"),
        files: vec![],
        stdin: None,
        rlimits: Rlimits {
            cpu_seconds: 60,
            open_files: 256,
            processes: 33,
            file_size_bytes: 16 << 20,
            address_space_bytes: None,
        },
        wall_timeout: timeout,
        stdout_cap: 1 << 20,
        stderr_cap: 1 << 20,
    }
}

#[test]
fn one_sandbox_runs_several_programs_and_keeps_its_files() {
    let mut sb = Sandbox::create(&spec()).unwrap();
    let mut first = bash(
        "cat /workspace/in.txt; echo state > /tmp/kept",
        Duration::from_secs(10),
    );
    first.files.push(InputFile {
        path: "/workspace/in.txt".into(),
        mode: 0o644,
        content: b"hello\n".to_vec(),
    });
    let o = sb.run(&first, &mut NoSink, None).unwrap();
    assert_eq!(o.end, End::Exited(ExitStatus::Code(0)));
    assert_eq!(o.stdout, b"hello\n");
    // A second program in the same sandbox sees what the first left on disk, but not its
    // processes: a background sleeper of the first run is gone.
    let o = sb
        .run(
            &bash(
                "cat /tmp/kept; set -- /proc/[0-9]*; echo $#",
                Duration::from_secs(10),
            ),
            &mut NoSink,
            None,
        )
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "state\n2\n",
        "only pid 1 and the new program may exist"
    );
    sb.destroy().unwrap();
}

#[test]
fn background_processes_die_with_each_program() {
    let mut sb = Sandbox::create(&spec()).unwrap();
    let o = sb
        .run(
            &bash(
                "(setsid sleep 1000 &) ; sleep 1000 & echo started",
                Duration::from_secs(10),
            ),
            &mut NoSink,
            None,
        )
        .unwrap();
    assert_eq!(o.end, End::Exited(ExitStatus::Code(0)));
    let o = sb
        .run(
            &bash("set -- /proc/[0-9]*; echo $#", Duration::from_secs(10)),
            &mut NoSink,
            None,
        )
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "2\n");
}

#[derive(Default)]
struct Recorder(Vec<(Stream, Vec<u8>, Instant)>);
impl OutputSink for Recorder {
    fn output(&mut self, stream: Stream, chunk: &[u8]) {
        self.0.push((stream, chunk.to_vec(), Instant::now()));
    }
}

#[test]
fn output_is_streamed_while_the_program_runs() {
    let mut sb = Sandbox::create(&spec()).unwrap();
    let mut rec = Recorder::default();
    let t0 = Instant::now();
    let o = sb
        .run(
            &bash(
                "echo one; echo err >&2; sleep 0.5; echo two",
                Duration::from_secs(10),
            ),
            &mut rec,
            None,
        )
        .unwrap();
    assert_eq!(o.stdout, b"one\ntwo\n");
    assert_eq!(o.stderr, b"err\n");
    let first = rec
        .0
        .iter()
        .find(|(s, c, _)| *s == Stream::Stdout && c.starts_with(b"one"))
        .unwrap();
    // "one" arrived before the program slept, i.e. well before it ended.
    assert!(
        first.2.duration_since(t0) < o.wall,
        "chunk at {:?}, run took {:?}",
        first.2.duration_since(t0),
        o.wall
    );
    assert!(rec
        .0
        .iter()
        .any(|(s, c, _)| *s == Stream::Stderr && c == b"err\n"));
}

/// Tells another thread when the program has printed `started`.
struct StartedSignal(Option<std::sync::mpsc::Sender<()>>);
impl OutputSink for StartedSignal {
    fn output(&mut self, stream: Stream, chunk: &[u8]) {
        if stream == Stream::Stdout && chunk.starts_with(b"started") {
            if let Some(tx) = self.0.take() {
                let _ = tx.send(());
            }
        }
    }
}

#[test]
fn a_kill_switch_stops_a_run_from_another_thread() {
    const TIMEOUT: Duration = Duration::from_secs(30);
    let mut sb = Sandbox::create(&spec()).unwrap();
    let ks = KillSwitch::new().unwrap();
    let trigger = ks.clone();
    let (tx, started_rx) = std::sync::mpsc::channel();
    // Fire once the program runs (it said so), from another thread; note when.
    let t = std::thread::spawn(move || {
        started_rx.recv().expect("the program started");
        trigger.trigger();
        Instant::now()
    });
    let o = sb
        .run(
            &bash("trap '' TERM; echo started; while :; do :; done", TIMEOUT),
            &mut StartedSignal(Some(tx)),
            Some(&ks),
        )
        .unwrap();
    let ended = Instant::now();
    let triggered = t.join().unwrap();
    assert_eq!(o.end, End::Cancelled);
    // Stopped by the switch, long before the timeout.
    assert!(
        ended - triggered < common::LOADED_MARGIN,
        "{:?} after the trigger",
        ended - triggered
    );
    // The sandbox is dead afterwards.
    assert!(sb
        .run(&bash("true", Duration::from_secs(5)), &mut NoSink, None)
        .is_err());
}

#[test]
fn the_engine_reports_enforcement_and_limits() {
    let mut c = EngineConfig::for_host();
    c.helper_exe = common::runcell_bin();
    let engine = Engine::new(c);
    let v = engine.execute(
        &ExecRequest::new("bash", "echo $((6*7))"),
        &mut NoSink,
        None,
    );
    assert_eq!(v.stdout, "42\n");
    assert_eq!(v.exit_code, Some(0));
    assert_eq!(v.limits.unwrap().pids.0, 64);
    assert!(
        v.enforcement.missing.is_empty(),
        "{:?}",
        v.enforcement.missing
    );
}

#[test]
fn files_are_never_written_through_symlinks_a_previous_program_planted() {
    let mut sb = Sandbox::create(&spec()).unwrap();
    let plant = bash(
        "ln -s /etc /workspace/dir && ln -s /tmp/target /workspace/file && echo ok",
        Duration::from_secs(10),
    );
    assert_eq!(sb.run(&plant, &mut NoSink, None).unwrap().stdout, b"ok\n");
    // A symlinked final component is replaced by the file, never written through.
    let mut p = bash("test -f /workspace/file && test ! -L /workspace/file && test ! -e /tmp/target && cat /workspace/file", Duration::from_secs(10));
    p.files.push(InputFile {
        path: "/workspace/file".into(),
        mode: 0o644,
        content: b"x".to_vec(),
    });
    assert_eq!(sb.run(&p, &mut NoSink, None).unwrap().stdout, b"x");
    // A symlinked directory on the way is refused.
    let mut p = bash("true", Duration::from_secs(10));
    p.files.push(InputFile {
        path: "/workspace/dir/passwd2".into(),
        mode: 0o644,
        content: b"x".to_vec(),
    });
    let err = sb.run(&p, &mut NoSink, None).unwrap_err();
    assert_eq!(
        err.os_error().and_then(|e| e.name),
        Some("ELOOP"),
        "{err:?}"
    );
    let err = chain(&err);
    assert!(
        err.contains("symbolic links") || err.contains("Too many levels"),
        "{err}"
    );
    let mut sb = Sandbox::create(&spec()).unwrap();
    let check = bash(
        "test ! -e /etc/passwd2 && echo clean",
        Duration::from_secs(10),
    );
    assert_eq!(
        sb.run(&check, &mut NoSink, None).unwrap().stdout,
        b"clean\n"
    );
}

#[test]
fn a_fifo_or_directory_at_an_input_path_never_hangs_pid_1() {
    let mut sb = Sandbox::create(&spec()).unwrap();
    let plant = bash(
        "mkfifo /workspace/f && mkdir /workspace/d && echo ok",
        Duration::from_secs(10),
    );
    assert_eq!(sb.run(&plant, &mut NoSink, None).unwrap().stdout, b"ok\n");
    // A fifo is replaced by the file.
    const TIMEOUT: Duration = Duration::from_secs(10);
    let mut p = bash("cat /workspace/f", TIMEOUT);
    p.files.push(InputFile {
        path: "/workspace/f".into(),
        mode: 0o644,
        content: b"data".to_vec(),
    });
    let started = Instant::now();
    let o = sb.run(&p, &mut NoSink, None).unwrap();
    assert_eq!(o.stdout, b"data");
    // Not stuck on the fifo until the program's timeout.
    assert!(started.elapsed() < TIMEOUT, "{:?}", started.elapsed());
    // A directory is refused, as an error of the request.
    let mut p = bash("true", Duration::from_secs(10));
    p.files.push(InputFile {
        path: "/workspace/d".into(),
        mode: 0o644,
        content: b"x".to_vec(),
    });
    let err = chain(&sb.run(&p, &mut NoSink, None).unwrap_err());
    assert!(err.contains("directory is in the way"), "{err}");
}

#[test]
fn killing_the_helper_kills_the_whole_sandbox() {
    // Regression: the parent-death signal that ties pid 1 to the helper is cleared by the
    // kernel when pid 1 changes credentials; it must be armed again after that.
    let sb = Sandbox::create(&spec()).unwrap();
    let helper = sb.helper_pid();
    let pid1 = std::fs::read_to_string(format!("/proc/{helper}/task/{helper}/children"))
        .unwrap()
        .trim()
        .parse::<i32>()
        .unwrap();
    assert!(std::path::Path::new(&format!("/proc/{pid1}")).exists());
    std::process::Command::new("kill")
        .args(["-9", &helper.to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + common::LOADED_MARGIN;
    while std::fs::read_to_string(format!("/proc/{pid1}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
        assert!(
            Instant::now() < deadline,
            "pid 1 ({pid1}) survived its helper"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(sb);
}

/// Network by permission, the jail's part: pid 1 listens on the sandbox's loopback and hands
/// the listening socket to the supervisor, which accepts the program's connections from
/// outside the sandbox's network namespace. The host's loopback never sees that port.
#[test]
fn the_proxy_listener_is_in_the_sandbox_and_served_from_outside() {
    let mut s = spec();
    s.proxy_port = Some(3128);
    let mut sb = Sandbox::create(&s).unwrap();
    let listener = sb
        .take_proxy_listener()
        .expect("the listener came with Ready");
    assert_eq!(
        listener.local_addr().unwrap(),
        "127.0.0.1:3128".parse().unwrap()
    );
    assert!(sb.take_proxy_listener().is_none(), "handed over once");
    let server = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut c, _) = listener.accept().unwrap();
        let mut got = [0u8; 4];
        c.read_exact(&mut got).unwrap();
        c.write_all(b"pong").unwrap();
        got
    });
    let o = sb
        .run(
            &bash(
                "exec 3<>/dev/tcp/127.0.0.1/3128; printf ping >&3; head -c 4 <&3",
                Duration::from_secs(10),
            ),
            &mut NoSink,
            None,
        )
        .unwrap();
    assert_eq!(o.end, End::Exited(ExitStatus::Code(0)), "{o:?}");
    assert_eq!(o.stdout, b"pong");
    assert_eq!(&server.join().unwrap(), b"ping");
    // Nothing listens on the host's loopback at that port because of the sandbox.
    let host = std::net::TcpStream::connect_timeout(
        &"127.0.0.1:3128".parse().unwrap(),
        Duration::from_millis(300),
    );
    assert!(host.is_err(), "the host's 127.0.0.1:3128 answered");
}

/// Whether any process on the host still has `/workspace/NAME` under its root: the
/// sandbox that wrote it is not torn down yet.
fn a_sandbox_still_has(name: &str) -> bool {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .any(|e| e.path().join("root/workspace").join(name).exists())
}

/// Regression (issue 24, the cold path): a server's one-shot run gave its admission slot
/// and its memory on the ledger back with the verdict, while the pool's teardown thread
/// still held its sandbox, so the next run was admitted beside a sandbox that still held
/// its memory and cgroup. What the run holds must go only once its sandbox is gone.
#[test]
fn a_one_shot_run_holds_its_slot_until_its_sandbox_is_torn_down() {
    struct Probe {
        name: String,
        seen: std::sync::mpsc::Sender<bool>,
    }
    impl Drop for Probe {
        fn drop(&mut self) {
            let _ = self.seen.send(a_sandbox_still_has(&self.name));
        }
    }
    let mut c = EngineConfig::for_host();
    c.helper_exe = common::runcell_bin();
    let mut e = Engine::new(c);
    // A server's pool, and with it its teardown thread; the request sets a variable, so it
    // runs in a fresh sandbox (not a warm one), which the teardown thread takes after it.
    e.start_pool(
        &runcell_core::PoolSizes([(runcell_core::Language::Python, 1)].into()),
        &runcell_core::Preload::default(),
    );
    let name = format!("probe-{}-{}", std::process::id(), rand_suffix());
    let mut r = ExecRequest::new(
        "python",
        format!("open({name:?}, 'w').close(); print(1, flush=True)"),
    );
    r.env.insert("PROBE".into(), "1".into());
    let v = e.validate(&r).expect("valid");
    // The probe itself is checked: while the run is live, the file is seen.
    struct Live {
        name: String,
        seen: Option<bool>,
    }
    impl runcell_jail::OutputSink for Live {
        fn output(&mut self, _: runcell_jail::Stream, _: &[u8]) {
            if self.seen.is_none() {
                self.seen = Some(a_sandbox_still_has(&self.name));
            }
        }
    }
    let mut live = Live {
        name: name.clone(),
        seen: None,
    };
    let (seen, rx) = std::sync::mpsc::channel();
    let verdict = e.execute_valid_holding(
        &v,
        &mut live,
        None,
        Box::new(Probe {
            name: name.clone(),
            seen,
        }),
    );
    assert_eq!(verdict.exit_code, Some(0), "{verdict:?}");
    assert_eq!(
        live.seen,
        Some(true),
        "the probe sees a live sandbox's file"
    );
    let still_there = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("what the run held was dropped");
    assert!(
        !still_there,
        "the run's slot was given back while its sandbox was still up"
    );
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}
