//! The budget plan: what one poll decides, in which order, and what survives a failed step.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;

use super::*;
use crate::api::backlog_budget::ClassState;
use crate::api::conditions::find;
use crate::controller::budget::classes::ClassObservations;
use crate::controller::budget::control_document::{ConfigMapFact, PolicySource};
use crate::controller::budget::document_copy::DocumentCopy;
use crate::controller::budget::facts::Observed;
use crate::controller::budget::inputs::MetricObservations;
use crate::controller::budget::target::{TargetProblem, Workload};
use crate::controller::plan::execute;
use crate::controller::plan::testing::Recorder;
use crate::core::metric_input::Observation;

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(seconds).unwrap()
}

/// 12 partitions of 100 events/s per replica; one event class that can be paused.
fn budget() -> BacklogBudget {
    let mut budget: BacklogBudget = serde_json::from_value(serde_json::json!({
        "apiVersion": "backlog.dev/v1alpha1",
        "kind": "BacklogBudget",
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u-1", "generation": 2},
        "spec": {
            "scaleTargetRef": {"kind": "Deployment", "name": "orders"},
            "minReplicas": 1,
            "maxReplicas": 12,
            "completionDeadline": "10m",
            "metrics": {"backlog": "lag", "oldestUnfinishedAge": "age", "produceRate": "rate"},
            "partitionCount": 12,
            "capacity": {"perReplicaRate": 100.0, "reservedRetryShare": 0.0},
            "pollInterval": "1s",
            "eventClasses": [{
                "name": "refund",
                "failureRatio": "ratio",
                "executionRate": "executions",
                "pausePolicy": {"for": "2s", "openDuration": "3s", "maxOpenDuration": "10s"}
            }]
        }
    }))
    .unwrap();
    budget.metadata.creation_timestamp = Some(Time(at(0)));
    budget
}

fn value(x: f64) -> Observation {
    Observation::Samples(vec![x])
}

/// `backlog` events waiting, `rate` arriving per second, the refund class failing at `ratio`.
fn facts(backlog: f64, rate: f64, replicas: u32, ratio: f64) -> BudgetFacts {
    aged_facts(backlog, 10.0, rate, replicas, ratio)
}

/// 550/s arriving on 2 replicas (200/s) for long enough that the oldest event is 260 s old:
/// waiting any longer would pass the limit (270 s), so 6 replicas now.
fn behind_facts() -> BudgetFacts {
    aged_facts(550.0 * 260.0, 260.0, 550.0, 2, 0.0)
}

fn aged_facts(backlog: f64, age: f64, rate: f64, replicas: u32, ratio: f64) -> BudgetFacts {
    BudgetFacts::Observed(Box::new(Observed {
        workload: Workload {
            replicas,
            ready: Some(replicas),
        },
        scaling: ScalingFacts::Observed(Box::new(MetricObservations {
            backlog: value(backlog),
            oldest_age: Some(value(age)),
            produce_rate: Some(value(rate)),
            completion_rate: None,
            retry_rate: None,
            quarantine_rate: None,
            partitions: None,
            peak_produce_rate: None,
            partition_backlogs: None,
            class_backlogs: vec![],
        })),
        classes: vec![ClassObservations {
            failure_ratio: value(ratio),
            execution_rate: value(10.0),
        }],
        policy: Ok(PolicySource::Unset),
        configmap: ConfigMapFact::Absent,
        grouping: None,
    }))
}

/// The step kinds of a plan, in order.
fn shape(plan: &BudgetPlan) -> Vec<String> {
    plan.steps
        .iter()
        .map(|step| match step {
            BudgetStep::Scale(change) => format!("Scale {}→{}", change.from, change.to),
            BudgetStep::WriteStatus(_) => "WriteStatus".to_owned(),
            BudgetStep::Publish(event) => format!("Event {}", event.reason),
            BudgetStep::WriteDocument(_) => "WriteDocument".to_owned(),
        })
        .collect()
}

/// What the API server holds between polls: the status and the control ConfigMap.
#[derive(Default)]
struct World {
    status: BacklogBudgetStatus,
    configmap: Option<k8s_openapi::api::core::v1::ConfigMap>,
}

impl World {
    /// The facts of `observed` with the ConfigMap as the poll would read it.
    fn facts(&self, observed: BudgetFacts) -> BudgetFacts {
        let mut facts = observed;
        if let BudgetFacts::Observed(observed) = &mut facts {
            let copy = self.configmap.as_ref().map(DocumentCopy::of);
            observed.configmap = ConfigMapFact::of(copy.as_ref(), Some("u-1"));
        }
        facts
    }

