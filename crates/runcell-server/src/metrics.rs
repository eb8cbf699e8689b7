//! `GET /metrics`: Prometheus text format.
//!
//! Label values are never taken from a request as such: the language is one of the known
//! names or `unknown`, the category one of the verdict's or the API's fixed categories, so a
//! client cannot blow up the number of series.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;

use prometheus_client::encoding::{text::encode, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use runcell_core::Language;
use runcell_core::Verdict;

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
    running: Gauge,
    queued: Gauge,
    queued_now: AtomicI64,
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
        let executions = Family::<ExecLabels, Counter>::default();
        registry.register(
            "executions",
            "Executions that ran (or were refused by the policy), by language, outcome and interface",
            executions.clone(),
        );
        let latency = Family::<LanguageLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(LATENCY_BUCKETS)
        });
        registry.register(
            "execution_duration_seconds",
            "Time from admission to verdict (queueing, sandbox set-up, compile and run)",
            latency.clone(),
        );
        let rejections = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "rejections",
            "Requests refused before running: rate_limited (429), payload_too_large (413), \
             invalid_request (400), request_timeout (408), unauthorized (401), forbidden (403), \
             unavailable (503)",
            rejections.clone(),
        );
        let running = Gauge::default();
        registry.register(
            "sandboxes_running",
            "Sandboxes running now",
            running.clone(),
        );
        let queued = Gauge::default();
        registry.register(
            "queue_depth",
            "Admitted executions waiting for a sandbox slot",
            queued.clone(),
        );
        let capacity: Gauge = Gauge::default();
        capacity.set(max_concurrent as i64);
        registry.register(
            "max_concurrent",
            "Sandboxes allowed to run at once",
            capacity,
        );
        let queue_capacity: Gauge = Gauge::default();
        queue_capacity.set(max_queue as i64);
        registry.register(
            "max_queue",
            "Executions allowed to wait beyond those",
            queue_capacity,
        );
        Metrics {
            registry: Mutex::new(registry),
            executions,
            latency,
            rejections,
            running,
            queued,
            queued_now: AtomicI64::new(0),
        }
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
        self.latency
            .get_or_create(&LanguageLabel { language })
            .observe(seconds);
    }

    /// A request refused before it ran; `reason` is the API error category.
    pub fn rejected(&self, reason: &'static str) {
        self.rejections.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// Counts an execution waiting for a slot until dropped.
    pub fn queued(&self) -> QueuedGuard<'_> {
        self.queued_now.fetch_add(1, Ordering::Relaxed);
        QueuedGuard(self)
    }

    /// The text exposition, with the gauges read now.
    pub fn render(&self, running: usize) -> String {
        self.running.set(running as i64);
        self.queued
            .set(self.queued_now.load(Ordering::Relaxed).max(0));
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &registry);
        out
    }
}

/// See [`Metrics::queued`].
pub struct QueuedGuard<'a>(&'a Metrics);

impl Drop for QueuedGuard<'_> {
    fn drop(&mut self) {
        self.0.queued_now.fetch_sub(1, Ordering::Relaxed);
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
        m.executed("mcp", &v, 0.02);
        m.rejected("rate_limited");
        let _q = m.queued();
        let text = m.render(1);
        for needle in [
            "runcell_executions_total{language=\"python\",category=\"timeout\",interface=\"http\"} 1",
            "runcell_executions_total{language=\"node\",category=\"ok\",interface=\"mcp\"} 1",
            "runcell_execution_duration_seconds_bucket{le=\"2.5\",language=\"python\"} 1",
            "runcell_rejections_total{reason=\"rate_limited\"} 1",
            "runcell_sandboxes_running 1",
            "runcell_queue_depth 1",
            "runcell_max_concurrent 2",
            "runcell_max_queue 8",
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
