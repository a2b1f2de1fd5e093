//! The words a decision leaves in status: the explanation of the replica count and the
//! messages of the conditions it sets. The explanation names the values the count was
//! decided on (backlog, λ, μ per replica and where it came from), so a user can check it
//! against Prometheus.

use super::{DEADLINE_AT_RISK, HotPartition, PARTITION_SKEW, UsedValues, Values};
use crate::budget_config::BudgetConfig;
use crate::capacity_estimate::{CapacitySource, Recovery};
use crate::condition::{ConditionSpec, Truth};
use crate::deadline_plan::{Plan, PlanReason, PlanSettings};
use crate::drain::group_capacity;
use crate::format::{busiest_owning, seconds, si};
use crate::phase::BudgetPhase;

pub(super) fn skew_condition(hot: Option<&HotPartition>, replicas: u32) -> ConditionSpec {
    let Some(hot) = hot else {
        return ConditionSpec::new(PARTITION_SKEW, Truth::False, "BacklogSpread", "");
    };
    let (partition, share) = (&hot.skew.partition, hot.skew.share * 100.0);
    let receives = hot.hot_rate.map_or_else(String::new, |rate| {
        format!(" and receives about {}/s", si(rate))
    });
    if hot.helped {
        ConditionSpec::new(
            PARTITION_SKEW,
            Truth::True,
            "HotPartitionSharesAConsumer",
            format!(
                "partition {partition} holds {share:.0} % of the backlog{receives}, which one consumer completes: {replicas} replicas leave its consumer few other partitions; splitting the hot key would let fewer do"
            ),
        )
    } else {
        ConditionSpec::new(
            PARTITION_SKEW,
            Truth::True,
            "HotPartition",
            format!(
                "partition {partition} holds {share:.0} % of the backlog{receives}; more consumers cannot help: split the hot key or give it its own topic"
            ),
        )
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn explain(
    values: &Values,
    planned: &Plan,
    settings: &PlanSettings,
    usable_rate: f64,
    undrainable: bool,
    (recommendation, current): (u32, u32),
    (floor, cap): (u32, u32),
    limited_by_partitions: bool,
    waiting: Option<f64>,
) -> String {
    let lambda = values.produce_rate;
    let rate = values.per_replica_rate;
    // The claim comes first; what the plan does meanwhile follows, since it may rightly hold
    // fewer than the cap through a peak it expects to pass.
    let undrainable = undrainable.then(|| {
        let partitions = values.partitions;
        let most = si(group_capacity(cap, partitions, rate));
        let sum = match busiest_owning(cap, partitions) {
            Some(busiest) => format!("{}/s each, {busiest}: {most}/s", si(rate)),
            None => format!("{cap} × {}/s = {most}/s", si(rate)),
        };
        format!(
            "λ {}/s is at or above the most {cap} replicas can complete ({sum}): the backlog can never catch up at this rate; add partitions or speed up the consumer. ",
            si(lambda),
        )
    });
    let source = match values.used.capacity_source {
        Some(CapacitySource::Measured) => " (measured while saturated)",
        Some(CapacitySource::Prior) => " (lower bound: the consumers were never saturated)",
        Some(CapacitySource::Stale) => {
            " (lower bound: measured while saturated long ago; the consumers may have recovered)"
        }
        _ => "",
    };
    let mut text = format!(
        "{}backlog {}, λ {}/s{}, μ/replica {}/s{}",
        undrainable.unwrap_or_default(),
        si(values.scaling_backlog),
        si(lambda),
        if values.used.produce_rate_estimated {
            " (estimated)"
        } else if values.used.produce_rate_from_backlog {
            " (from the backlog's rise)"
        } else {
            ""
        },
        si(rate),
        source,
    );
    let limit = seconds(settings.age_limit);
    let peak = seconds(planned.outlook.peak_age);
    let n = planned.replicas;
    // A count that falls behind is held (or entered) while the deadline leaves room: say how
    // much it completes, as planned (without the share kept for retries), and what follows.
    let behind = match planned.keep_up {
        Some(keep_up) if planned.falls_behind => format!(
            "{n} complete {}/s, less than λ: the backlog grows while the oldest age stays below {limit} with {keep_up} from the next decision (predicted peak {peak})",
            si(values.partition_capacity(n, usable_rate))
        ),
        // No count keeps up: the plan bets on λ passing, as long as it has lasted so far.
        None if planned.falls_behind => format!(
            "{n} complete {}/s, less than λ, and no count keeps up: the oldest age stays below {limit} if λ lasts about as long as it has so far (should it stay, the oldest age would reach {peak})",
            si(values.partition_capacity(n, usable_rate))
        ),
        _ => String::new(),
    };
    text.push_str(&match planned.reason {
        PlanReason::Holding | PlanReason::ScaleDown if planned.rides_out => format!(
            " → {n}: they complete {}/s, less than λ at this peak, which has returned at a steady period; they catch it up after the peak, as after the last ones, with the oldest age below {limit}",
            si(values.partition_capacity(n, usable_rate))
        ),
        PlanReason::Holding if planned.falls_behind => format!(" → holding: {behind}"),
        PlanReason::Holding => format!(
            " → {n} replicas keep the oldest age below {limit} (predicted peak {peak})"
        ),
        PlanReason::ScaleUp if planned.falls_behind => {
            format!(" → {n}, the cheapest way through should λ last: {behind}")
        }
        // The drain limit binds too where it is the shorter: the age limit alone would not
        // explain a scale-up whose predicted peak is far below it.
        PlanReason::ScaleUp if settings.drain_limit < settings.age_limit => format!(
            " → need {n}: {current} would let the oldest age pass {limit} or keep the events waiting now past targetDrainTime {} (predicted peak {peak} with {n})",
            seconds(settings.drain_limit)
        ),
        PlanReason::ScaleUp => format!(
            " → need {n}: {current} would let the oldest age pass {limit} (predicted peak {peak} with {n})"
        ),
        PlanReason::ScaleDown if planned.falls_behind => format!(
            " → economy, {n} replicas, planned to keep the margin for {} at today's λ: {behind}",
            seconds(settings.economy_stay())
        ),
        PlanReason::ScaleDown => format!(
            " → {n} suffice: they keep the oldest age below {limit}, also if a recurring peak returns (predicted peak {peak})"
        ),
        PlanReason::Probe => {
            let why = match values.recovery_to_test {
                Some(Recovery {
                    rate,
                    configured: true,
                }) => format!(
                    "{n} keep up if the consumers complete the {}/s each of spec.capacity.perReplicaRate, and the slower rate measured long ago is only a lower bound while they idle",
                    si(rate)
                ),
                Some(Recovery { rate, .. }) => format!(
                    "{n} keep up if the consumers recovered to the {}/s each they completed before, and the rate measured since is only a lower bound while they idle",
                    si(rate)
                ),
                None => "the rate is only a lower bound while they idle".to_owned(),
            };
            format!(
                " → trying {n} to learn what the consumers complete: {why}, and even at it the partition count, asked for once the try could be measured, keeps the oldest age below {limit} (predicted peak {peak})"
            )
        }
        // The cap may keep the age but not complete the queue within targetDrainTime: say
        // which limit it misses, or the message contradicts itself ("reach 3m of 5m").
        PlanReason::CapFallsShort
            if planned.outlook.peak_age <= settings.age_limit
                && planned
                    .outlook
                    .drained_at
                    .is_none_or(|t| t > settings.drain_by()) =>
        {
            format!(
            " → need more than {cap}: even {cap} complete the events waiting now {} (targetDrainTime {}), though they keep the oldest age below {limit} (predicted peak {peak})",
            planned
                .outlook
                .drained_at
                .map_or_else(|| "only beyond the plan's horizon".to_owned(), |t| format!(
                    "only after {}",
                    seconds(t)
                )),
            seconds(settings.drain_limit)
        )
        }
        PlanReason::CapFallsShort => format!(
            " → need more than {cap}: even {cap} let the oldest age reach {peak} (limit {limit})"
        ),
        PlanReason::Recovering => format!(
            " → the oldest event is past the critical fraction: all {n} replicas until it is back below {limit}"
        ),
    });
    if limited_by_partitions {
        text.push_str(&format!(", capped at {} partitions", values.partitions));
    } else if values.awaiting_measurement && recommendation > planned.replicas {
        text.push_str(&format!(
            ", held at {recommendation} until the completions show what the last change gives (a scale-down waits for that measurement)"
        ));
    } else if recommendation != planned.replicas {
        text.push_str(&format!(", kept within [{floor}, {cap}] replicas"));
    }
    if let Some(wait) = waiting {
        text.push_str(&format!(
            "; {} to {recommendation} waits {} more (stabilization)",
            if recommendation < current {
                "scaling down"
            } else {
                "scaling up"
            },
            seconds(wait)
        ));
    }
    text
}

pub(super) fn metrics_message(used: &UsedValues) -> String {
    let mut notes = Vec::new();
    if used.oldest_age_estimated {
        notes.push("oldest unfinished age is estimated as backlog / λ because metrics.oldestUnfinishedAge is not set; export it from the consumer for a real value");
    }
    if used.produce_rate_estimated {
        notes.push("λ is estimated from the backlog trend because metrics.produceRate is not set");
    }
    if used.per_replica_rate_measured() {
        notes.push("per-replica rate is measured as completionRate / ready replicas");
    }
    if notes.is_empty() {
        "every query returned one sample".to_owned()
    } else {
        notes.join("; ")
    }
}

pub(super) fn deadline_condition(
    phase: BudgetPhase,
    oldest_age: f64,
    ratio: f64,
    config: &BudgetConfig,
    explanation: &str,
) -> ConditionSpec {
    let age = format!(
        "oldest unfinished event is {} old, {:.0}% of the {} deadline",
        seconds(oldest_age),
        ratio * 100.0,
        seconds(config.deadline_seconds)
    );
    match phase {
        BudgetPhase::Undrainable => ConditionSpec::new(
            DEADLINE_AT_RISK,
            Truth::True,
            "Undrainable",
            format!("{age}; {explanation}"),
        ),
        BudgetPhase::Breaching => {
            ConditionSpec::new(DEADLINE_AT_RISK, Truth::True, "PastCriticalThreshold", age)
        }
        BudgetPhase::AtRisk if ratio >= config.warning_at => {
            ConditionSpec::new(DEADLINE_AT_RISK, Truth::True, "PastWarningThreshold", age)
        }
        BudgetPhase::AtRisk => ConditionSpec::new(
            DEADLINE_AT_RISK,
            Truth::True,
            "BacklogGrowing",
            format!("{age}; the backlog grows at the current capacity"),
        ),
        _ => ConditionSpec::new(DEADLINE_AT_RISK, Truth::False, "WithinBudget", age),
    }
}
