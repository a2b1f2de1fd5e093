use proptest::prelude::*;

use super::*;
use crate::event_class::PauseDefinition;

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(seconds).unwrap()
}

fn at_ms(millis: i64) -> Timestamp {
    Timestamp::from_millisecond(millis).unwrap()
}

fn settings() -> BreakerSettings {
    BreakerSettings {
        mode: ClassMode::Auto,
        threshold: 0.5,
        for_seconds: 10.0,
        open_seconds: 30.0,
        max_open_seconds: 100.0,
        probe_ratio: 0.1,
        min_rate: 1.0,
    }
}

fn measured(ratio: f64) -> Reading {
    Reading::Measured {
        failure_ratio: ratio,
        execution_rate: 20.0,
    }
}

fn quiet() -> Reading {
    Reading::Quiet {
        execution_rate: 0.0,
        minimum: 1.0,
    }
}

fn missing() -> Reading {
    Reading::Missing("spec.eventClasses[x].failureRatio returned no sample".into())
}

/// Steps once per second from `from` to `to` (inclusive) with the same reading and returns the
/// memory and every transition with its time.
fn run(
    settings: &BreakerSettings,
    memory: Option<ClassMemory>,
    reading: &Reading,
    from: i64,
    to: i64,
) -> (ClassMemory, Vec<(i64, Transition)>) {
    let mut memory = memory;
    let mut transitions = Vec::new();
    for t in from..=to {
        let step = step(settings, memory.as_ref(), reading, at(t));
        if let Some(transition) = step.transition {
            transitions.push((t, transition));
        }
        memory = Some(step.memory);
    }
    (memory.unwrap(), transitions)
}

fn paused_at(settings: &BreakerSettings) -> ClassMemory {
    let (memory, transitions) = run(settings, None, &measured(0.9), 0, 10);
    assert_eq!(transitions.len(), 1);
    assert_eq!(memory.state, ClassState::Paused);
    memory
}

#[test]
fn pauses_once_the_ratio_held_for_the_full_for() {
    let (memory, transitions) = run(&settings(), None, &measured(0.8), 0, 20);
    assert_eq!(transitions.len(), 1);
    let (t, transition) = &transitions[0];
    assert_eq!(*t, 10, "first seen at 0s, `for` is 10s");
    assert_eq!(transition.from, ClassState::Active);
    assert_eq!(transition.to, ClassState::Paused);
    assert_eq!(transition.reason, TransitionReason::FailureRatioHigh);
    assert_eq!(transition.failure_ratio, Some(0.8));
    assert_eq!(transition.execution_rate, Some(20.0));
    assert!(
        transition.message.starts_with(
            "failure ratio 0.8 ≥ threshold 0.5 for 10s at 20 executions/s: paused for 30s"
        ),
        "{}",
        transition.message
    );
    assert_eq!(memory.since, at(10));
    assert_eq!(memory.open_seconds, Some(30.0));
    assert_eq!(memory.transition_ratio, Some(0.8));
    assert_eq!(memory.condition_since, None);
}

#[test]
fn the_threshold_itself_counts_as_failing() {
    let (memory, _) = run(&settings(), None, &measured(0.5), 0, 10);
    assert_eq!(memory.state, ClassState::Paused);
}

#[test]
fn a_dip_below_the_threshold_restarts_the_timer() {
    let s = settings();
    let (memory, transitions) = run(&s, None, &measured(0.9), 0, 8);
    assert!(transitions.is_empty());
    assert_eq!(memory.condition_since, Some(at(0)));
    let dipped = step(&s, Some(&memory), &measured(0.2), at(9)).memory;
    assert_eq!(dipped.condition_since, None);
    let (memory, transitions) = run(&s, Some(dipped), &measured(0.9), 10, 19);
    assert!(transitions.is_empty(), "{transitions:?}");
    let (_, transitions) = run(&s, Some(memory), &measured(0.9), 20, 20);
    assert_eq!(transitions.len(), 1);
}

#[test]
fn timers_start_at_the_next_whole_second() {
    let s = settings();
    let first = step(&s, None, &measured(0.9), at_ms(10_300));
    assert_eq!(first.memory.condition_since, Some(at(11)));
    // 9.7 s after the first reading: not yet 10 s since the stored start.
    let early = step(&s, Some(&first.memory), &measured(0.9), at_ms(20_000));
    assert!(early.transition.is_none());
    let late = step(&s, Some(&early.memory), &measured(0.9), at_ms(21_000));
    assert!(late.transition.is_some());
}

