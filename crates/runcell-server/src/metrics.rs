//! `GET /metrics`: Prometheus text format.
//!
//! Label values are never taken from a request as such: the language is one of the known
//! names or `unknown`, the category one of the verdict's or the API's fixed categories, so a
//! client cannot blow up the number of series.

use std::sync::Mutex;

use prometheus_client::encoding::{text::encode, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use runcell_core::Language;
use runcell_core::{PoolStats, Verdict};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ExecLabels {
    language: &'static str,
    /// `ok`, or the verdict's error category.
    category: &'static str,
    /// `http` or `mcp`.
    interface: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LanguageLabel {
    language: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    /// `ok`, or the agent error's category.
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabel {
    /// `prompt` or `completion`.
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabel {
    /// `allowed` or `refused`.
    decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    /// `out` (from runs) or `in` (to runs).
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    /// `ok` (the owner answered, whatever it answered) or `peer_unavailable`.
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// Seconds, from a trivial bash run to the longest timeouts.
const LATENCY_BUCKETS: [f64; 14] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
];

/// The server's metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    executions: Family<ExecLabels, Counter>,
    latency: Family<LanguageLabel, Histogram>,
    rejections: Family<ReasonLabel, Counter>,
    agent_requests: Family<OutcomeLabel, Counter>,
    agent_model_calls: Family<OutcomeLabel, Counter>,
    agent_model_seconds: Histogram,
    agent_runs: Histogram,
    agent_tokens: Family<TokenLabel, Counter>,
    network_connections: Family<DecisionLabel, Counter>,
    network_bytes: Family<DirectionLabel, Counter>,
    running: Gauge,
    queued: Gauge,
    forwards: Family<ResultLabel, Counter>,
    draining: Gauge,
    /// `runcell_build_info`'s version and commit.
    build: (String, String),
    /// The same counts as some families above, summed over their other labels, for the
    /// operator's console (prometheus-client cannot list a family's series).
    totals: Mutex<Totals>,
    max_concurrent: usize,
    max_queue: usize,
    /// The names of the registry's families (without the prefix): a family without series
    /// yet is not in the exposition, but it is in the reference.
    registered: Vec<&'static str>,
}

/// Counters since the server started, for the console's [`Metrics::snapshot`].
#[derive(Debug, Clone, Default, serde::Serialize, utoipa::ToSchema)]
pub struct Totals {
    /// `runcell_executions_total` by category (`ok` or the verdict's error category).
    pub executions: std::collections::BTreeMap<String, u64>,
    /// `runcell_rejections_total` by reason.
    pub rejections: std::collections::BTreeMap<String, u64>,
    /// `runcell_network_connections_total` with `decision="allowed"`.
    pub network_connections_allowed: u64,
    /// `runcell_network_connections_total` with `decision="refused"`.
    pub network_connections_refused: u64,
}

/// Register a family, and note its name.
fn register(
    registry: &mut Registry,
    registered: &mut Vec<&'static str>,
    name: &'static str,
    help: &str,
    metric: impl prometheus_client::registry::Metric,
) {
    registered.push(name);
    registry.register(name, help, metric);
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

/// The bounded label of a requested language.
pub fn language_label(requested: &str) -> &'static str {
    Language::parse(requested).map_or("unknown", Language::name)
}

impl Metrics {
    pub fn new(max_concurrent: usize, max_queue: usize) -> Metrics {
        let mut registry = Registry::with_prefix("runcell");
        let mut registered = Vec::new();
        let executions = Family::<ExecLabels, Counter>::default();
        register(
            &mut registry,
            &mut registered,
            "executions",
            "Executions that ran (or were refused by the policy), by language, outcome and interface",
            executions.clone(),
        );
        let latency = Family::<LanguageLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(LATENCY_BUCKETS)
        });
        register(
            &mut registry,
            &mut registered,
            "execution_duration_seconds",
            "Time from admission to verdict (queueing, sandbox set-up, compile and run)",
            latency.clone(),
        );
        let rejections = Family::<ReasonLabel, Counter>::default();
        register(
            &mut registry,
            &mut registered,
            "rejections",
            "Requests refused before running: rate_limited (429), payload_too_large (413), \
             invalid_request (400), request_timeout (408), unauthorized (401), forbidden (403), \
             unavailable (503)",
            rejections.clone(),
        );
        let agent_requests = Family::<OutcomeLabel, Counter>::default();
        register(
            &mut registry,
            &mut registered,
            "agent_requests",
            "Agent requests (POST /v1/agents) by outcome: ok, or the loop's error category",
            agent_requests.clone(),
        );
        let agent_model_calls = Family::<OutcomeLabel, Counter>::default();
        register(
            &mut registry,
            &mut registered,
            "agent_model_calls",
            "Calls to the agent loop's model by outcome: ok, or upstream_unavailable, \
             upstream_rate_limited, upstream_timeout, upstream_malformed, upstream_refused \
             (after the call's own retries)",
            agent_model_calls.clone(),
        );
        let agent_model_seconds = Histogram::new(LATENCY_BUCKETS);
        register(
            &mut registry,
            &mut registered,
            "agent_model_call_duration_seconds",
            "Time of one call to the agent loop's model, retries included",
            agent_model_seconds.clone(),
        );
        let agent_runs = Histogram::new([0.0, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0]);
        register(
            &mut registry,
            &mut registered,
            "agent_runs_per_request",
            "Code runs of one agent request (each run is also in executions)",
            agent_runs.clone(),
        );
        let agent_tokens = Family::<TokenLabel, Counter>::default();
        register(
            &mut registry,
            &mut registered,
            "agent_tokens",
            "Tokens the agent loop's model calls used, by kind (prompt, completion)",
            agent_tokens.clone(),
        );
        let network_connections = Family::<DecisionLabel, Counter>::default();
        register(
            &mut registry,
            &mut registered,
            "network_connections",
            "Connections runs made (allowed) or tried (refused) through their egress proxy",
            network_connections.clone(),
        );
        let network_bytes = Family::<DirectionLabel, Counter>::default();
        register(
            &mut registry,
            &mut registered,
            "network_bytes",
            "Bytes through the egress proxies, by direction: out (from runs), in (to runs)",
            network_bytes.clone(),
        );
        let running = Gauge::default();
        register(
            &mut registry,
            &mut registered,
            "sandboxes_running",
            "Sandboxes running now",
            running.clone(),
        );
        let queued = Gauge::default();
        register(
            &mut registry,
            &mut registered,
            "queue_depth",
            "Admitted executions waiting for a sandbox slot",
            queued.clone(),
        );
        let capacity: Gauge = Gauge::default();
        capacity.set(max_concurrent as i64);
        register(
            &mut registry,
            &mut registered,
            "max_concurrent",
            "Sandboxes allowed to run at once",
            capacity,
        );
        let queue_capacity: Gauge = Gauge::default();
        queue_capacity.set(max_queue as i64);
        register(
            &mut registry,
            &mut registered,
            "max_queue",
            "Executions allowed to wait beyond those",
            queue_capacity,
        );
        let forwards = Family::<ResultLabel, Counter>::default();
        register(
            &mut registry,
            &mut registered,
            "forwards",
            "Requests for another server's session forwarded to it, by result: ok (it \
             answered), peer_unavailable (it could not be reached)",
            forwards.clone(),
        );
        let draining = Gauge::default();
        register(
            &mut registry,
            &mut registered,
            "draining",
            "1 while the server drains (stopping: no new sessions, calls in flight go on)",
            draining.clone(),
        );
        Metrics {
            registry: Mutex::new(registry),
            registered,
            forwards,
            draining,
            executions,
            latency,
            rejections,
            agent_requests,
            agent_model_calls,
            agent_model_seconds,
            agent_runs,
            agent_tokens,
            network_connections,
            network_bytes,
            running,
            queued,
            build: (env!("CARGO_PKG_VERSION").into(), "unknown".into()),
            totals: Mutex::default(),
            max_concurrent,
            max_queue,
        }
    }

    fn totals(&self) -> std::sync::MutexGuard<'_, Totals> {
        self.totals.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The counters since the server started, summed as the console shows them.
    pub fn totals_now(&self) -> Totals {
        self.totals().clone()
    }

    /// `runcell_max_concurrent` and `runcell_max_queue`.
    pub fn capacity(&self) -> (usize, usize) {
        (self.max_concurrent, self.max_queue)
    }

    /// This server's version and the commit it was built from.
    pub fn build(&self) -> (&str, &str) {
        (&self.build.0, &self.build.1)
    }

    /// One request forwarded to the server holding its session.
    pub fn forwarded(&self, result: &'static str) {
        self.forwards.get_or_create(&ResultLabel { result }).inc();
    }

    pub fn set_draining(&self, on: bool) {
        self.draining.set(i64::from(on));
    }

    /// The commit `runcell_build_info` names.
    pub fn set_commit(&mut self, commit: &str) {
        self.build.1 = commit.to_string();
    }

    /// One finished execution (whatever its verdict).
    pub fn executed(&self, interface: &'static str, verdict: &Verdict, seconds: f64) {
        let language = verdict
            .language
            .as_deref()
            .map_or("unknown", language_label);
        let category = verdict.error.as_ref().map_or("ok", |e| e.category.as_str());
        self.executions
            .get_or_create(&ExecLabels {
                language,
                category,
                interface,
            })
            .inc();
        *self
            .totals()
            .executions
            .entry(category.to_string())
            .or_default() += 1;
        self.latency
            .get_or_create(&LanguageLabel { language })
            .observe(seconds);
    }

    /// One finished agent request: its outcome (`ok` or the loop's error category) and the
    /// code it ran.
    pub fn agent(&self, outcome: &'static str, runs: u32) {
        self.agent_requests
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
        self.agent_runs.observe(f64::from(runs));
    }

    /// One call to the agent loop's model: its outcome, time and tokens.
    pub fn agent_model_call(&self, outcome: &'static str, seconds: f64, tokens: (u64, u64)) {
        self.agent_model_calls
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
        self.agent_model_seconds.observe(seconds);
        self.agent_tokens
            .get_or_create(&TokenLabel { kind: "prompt" })
            .inc_by(tokens.0);
        self.agent_tokens
            .get_or_create(&TokenLabel { kind: "completion" })
            .inc_by(tokens.1);
    }

    /// The connections of one run with network by permission.
    pub fn network(&self, report: &runcell_core::NetworkReport) {
        for c in &report.connections {
            let decision = if c.allowed { "allowed" } else { "refused" };
            {
                let mut t = self.totals();
                if c.allowed {
                    t.network_connections_allowed += 1;
                } else {
                    t.network_connections_refused += 1;
                }
            }
            self.network_connections
                .get_or_create(&DecisionLabel { decision })
                .inc();
            self.network_bytes
                .get_or_create(&DirectionLabel { direction: "out" })
                .inc_by(c.bytes_out);
            self.network_bytes
                .get_or_create(&DirectionLabel { direction: "in" })
                .inc_by(c.bytes_in);
        }
    }

    /// A request refused before it ran; `reason` is the API error category.
    pub fn rejected(&self, reason: &'static str) {
        self.rejections.get_or_create(&ReasonLabel { reason }).inc();
        *self
            .totals()
            .rejections
            .entry(reason.to_string())
            .or_default() += 1;
    }

    /// The text exposition, with the gauges and the warm pool's figures read now.
    pub fn render(
        &self,
        running: usize,
        queued: usize,
        pool: &[PoolStats],
        sessions: runcell_core::SessionStats,
        templates: &runcell_core::templates::TemplatesReport,
    ) -> String {
        self.running.set(running as i64);
        self.queued.set(queued as i64);
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &registry);
        // The pool's counters live in the engine: they are written here as they are now,
        // before the closing "# EOF".
        if let Some(body) = out.strip_suffix("# EOF\n") {
            let mut text = body.to_string();
            pool_families(&mut text, pool);
            template_families(&mut text, templates);
            session_families(&mut text, sessions);
            build_family(&mut text, &self.build);
            process_families(&mut text, std::path::Path::new("/proc"));
            text.push_str("# EOF\n");
            out = text;
        }
        out
    }
}