    /// One poll at `t` whose every step succeeds.
    fn poll(&mut self, budget: &BacklogBudget, observed: BudgetFacts, t: i64) -> BudgetPlan {
        let plan = decide(
            &BudgetSettings::of(budget),
            &self.facts(observed),
            &self.status,
            at(t),
        );
        for step in &plan.steps {
            match step {
                BudgetStep::WriteStatus(status) => self.status = status.as_ref().clone(),
                BudgetStep::WriteDocument(configmap) => {
                    self.configmap = Some(configmap.as_ref().clone());
                }
                _ => {}
            }
        }
        plan
    }

    /// Polls once a second from `from` to `to`.
    fn settle(
        &mut self,
        budget: &BacklogBudget,
        observed: impl Fn() -> BudgetFacts,
        from: i64,
        to: i64,
    ) {
        for t in from..=to {
            self.poll(budget, observed(), t);
        }
    }
}

#[test]
fn a_first_poll_scales_then_records_then_publishes_the_document() {
    let budget = budget();
    // 550/s needs 6 replicas of 100/s, each owning 2 of the 12 partitions (5 would leave
    // one owning 3); 2 run.
    let plan = decide(
        &BudgetSettings::of(&budget),
        &behind_facts(),
        &BacklogBudgetStatus::default(),
        at(100),
    );
    assert_eq!(
        shape(&plan),
        [
            "Scale 2→6",
            "Event ScaledUp",
            "WriteStatus",
            // Healthy at the first look is no change of phase: no Event.
            "WriteDocument"
        ]
    );
    let last = plan
        .status
        .last_scale
        .as_ref()
        .expect("the scale is recorded");
    assert_eq!((last.from, last.to), (2, 6));
    assert_eq!(plan.status.observed_generation, Some(2));
    assert_eq!(plan.status.control_document_revision, Some(1));
    assert_eq!(plan.requeue, Duration::from_secs(1));
    let ready = find(&plan.status.conditions, readiness::READY).unwrap();
    assert_eq!(ready.status, "True");
}

/// `facts` with the produce rate's 24-hour peak at `peak`.
fn facts_with_peak(rate: f64, replicas: u32, peak: Option<Observation>) -> BudgetFacts {
    let mut facts = facts(0.0, rate, replicas, 0.0);
    if let BudgetFacts::Observed(observed) = &mut facts
        && let ScalingFacts::Observed(metrics) = &mut observed.scaling
    {
        metrics.peak_produce_rate = peak;
    }
    facts
}

#[test]
fn a_peak_the_partitions_cannot_carry_is_a_capacity_plan_problem_while_healthy() {
    let budget = budget();
    // Now 300/s, 3 replicas, healthy; yesterday's peak of 1500/s is above 12 × 100/s.
    let plan = decide(
        &BudgetSettings::of(&budget),
        &facts_with_peak(300.0, 3, Some(value(1500.0))),
        &BacklogBudgetStatus::default(),
        at(100),
    );
    assert_eq!(plan.status.phase, Some(BudgetPhase::Healthy));
    let condition = find(&plan.status.conditions, "CapacityPlan").unwrap();
    assert_eq!(condition.status, "False");
    assert_eq!(condition.reason, "UndrainableAtPeak");
    assert!(
        condition.message.contains("15 partitions"),
        "{}",
        condition.message
    );
    assert_eq!(plan.status.capacity_headroom, Some(0.8));

    // A peak they carry fits, with its headroom; an unanswered peak query is unknown; a
    // history without a sample yet, or with a lower peak than now, is the rate now (300/s).
    for (peak, status, headroom) in [
        (Some(value(600.0)), "True", Some(2.0)),
        (Some(Observation::Samples(vec![])), "True", Some(4.0)),
        (Some(value(200.0)), "True", Some(4.0)),
        (Some(Observation::Failed("timeout".into())), "Unknown", None),
        (None, "Unknown", None),
    ] {
        let plan = decide(
            &BudgetSettings::of(&budget),
            &facts_with_peak(300.0, 3, peak),
            &BacklogBudgetStatus::default(),
            at(100),
        );
        let condition = find(&plan.status.conditions, "CapacityPlan").unwrap();
        assert_eq!(condition.status, status, "{}", condition.message);
        assert_eq!(plan.status.capacity_headroom, headroom);
    }
}