#[test]
fn missing_data_holds_every_state_and_restarts_timers() {
    let s = settings();
    let (almost, _) = run(&s, None, &measured(0.9), 0, 9);
    let held = step(&s, Some(&almost), &missing(), at(10));
    assert_eq!(held.memory.state, ClassState::Active);
    assert_eq!(held.memory.condition_since, None);
    assert!(held.transition.is_none());

    // A paused class does not start probing while nobody can watch the probes.
    let paused = paused_at(&s);
    let (memory, transitions) = run(&s, Some(paused), &missing(), 11, 200);
    assert!(transitions.is_empty());
    assert_eq!(memory.state, ClassState::Paused);
    assert_eq!(memory.since, at(10));
    // Once data is back, the elapsed open duration lets it probe at once.
    let back = step(&s, Some(&memory), &quiet(), at(201));
    assert_eq!(back.memory.state, ClassState::Probing);
}

#[test]
fn below_min_rate_no_decision_is_made() {
    let s = settings();
    let (memory, transitions) = run(&s, None, &quiet(), 0, 100);
    assert!(transitions.is_empty());
    assert_eq!(memory.state, ClassState::Active);
    assert_eq!(memory.failure_ratio, None);
}

#[test]
fn a_paused_class_probes_after_the_open_duration_without_executions() {
    let s = settings();
    let paused = paused_at(&s);
    let (memory, transitions) = run(&s, Some(paused), &quiet(), 11, 40);
    assert_eq!(transitions.len(), 1);
    let (t, transition) = &transitions[0];
    assert_eq!(*t, 40, "paused at 10s for 30s");
    assert_eq!(transition.from, ClassState::Paused);
    assert_eq!(transition.to, ClassState::Probing);
    assert_eq!(transition.reason, TransitionReason::OpenDurationElapsed);
    assert_eq!(
        transition.failure_ratio,
        Some(0.9),
        "carries the last ratio seen"
    );
    assert_eq!(memory.state, ClassState::Probing);
    assert_eq!(memory.open_seconds, Some(30.0));
}

fn probing_at(s: &BreakerSettings) -> ClassMemory {
    let (memory, _) = run(s, Some(paused_at(s)), &quiet(), 11, 40);
    assert_eq!(memory.state, ClassState::Probing);
    memory
}

#[test]
fn healthy_probes_for_the_full_for_make_the_class_active() {
    let s = settings();
    let probing = probing_at(&s);
    let (memory, transitions) = run(&s, Some(probing), &measured(0.1), 41, 60);
    assert_eq!(transitions.len(), 1);
    let (t, transition) = &transitions[0];
    assert_eq!(*t, 51);
    assert_eq!(transition.to, ClassState::Active);
    assert_eq!(transition.reason, TransitionReason::ProbesHealthy);
    assert_eq!(transition.failure_ratio, Some(0.1));
    assert_eq!(
        memory.open_seconds, None,
        "the next pause starts short again"
    );
}

#[test]
fn failing_probes_pause_again_with_the_open_duration_doubled_up_to_the_maximum() {
    let s = settings();
    let mut memory = probing_at(&s);
    let mut t = 41;
    let mut opens = Vec::new();
    for _ in 0..4 {
        let failed = step(&s, Some(&memory), &measured(0.7), at(t));
        let transition = failed.transition.expect("probes failing pause the class");
        assert_eq!(transition.reason, TransitionReason::ProbesFailing);
        assert_eq!(transition.failure_ratio, Some(0.7));
        opens.push(failed.memory.open_seconds.unwrap());
        let open = failed.memory.open_seconds.unwrap() as i64;
        let (probing, transitions) = run(&s, Some(failed.memory), &quiet(), t + 1, t + open);
        assert_eq!(transitions.len(), 1);
        assert_eq!(transitions[0].0, t + open);
        memory = probing;
        t += open + 1;
    }
    assert_eq!(opens, [60.0, 100.0, 100.0, 100.0]);
}

#[test]
fn probing_needs_only_the_probes_share_of_the_min_rate() {
    let s = settings();
    let ratio = Observation::Samples(vec![0.0]);
    let rate = Observation::Samples(vec![0.2]);
    assert_eq!(
        read(&s, "x", ClassState::Active, &ratio, &rate),
        Reading::Quiet {
            execution_rate: 0.2,
            minimum: 1.0
        }
    );
    assert_eq!(
        read(&s, "x", ClassState::Probing, &ratio, &rate),
        Reading::Measured {
            failure_ratio: 0.0,
            execution_rate: 0.2
        }
    );
}

