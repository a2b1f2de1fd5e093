//! The operator's own telemetry: Prometheus metrics about its reconciles, budgets and queries,
//! and `tracing` logs (JSON in a cluster, readable text on a terminal).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::{EncodeLabelSet, text::encode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::api_client::ThrottleObserver;
use crate::metrics_source::QueryObserver;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub controller: String,
    pub error: String,
}

/// A budget's series' labels. Shared texts: a budget has a series in three families, and
/// each keeps its own copy of the labels (one allocation each, at thousands of budgets).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BudgetLabels {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    pub phase: String,
}

/// Everything the operator exports on `/metrics`.
pub struct Metrics {
    registry: Registry,
    pub reconciles: Family<ControllerLabels, Counter>,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    pub reconcile_duration: Family<ControllerLabels, Histogram>,
    pub budget_phase: Family<PhaseLabels, Gauge>,
    pub desired_replicas: Family<BudgetLabels, Gauge>,
    pub drain_time_seconds: Family<BudgetLabels, Gauge<f64, AtomicU64>>,
    pub query_duration: Histogram,
    /// API requests that waited for the client-side rate limit, and how long.
    pub api_throttled: Counter,
    pub api_throttle_wait: Histogram,
    pub query_failures: Counter,
    /// 1 while this replica leads (or runs without leader election), else 0.
    pub leading: Gauge,
    pub leadership_lost: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("backlog_operator");
        let reconciles = Family::<ControllerLabels, Counter>::default();
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        let reconcile_duration =
            Family::<ControllerLabels, Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.005, 2.0, 12))
            });
        let budget_phase = Family::<PhaseLabels, Gauge>::default();
        let desired_replicas = Family::<BudgetLabels, Gauge>::default();
        let drain_time_seconds = Family::<BudgetLabels, Gauge<f64, AtomicU64>>::default();
        let query_duration = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        let query_failures = Counter::default();
        let api_throttled = Counter::default();
        let api_throttle_wait = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        let leading = Gauge::default();
        let leadership_lost = Counter::default();
        registry.register("reconciles", "Reconciles run", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by error kind",
            reconcile_errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one reconcile",
            reconcile_duration.clone(),
        );
        registry.register(
            "budget_phase",
            "1, labelled with the phase each BacklogBudget is in (one series per budget)",
            budget_phase.clone(),
        );
        registry.register(
            "budget_desired_replicas",
            "Replicas the budget wants for its workload",
            desired_replicas.clone(),
        );
        registry.register(
            "budget_drain_time_seconds",
            "Predicted seconds to drain the backlog (NaN when it cannot drain)",
            drain_time_seconds.clone(),
        );
        registry.register(
            "prometheus_query_duration_seconds",
            "Latency of the PromQL queries the operator evaluates",
            query_duration.clone(),
        );
        registry.register(
            "prometheus_query_failures",
            "PromQL queries that failed or timed out",
            query_failures.clone(),
        );
        registry.register(
            "api_throttled_requests",
            "API requests that waited for the client-side limit (--api-qps, --api-burst)",
            api_throttled.clone(),
        );
        registry.register(
            "api_throttle_wait_seconds",
            "How long API requests waited for the client-side limit",
            api_throttle_wait.clone(),
        );
        registry.register(
            "leading",
            "1 while this replica holds the Lease and may write, else 0",
            leading.clone(),
        );
        registry.register(
            "leadership_lost",
            "Terms that ended without a shutdown (renewals failed or the Lease was taken)",
            leadership_lost.clone(),
        );
        Self {
            registry,
            reconciles,
            reconcile_errors,
            reconcile_duration,
            budget_phase,
            desired_replicas,
            drain_time_seconds,
            query_duration,
            query_failures,
            api_throttled,
            api_throttle_wait,
            leading,
            leadership_lost,
        }
    }
}

impl Metrics {
    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }

    /// Records one reconcile of `controller`.
    pub fn reconciled(&self, controller: &str, seconds: f64) {
        let labels = ControllerLabels {
            controller: controller.to_owned(),
        };
        self.reconciles.get_or_create(&labels).inc();
        self.reconcile_duration
            .get_or_create(&labels)
            .observe(seconds);
    }

    pub fn failed(&self, controller: &str, error: &str) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels {
                controller: controller.to_owned(),
                error: error.to_owned(),
            })
            .inc();
    }

    /// Exports one budget's decision: its phase as one series (at thousands of budgets a
    /// series for every phase of every budget would be most of the operator's memory and of
    /// each scrape), its desired replicas and its drain time.
    pub fn budget_decided(
        &self,
        budget: &BudgetLabels,
        previous_phase: Option<&str>,
        phase: &str,
        desired: i64,
        drain_time_seconds: Option<f64>,
    ) {
        if let Some(previous) = previous_phase.filter(|previous| *previous != phase) {
            self.budget_phase.remove(&budget.with_phase(previous));
        }
        self.budget_phase
            .get_or_create(&budget.with_phase(phase))
            .set(1);
        self.desired_replicas.get_or_create(budget).set(desired);
        self.drain_time_seconds
            .get_or_create(budget)
            .set(drain_time_seconds.unwrap_or(f64::NAN));
    }

    /// Drops a deleted budget's series.
    pub fn budget_deleted(&self, budget: &BudgetLabels, phase: Option<&str>) {
        if let Some(phase) = phase {
            self.budget_phase.remove(&budget.with_phase(phase));
        }
        self.desired_replicas.remove(budget);
        self.drain_time_seconds.remove(budget);
    }
}

impl BudgetLabels {
    fn with_phase(&self, phase: &str) -> PhaseLabels {
        PhaseLabels {
            namespace: Arc::clone(&self.namespace),
            name: Arc::clone(&self.name),
            phase: phase.to_owned(),
        }
    }
}

impl ThrottleObserver for Metrics {
    fn throttled(&self, waited: std::time::Duration) {
        self.api_throttled.inc();
        self.api_throttle_wait.observe(waited.as_secs_f64());
    }
}

impl QueryObserver for Metrics {
    fn observe(&self, seconds: f64, failed: bool) {
        self.query_duration.observe(seconds);
        if failed {
            self.query_failures.inc();
        }
    }
}

/// Starts logging: JSON lines when `json`, otherwise compact text. `RUST_LOG` filters.
pub fn init_logging(json: bool) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,kube=warn"));
    // Logs go to stderr so that commands printing results (watch, simulate) keep stdout clean.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second initialisation (e.g. in tests) is harmless and ignored.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.compact().try_init()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase_lines(metrics: &Metrics) -> Vec<String> {
        metrics
            .encode()
            .lines()
            .filter(|line| line.starts_with("backlog_operator_budget_phase{"))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn a_budget_has_one_phase_series_and_none_once_deleted() {
        let metrics = Metrics::default();
        let orders = BudgetLabels {
            namespace: "shop".into(),
            name: "orders".into(),
        };
        metrics.budget_decided(&orders, None, "Healthy", 3, Some(12.0));
        metrics.budget_decided(&orders, Some("Healthy"), "AtRisk", 5, None);
        let lines = phase_lines(&metrics);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("phase=\"AtRisk\"") && lines[0].ends_with(" 1"));
        metrics.budget_deleted(&orders, Some("AtRisk"));
        let text = metrics.encode();
        assert!(!text.contains("name=\"orders\""), "{text}");
    }
}
