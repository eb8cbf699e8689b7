//! The runcell binary: `runcell run`, `runcell doctor`, and (hidden) the sandbox helper.
#![forbid(unsafe_code)]

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

mod agent;
mod reference;
mod repl;
mod settings;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use runcell_core::limits::{Limit, LimitPolicy};
use runcell_core::units::format_size;
use runcell_core::verdict::ErrorCategory;
use runcell_core::{
    Engine, EngineConfig, ExecRequest, InputFile, Language, NoSink, OutputSink, Stream, Verdict,
};

/// Run untrusted code in a sandbox and get a structured verdict.
#[derive(Parser)]
#[command(name = "runcell", version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("RUNCELL_COMMIT"), ")"), about, long_about = None)]
struct Cli {
    /// Where prepared runtimes live (default: /var/lib/runcell as root, else
    /// ~/.local/share/runcell).
    #[arg(long, global = true, env = "RUNCELL_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// The TOML settings file (settings: the defaults, then this file, then the environment,
    /// then the flags; see docs/serve.md). Read by every command.
    #[arg(long, global = true, env = "RUNCELL_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a program in a fresh sandbox.
    Run(Box<RunArgs>),
    /// Prepare runtimes ahead of time: the Python data stack and Go's standard-library build
    /// cache. Idempotent.
    Setup,
    /// Check which isolation layers and runtimes this host provides.
    Doctor {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// An interactive session in the terminal: state is kept between inputs, Ctrl-C
    /// interrupts the running input, Ctrl-D ends the session.
    Repl(ReplArgs),
    /// Ask a model a question it answers by writing and running code (the agent loop): each
    /// step is shown as it happens, then the answer. The model API comes from
    /// RUNCELL_AGENT_UPSTREAM, RUNCELL_AGENT_BASE_URL, RUNCELL_AGENT_API_KEY and
    /// RUNCELL_AGENT_MODEL (or the flags).
    Agent(Box<AgentArgs>),
    /// Serve the HTTP API (and MCP at /mcp) until SIGTERM or SIGINT.
    ///
    /// Endpoints: POST /v1/execute (JSON, or server-sent events with
    /// `Accept: text/event-stream`), GET /v1/runtimes, GET /metrics (Prometheus), GET /healthz
    /// and GET /openapi.json (no key needed).
    ///
    /// Every setting comes from its default, then the TOML file given with --config
    /// (RUNCELL_CONFIG), then its environment variable, then its flag: each over the one
    /// before (NAME=VALUE lists such as the limits entry by entry). The file uses the same
    /// names in snake_case (listen, max_concurrent, max_queue, max_body, shutdown_grace,
    /// strict, audit_log), API keys as [[api_keys]] tables with `id` and `key` (the file must
    /// then be chmod 600), limits under [limits.default] and [limits.max], caps under [caps].
    /// An invalid setting is refused naming it and where its value came from. The same
    /// settings apply to `runcell mcp`, `tools`, `run`, `repl` and `agent`. See docs/serve.md.
    #[command(verbatim_doc_comment)]
    Serve(Box<ServeArgs>),
    /// Serve MCP (Model Context Protocol) on stdin/stdout, for Claude Desktop, Cursor and
    /// other MCP clients: one code_exec_<language> tool per installed runtime. Logs go to
    /// stderr.
    Mcp(McpArgs),
    /// Print the tool definitions for agents that call POST /v1/execute themselves.
    Tools(ToolsArgs),
    /// Print a completion script for SHELL (bash, zsh, fish, elvish, powershell), e.g.
    /// `runcell completion bash > /etc/bash_completion.d/runcell`.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the generated reference under docs/reference/ (scripts/gen-reference.sh).
    #[command(name = "__reference", hide = true)]
    Reference {
        #[arg(value_enum)]
        what: reference::Reference,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// Address to listen on: ADDR:PORT, HOST:PORT (localhost:8080) or :PORT (loopback)
    /// [default: 127.0.0.1:8080]. Without an API key only a loopback address is allowed.
    #[arg(long, value_name = "ADDR", value_parser = settings::parse_listen)]
    listen: Option<std::net::SocketAddr>,
    /// Also serve kubernetes-sigs/agent-sandbox's runtime contract (`GET /`, `POST /execute`,
    /// `/upload`, `/download/`, `/list/`, `/exists/`) on this address, e.g. 0.0.0.0:8888:
    /// one session for the whole pod, WITHOUT authentication (the contract has none; only the
    /// sandbox router may reach it) [default: off]. See docs/agent-sandbox.md.
    #[arg(long, value_name = "ADDR", value_parser = settings::parse_listen)]
    agent_sandbox_listen: Option<std::net::SocketAddr>,
    /// An API key clients must send (`Authorization: Bearer KEY` or `X-API-Key: KEY`), at
    /// least 16 characters. Repeatable; the environment variable takes a comma-separated list.
    /// These keys are named key-1, key-2, ... in the audit log; they replace the file's keys.
    /// Prefer the environment or the file: arguments are visible to every user in `ps`.
    #[arg(
        long = "api-key",
        value_delimiter = ',',
        hide_env_values = true,
        value_name = "KEY"
    )]
    api_keys: Vec<String>,
    /// Sandboxes running at once [default: the number of cores].
    #[arg(long, value_name = "N")]
    max_concurrent: Option<usize>,
    /// Requests waiting for a sandbox; beyond them the server answers 429 with Retry-After
    /// [default: 4 x max-concurrent].
    #[arg(long, value_name = "N")]
    max_queue: Option<usize>,
    /// Client connections open at once; beyond it a new connection is closed at once
    /// [default: what the open-files limit leaves after the sandboxes' share; the soft limit
    /// is raised to the hard one at start].
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    /// Client connections open at once from one address [default: 4 per place in line
    /// (max-concurrent + max-queue), at least 64, at most a quarter of max-connections].
    /// Behind a reverse proxy every client is the proxy: raise it there.
    #[arg(long, value_name = "N")]
    max_connections_per_peer: Option<usize>,
    /// Largest request body (e.g. 10M); larger ones get 413 [default: room for the largest
    /// code, stdin and input files the policy allows].
    #[arg(long, value_name = "SIZE")]
    max_body: Option<String>,
    /// On SIGTERM/SIGINT, how long running executions may take before they are killed
    /// (seconds, or with a unit) [default: 30s]. A second signal ends the grace at once.
    #[arg(long, value_name = "DURATION")]
    shutdown_grace: Option<String>,
    /// Default limit of a request that does not ask, as NAME=VALUE (repeatable; the
    /// environment variable takes a comma-separated list); values as in a request (10s, 256M,
    /// 0.5).
    #[arg(
        long_help = limit_help("Default limit of a request that does not ask, as NAME=VALUE (repeatable; the environment variable takes a comma-separated list); values as in a request (10s, 256M, 0.5) [default: runcell's defaults: see GET /v1/runtimes]."),
        long = "default-limit",
        value_delimiter = ',',
        value_name = "NAME=VALUE"
    )]
    default_limits: Vec<String>,
    /// The most a request may ask for, as NAME=VALUE (same names; repeatable). A request
    /// above it gets a 400 naming the limit and the maximum.
    #[arg(
        long_help = limit_help("The most a request may ask for, as NAME=VALUE (same names; repeatable). A request above it gets a 400 naming the limit and the maximum [default: this host's memory and cores, and runcell's maxima for the rest: see GET /v1/runtimes]."),
        long = "max-limit",
        value_delimiter = ',',
        value_name = "NAME=VALUE"
    )]
    max_limits: Vec<String>,
    /// Caps on what a request carries and gets back, as NAME=VALUE (repeatable).
    #[arg(
        long_help = format!("Caps on what a request carries and gets back, as NAME=VALUE (repeatable). Names: {} [default: runcell's: GET /v1/runtimes shows them in `policy`].", runcell_core::limits::CAP_NAMES.join(", ")),
        long = "cap",
        value_delimiter = ',',
        value_name = "NAME=VALUE"
    )]
    caps: Vec<String>,
    /// Warm sandboxes kept ready for one-shot runs, as LANG=N (repeatable; the environment
    /// variable takes a comma-separated list; 0 turns a language's pool off). They are built
    /// with the default limits; a request that asks for other memory, pids, cpus, disk or I/O
    /// limits starts cold [default: python=1 per two cores, at most 4].
    #[arg(long = "pool", value_delimiter = ',', value_name = "LANG=N")]
    pool: Vec<String>,
    /// Modules the warm Python interpreters import before a request arrives, as
    /// LANG=MODULE,MODULE (repeatable; e.g. python=numpy,pandas,matplotlib.pyplot): a request's
    /// own `import pandas` then finds it loaded. Each warm sandbox holds their memory
    /// [default: none].
    #[arg(long = "preload", value_name = "LANG=MODULES")]
    preload: Vec<String>,
    /// Fork Python interpreters (the pool's, sessions', and one-shot runs' that find no warm
    /// sandbox) from a prepared template that imported the preloads once, where the host
    /// allows it: true or false [default: true; see docs/isolation.md, "Templates"].
    #[arg(long, value_name = "BOOL")]
    templates: Option<String>,
    /// This server's name among several behind one address (Kubernetes: the pod's name, from
    /// the downward API): session ids then name it, and any server forwards a session's
    /// requests to the one holding it. Needs RUNCELL_CLUSTER_KEY and RUNCELL_CLUSTER_PEER_URL
    /// or RUNCELL_CLUSTER_PEERS. See docs/serve.md, "Running several servers".
    #[arg(long, value_name = "NAME")]
    cluster_pod: Option<String>,
    /// Live sessions at most (POST /v1/sessions; 429 beyond) [default: 32].
    #[arg(long, value_name = "N")]
    max_sessions: Option<usize>,
    /// Live sessions per API key at most [default: 8].
    #[arg(long, value_name = "N")]
    max_sessions_per_key: Option<usize>,
    /// Idle time after which a session ends, unless its request asks for another [default:
    /// 10m].
    #[arg(long, value_name = "DURATION")]
    session_ttl: Option<String>,
    /// The longest idle TTL a session request may ask for [default: 1h].
    #[arg(long, value_name = "DURATION")]
    session_max_ttl: Option<String>,
    /// A session ends this long after its creation, however busy [default: 4h].
    #[arg(long, value_name = "DURATION")]
    session_lifetime: Option<String>,
    /// Idle time after which a paused session ends (it replaces the session's idle TTL while
    /// it is paused) [default: 1h].
    #[arg(long, value_name = "DURATION")]
    session_paused_ttl: Option<String>,
    /// The model API behind POST /v1/agents: anthropic (Messages) or openai (Chat
    /// Completions, also vLLM, Ollama, LM Studio).
    #[arg(long, value_name = "anthropic|openai")]
    agent_upstream: Option<String>,
    /// The model API's base URL [default: the vendor's public URL, as its SDK has it].
    #[arg(long, value_name = "URL")]
    agent_base_url: Option<String>,
    /// The model API's key (prefer the environment variable: flags show in ps).
    #[arg(long, value_name = "KEY", hide_env_values = true)]
    agent_api_key: Option<String>,
    /// The model a request gets when it names none.
    #[arg(long, value_name = "MODEL")]
    agent_model: Option<String>,
    /// The models a request may name (repeatable or comma-separated) [default: any].
    #[arg(long, value_name = "MODEL", value_delimiter = ',')]
    agent_models: Vec<String>,
    /// What runs may ask of the network (network by permission): HOST[:PORT] entries,
    /// repeatable or comma-separated; a name, *.domain or a literal address (loopback,
    /// private and metadata addresses only literally, with their port) [default: none, no
    /// run has network].
    #[arg(long = "allow-net", value_name = "HOST[:PORT]", value_delimiter = ',')]
    allow_net: Vec<String>,
    /// Connections per run through the egress proxy [default: 64].
    #[arg(long, value_name = "N")]
    net_max_connections: Option<u32>,
    /// Bytes per run through the egress proxy, both ways together [default: 64M].
    #[arg(long, value_name = "SIZE")]
    net_max_bytes: Option<String>,
    /// A run that asks for network waits until a person approves it: over HTTP an admin key
    /// (GET /v1/approvals, POST /v1/approvals/ID), over MCP the client's user (elicitation).
    #[arg(long)]
    net_approval: bool,
    /// How long such a run waits before it is refused [default: 5m].
    #[arg(long, value_name = "DURATION")]
    net_approval_timeout: Option<String>,
    /// Who approves MCP calls: admin (the /v1/approvals queue, as for HTTP) or client (the
    /// MCP client's user, through elicitation: the client is the caller itself, so choose it
    /// only where clients are people's) [default: admin].
    #[arg(long, value_name = "admin|client")]
    net_approval_by: Option<String>,
    /// API keys that may also approve runs waiting for network (ids admin-1, ...);
    /// repeatable or comma-separated.
    #[arg(
        long = "admin-key",
        value_name = "KEY",
        value_delimiter = ',',
        hide_env_values = true
    )]
    admin_keys: Vec<String>,
    /// Python packages runs may ask for (vetted installs: binary wheels from the index, in a
    /// sandbox that reaches only the index), repeatable or comma-separated; `*`: any
    /// [default: none].
    #[arg(long = "allow-package", value_name = "NAME", value_delimiter = ',')]
    allow_packages: Vec<String>,
    /// The package index (PEP 503) installs come from [default: https://pypi.org/simple].
    #[arg(long, value_name = "URL")]
    package_index: Option<String>,
    /// The most the package cache may hold on disk, all installed layers together; the least
    /// recently used that no run is using are removed beyond it [default: 2G].
    #[arg(long, value_name = "SIZE")]
    package_cache_max: Option<String>,
    /// The wall-clock budget of one agent request, model calls and runs together [default:
    /// 5m].
    #[arg(long, value_name = "DURATION")]
    agent_timeout: Option<String>,
    /// Where the audit log (one JSON line per execution) goes: stderr, off, or a file path
    /// (appended to, created 0640) [default: stderr].
    #[arg(long, value_name = "stderr|off|FILE")]
    audit_log: Option<String>,
    /// Refuse to run code when any isolation layer is missing on this host.
    #[arg(long)]
    strict: bool,
}