#[test]
fn readings_name_the_query_and_the_problem() {
    let s = settings();
    let ok = Observation::Samples(vec![5.0]);
    let nan = Observation::Samples(vec![f64::NAN]);
    let empty = Observation::Samples(vec![]);
    let Reading::Missing(message) = read(&s, "refund", ClassState::Active, &ok, &empty) else {
        panic!("an empty execution rate is missing data");
    };
    assert!(
        message.starts_with("spec.eventClasses[refund].executionRate returned no sample"),
        "{message}"
    );
    let Reading::Missing(message) = read(&s, "refund", ClassState::Active, &nan, &ok) else {
        panic!("a NaN ratio with executions is missing data");
    };
    assert!(
        message.starts_with("spec.eventClasses[refund].failureRatio returned NaN"),
        "{message}"
    );
    let Reading::Missing(message) = read(&s, "refund", ClassState::Active, &ok, &ok) else {
        panic!("a ratio above 1 is missing data");
    };
    assert!(message.contains("must be within [0, 1]"), "{message}");
    let failed = Observation::Failed("connection refused".into());
    assert!(matches!(
        read(&s, "refund", ClassState::Paused, &nan, &failed),
        Reading::Missing(_)
    ));
    // Paused: nothing executes, 0/0 is NaN, and that is not missing data.
    assert_eq!(
        read(
            &s,
            "refund",
            ClassState::Paused,
            &nan,
            &Observation::Samples(vec![0.0])
        ),
        Reading::Quiet {
            execution_rate: 0.0,
            minimum: 1.0
        }
    );
}

#[test]
fn manual_override_in_both_directions() {
    let mut s = settings();
    s.mode = ClassMode::Paused;
    let paused = step(&s, None, &missing(), at(0));
    let transition = paused.transition.expect("the override pauses at once");
    assert_eq!(transition.reason, TransitionReason::PausedBySpec);
    assert_eq!(paused.memory.state, ClassState::Paused);
    // The override holds whatever the data says and however long it lasts.
    let (held, transitions) = run(&s, Some(paused.memory), &measured(0.0), 1, 500);
    assert!(transitions.is_empty());
    assert_eq!(held.state, ClassState::Paused);

    s.mode = ClassMode::Active;
    let active = step(&s, Some(&held), &measured(0.0), at(501));
    assert_eq!(
        active.transition.map(|t| (t.from, t.to, t.reason)),
        Some((
            ClassState::Paused,
            ClassState::Active,
            TransitionReason::ActivatedBySpec
        ))
    );
    let (held, transitions) = run(&s, Some(active.memory), &measured(1.0), 502, 600);
    assert!(
        transitions.is_empty(),
        "a failing class stays active by hand"
    );
    assert_eq!(held.state, ClassState::Active);
    assert_eq!(held.failure_ratio, Some(1.0), "the ratio is still recorded");

    // Back to Auto: the breaker continues from Active and pauses after `for`.
    s.mode = ClassMode::Auto;
    let (memory, transitions) = run(&s, Some(held), &measured(1.0), 601, 611);
    assert_eq!(transitions.len(), 1);
    assert_eq!(memory.state, ClassState::Paused);
}

#[test]
fn a_manual_pause_returned_to_auto_probes_after_the_open_duration() {
    let mut s = settings();
    s.mode = ClassMode::Paused;
    let paused = step(&s, None, &quiet(), at(0)).memory;
    s.mode = ClassMode::Auto;
    let (memory, transitions) = run(&s, Some(paused), &quiet(), 1, 30);
    assert_eq!(transitions.len(), 1);
    assert_eq!(memory.state, ClassState::Probing);
}

#[test]
fn the_spec_shortening_max_open_duration_shortens_a_running_pause() {
    let s = settings();
    let mut paused = paused_at(&s);
    paused.open_seconds = Some(1000.0);
    let (memory, transitions) = run(&s, Some(paused), &quiet(), 11, 110);
    assert_eq!(transitions.len(), 1);
    assert_eq!(transitions[0].0, 110, "clamped to maxOpenDuration 100s");
    assert_eq!(memory.state, ClassState::Probing);
}

fn class(policy: PauseDefinition) -> ClassDefinition {
    ClassDefinition {
        name: "refund".into(),
        min_rate: 1.0,
        mode: ClassMode::Auto,
        pause_policy: policy,
    }
}