/// The name of every metric family the server exposes (as `# TYPE` names it in the
/// OpenMetrics text: a counter without its `_total`), sorted: the registry's families and
/// the exposition of a fresh server, so that the list cannot differ from what `/metrics`
/// writes.
pub fn family_names() -> Vec<String> {
    let metrics = Metrics::new(1, 1);
    let text = metrics.render(
        0,
        0,
        &[],
        runcell_core::SessionStats::default(),
        &runcell_core::templates::TemplatesReport::default(),
    );
    let mut names: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .chain(metrics.registered.iter().map(|n| format!("runcell_{n}")))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Every reason `runcell_rejections_total` counts: the API's error categories and the
/// connections refused before any request.
pub fn rejection_reasons() -> Vec<&'static str> {
    let mut all = crate::error::categories();
    all.extend(crate::connections::Refused::ALL.map(crate::connections::Refused::reason));
    all.sort_unstable();
    all
}

/// What was built: `runcell_build_info{version, commit} 1`.
fn build_family(out: &mut String, (version, commit): &(String, String)) {
    use std::fmt::Write;
    let esc = |s: &str| {
        s.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', " ")
    };
    let _ = writeln!(
        out,
        "# HELP runcell_build_info The version and commit of this runcell (always 1)."
    );
    let _ = writeln!(out, "# TYPE runcell_build_info gauge");
    let _ = writeln!(
        out,
        "runcell_build_info{{version=\"{}\",commit=\"{}\"}} 1",
        esc(version),
        esc(commit)
    );
}