#[derive(Args)]
struct RunArgs {
    /// Language: python, node (javascript), ruby, go, bash. Default: from the file's
    /// extension, otherwise python.
    #[arg(long, short = 'l')]
    lang: Option<String>,
    /// The code to run, given inline.
    #[arg(short = 'c', long = "code", conflicts_with = "file")]
    code: Option<String>,
    /// A file with the code, or '-' to read it from standard input.
    file: Option<PathBuf>,
    /// Wall-clock limit, in seconds or with a unit (500ms, 2m). Default 30.
    #[arg(long, allow_hyphen_values = true)]
    timeout: Option<String>,
    /// Compile-time limit for compiled languages (Go). Default 60.
    #[arg(long, allow_hyphen_values = true)]
    compile_timeout: Option<String>,
    /// Memory limit, swap included (256M, 1G). Default 256M.
    #[arg(long, allow_hyphen_values = true)]
    memory: Option<String>,
    /// CPU cores (may be fractional, e.g. 0.5). Default 1.
    #[arg(long, allow_hyphen_values = true)]
    cpus: Option<String>,
    /// Processes and threads. Default 64.
    #[arg(long, allow_hyphen_values = true)]
    pids: Option<String>,
    /// Disk space of /tmp, /workspace and /dev/shm together (64M). Default 64M.
    #[arg(long, allow_hyphen_values = true)]
    disk: Option<String>,
    /// Cap of stdout and of stderr each (1M). Default 1M.
    #[arg(long, allow_hyphen_values = true)]
    output: Option<String>,
    /// Open files per process. Default 1024.
    #[arg(long, allow_hyphen_values = true)]
    open_files: Option<String>,
    /// Any limit by name, as NAME=VALUE (repeatable), with the names and values of a request
    /// body: timeout=10s, memory=1G, cpus=0.5, ... The flags above are shorthands for these.
    #[arg(
        long = "limit",
        value_name = "NAME=VALUE",
        long_help = limit_help("Any limit by name, as NAME=VALUE (repeatable), with the names and values of a request body: timeout=10s, memory=1G, cpus=0.5, ... The flags above are shorthands for these.")
    )]
    limit: Vec<String>,
    /// A file to feed to the program's standard input ('-' for runcell's own stdin).
    #[arg(long)]
    stdin: Option<PathBuf>,
    /// Copy a host file into /workspace (DEST is relative to /workspace; default: the file's
    /// name). Repeatable. The program works on a copy: the original is never changed.
    #[arg(long = "file", value_name = "SRC[:DEST]")]
    files: Vec<String>,
    /// Write the files the program created or changed under /workspace into DIR, which must
    /// be new or empty (checked before the program runs: nothing on the host is replaced).
    /// Files are created 0644 (never executable), directories 0755, never through a symlink;
    /// names starting with '.' (.git, .ssh, ...) are never written. Each output not written
    /// is listed with the reason (with --json: files[].not_written); runcell then exits 125
    /// if the program itself exited 0.
    #[arg(long, value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// Let the program reach HOST[:PORT] through runcell's egress proxy (repeatable): a name,
    /// *.domain (its subdomains) or a literal address; without a port, every port. Loopback,
    /// private and metadata addresses only when named literally with their port. Without it
    /// the program has no network.
    #[arg(long = "allow-net", value_name = "HOST[:PORT]")]
    allow_net: Vec<String>,
    /// A Python package the curated stack lacks (repeatable): a requirement such as
    /// tabulate==0.9.0, installed as a binary wheel from --package-index in a sandbox of its
    /// own before the run, and kept in runcell's cache for the next run that asks for it.
    #[arg(long = "package", value_name = "REQUIREMENT")]
    packages: Vec<String>,
    /// The package index (a PEP 503 simple index) [default: https://pypi.org/simple].
    #[arg(long, value_name = "URL")]
    package_index: Option<String>,
    /// Print exactly one JSON verdict on stdout and nothing else.
    #[arg(long)]
    json: bool,
    /// Refuse to run when any isolation layer is missing on this host.
    #[arg(long)]
    strict: bool,
}