#[test]
fn a_scale_up_slower_than_the_age_limit_asks_for_replicas_held_running() {
    // A 2-minute deadline warned at half (60 s), 1 s polls, 90 s pod starts, 40 s
    // rebalances: a rise to yesterday's 700/s must be held for 132 s by the replicas running,
    // which must complete 700 × 72 / 92 = 548/s: 6 replicas of 100/s (2 partitions each).
    let slow = |pod_start: &str| {
        let mut budget = budget();
        budget.spec.completion_deadline = "2m".to_owned();
        budget.spec.scaling = serde_json::from_value(serde_json::json!({
            "podStartTime": pod_start, "rebalanceCost": "40s"
        }))
        .unwrap();
        budget
    };
    let plan = decide(
        &BudgetSettings::of(&slow("90s")),
        &facts_with_peak(300.0, 3, Some(value(700.0))),
        &BacklogBudgetStatus::default(),
        at(100),
    );
    let condition = find(&plan.status.conditions, "CapacityPlan").unwrap();
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("False", "ReactionSlowerThanAgeLimit"),
        "{}",
        condition.message
    );
    assert!(
        condition.message.contains("raise spec.minReplicas to 6"),
        "{}",
        condition.message
    );
    // Pods that start in 10 s are there within the 60 s.
    let plan = decide(
        &BudgetSettings::of(&slow("10s")),
        &facts_with_peak(300.0, 3, Some(value(700.0))),
        &BacklogBudgetStatus::default(),
        at(100),
    );
    let condition = find(&plan.status.conditions, "CapacityPlan").unwrap();
    assert_eq!(condition.reason, "Fits", "{}", condition.message);
}

#[test]
fn nothing_new_is_no_step() {
    let budget = budget();
    let mut world = World::default();
    world.settle(&budget, || facts(0.0, 550.0, 6, 0.0), 0, 3);
    let plan = world.poll(&budget, facts(0.0, 550.0, 6, 0.0), 4);
    assert_eq!(shape(&plan), Vec::<String>::new());
}

#[test]
fn a_class_pausing_is_recorded_announced_and_published_in_that_order() {
    let budget = budget();
    let mut world = World::default();
    world.settle(&budget, || facts(0.0, 550.0, 6, 0.0), 0, 3);
    // The class fails from t=4 on; `for` is 2s, so it pauses at t=6.
    world.settle(&budget, || facts(0.0, 550.0, 6, 0.9), 4, 5);
    let plan = world.poll(&budget, facts(0.0, 550.0, 6, 0.9), 6);
    assert_eq!(
        shape(&plan),
        ["WriteStatus", "Event ClassPaused", "WriteDocument"]
    );
    assert_eq!(plan.status.event_classes[0].state, ClassState::Paused);
    let BudgetStep::WriteDocument(configmap) = &plan.steps[2] else {
        panic!("the document is last");
    };
    let document = control_document::document_of(configmap).expect("a valid document");
    assert_eq!(
        document.event_class("refund").map(|c| c.state),
        Some(ClassState::Paused)
    );
    let BudgetStep::Publish(event) = &plan.steps[1] else {
        panic!("the Event follows the status");
    };
    assert_eq!(event.type_, EventType::Warning);
    assert_eq!(event.action, "FailureRatioHigh/refund");
}

/// Runs `plan` with the steps at `fail` failing; the kinds of the steps that ran.
fn run_failing(plan: &BudgetPlan, fail: &[usize]) -> (Vec<String>, bool) {
    let recorder = Recorder::failing(fail.iter().copied());
    let executed = futures::executor::block_on(execute(&plan.steps, &recorder));
    let ran = BudgetPlan {
        steps: recorder.performed(),
        ..plan.clone()
    };
    (shape(&ran), executed.into_result().is_err())
}

#[test]
fn a_failed_scale_writes_and_announces_nothing() {
    let budget = budget();
    let plan = decide(
        &BudgetSettings::of(&budget),
        &facts(0.0, 550.0, 2, 0.0),
        &BacklogBudgetStatus::default(),
        at(100),
    );
    assert_eq!(run_failing(&plan, &[0]), (vec![], true));
}

#[test]
fn a_failed_status_write_announces_nothing_and_publishes_no_document() {
    let budget = budget();
    let plan = decide(
        &BudgetSettings::of(&budget),
        &behind_facts(),
        &BacklogBudgetStatus::default(),
        at(100),
    );
    // The scale and its Event happened; nothing that describes the unwritten status did.
    assert_eq!(
        run_failing(&plan, &[2]),
        (
            vec!["Scale 2→6".to_owned(), "Event ScaledUp".to_owned()],
            true
        )
    );
}