/// The standard process families (as Prometheus' client libraries export them), read from
/// `proc` (normally `/proc`): CPU seconds, resident and virtual memory, open and maximum
/// descriptors, start time. A file that cannot be read leaves its families out.
fn process_families(out: &mut String, proc: &std::path::Path) {
    use std::fmt::Write;
    let me = proc.join("self");
    let mut families: Vec<(&str, &str, &str, f64)> = Vec::new();
    if let Ok(stat) = std::fs::read_to_string(me.join("stat")) {
        // Fields after the command name, which may hold spaces and parentheses.
        let f: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, r)| r.split_whitespace().collect())
            .unwrap_or_default();
        let field = |n: usize| f.get(n - 3).and_then(|v| v.parse::<f64>().ok());
        let ticks = rustix::param::clock_ticks_per_second() as f64;
        if let (Some(utime), Some(stime)) = (field(14), field(15)) {
            families.push((
                "process_cpu_seconds",
                "counter",
                "Total user and system CPU time spent in seconds",
                (utime + stime) / ticks,
            ));
        }
        if let Some(vsize) = field(23) {
            families.push((
                "process_virtual_memory_bytes",
                "gauge",
                "Virtual memory size in bytes",
                vsize,
            ));
        }
        if let Some(rss) = field(24) {
            families.push((
                "process_resident_memory_bytes",
                "gauge",
                "Resident memory size in bytes",
                rss * rustix::param::page_size() as f64,
            ));
        }
        let btime = std::fs::read_to_string(proc.join("stat"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("btime "))
                    .and_then(|v| v.trim().parse::<f64>().ok())
            });
        if let (Some(start), Some(btime)) = (field(22), btime) {
            families.push((
                "process_start_time_seconds",
                "gauge",
                "Start time of the process since unix epoch in seconds",
                btime + start / ticks,
            ));
        }
    }
    if let Ok(fds) = std::fs::read_dir(me.join("fd")) {
        families.push((
            "process_open_fds",
            "gauge",
            "Number of open file descriptors",
            fds.count() as f64,
        ));
    }
    if let Some(max) = std::fs::read_to_string(me.join("limits"))
        .ok()
        .and_then(|l| {
            l.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|v| v.parse::<f64>().ok())
        })
    {
        families.push((
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors",
            max,
        ));
    }
    for (name, kind, help, value) in families {
        let _ = writeln!(out, "# HELP {name} {help}.");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let suffix = if kind == "counter" { "_total" } else { "" };
        let _ = writeln!(out, "{name}{suffix} {value}");
    }
}