fn main() -> ExitCode {
    // The sandbox helper role must start before anything else (no threads, no allocation of
    // shared state): the supervisor exec's this binary with `__jail`.
    if std::env::args_os().nth(1).as_deref() == Some(runcell_core::HELPER_ARG.as_ref()) {
        runcell_core::helper_main();
    }
    // So must the template's (a prepared interpreter that sandboxes' interpreters are forked
    // from): `runcell __template`.
    if std::env::args_os().nth(1).as_deref() == Some(runcell_core::TEMPLATE_ARG.as_ref()) {
        runcell_core::template_main();
    }
    let matches = match command().try_get_matches() {
        Ok(m) => m,
        Err(e) => return argument_error(e),
    };
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => return argument_error(e),
    };
    let ctx = Ctx {
        host: runcell_runtimes::Host {
            data_dir: cli
                .data_dir
                .clone()
                .unwrap_or_else(runcell_runtimes::default_data_dir),
        },
        config: cli.config.clone(),
        matches: matches
            .subcommand()
            .map(|(_, m)| m.clone())
            .unwrap_or_default(),
    };
    let host = ctx.host.clone();
    if matches!(cli.command, Command::Serve(_) | Command::Mcp(_)) {
        // Before any thread starts: the servers free a run's output and files after each
        // request, and glibc would otherwise keep those buffers resident (the soak test's
        // growing server).
        runcell_core::pin_mmap_threshold();
        init_logging();
    }
    let result = match cli.command {
        Command::Run(args) => Ok(run(*args, &ctx)),
        Command::Setup => setup(&host),
        Command::Repl(args) => Ok(repl_cmd(args, &ctx)),
        Command::Agent(args) => Ok(agent_cmd(*args, &ctx)),
        Command::Doctor { json } => doctor(json, host),
        Command::Completion { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "runcell",
                &mut std::io::stdout(),
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve(_) => serve(&ctx),
        Command::Mcp(_) => mcp(&ctx),
        Command::Tools(args) => tools(args, &ctx),
        Command::Reference { what } => reference::print(what).map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("runcell: error: {e:#}");
            ExitCode::from(125)
        }
    }
}

/// What every command gets: where runtimes live, the settings file, and its own flags.
struct Ctx {
    host: runcell_runtimes::Host,
    config: Option<PathBuf>,
    /// The command's flags, which the settings model reads as its last source.
    matches: clap::ArgMatches,
}

impl Ctx {
    /// The operator's policy: the defaults, the file, the environment, the command's flags.
    fn policy(&self) -> anyhow::Result<runcell_core::Policy> {
        self.resolve(None)
    }

    /// The policy of a command that runs one sandbox at a time (`run`, `repl`, `agent`): what
    /// is shared between the runs at once (memory, the host's file table) is shared by one,
    /// unless the settings say how many run at once.
    fn policy_for_one(&self) -> anyhow::Result<runcell_core::Policy> {
        self.resolve(Some("1"))
    }

    fn resolve(&self, concurrency: Option<&str>) -> anyhow::Result<runcell_core::Policy> {
        let mut s = settings::from_process(self.config.as_deref(), Some(&self.matches))
            .context("invalid configuration")?;
        if let Some(n) = concurrency {
            s.default_to("max_concurrent", n);
            // One run at a time: a template would be started for it alone.
            s.default_to("templates", "false");
        }
        s.resolve(self.host.clone())
            .context("invalid configuration")
    }
}

/// The command line: clap's, with each flag's environment variable in its help (the settings
/// model reads the variables itself, so that it knows where each value came from).
fn command() -> clap::Command {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    let subcommands: Vec<String> = cmd
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    for name in subcommands {
        cmd = cmd.mut_subcommand(name, |mut sc| {
            let ids: Vec<String> = sc.get_arguments().map(|a| a.get_id().to_string()).collect();
            for id in ids {
                let Some(env) = settings::env_of(&id) else {
                    continue;
                };
                sc = sc.mut_arg(id, |a| {
                    let short = a.get_help().map(|h| h.to_string()).unwrap_or_default();
                    let long = a.get_long_help().map(|h| h.to_string());
                    let a = a.help(format!("{short} [env: {env}]"));
                    match long {
                        Some(l) => a.long_help(format!("{l}\n[env: {env}]")),
                        None => a,
                    }
                });
            }
            sc
        });
    }
    cmd
}