#[test]
fn a_failed_document_write_loses_no_class_event() {
    let budget = budget();
    let settings = BudgetSettings::of(&budget);
    let mut world = World::default();
    world.settle(&budget, || facts(0.0, 550.0, 6, 0.0), 0, 3);
    world.settle(&budget, || facts(0.0, 550.0, 6, 0.9), 4, 5);
    let plan = decide(
        &settings,
        &world.facts(facts(0.0, 550.0, 6, 0.9)),
        &world.status,
        at(6),
    );
    let (ran, failed) = run_failing(&plan, &[2]);
    assert_eq!(ran, ["WriteStatus", "Event ClassPaused"]);
    assert!(
        failed,
        "the reconcile fails, so the document is written at the retry"
    );
    // The retry, from the written status and the old document: the document again, no second
    // Event.
    world.status = plan.status.clone();
    let retry = shape(&world.poll(&budget, facts(0.0, 550.0, 6, 0.9), 7));
    assert_eq!(retry.last().map(String::as_str), Some("WriteDocument"));
    assert!(
        !retry.iter().any(|step| step.starts_with("Event")),
        "{retry:?}"
    );
}

#[test]
fn an_unusable_spec_or_target_only_says_why() {
    let mut broken = budget();
    broken.spec.completion_deadline = "soon".into();
    let plan = decide(
        &BudgetSettings::of(&broken),
        &BudgetFacts::Unread,
        &BacklogBudgetStatus::default(),
        at(0),
    );
    assert_eq!(shape(&plan), ["WriteStatus", "Event Invalid"]);
    let condition = find(&plan.status.conditions, SCALING_ACTIVE).unwrap();
    assert_eq!(condition.reason, "InvalidSpec");
    assert_eq!(plan.requeue, INVALID_RETRY);

    let budget = budget();
    let missing = BudgetFacts::TargetUnusable(TargetProblem::NotFound {
        kind: "Deployment".into(),
        name: "orders".into(),
    });
    let plan = decide(
        &BudgetSettings::of(&budget),
        &missing,
        &BacklogBudgetStatus::default(),
        at(0),
    );
    assert_eq!(shape(&plan), ["WriteStatus", "Event Invalid"]);
    let condition = find(&plan.status.conditions, SCALING_ACTIVE).unwrap();
    assert_eq!(condition.reason, "TargetUnavailable");
    assert!(
        condition
            .message
            .contains("Deployment orders does not exist")
    );
    let stalled = find(&plan.status.conditions, readiness::STALLED).unwrap();
    assert_eq!(stalled.status, "True");
}

#[test]
fn another_autoscaler_is_a_conflict_and_nothing_is_scaled() {
    let budget = budget();
    let BudgetFacts::Observed(mut observed) = facts(0.0, 550.0, 2, 0.0) else {
        unreachable!()
    };
    observed.scaling = ScalingFacts::OwnedElsewhere("HorizontalPodAutoscaler keda".into());
    let plan = decide(
        &BudgetSettings::of(&budget),
        &BudgetFacts::Observed(observed),
        &BacklogBudgetStatus::default(),
        at(0),
    );
    assert!(!shape(&plan).iter().any(|step| step.starts_with("Scale")));
    assert_eq!(plan.status.phase, Some(BudgetPhase::Conflict));
}

/// Where a step may stand in a plan: the scale and its Event, then the status, then the Events
/// that describe the status, then the control document.
fn rank(step: &BudgetStep) -> u8 {
    match step {
        BudgetStep::Scale(_) => 0,
        BudgetStep::Publish(event) if event.reason.starts_with("Scaled") => 1,
        BudgetStep::WriteStatus(_) => 2,
        BudgetStep::Publish(_) => 3,
        BudgetStep::WriteDocument(_) => 4,
    }
}