/// The exposition as Prometheus' classic text format (0.0.4) has it, from the OpenMetrics
/// text: a counter's `HELP` and `TYPE` name its samples (`_total`), and there is no `UNIT` and
/// no `# EOF`.
pub fn to_classic(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        match renamed {
            Some(l) => out.push_str(&l),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Which format an `Accept` header asks for: OpenMetrics when it names it, the classic text
/// format otherwise (a plain `curl`, Prometheus' own parsers).
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',').any(|part| {
            let mut bits = part.split(';');
            let kind = bits.next().unwrap_or_default().trim();
            let q = bits
                .filter_map(|b| b.trim().strip_prefix("q="))
                .find_map(|q| q.parse::<f32>().ok())
                .unwrap_or(1.0);
            kind.eq_ignore_ascii_case("application/openmetrics-text") && q > 0.0
        })
    })
}

/// The sessions' families, in the OpenMetrics text format.
fn session_families(out: &mut String, s: runcell_core::SessionStats) {
    use std::fmt::Write;
    let families = [
        ("sessions", "gauge", "Live sessions", s.live as u64),
        ("sessions_created", "counter", "Sessions created", s.created),
        (
            "sessions_expired",
            "counter",
            "Sessions ended by the reaper (idle past their TTL, or past the maximum lifetime)",
            s.expired,
        ),
        (
            "sessions_deleted",
            "counter",
            "Sessions ended by DELETE",
            s.deleted,
        ),
        (
            "sessions_forked",
            "counter",
            "Sessions forked (a new session copied from another)",
            s.forked,
        ),
        (
            "sessions_paused",
            "counter",
            "Sessions paused (their sandbox frozen)",
            s.paused,
        ),
        (
            "sessions_resumed",
            "counter",
            "Paused sessions resumed (by resume, connect, or a call or file operation)",
            s.resumed,
        ),
    ];
    for (name, kind, help, value) in families {
        let _ = writeln!(out, "# HELP runcell_{name} {help}.");
        let _ = writeln!(out, "# TYPE runcell_{name} {kind}");
        let suffix = if kind == "counter" { "_total" } else { "" };
        let _ = writeln!(out, "runcell_{name}{suffix} {value}");
    }
}

