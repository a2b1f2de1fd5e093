//! The operator's own telemetry: Prometheus metrics about its reconciles, budgets and queries,
//! and `tracing` logs (JSON in a cluster, readable text on a terminal).

mod budget_series;

use std::sync::Arc;

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

/// Everything the operator exports on `/metrics`.
pub struct Metrics {
    registry: Registry,
    pub reconciles: Family<ControllerLabels, Counter>,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    pub reconcile_duration: Family<ControllerLabels, Histogram>,
    /// Each budget's phase, desired replicas and drain time.
    budgets: Arc<budget_series::BudgetSeries>,
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
        let budgets = Arc::new(budget_series::BudgetSeries::default());
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
        registry.register_collector(Box::new(Arc::clone(&budgets)));
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
            budgets,
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
        namespace: &str,
        name: &str,
        phase: &str,
        desired: i64,
        drain_time_seconds: Option<f64>,
    ) {
        self.budgets
            .set(namespace, name, phase, desired, drain_time_seconds);
    }

    /// Drops a deleted budget's series.
    pub fn budget_deleted(&self, namespace: &str, name: &str) {
        self.budgets.remove(namespace, name);
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
        metrics.budget_decided("shop", "orders", "Healthy", 3, Some(12.0));
        metrics.budget_decided("shop", "billing", "Healthy", 2, Some(1.5));
        metrics.budget_decided("shop", "orders", "AtRisk", 5, None);
        let lines = phase_lines(&metrics);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines.contains(
            &r#"backlog_operator_budget_phase{namespace="shop",name="orders",phase="AtRisk"} 1"#
                .to_owned()
        ));
        let text = metrics.encode();
        for line in [
            r#"backlog_operator_budget_desired_replicas{namespace="shop",name="orders"} 5"#,
            r#"backlog_operator_budget_drain_time_seconds{namespace="shop",name="orders"} NaN"#,
            r#"backlog_operator_budget_drain_time_seconds{namespace="shop",name="billing"} 1.5"#,
            "# TYPE backlog_operator_budget_desired_replicas gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in {text}");
        }
        metrics.budget_deleted("shop", "orders");
        let text = metrics.encode();
        assert!(!text.contains("name=\"orders\""), "{text}");
        assert!(text.contains("name=\"billing\""), "{text}");
    }
}