#[test]
fn settings_come_from_the_spec_with_errors_naming_the_field() {
    let settings = BreakerSettings::from_spec(&class(PauseDefinition::default())).unwrap();
    assert_eq!(settings.for_seconds, 120.0);
    assert_eq!(settings.open_seconds, 300.0);
    assert_eq!(settings.max_open_seconds, 3600.0);
    assert_eq!(settings.threshold, 0.5);

    let error = |policy: PauseDefinition| {
        BreakerSettings::from_spec(&class(policy))
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        error(PauseDefinition {
            for_: "soon".into(),
            ..PauseDefinition::default()
        }),
        "spec.eventClasses[refund].pausePolicy.for \"soon\" is not a duration: use Go syntax such as 250ms, 30s or 5m"
    );
    assert!(
        error(PauseDefinition {
            threshold: 0.0,
            ..PauseDefinition::default()
        })
        .starts_with("spec.eventClasses[refund].pausePolicy.threshold (0) must be in (0, 1]")
    );
    assert!(
        error(PauseDefinition {
            probe_ratio: 1.5,
            ..PauseDefinition::default()
        })
        .starts_with("spec.eventClasses[refund].pausePolicy.probeRatio (1.5)")
    );
    assert!(
        error(PauseDefinition {
            open_duration: "2h".into(),
            ..PauseDefinition::default()
        })
        .contains("maxOpenDuration (1h) must be at least openDuration (2h)")
    );
    let mut negative = class(PauseDefinition::default());
    negative.min_rate = -1.0;
    assert!(
        BreakerSettings::from_spec(&negative)
            .unwrap_err()
            .to_string()
            .starts_with("spec.eventClasses[refund].minRate (-1)")
    );
}

// ---------------------------------------------------------------------------
// Properties

fn any_state() -> impl Strategy<Value = ClassState> {
    prop_oneof![
        Just(ClassState::Active),
        Just(ClassState::Paused),
        Just(ClassState::Probing),
    ]
}

fn any_settings() -> impl Strategy<Value = BreakerSettings> {
    (
        0.05..=1.0f64,
        1u32..60,
        1u32..120,
        0u32..600,
        0.05..=1.0f64,
        0.0..5.0f64,
    )
        .prop_map(
            |(threshold, for_s, open, extra, probe_ratio, min_rate)| BreakerSettings {
                mode: ClassMode::Auto,
                threshold,
                for_seconds: f64::from(for_s),
                open_seconds: f64::from(open),
                max_open_seconds: f64::from(open + extra),
                probe_ratio,
                min_rate,
            },
        )
}

fn any_memory() -> impl Strategy<Value = ClassMemory> {
    (
        any_state(),
        0i64..1000,
        prop::option::of(0i64..1000),
        prop::option::of(1.0..1000.0f64),
        prop::option::of(0.0..=1.0f64),
    )
        .prop_map(|(state, since, condition, open, ratio)| ClassMemory {
            state,
            since: at(since),
            condition_since: condition.map(at),
            open_seconds: open,
            failure_ratio: ratio,
            transition_ratio: ratio,
            message: String::new(),
        })
}

fn any_reading() -> impl Strategy<Value = Reading> {
    prop_oneof![
        2 => (0.0..=1.0f64, 0.0..50.0f64).prop_map(|(failure_ratio, execution_rate)| Reading::Measured { failure_ratio, execution_rate }),
        1 => (0.0..1.0f64).prop_map(|execution_rate| Reading::Quiet { execution_rate, minimum: 1.0 }),
        1 => Just(missing()),
    ]
}

/// The edges of the automatic state machine.
fn allowed(from: ClassState, to: ClassState) -> bool {
    matches!(
        (from, to),
        (ClassState::Active, ClassState::Paused)
            | (ClassState::Paused, ClassState::Probing)
            | (ClassState::Probing, ClassState::Active)
            | (ClassState::Probing, ClassState::Paused)
    )
}