/// The templates' families (docs/isolation.md, "Templates"), in the OpenMetrics text format.
fn template_families(out: &mut String, t: &runcell_core::templates::TemplatesReport) {
    use std::fmt::Write;
    let l = "language=\"python\"";
    let _ = writeln!(
        out,
        "# HELP runcell_templates Templates that Python interpreters are forked from, by state (live: serving forks; failed: waiting to be tried again)."
    );
    let _ = writeln!(out, "# TYPE runcell_templates gauge");
    let _ = writeln!(
        out,
        "runcell_templates{{{l},state=\"live\"}} {}",
        t.now.live
    );
    let _ = writeln!(
        out,
        "runcell_templates{{{l},state=\"failed\"}} {}",
        t.now.failed
    );
    let _ = writeln!(
        out,
        "# HELP runcell_template_starts Templates started (their preloads imported)."
    );
    let _ = writeln!(out, "# TYPE runcell_template_starts counter");
    let _ = writeln!(
        out,
        "runcell_template_starts_total{{{l},result=\"ok\"}} {}",
        t.starts
    );
    let _ = writeln!(
        out,
        "runcell_template_starts_total{{{l},result=\"failed\"}} {}",
        t.start_failures
    );
    let _ = writeln!(
        out,
        "# HELP runcell_template_start_seconds Seconds spent starting templates that became ready (divided by their starts: the mean start time)."
    );
    let _ = writeln!(out, "# TYPE runcell_template_start_seconds counter");
    let _ = writeln!(
        out,
        "runcell_template_start_seconds_total{{{l}}} {}",
        t.start_seconds
    );
    let _ = writeln!(
        out,
        "# HELP runcell_template_forks Interpreters forked from a template into a sandbox (failed: started the usual way instead)."
    );
    let _ = writeln!(out, "# TYPE runcell_template_forks counter");
    let _ = writeln!(
        out,
        "runcell_template_forks_total{{{l},result=\"ok\"}} {}",
        t.forks_ok
    );
    let _ = writeln!(
        out,
        "runcell_template_forks_total{{{l},result=\"failed\"}} {}",
        t.forks_failed
    );
    let _ = writeln!(
        out,
        "# HELP runcell_template_fork_seconds Seconds from a fork's request to its interpreter's readiness, for forks that succeeded."
    );
    let _ = writeln!(out, "# TYPE runcell_template_fork_seconds summary");
    let _ = writeln!(
        out,
        "runcell_template_fork_seconds_sum{{{l}}} {}",
        t.fork_seconds
    );
    let _ = writeln!(
        out,
        "runcell_template_fork_seconds_count{{{l}}} {}",
        t.forks_ok
    );
}