/// Logs of `runcell serve` and `runcell mcp` go to stderr (stdout is MCP's channel) through
/// `tracing`, filtered by `RUNCELL_LOG` (by default runcell's own `info` and the libraries'
/// warnings; e.g. `debug`, `runcell_server=debug`). Every line logged while a request is
/// handled carries its request id. The audit log is separate and unaffected.
///
/// Whatever the filter says, the libraries' debug and trace events are never written: the MCP
/// SDK logs whole requests and results there (code and output, which may hold users' data),
/// and the HTTP stack their headers (API keys).
fn init_logging() {
    use tracing_subscriber::filter::{filter_fn, EnvFilter};
    use tracing_subscriber::prelude::*;
    const DEFAULT: &str =
        "warn,runcell=info,runcell_core=info,runcell_server=info,runcell_mcp=info";
    let filter =
        EnvFilter::try_from_env(reference::LOG_ENV).unwrap_or_else(|_| EnvFilter::new(DEFAULT));
    let ours_or_quiet = filter_fn(|meta| {
        meta.target().starts_with("runcell") || *meta.level() <= tracing::Level::INFO
    });
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(filter)
        .with_filter(ours_or_quiet);
    let _ = tracing_subscriber::registry().with(layer).try_init();
}

/// A command line clap rejects. With `run --json` the caller expects exactly one JSON verdict,
/// so the error becomes an invalid_request verdict; otherwise clap prints its usual message.
fn argument_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let args: Vec<String> = std::env::args().collect();
    let json_run =
        args.get(1).map(String::as_str) == Some("run") && args.iter().any(|a| a == "--json");
    let informational = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion);
    if !json_run || informational {
        e.exit();
    }
    let message = e.render().to_string();
    let first = message
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("invalid arguments")
        .trim_start_matches("error: ")
        .to_string();
    let verdict = Verdict::failed(
        ErrorCategory::InvalidRequest,
        format!("Invalid command line: {first}. See `runcell run --help`."),
    );
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer(&mut out, &verdict);
    let _ = out.write_all(b"\n");
    ExitCode::from(2)
}

/// Read at most `max` bytes; more is an error naming the limit (an endless file such as
/// /dev/zero must not exhaust memory before the size check).
fn read_bounded(mut r: impl Read, what: &str, max: u64) -> Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    r.by_ref()
        .take(max + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("Cannot read {what}: {e}."))?;
    if buf.len() as u64 > max {
        return Err(format!(
            "{what} is larger than the limit of {max} bytes. Send a shorter program or input."
        ));
    }
    Ok(buf)
}

/// Writes the program's output through as it arrives.
pub(crate) struct Passthrough;

impl OutputSink for Passthrough {
    fn output(&mut self, stream: Stream, chunk: &[u8]) {
        let _ = match stream {
            Stream::Stdout => {
                let mut o = std::io::stdout().lock();
                o.write_all(chunk).and_then(|_| o.flush())
            }
            Stream::Stderr => {
                let mut e = std::io::stderr().lock();
                e.write_all(chunk).and_then(|_| e.flush())
            }
        };
    }
}

/// A flag's long help followed by every limit of the request contract, from core: a limit
/// added there shows up here by itself.
fn limit_help(intro: &str) -> String {
    let mut s = format!("{intro}\n\nLimits:");
    for &l in Limit::ALL {
        s.push_str(&format!("\n  {:<16} {}", l.name(), l.doc()));
    }
    s
}

/// The flag of a limit: the limit's name with dashes (`--open-files`).
fn flag_name(limit: Limit) -> String {
    limit.name().replace('_', "-")
}

impl RunArgs {
    /// Every limit flag, with its value if given.
    fn limits(&self) -> [(Limit, Option<&str>); 8] {
        [
            (Limit::Timeout, self.timeout.as_deref()),
            (Limit::CompileTimeout, self.compile_timeout.as_deref()),
            (Limit::Memory, self.memory.as_deref()),
            (Limit::Cpus, self.cpus.as_deref()),
            (Limit::Pids, self.pids.as_deref()),
            (Limit::Disk, self.disk.as_deref()),
            (Limit::Output, self.output.as_deref()),
            (Limit::OpenFiles, self.open_files.as_deref()),
        ]
    }
}

/// Turn the CLI's arguments into a request, or the message of an invalid_request verdict.
fn build_request(args: &RunArgs, policy: &LimitPolicy) -> Result<ExecRequest, String> {
    let invalid = |m: String| m;
    let (code, path) = match (&args.code, &args.file) {
        (Some(c), _) => (c.clone(), None),
        (None, Some(p)) if p.as_os_str() == "-" => {
            let buf = read_bounded(
                std::io::stdin(),
                "The code on standard input",
                policy.max_code_bytes,
            )?;
            let code = String::from_utf8(buf)
                .map_err(|_| invalid("The code on standard input is not valid UTF-8.".into()))?;
            (code, None)
        }
        (None, Some(p)) => {
            let file = std::fs::File::open(p)
                .map_err(|e| invalid(format!("Cannot read {}: {e}.", p.display())))?;
            let bytes = read_bounded(file, &p.display().to_string(), policy.max_code_bytes)?;
            let code = String::from_utf8(bytes)
                .map_err(|_| invalid(format!("{} is not valid UTF-8 text.", p.display())))?;
            (code, Some(p.clone()))
        }
        (None, None) => {
            return Err(invalid(
                "No code given: pass -c CODE, a FILE, or '-' to read standard input.".into(),
            ))
        }
    };
    let language = match (&args.lang, &path) {
        (Some(l), _) => l.clone(),
        (None, Some(p)) => match (Language::from_path(p), p.extension()) {
            (Some(l), _) => l.name().to_string(),
            // A file with an extension runcell does not know is not guessed to be Python.
            (None, Some(ext)) if p.as_os_str() != "-" => {
                return Err(invalid(format!(
                    "Cannot tell the language of {} from its extension (.{}): pass --lang \
                     (python, node, ruby, go or bash). Known extensions: .py, .js, .mjs, .cjs, \
                     .rb, .go, .sh, .bash.",
                    p.display(),
                    ext.to_string_lossy()
                )))
            }
            (None, _) => "python".into(),
        },
        (None, None) => "python".into(),
    };
    let stdin = match &args.stdin {
        None => None,
        Some(p) if p.as_os_str() == "-" => {
            if args.file.as_deref() == Some("-".as_ref()) {
                return Err(invalid(
                    "--stdin - and code from '-' cannot both use standard input.".into(),
                ));
            }
            let buf = read_bounded(std::io::stdin(), "Standard input", policy.max_stdin_bytes)?;
            Some(String::from_utf8_lossy(&buf).into_owned())
        }
        Some(p) => {
            let file = std::fs::File::open(p)
                .map_err(|e| invalid(format!("Cannot read {}: {e}.", p.display())))?;
            let buf = read_bounded(file, &p.display().to_string(), policy.max_stdin_bytes)?;
            Some(String::from_utf8_lossy(&buf).into_owned())
        }
    };
    let files = read_file_args(&args.files, policy)?;
    let mut req = ExecRequest {
        files,
        language: Some(language),
        code: Some(code),
        stdin,
        limits: Default::default(),
        network: (!args.allow_net.is_empty()).then(|| runcell_core::NetworkRequest {
            allow: args.allow_net.clone(),
        }),
        packages: args.packages.clone(),
        ttl: None,
        env: Default::default(),
    };
    for (limit, value) in args.limits() {
        if let Some(text) = value {
            req.limits
                .set_text(limit, text)
                .map_err(|e| invalid(format!("--{}: {e}.", flag_name(limit))))?;
        }
    }
    let mut named = std::collections::HashSet::new();
    for pair in &args.limit {
        let (name, text) = pair.split_once('=').ok_or_else(|| {
            invalid(format!(
                "--limit {pair}: expected NAME=VALUE (e.g. timeout=10s)."
            ))
        })?;
        let limit = Limit::from_name(name.trim()).ok_or_else(|| {
            invalid(format!(
                "--limit {pair}: unknown limit '{name}'; the limits are: {}.",
                runcell_core::limits::limit_names()
            ))
        })?;
        let flag_given = args
            .limits()
            .iter()
            .any(|(l, v)| *l == limit && v.is_some());
        if flag_given || !named.insert(limit) {
            return Err(invalid(format!(
                "--limit {pair}: {limit} is given twice; give each limit once."
            )));
        }
        req.limits
            .set_text(limit, text)
            .map_err(|e| invalid(format!("--limit {name}: {e}.")))?;
    }
    Ok(req)
}

