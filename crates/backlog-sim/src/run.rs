//! The simulation loop: the workload steps, Prometheus scrapes, the policy decides.

use serde::Serialize;

use super::oracle;
use super::policy::{Policy, PolicyKind, View, build};
use super::scenario::Model;
use super::scrapes::{Scrape, ScrapeHistory};
use super::static_reference;
use super::workload::Workload;

/// One row of the timeline (every scrape interval).
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TimelineRow {
    pub t: f64,
    /// Events produced per second.
    pub lambda: f64,
    /// Events per second the ready consumers can complete (0 while rebalancing).
    pub mu: f64,
    pub backlog: f64,
    pub oldest_age: f64,
    pub deadline: f64,
    pub replicas: u32,
    pub ready: u32,
    pub label: String,
    /// The policy's drain-time prediction at its latest decision.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_drain_seconds: Option<f64>,
}

/// What a run achieved.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub scenario: String,
    pub policy: PolicyKind,
    /// Seconds during which the oldest unfinished event was older than the deadline.
    pub breach_seconds: f64,
    pub max_oldest_age_seconds: f64,
    /// ∫ spec.replicas dt: what the consumer pods cost.
    pub replica_seconds: f64,
    /// Changes of spec.replicas (each one costs a consumer-group rebalance).
    pub scale_events: u32,
    pub rebalances: u32,
    /// Seconds from the backlog's peak until it was back below 30 s of arrivals;
    /// `null` when it never got there.
    pub drain_seconds: Option<f64>,
    pub peak_backlog: f64,
    pub peak_replicas: u32,
    pub produced: f64,
    pub completed: f64,
    pub remaining_backlog: f64,
    pub latency_p50_seconds: Option<f64>,
    pub latency_p95_seconds: Option<f64>,
    pub latency_p99_seconds: Option<f64>,
    /// KEDA lagThreshold used (lag-threshold policy only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag_threshold: Option<f64>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SimulationResult {
    pub summary: Summary,
    pub timeline: Vec<TimelineRow>,
    /// Every change of spec.replicas, with why the policy made it.
    pub changes: Vec<ScaleChangeRow>,
}

/// One change of spec.replicas: what the budget would announce as an Event.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScaleChangeRow {
    pub t: f64,
    pub from: u32,
    pub to: u32,
    /// The budget's explanation; the other policies' label.
    pub reason: String,
}

/// Seconds of arrivals below which a backlog counts as drained.
const DRAINED_ARRIVAL_SECONDS: f64 = 30.0;

pub fn simulate(model: &Model, kind: PolicyKind) -> SimulationResult {
    match kind {
        PolicyKind::Static => static_reference::simulate_static(model),
        PolicyKind::Oracle => oracle::simulate_oracle(model),
        _ => run(model, kind, false),
    }
}

/// One run; with `stop_at_breach` it ends at the first second of breach (a search only needs
/// to know whether there is one).
pub(crate) fn run(model: &Model, kind: PolicyKind, stop_at_breach: bool) -> SimulationResult {
    run_policy(model, kind, build(kind, model), stop_at_breach)
}

/// One run under a policy the caller built (the oracle replays a schedule of its own).
pub(crate) fn run_policy(
    model: &Model,
    kind: PolicyKind,
    mut policy: Box<dyn Policy + '_>,
    stop_at_breach: bool,
) -> SimulationResult {
    let mut workload = Workload::new(model);
    let mut scrapes = ScrapeHistory::new(model.rate_window);
    let mut timeline = Vec::new();
    let deadline = model.budget.deadline_seconds;

    let (mut next_scrape, mut next_decision) = (0.0, 0.0);
    let mut label = String::new();
    let mut predicted_drain_seconds = None;
    let mut breach_seconds = 0.0;
    let mut max_oldest_age: f64 = 0.0;
    let mut replica_seconds = 0.0;
    let mut scale_events = 0;
    let mut peak = (0.0, 0.0);
    let mut drained_after_peak: Option<f64> = Some(0.0);
    let mut peak_replicas = workload.replicas();
    let mut changes = Vec::new();

    while workload.now < model.duration {
        let now = workload.now;
        if now >= next_scrape {
            let scrape = Scrape {
                at: now,
                backlog: workload.backlog(),
                oldest_age: workload.oldest_age(),
                produced_total: workload.produced_total,
                completed_total: workload.completed_total,
                ready_replicas: workload.ready_replicas(),
                partition_backlogs: workload.partition_backlogs(),
            };
            timeline.push(TimelineRow {
                t: now,
                lambda: model.production_rate(now),
                mu: workload.capacity(),
                backlog: scrape.backlog,
                oldest_age: scrape.oldest_age,
                deadline,
                replicas: workload.replicas(),
                ready: scrape.ready_replicas,
                label: label.clone(),
                predicted_drain_seconds,
            });
            scrapes.record(scrape);
            next_scrape += model.scrape_interval;
        }
        if now >= next_decision {
            let outcome = policy.decide(&View {
                now,
                scrapes: &scrapes,
                live_backlog: workload.backlog(),
                replicas: workload.replicas(),
            });
            if outcome.replicas != workload.replicas() {
                changes.push(ScaleChangeRow {
                    t: now,
                    from: workload.replicas(),
                    to: outcome.replicas,
                    reason: outcome.explanation.unwrap_or_else(|| outcome.label.clone()),
                });
                workload.scale_to(outcome.replicas);
                scale_events += 1;
            }
            label = outcome.label;
            predicted_drain_seconds = outcome.predicted_drain_seconds;
            next_decision += policy.interval();
        }

        workload.step();

        let dt = model.step;
        let oldest_age = workload.oldest_age();
        let backlog = workload.backlog();
        if oldest_age > deadline {
            breach_seconds += dt;
            if stop_at_breach {
                break;
            }
        }
        max_oldest_age = max_oldest_age.max(oldest_age);
        replica_seconds += f64::from(workload.replicas()) * dt;
        peak_replicas = peak_replicas.max(workload.replicas());
        if backlog > peak.1 {
            peak = (workload.now, backlog);
            drained_after_peak = None;
        } else if drained_after_peak.is_none()
            && backlog <= model.production_rate(workload.now) * DRAINED_ARRIVAL_SECONDS
        {
            drained_after_peak = Some(workload.now - peak.0);
        }
    }

    let summary = Summary {
        scenario: model.name.clone(),
        policy: kind,
        breach_seconds,
        max_oldest_age_seconds: max_oldest_age,
        replica_seconds,
        scale_events,
        rebalances: workload.rebalances,
        drain_seconds: drained_after_peak,
        peak_backlog: peak.1,
        peak_replicas,
        produced: workload.produced_total,
        completed: workload.completed_total,
        remaining_backlog: workload.backlog(),
        latency_p50_seconds: workload.latencies.quantile(0.5),
        latency_p95_seconds: workload.latencies.quantile(0.95),
        latency_p99_seconds: workload.latencies.quantile(0.99),
        lag_threshold: (kind == PolicyKind::LagThreshold).then_some(model.lag_threshold),
    };
    SimulationResult {
        summary,
        timeline,
        changes,
    }
}