/// The warm pool's families, in the OpenMetrics text format.
fn pool_families(out: &mut String, pool: &[PoolStats]) {
    use std::fmt::Write;
    type Family = (
        &'static str,
        &'static str,
        &'static str,
        fn(&PoolStats) -> String,
    );
    let families: [Family; 7] = [
        (
            "pool_target",
            "gauge",
            "Warm sandboxes wanted, by language",
            |s| s.target.to_string(),
        ),
        (
            "pool_ready",
            "gauge",
            "Warm sandboxes ready now, by language",
            |s| s.ready.to_string(),
        ),
        (
            "pool_hits",
            "counter",
            "One-shot runs that took a warm sandbox",
            |s| s.hits.to_string(),
        ),
        (
            "pool_misses",
            "counter",
            "One-shot runs built cold: limits other than the pool's, or no warm sandbox ready",
            |s| s.misses.to_string(),
        ),
        ("pool_refills", "counter", "Warm sandboxes built", |s| {
            s.refills.to_string()
        }),
        (
            "pool_refill_seconds",
            "counter",
            "Seconds spent building warm sandboxes (divided by pool_refills: the mean refill time)",
            |s| format!("{}", s.refill_seconds),
        ),
        (
            "pool_refill_failures",
            "counter",
            "Warm sandboxes that could not be built (the pool retries with a growing pause; the log says why)",
            |s| s.refill_failures.to_string(),
        ),
    ];
    for (name, kind, help, value) in families {
        let _ = writeln!(out, "# HELP runcell_{name} {help}.");
        let _ = writeln!(out, "# TYPE runcell_{name} {kind}");
        let suffix = if kind == "counter" { "_total" } else { "" };
        for s in pool {
            let language = s.language.map_or("unknown", Language::name);
            let _ = writeln!(
                out,
                "runcell_{name}{suffix}{{language=\"{language}\"}} {}",
                value(s)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runcell_core::verdict::ErrorCategory;

    #[test]
    fn exposition_has_every_family() {
        let m = Metrics::new(2, 8);
        let mut v = Verdict::failed(ErrorCategory::Timeout, "slow");
        v.language = Some("python".into());
        m.executed("http", &v, 1.5);
        v.error = None;
        v.language = Some("javascript".into());
        m.executed("mcp-http", &v, 0.02);
        m.rejected("rate_limited");
        let pool = [PoolStats {
            language: Some(Language::Python),
            target: 2,
            ready: 1,
            hits: 5,
            misses: 1,
            refills: 6,
            refill_seconds: 0.3,
            refill_failures: 2,
        }];
        let templates = runcell_core::templates::TemplatesReport {
            forks_ok: 4,
            fork_seconds: 0.1,
            ..Default::default()
        };
        let text = m.render(
            1,
            1,
            &pool,
            runcell_core::SessionStats::default(),
            &templates,
        );
        for needle in [
            "runcell_executions_total{language=\"python\",category=\"timeout\",interface=\"http\"} 1",
            "runcell_executions_total{language=\"node\",category=\"ok\",interface=\"mcp-http\"} 1",
            "runcell_execution_duration_seconds_bucket{le=\"2.5\",language=\"python\"} 1",
            "runcell_rejections_total{reason=\"rate_limited\"} 1",
            "runcell_sandboxes_running 1",
            "runcell_queue_depth 1",
            "runcell_max_concurrent 2",
            "runcell_max_queue 8",
            "# TYPE runcell_pool_hits counter",
            "runcell_pool_hits_total{language=\"python\"} 5",
            "runcell_pool_ready{language=\"python\"} 1",
            "runcell_pool_refill_seconds_total{language=\"python\"} 0.3",
            "runcell_pool_refill_failures_total{language=\"python\"} 2",
            "runcell_template_forks_total{language=\"python\",result=\"ok\"} 4",
            "runcell_template_fork_seconds_count{language=\"python\"} 4",
            "# EOF",
        ] {
            assert!(text.contains(needle), "missing {needle} in:\n{text}");
        }
    }

    #[test]
    fn unknown_languages_share_one_label() {
        assert_eq!(language_label("cobol"), "unknown");
        assert_eq!(language_label("x\"}\n"), "unknown");
        assert_eq!(language_label("js"), "node");
    }
}