/// Host files named by `--file SRC[:DEST]` arguments, read (within the per-file cap) into
/// input files for /workspace.
fn read_file_args(specs: &[String], policy: &LimitPolicy) -> Result<Vec<InputFile>, String> {
    let mut files = Vec::new();
    for spec in specs {
        let (src, dest) = match spec.split_once(':') {
            Some((src, dest)) if !dest.is_empty() => (src, dest.to_string()),
            _ => {
                let src = spec.trim_end_matches(':');
                let name = std::path::Path::new(src)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .ok_or_else(|| format!("--file {spec}: no file name to use in /workspace."))?;
                (src, name)
            }
        };
        let file =
            std::fs::File::open(src).map_err(|e| format!("--file: cannot read {src}: {e}."))?;
        let bytes = read_bounded(file, src, policy.max_input_file_bytes)?;
        files.push(match String::from_utf8(bytes) {
            Ok(text) => InputFile::text(dest, text),
            Err(e) => InputFile::bytes(dest, e.as_bytes()),
        });
    }
    Ok(files)
}

/// `runcell agent`.
#[derive(Args)]
struct AgentArgs {
    /// The question.
    question: String,
    /// A host file for /workspace, as SRC[:DEST] (repeatable); present in every run.
    #[arg(long = "file", value_name = "SRC[:DEST]")]
    files: Vec<String>,
    /// The language of the code tool offered.
    #[arg(long, short = 'l', default_value = "python")]
    lang: String,
    /// Runs of the code tool at most.
    #[arg(long)]
    max_calls: Option<u32>,
    /// Print the final chat.completion object (with the steps) instead of the answer.
    #[arg(long)]
    json: bool,
    /// anthropic or openai.
    #[arg(long = "upstream", id = "agent_upstream")]
    upstream: Option<String>,
    /// The model API's base URL.
    #[arg(long = "base-url", id = "agent_base_url")]
    base_url: Option<String>,
    /// The model API's key (prefer the environment variable: flags show in ps).
    #[arg(long = "api-key", id = "agent_api_key")]
    api_key: Option<String>,
    /// The model.
    #[arg(long = "model", id = "agent_model")]
    model: Option<String>,
}

fn agent_cmd(args: AgentArgs, ctx: &Ctx) -> ExitCode {
    let policy = match ctx.policy_for_one() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("runcell agent: {e:#}");
            return ExitCode::from(2);
        }
    };
    let engine = Engine::new(policy.engine.clone());
    let files = match read_file_args(&args.files, engine.policy()) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("runcell agent: {e}");
            return ExitCode::from(2);
        }
    };
    agent::agent(
        engine,
        agent::AgentOptions {
            question: args.question,
            language: args.lang,
            files,
            max_calls: args.max_calls,
            json: args.json,
            agent: policy.agent,
        },
    )
}

/// `runcell repl`.
#[derive(Args)]
struct ReplArgs {
    /// python, node (or javascript), ruby, go or bash.
    #[arg(long, short = 'l', default_value = "python")]
    lang: String,
    /// Any limit by name, as NAME=VALUE (repeatable): `timeout` is each input's, the others
    /// (memory=1G, pids, disk, cpus) the whole session's.
    #[arg(long = "limit", value_name = "NAME=VALUE")]
    limit: Vec<String>,
    /// Refuse to run when any isolation layer is missing on this host.
    #[arg(long)]
    strict: bool,
}

fn repl_cmd(args: ReplArgs, ctx: &Ctx) -> ExitCode {
    let policy = match ctx.policy_for_one() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("runcell repl: {e:#}");
            return ExitCode::from(2);
        }
    };
    let engine = Engine::new(policy.engine);
    let mut limits = runcell_core::LimitOverrides::default();
    for pair in &args.limit {
        let parsed = pair.split_once('=').and_then(|(name, text)| {
            Limit::from_name(name.trim()).map(|l| limits.set_text(l, text.trim()))
        });
        match parsed {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                eprintln!("runcell repl: --limit {pair}: {e}.");
                return ExitCode::from(2);
            }
            None => {
                eprintln!(
                    "runcell repl: --limit {pair}: expected NAME=VALUE with a limit among: {}.",
                    runcell_core::limits::limit_names()
                );
                return ExitCode::from(2);
            }
        }
    }
    repl::repl(
        &engine,
        repl::ReplOptions {
            language: args.lang,
            limits,
        },
    )
}

fn run(args: RunArgs, ctx: &Ctx) -> ExitCode {
    // The operator's policy (the file, the environment; `--allow-net`, `--package-index` and
    // `--strict` are its settings too): on the command line the caller is the operator, so
    // what it allows is what the run may ask for, and it may ask for any package.
    let mut config = match ctx.policy_for_one() {
        Ok(p) => p.engine,
        Err(e) => {
            return answer_refused(
                &args,
                Verdict::failed(ErrorCategory::InvalidRequest, format!("{e:#}")),
            )
        }
    };
    config.packages.allow_any = true;
    let engine = Engine::new(config);
    // The output directory is checked before anything runs: a directory that is not empty is
    // refused as an invalid request rather than discovered after the program has run.
    let checked = match &args.output_dir {
        Some(dir) => runcell_core::files::check_output_dir(dir),
        None => Ok(()),
    };
    let mut verdict = match checked.and_then(|()| build_request(&args, &engine.config().policy)) {
        Ok(req) => {
            let sink: Box<dyn OutputSink + Send> = if args.json {
                Box::new(NoSink)
            } else {
                Box::new(Passthrough)
            };
            run_one(engine, req, sink)
        }
        Err(message) => Verdict::failed(ErrorCategory::InvalidRequest, message),
    };
    // Written only when a program ran; every file not written carries the reason.
    let outputs = match &args.output_dir {
        Some(dir) if verdict.exit_code.is_some() => {
            let written = runcell_core::files::write_all(dir, &mut verdict.files);
            let named = verdict
                .files
                .iter()
                .filter(|f| f.not_written.is_some())
                .count() as u64;
            let mut missing = named + verdict.files_omitted;
            if let Err(e) = &written {
                // Even with no file to write, DIR itself could not be made: the caller asked
                // for it and must learn so from the status.
                verdict.warnings.push(format!("--output-dir: {e}"));
                missing = missing.max(1);
            }
            if missing > 0 {
                verdict.warnings.push(format!(
                    "--output-dir: {missing} output file(s) not written to {} (files[].not_written \
                     says why; files_omitted were not returned)",
                    dir.display()
                ));
            }
            Some((dir, written, missing))
        }
        _ => None,
    };
    if args.json {
        let mut out = std::io::stdout().lock();
        let _ = serde_json::to_writer(&mut out, &verdict);
        let _ = out.write_all(b"\n");
    } else {
        eprintln!("{}", summary(&verdict));
        for f in &verdict.files {
            let note = if f.truncated {
                " (content over the cap, not returned)"
            } else {
                ""
            };
            eprintln!(
                "runcell: file {} ({}, {}){note}",
                f.path,
                format_size(f.size),
                f.mime_type
            );
        }
        if let Some((dir, written, _)) = &outputs {
            match written {
                Ok(paths) => {
                    for p in paths {
                        eprintln!("runcell: wrote {}", p.display());
                    }
                }
                Err(e) => eprintln!("runcell: error: cannot write output files: {e}"),
            }
            for f in verdict.files.iter() {
                if let Some(reason) = &f.not_written {
                    eprintln!("runcell: not written: {}: {reason}", f.path);
                }
            }
            if verdict.files_omitted > 0 {
                eprintln!(
                    "runcell: not written: {} more output file(s) were not returned (see above), \
                     so not written to {}",
                    verdict.files_omitted,
                    dir.display()
                );
            }
        }
    }
    match (&outputs, verdict.exit_code) {
        // The program succeeded but DIR does not hold all it produced: say so in the status.
        (Some((_, _, missing)), Some(0)) if *missing > 0 => ExitCode::from(125),
        _ => exit_code(&verdict),
    }
}