proptest! {
    #[test]
    fn missing_data_never_changes_a_state(
        s in any_settings(),
        memory in any_memory(),
        later in 0i64..100_000,
    ) {
        let step = step(&s, Some(&memory), &missing(), at(1000 + later));
        prop_assert!(step.transition.is_none());
        prop_assert_eq!(step.memory.state, memory.state);
        prop_assert_eq!(step.memory.since, memory.since);
        prop_assert_eq!(step.memory.failure_ratio, memory.failure_ratio);
    }

    #[test]
    fn below_the_minimum_only_the_open_duration_moves_a_class(
        s in any_settings(),
        memory in any_memory(),
        later in 0i64..100_000,
    ) {
        let step = step(&s, Some(&memory), &quiet(), at(1000 + later));
        match step.transition {
            None => prop_assert_eq!(step.memory.state, memory.state),
            Some(transition) => {
                prop_assert_eq!(memory.state, ClassState::Paused);
                prop_assert_eq!(transition.to, ClassState::Probing);
                prop_assert_eq!(transition.reason, TransitionReason::OpenDurationElapsed);
            }
        }
    }

    #[test]
    fn an_override_always_wins(
        s in any_settings(),
        memory in prop::option::of(any_memory()),
        reading in any_reading(),
        pause in any::<bool>(),
    ) {
        let mut s = s;
        s.mode = if pause { ClassMode::Paused } else { ClassMode::Active };
        let wanted = if pause { ClassState::Paused } else { ClassState::Active };
        let step = step(&s, memory.as_ref(), &reading, at(2000));
        prop_assert_eq!(step.memory.state, wanted);
        let changed = memory.map_or(ClassState::Active, |m| m.state) != wanted;
        prop_assert_eq!(step.transition.is_some(), changed);
    }

    /// Random runs: only the state machine's edges are taken, the pause length stays within
    /// bounds, data-based transitions carry the ratio that caused them, and a class is paused
    /// only after `for` of continuous readings at or above the threshold.
    #[test]
    fn runs_follow_the_state_machine(
        s in any_settings(),
        readings in prop::collection::vec((any_reading(), 1i64..20), 1..150),
    ) {
        let mut memory: Option<ClassMemory> = None;
        let mut t = 0i64;
        // Times of the current run of failing readings (Active only).
        let mut failing_since: Option<i64> = None;
        for (reading, gap) in readings {
            t += gap;
            let state = memory.as_ref().map_or(ClassState::Active, |m| m.state);
            let failing = matches!(reading, Reading::Measured { failure_ratio, .. } if failure_ratio >= s.threshold);
            failing_since = if failing { failing_since.or(Some(t)) } else { None };
            let step = step(&s, memory.as_ref(), &reading, at(t));
            if let Some(open) = step.memory.open_seconds {
                prop_assert!(open >= s.open_seconds && open <= s.max_open_seconds, "{}", open);
            }
            if let Some(transition) = &step.transition {
                prop_assert_eq!(transition.from, state);
                prop_assert!(allowed(transition.from, transition.to), "{:?}", transition);
                prop_assert_eq!(step.memory.state, transition.to);
                prop_assert_eq!(step.memory.since, at(t));
                match transition.reason {
                    TransitionReason::FailureRatioHigh => {
                        let ratio = transition.failure_ratio.expect("carries the ratio");
                        prop_assert!(ratio >= round3(s.threshold) - 1e-9);
                        let since = failing_since.expect("a failing run");
                        prop_assert!((t - since) as f64 >= s.for_seconds, "paused after {}s of {}", t - since, s.for_seconds);
                    }
                    TransitionReason::ProbesFailing => {
                        prop_assert!(transition.failure_ratio.expect("carries the ratio") >= round3(s.threshold) - 1e-9);
                    }
                    TransitionReason::ProbesHealthy => {
                        // The ratio carried is rounded to three decimals, as shown: a ratio just
                        // below the threshold may round up to it, never past it.
                        prop_assert!(transition.failure_ratio.expect("carries the ratio") <= round3(s.threshold) + 1e-9);
                    }
                    TransitionReason::OpenDurationElapsed => {
                        prop_assert!(!matches!(reading, Reading::Missing(_)));
                    }
                    TransitionReason::PausedBySpec | TransitionReason::ActivatedBySpec => {
                        prop_assert!(false, "no override in Auto");
                    }
                }
            } else {
                prop_assert_eq!(step.memory.state, state);
            }
            if matches!(reading, Reading::Missing(_)) {
                prop_assert!(step.transition.is_none());
            }
            memory = Some(step.memory);
        }
    }

    /// The memory survives the whole-second precision of status: stepping from a memory read
    /// back from whole seconds never transitions earlier than from the exact one.
    #[test]
    fn whole_second_timers_are_never_early(
        s in any_settings(),
        start_ms in 0i64..10_000,
        offset_ms in 0i64..200_000,
    ) {
        let first = step(&s, None, &measured(1.0), at_ms(start_ms));
        let stored = first.memory.condition_since.expect("failing starts the timer");
        prop_assert_eq!(stored.subsec_nanosecond(), 0);
        let now = at_ms(start_ms + offset_ms);
        let later = step(&s, Some(&first.memory), &measured(1.0), now);
        if later.transition.is_some() {
            prop_assert!(offset_ms as f64 / 1000.0 >= s.for_seconds);
        }
    }
}