proptest::proptest! {
    /// Whatever the numbers and however far the class has gone, the steps come in that order;
    /// and whichever step fails, no Event describing the status runs without the status written,
    /// and nothing runs after a failed scale.
    #[test]
    fn steps_keep_their_order_and_no_event_outlives_a_failed_write(
        backlog in 0.0f64..100_000.0,
        rate in 0.0f64..5_000.0,
        replicas in 1u32..12,
        failing_from in 0i64..8,
        polls in 0i64..12,
        fail in 0usize..6,
    ) {
        let budget = budget();
        let mut world = World::default();
        let observed = |t: i64| {
            let ratio = if t >= failing_from { 0.9 } else { 0.0 };
            facts(backlog, rate, replicas, ratio)
        };
        for t in 0..polls {
            world.poll(&budget, observed(t), t);
        }
        let plan = decide(
            &BudgetSettings::of(&budget),
            &world.facts(observed(polls)),
            &world.status,
            at(polls),
        );
        let ranks: Vec<u8> = plan.steps.iter().map(rank).collect();
        proptest::prop_assert!(ranks.windows(2).all(|w| w[0] <= w[1]), "{:?}", shape(&plan));
        proptest::prop_assert!(ranks.iter().filter(|r| **r == 0).count() <= 1);

        let recorder = Recorder::failing([fail]);
        let executed = futures::executor::block_on(execute(&plan.steps, &recorder));
        let performed = recorder.performed();
        let wrote_status = performed.iter().any(|s| matches!(s, BudgetStep::WriteStatus(_)));
        proptest::prop_assert!(
            wrote_status || !performed.iter().any(|s| rank(s) == 3),
            "{:?}", shape(&plan)
        );
        if matches!(plan.steps.get(fail), Some(BudgetStep::Scale(_))) {
            proptest::prop_assert!(performed.is_empty());
        }
        let failed_write = matches!(
            plan.steps.get(fail),
            Some(BudgetStep::Scale(_) | BudgetStep::WriteStatus(_) | BudgetStep::WriteDocument(_))
        );
        proptest::prop_assert_eq!(executed.into_result().is_err(), failed_write);
    }
}

#[test]
fn a_phase_event_reports_a_change_and_a_first_look_that_is_not_healthy() {
    let with_phase = |phase: Option<BudgetPhase>| BacklogBudgetStatus {
        phase,
        ..Default::default()
    };
    let reason = |previous, next| {
        phase_event(&with_phase(previous), &with_phase(next)).map(|event| event.reason)
    };
    assert_eq!(reason(None, Some(BudgetPhase::Healthy)), None);
    assert_eq!(
        reason(None, Some(BudgetPhase::AtRisk)),
        Some("AtRisk".into())
    );
    assert_eq!(
        reason(Some(BudgetPhase::AtRisk), Some(BudgetPhase::Healthy)),
        Some("Healthy".into())
    );
    assert_eq!(
        reason(Some(BudgetPhase::Healthy), Some(BudgetPhase::Healthy)),
        None
    );
    assert_eq!(reason(Some(BudgetPhase::Healthy), None), None);
}

/// The decision memory keeps each status packed ([`PackedStatus`]); the next poll must read
/// exactly what this one decided, or it would continue from other numbers and times, and
/// a status that differs from the one written would be news at every poll.
#[test]
fn every_decided_status_reads_back_from_the_memory_as_decided() {
    use crate::controller::budget::packed_status::PackedStatus;
    let budget = budget();
    let settings = BudgetSettings::of(&budget);
    // Microsecond times, as the decision clock reads them, not on whole seconds.
    let start = Timestamp::new(1_800_000_000, 123_457_000).unwrap();
    let polls = [
        behind_facts(),
        facts(90_000.0, 550.0, 6, 0.9),
        aged_facts(60_000.0, 130.7, 550.0, 6, 0.9),
        aged_facts(2_000.0, 3.3, 120.0, 6, 0.95),
        facts(0.0, 120.0, 6, 0.0),
        facts(0.0, 120.0, 2, 0.0),
    ];
    let mut previous = BacklogBudgetStatus::default();
    for (poll, facts) in polls.iter().enumerate() {
        let micros = i64::try_from(poll).unwrap() * 1_033_333;
        let now = start
            .checked_add(k8s_openapi::jiff::SignedDuration::from_micros(micros))
            .unwrap();
        let status = decide(&settings, facts, &previous, now).status;
        let remembered = PackedStatus::pack(&status).unpack().expect("unpacks");
        // Conditions' transition times keep whole seconds, as on the API server (and in the
        // status's fingerprint); everything else reads back exactly.
        let without_conditions = |status: &BacklogBudgetStatus| BacklogBudgetStatus {
            conditions: vec![],
            ..status.clone()
        };
        assert_eq!(
            without_conditions(&remembered),
            without_conditions(&status),
            "poll {poll}"
        );
        assert_eq!(
            serde_json::to_value(&remembered.conditions).unwrap(),
            serde_json::to_value(&status.conditions).unwrap(),
            "poll {poll}"
        );
        previous = remembered;
    }
    assert!(previous.last_scale.is_some() && !previous.recent_demand.is_empty());
}