/// Run one request of the operator's through the run service (the same intake, admission and
/// engine as every other door's), on a runtime of its own.
fn run_one(engine: Engine, req: ExecRequest, sink: Box<dyn OutputSink + Send>) -> Verdict {
    use runcell_core::{Call, Caller, RunService, Source, Target};
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return Verdict::failed(
            ErrorCategory::SandboxFailure,
            "runcell could not start its async runtime.",
        );
    };
    let service = RunService::local(engine);
    let caller = Caller::local("cli");
    rt.block_on(async {
        let ticket = service.reserve(&caller)?;
        let call = Call::new(caller.clone(), Source::Operator, Target::OneShot, req);
        service.admit(ticket, call).await?.run(sink).await
    })
    .unwrap_or_else(|e| runcell_core::service::refusal_verdict(&e))
}

/// A run refused before it could start: its verdict, as `--json` promises, and exit 2.
fn answer_refused(args: &RunArgs, verdict: Verdict) -> ExitCode {
    if args.json {
        let mut out = std::io::stdout().lock();
        let _ = serde_json::to_writer(&mut out, &verdict);
        let _ = out.write_all(b"\n");
    } else {
        eprintln!("{}", summary(&verdict));
    }
    exit_code(&verdict)
}

/// runcell's exit code when the code did not compile (sysexits' EX_DATAERR).
const COMPILE_ERROR_EXIT: i32 = 65;

/// The process exit code: the program's, or a fixed code when no program ran.
fn exit_code(v: &Verdict) -> ExitCode {
    let code = match (v.exit_code, v.category()) {
        // Not the compiler's status (Go's is 1 or 2, which would read as an invalid request).
        (_, Some(ErrorCategory::CompileError)) => COMPILE_ERROR_EXIT,
        (Some(c), _) => c,
        (None, Some(ErrorCategory::InvalidRequest)) => 2,
        (None, Some(ErrorCategory::RuntimeUnavailable)) => 127,
        (None, _) => 125,
    };
    ExitCode::from(code.clamp(0, 255) as u8)
}

/// The one-line summary printed on stderr after a run.
fn summary(v: &Verdict) -> String {
    let lang = v.language.as_deref().unwrap_or("program");
    let mut s = match (&v.error, v.exit_code) {
        (None, _) => format!("runcell: {lang} exited 0 in {:.3} s", v.execution_time),
        (Some(e), Some(code)) if e.category == ErrorCategory::CompileError => format!(
            "runcell: compile_error (compiler exit code {code}) after {:.3} s of compiling: {}",
            v.compile_time.unwrap_or_default(),
            e.message
        ),
        (Some(e), Some(code)) => format!(
            "runcell: {} (exit code {code}) after {:.3} s: {}",
            e.category.as_str(),
            v.execution_time,
            e.message
        ),
        (Some(e), None) => format!("runcell: {}: {}", e.category.as_str(), e.message),
    };
    if v.exit_code.is_some() {
        s.push_str(&format!(" [cpu {:.3} s", v.usage.cpu_time));
        if let Some(m) = v.usage.peak_memory_bytes {
            s.push_str(&format!(", peak memory {}", format_size(m)));
        }
        s.push_str(&format!(
            "; landlock {}, cgroup {}",
            v.enforcement.landlock, v.enforcement.cgroup
        ));
        if !v.enforcement.missing.is_empty() {
            s.push_str(&format!(", missing: {}", v.enforcement.missing.join("; ")));
        }
        s.push(']');
        if v.stdout_truncated || v.stderr_truncated {
            s.push_str(" (output truncated)");
        }
    }
    s
}

/// `runcell serve`: the HTTP API, until SIGTERM or SIGINT.
fn serve(ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let mut policy = ctx.policy()?;
    policy.commit = Some(env!("RUNCELL_COMMIT").to_string());
    // The server out of the OOM killer's way: sandbox processes (1000) go first.
    match runcell_jail::lower_oom_score_adj(
        OOM_SCORE_ADJ.as_ref(),
        runcell_jail::SERVER_OOM_SCORE_ADJ,
    ) {
        // Lowered, or kept where lowering needs CAP_SYS_RESOURCE: sandbox processes still go
        // first either way, so it is no warning.
        Ok(a) => tracing::info!("{a}"),
        Err(e) => tracing::warn!(error = %e, "could not read or set the server's oom_score_adj"),
    }
    if let Some(m) = &policy.engine.memory {
        tracing::info!(
            "memory: {} ({}); runs, sessions and warm sandboxes together: {}",
            format_size(m.bytes),
            m.source,
            policy
                .engine
                .all_runs_memory_bytes
                .map(format_size)
                .unwrap_or_else(|| "unbounded".into())
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    let result = rt.block_on(runcell_server::serve(policy));
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    result?;
    Ok(ExitCode::SUCCESS)
}

/// `runcell setup`: prepare what makes runs fast and useful, reporting progress on stderr.
fn setup(host: &runcell_runtimes::Host) -> anyhow::Result<ExitCode> {
    use runcell_runtimes::{Language, SetupEvent};
    eprintln!("runcell setup: data directory {}", host.data_dir.display());
    let mut failed = Vec::new();
    fn report(what: &'static str) -> impl FnMut(runcell_runtimes::SetupEvent) {
        move |e| match e {
            SetupEvent::Step(s) => eprintln!("  {s}"),
            SetupEvent::Output(line) => eprintln!("    {line}"),
            SetupEvent::Warning(w) => eprintln!("  warning: {w}"),
            SetupEvent::Done { reused: true } => eprintln!("  {what}: already prepared"),
            SetupEvent::Done { reused: false } => eprintln!("  {what}: ready"),
        }
    }
    match runcell_runtimes::locate_in(Language::Python, "/".as_ref()) {
        Ok(py) => {
            eprintln!(
                "Python data stack (numpy, pandas, matplotlib, scipy, sympy, pillow, openpyxl):"
            );
            match runcell_runtimes::python_stack::setup(
                &host.data_dir,
                &py.executable,
                &mut report("Python data stack"),
            ) {
                Ok(stack) => eprintln!(
                    "  {} packages at {}",
                    stack.packages.len(),
                    stack.root.display()
                ),
                Err(e) => {
                    eprintln!("  FAILED: {}", runcell_core::error::chain(&e));
                    failed.push("Python data stack");
                }
            }
        }
        Err(e) => {
            eprintln!(
                "Python data stack: FAILED ({})",
                runcell_core::error::chain(&e)
            );
            failed.push("Python data stack");
        }
    }
    match runcell_runtimes::locate(Language::Go, host) {
        Ok(go) => {
            eprintln!("Go build cache:");
            if let Err(e) = runcell_runtimes::go_cache::prepare(
                &host.data_dir,
                &go,
                &mut report("Go build cache"),
            ) {
                eprintln!("  FAILED: {}", runcell_core::error::chain(&e));
                failed.push("Go build cache");
            }
        }
        Err(e) => eprintln!(
            "Go build cache: skipped ({})",
            runcell_core::error::chain(&e)
        ),
    }
    if failed.is_empty() {
        eprintln!("runcell setup: done");
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("runcell setup: failed: {}", failed.join(", "));
        Ok(ExitCode::from(1))
    }
}

/// This process's OOM-killer adjustment.
const OOM_SCORE_ADJ: &str = "/proc/self/oom_score_adj";

/// `doctor`'s memory line: the figure runcell sizes from, where it came from, and what runs
/// may use of it.
fn memory_report(config: &EngineConfig) -> (Option<String>, String) {
    let all_runs = config.all_runs_memory_bytes.map(format_size);
    match &config.memory {
        Some(m) => (
            Some(m.source.to_string()),
            format!(
                "{} ({}); runs, sessions and warm sandboxes together at most {}",
                format_size(m.bytes),
                m.source,
                all_runs.unwrap_or_else(|| "?".into())
            ),
        ),
        None => (None, "unknown (no /proc/meminfo, no cgroup limit)".into()),
    }
}

/// `doctor`'s templates check: fork one Python interpreter end to end from a template (the
/// milliseconds the template took to start, and the fork), or why this host cannot.
fn templates_check(
    config: &EngineConfig,
    runtimes: &[(Language, Option<runcell_runtimes::Runtime>, Option<String>)],
) -> Result<(f64, f64), String> {
    let python = runtimes
        .iter()
        .find(|(l, _, _)| *l == Language::Python)
        .and_then(|(_, rt, _)| rt.as_ref())
        .ok_or("no Python runtime on this host")?;
    runcell_core::templates::Templates::available(&python.executable)?;
    let mut config = config.clone();
    config.templates = true;
    let engine = Engine::new(config);
    let v = engine.execute(
        &ExecRequest::new("python", "import os; print(os.getpid())"),
        &mut NoSink,
        None,
    );
    let report = engine.templates().report();
    engine.templates().shutdown();
    if v.exit_code != Some(0) {
        return Err(format!(
            "the check's run failed: {}",
            v.error.map(|e| e.message).unwrap_or_default()
        ));
    }
    if report.forks_ok == 0 {
        return Err(if report.start_failures > 0 {
            "the template did not start (the log says why)".into()
        } else {
            "the fork failed (the log says why)".into()
        });
    }
    Ok((
        report.start_seconds * 1000.0,
        report.fork_seconds * 1000.0 / report.forks_ok as f64,
    ))
}

fn doctor(json: bool, host: runcell_runtimes::Host) -> anyhow::Result<ExitCode> {
    let layers = runcell_core::isolation_layers();
    let prepared = |rt: &runcell_runtimes::Runtime| -> Option<String> {
        match rt.language {
            Language::Python => Some(match &rt.python_stack {
                Some(p) => format!("data stack installed ({} packages)", p.len()),
                None => "data stack NOT installed: run `runcell setup`".into(),
            }),
            Language::Go => Some(if rt.overlays.is_empty() {
                "build cache NOT prepared: run `runcell setup`".into()
            } else {
                "build cache prepared".into()
            }),
            _ => None,
        }
    };
    let runtimes: Vec<(Language, Option<runcell_runtimes::Runtime>, Option<String>)> =
        Language::ALL
            .iter()
            .map(|&l| match runcell_runtimes::locate(l, &host) {
                Ok(rt) => {
                    let version = rt.version();
                    (l, Some(rt), version)
                }
                Err(_) => (l, None, None),
            })
            .collect();
    // An end-to-end check: build a real sandbox and run bash's `true` in it.
    let mut config = EngineConfig::for_host();
    config.host = host.clone();
    let (memory_source, memory_line) = memory_report(&config);
    let memory_bytes = config.memory.as_ref().map(|m| m.bytes);
    let all_runs_memory = config.all_runs_memory_bytes;
    // Whether a server started like this one may lower its OOM score (doctor's own process
    // tries: it ends in a moment).
    let oom = match runcell_jail::lower_oom_score_adj(
        OOM_SCORE_ADJ.as_ref(),
        runcell_jail::SERVER_OOM_SCORE_ADJ,
    ) {
        Ok(a) => a.to_string(),
        Err(e) => format!("oom_score_adj unreadable: {e}"),
    };
    let template_check = templates_check(&config, &runtimes);
    let engine = Engine::new(config);
    let started = Instant::now();
    let probe = engine.execute(&ExecRequest::new("bash", "true"), &mut NoSink, None);
    let probe_ms = started.elapsed().as_millis();
    let sandbox_ok = probe.exit_code == Some(0);
    let all_layers = layers.iter().all(|l| l.available);
    // Where runcell runs decides the fix for a failed end-to-end check: a pod's securityContext
    // field, a container engine's flag, or a host setting.
    let place = runcell_jail::current_place();
    let identity = runcell_jail::Identity::current();
    let userns_ok = layers
        .iter()
        .any(|l| l.name == "user namespaces" && l.available);
    let probe_fix = probe.error.as_ref().and_then(|e| {
        let errno = e.os_error.as_ref().and_then(|o| o.name.as_deref());
        runcell_jail::classify(&e.message, errno).map(|f| {
            // A refused clone where the kernel refuses user namespaces outright is that, not a
            // seccomp profile.
            let f = match f {
                runcell_jail::Failure::SyscallFiltered if !userns_ok => {
                    runcell_jail::Failure::UserNamespacesDenied
                }
                f => f,
            };
            runcell_jail::fix(&place, f, identity != runcell_jail::Identity::Unprivileged)
        })
    });
    // Host settings that would make cold starts faster. Advice only: each is host-wide and
    // the operator's call; runcell never changes them, and they do not change the exit code.
    let speed = runcell_jail::startup_hints(
        runcell_jail::cgroup_version(),
        runcell_jail::RCU_EXPEDITED.as_ref(),
    );

    if json {
        let report = serde_json::json!({
            "place": place.to_string(),
            "identity": identity.as_str(),
            "layers": layers.iter().map(|l| serde_json::json!({
                "name": l.name, "available": l.available, "detail": l.detail, "fix": l.fix,
            })).collect::<Vec<_>>(),
            "runtimes": runtimes.iter().map(|(l, rt, v)| serde_json::json!({
                "language": l.name(),
                "available": rt.is_some(),
                "version": v,
                "executable": rt.as_ref().map(|r| r.executable.display().to_string()),
                "prepared": rt.as_ref().and_then(prepared),
                "install": rt.is_none().then(|| l.install_hint()),
            })).collect::<Vec<_>>(),
            "sandbox_test": {
                "ok": sandbox_ok,
                "milliseconds": probe_ms,
                "enforcement": probe.enforcement,
                "error": probe.error,
                "fix": probe_fix,
            },
            "host_limits": {
                "open_files_hard_limit": runcell_core::open_files_hard_limit(),
                "open_files_maximum": engine.policy().max.open_files.0,
                "memory_bytes": memory_bytes,
                "memory_source": memory_source,
                "all_runs_memory_bytes": all_runs_memory,
                "oom": oom,
            },
            "templates": {
                "ok": template_check.is_ok(),
                "template_start_milliseconds": template_check.as_ref().ok().map(|t| t.0),
                "fork_milliseconds": template_check.as_ref().ok().map(|t| t.1),
                "why_not": template_check.as_ref().err(),
            },
            "startup_hints": speed.iter().map(|h| serde_json::json!({
                "setting": h.setting, "state": h.state, "recommended": h.recommended,
                "advice": h.advice, "trade_off": h.trade_off,
            })).collect::<Vec<_>>(),
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("serialise report")?
        );
    } else {
        let color = std::io::stdout().is_terminal();
        let mark = |ok: bool| match (ok, color) {
            (true, true) => "\x1b[32mok\x1b[0m     ",
            (true, false) => "ok     ",
            (false, true) => "\x1b[31mMISSING\x1b[0m",
            (false, false) => "MISSING",
        };
        println!("Running as {identity}; place: {place}");
        println!("Isolation layers");
        for l in &layers {
            println!("  {:<20} {}  {}", l.name, mark(l.available), l.detail);
            if let Some(fix) = &l.fix {
                println!("  {:<20}          fix: {fix}", "");
            }
        }
        println!("Runtimes");
        for (l, rt, v) in &runtimes {
            match rt {
                Some(rt) => println!(
                    "  {:<20} {}  {} {}{}",
                    l.name(),
                    mark(true),
                    v.as_deref().unwrap_or("?"),
                    rt.executable.display(),
                    prepared(rt).map(|p| format!("; {p}")).unwrap_or_default()
                ),
                None => println!(
                    "  {:<20} {}  install: {}",
                    l.name(),
                    mark(false),
                    l.install_hint()
                ),
            }
        }
        println!("Host limits");
        match runcell_core::open_files_hard_limit() {
            Some(hard) => println!(
                "  {:<20} at most {} per process: the host's hard limit of open files (a run \
                 asking for more is refused; raise it with LimitNOFILE= or `ulimit -Hn`)",
                "open files",
                engine.policy().max.open_files.0.min(hard)
            ),
            None => println!(
                "  {:<20} at most {} per process (the host sets no hard limit)",
                "open files",
                engine.policy().max.open_files.0
            ),
        }
        println!("  {:<20} {memory_line}", "memory");
        println!("  {:<20} {oom}", "oom order");
        println!("Sandbox test");
        if sandbox_ok {
            let e = &probe.enforcement;
            println!(
                "  {:<20} {}  ran `true` in {probe_ms} ms: namespaces {}; seccomp {}; landlock {}; cgroup {}; as {}; devices {}; {}{}",
                "end to end",
                mark(true),
                e.namespaces.join(","),
                if e.seccomp { "on" } else { "off" },
                e.landlock,
                e.cgroup,
                e.identity,
                e.devices,
                if e.own_uid { "a uid per sandbox" } else { "sandboxes share runcell's uid" },
                if e.rootless { "; rootless" } else { "" }
            );
            for m in &e.missing {
                println!("  {:<20}          not enforced: {m}", "");
            }
        } else {
            println!(
                "  {:<20} {}  {}",
                "end to end",
                mark(false),
                probe
                    .error
                    .as_ref()
                    .map(|e| e.message.as_str())
                    .unwrap_or_default()
            );
            if let Some(fix) = &probe_fix {
                println!("  {:<20}          fix: {fix}", "");
            }
        }
        println!("Templates (Python interpreters forked from a prepared one; `serve`)");
        match &template_check {
            Ok((start, fork)) => println!(
                "  {:<20} {}  a template started in {start:.0} ms and forked an interpreter into a sandbox in {fork:.1} ms",
                "fork",
                mark(true)
            ),
            Err(why) => println!(
                "  {:<20} {}  interpreters start the usual way: {why}",
                "fork",
                mark(false)
            ),
        }
        println!("Start-up speed (host settings; optional, host-wide, runcell never sets them)");
        for h in &speed {
            let verdict = if h.recommended {
                "would help"
            } else {
                "fine      "
            };
            println!("  {:<30} {verdict}  {}", h.setting, h.state);
            if h.recommended {
                println!("  {:<30}             why: {}", "", h.advice);
                println!("  {:<30}             cost: {}", "", h.trade_off);
            }
        }
    }
    Ok(if sandbox_ok && all_layers {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[derive(Args)]
struct McpArgs {
    /// Refuse to run code when any isolation layer is missing on this host.
    #[arg(long)]
    strict: bool,
}

#[derive(Args)]
struct ToolsArgs {
    /// anthropic: [{name, description, input_schema}] for the Messages API; openai:
    /// [{type: "function", function: {name, description, parameters}}] for Chat Completions;
    /// openai-responses: [{type: "function", name, description, parameters}] for the
    /// Responses API; openai-strict and openai-responses-strict: the same with strict: true
    /// and a schema that follows OpenAI's strict rules; mcp: the tools/list entries. Each call's input, with "language" added, is the body of
    /// POST /v1/execute.
    #[arg(long, value_enum, default_value = "mcp")]
    format: ToolsFormat,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ToolsFormat {
    Anthropic,
    Openai,
    /// The Responses API's tool shape.
    OpenaiResponses,
    /// Chat Completions, strict mode.
    OpenaiStrict,
    /// The Responses API, strict mode.
    OpenaiResponsesStrict,
    Mcp,
}

/// `runcell mcp`: MCP on stdio until the client closes stdin. stdout carries only the protocol;
/// everything else goes to stderr.
fn mcp(ctx: &Ctx) -> anyhow::Result<ExitCode> {
    use runcell_mcp::{Catalog, McpServer};
    let policy = ctx.policy()?;
    let config = policy.engine.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    let strict = config.strict;
    let engine = Engine::new(config);
    let result = rt.block_on(async {
        let e = engine.clone();
        // Asking each runtime its version runs host programs.
        let catalog = tokio::task::spawn_blocking(move || Catalog::for_host(&e))
            .await
            .context("find the runtimes")?;
        let names: Vec<&str> = catalog.tools().iter().map(|t| t.name.as_str()).collect();
        if names.is_empty() {
            tracing::warn!("WARNING: no runtime is installed; there are no tools");
        }
        tracing::info!(
            "serving MCP on stdio{}; tools: {}",
            if strict { " (strict)" } else { "" },
            names.join(", ")
        );
        // Calls run through the run service as every door's: the policy's sandboxes at
        // once (a sandbox per core by default), a bounded line behind them.
        let service = runcell_core::RunService::new(
            engine,
            runcell_core::ServiceConfig {
                admission: runcell_core::AdmissionPolicy {
                    keys: 1,
                    ..policy.admission()
                },
                sessions: policy.sessions,
                memory_ledger: true,
                ..runcell_core::ServiceConfig::local()
            },
            std::sync::Arc::new(runcell_core::service::Quiet),
        );
        let server = McpServer::new(service, std::sync::Arc::new(catalog), "mcp-stdio");
        runcell_mcp::serve_stdio(server)
            .await
            .map_err(anyhow::Error::from)
    });
    // Cancelled calls' sandboxes are being killed; give their threads a moment to finish.
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    result?;
    tracing::info!("the client closed the connection");
    Ok(ExitCode::SUCCESS)
}

/// `runcell tools`: the MCP tools of this host in another tool-calling format, within the
/// operator's policy.
fn tools(args: ToolsArgs, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let config = ctx.policy()?.engine;
    let catalog = runcell_mcp::Catalog::for_host(&Engine::new(config));
    let format = match args.format {
        ToolsFormat::Anthropic => runcell_mcp::Format::Anthropic,
        ToolsFormat::Openai => runcell_mcp::Format::OpenAi,
        ToolsFormat::OpenaiResponses => runcell_mcp::Format::OpenAiResponses,
        ToolsFormat::OpenaiStrict => runcell_mcp::Format::OpenAiStrict,
        ToolsFormat::OpenaiResponsesStrict => runcell_mcp::Format::OpenAiResponsesStrict,
        ToolsFormat::Mcp => runcell_mcp::Format::Mcp,
    };
    let text = serde_json::to_string_pretty(&runcell_mcp::render(&catalog, format))
        .context("serialise the tools")?;
    println!("{text}");
    Ok(ExitCode::SUCCESS)
}
