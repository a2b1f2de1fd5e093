use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::api::backlog_budget::{BudgetPhase, DemandBucket, LastScale, Observed};

fn condition(type_: &str, status: &str, reason: &str, message: &str, second: i64) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time: Time(Timestamp::from_second(second).expect("a time")),
        observed_generation: Some(3),
    }
}

/// A status as a budget polls it, with wording and numbers of its own (not the dictionary's).
fn decided() -> BacklogBudgetStatus {
    // Times of the decision's own memory carry microseconds, which must survive.
    let precise = Timestamp::new(1_800_000_123, 456_789_000).expect("a time");
    BacklogBudgetStatus {
        observed_generation: Some(3),
        phase: Some(BudgetPhase::AtRisk),
        observed: Some(Observed {
            backlog: Some(48_213.0),
            produce_rate: Some(912.5),
            at: Some(MicroTime(precise)),
            backlog_since: Some(MicroTime(precise)),
            ..Observed::default()
        }),
        last_scale: Some(LastScale {
            at: MicroTime(precise),
            from: 4,
            to: 6,
            reason: "backlog 48.2k, λ 912/s, μ/replica 400/s → need 6".into(),
            age_limit_seconds: Some(300.0),
        }),
        recent_demand: vec![
            DemandBucket {
                at: MicroTime(precise),
                produce_rate: 912.5,
            },
            DemandBucket {
                at: MicroTime(Timestamp::new(1_800_000_600, 1_000).expect("a time")),
                produce_rate: 0.1 + 0.2,
            },
        ],
        explanation: Some("oldest event 7m12s of 10m0s: 6 replicas drain 48213 in 3m2s".into()),
        conditions: vec![
            condition(
                "CapacityPlan",
                "True",
                "Fits",
                "24 replicas complete 9.6k/s, 3.1× the peak produce rate of the last 24h (3.1k/s)",
                1_799_990_000,
            ),
            condition(
                "DeadlineAtRisk",
                "True",
                "PastWarningThreshold",
                "oldest unfinished event is 7m12s old, 72% of the 10m deadline",
                1_800_000_000,
            ),
            condition(
                "MetricsAvailable",
                "True",
                "AllQueriesAnswered",
                "every query returned one sample",
                1_799_990_000,
            ),
            condition(
                "ControlDocumentPublished",
                "True",
                "Published",
                "ConfigMap billing-backlog-control key control.json, revision 7: retry policy billing-retries, 2 event classes",
                1_799_990_000,
            ),
            condition(
                "ScalingActive",
                "True",
                "ScaledUp",
                "4 → 6 replicas: backlog 48.2k, λ 912/s, μ/replica 400/s → 6 replicas keep the oldest age below 5m (predicted peak 8m1s)",
                1_800_000_000,
            ),
            condition(
                "Ready",
                "False",
                "AtRisk",
                "oldest unfinished event is 7m12s old, 72% of the 10m deadline",
                1_800_000_000,
            ),
        ],
        ..BacklogBudgetStatus::default()
    }
}

#[test]
fn a_status_unpacks_as_it_was_packed_with_its_own_times_exact() {
    let status = decided();
    let packed = PackedStatus::pack(&status);
    assert_eq!(packed.unpack().expect("unpacks"), status);
    let empty = BacklogBudgetStatus::default();
    assert_eq!(PackedStatus::pack(&empty).unpack().expect("unpacks"), empty);
    assert!(PackedStatus::pack(&empty).packed_bytes() < 8);
}

#[test]
fn numbers_unpack_to_the_same_bits() {
    // Numbers the decision carries from poll to poll (its demand history, measured rates)
    // must read back exactly, or a status would differ from the one written and be news
    // at every poll.
    let awkward = [
        0.1 + 0.2,
        1.0 / 3.0,
        123_456.789_012_345_68,
        f64::MAX,
        f64::MIN_POSITIVE,
        5e-324,
        -0.0,
        2.0_f64.powi(60) + 1.0,
    ];
    for value in awkward {
        let status = BacklogBudgetStatus {
            drain_time_seconds: Some(value),
            ..decided()
        };
        let back = PackedStatus::pack(&status).unpack().expect("unpacks");
        assert_eq!(
            back.drain_time_seconds.map(f64::to_bits),
            Some(value.to_bits()),
            "{value:e}"
        );
    }
}

#[test]
fn the_decision_clock_reads_whole_microseconds() {
    let now = decision_clock();
    assert_eq!(now.subsec_nanosecond() % 1_000, 0);
    let status = BacklogBudgetStatus {
        busy_since: Some(MicroTime(now)),
        ..BacklogBudgetStatus::default()
    };
    assert_eq!(
        PackedStatus::pack(&status).unpack().expect("unpacks"),
        status
    );
}

#[test]
fn a_status_packs_to_a_small_share_of_its_text() {
    let status = decided();
    let json = serde_json::to_vec(&status).expect("serializes");
    let packed = PackedStatus::pack(&status).packed_bytes();
    // The dictionary carries the field names and the usual wording; what is left is mostly
    // this budget's own numbers and names.
    assert!(
        packed * 3 < json.len(),
        "{packed} bytes packed of {}",
        json.len()
    );
    let without_dictionary = lz4_flex::block::compress_prepend_size(&json).len();
    assert!(
        packed < without_dictionary,
        "{packed} with the dictionary, {without_dictionary} without"
    );
}

#[test]
fn the_dictionary_sample_is_a_status() {
    let sample: BacklogBudgetStatus =
        serde_json::from_str(DICTIONARY_SAMPLE).expect("the dictionary sample parses");
    assert!(!sample.conditions.is_empty());
    assert!(sample.observed.is_some());
    assert_eq!(
        *DICTIONARY,
        serde_json::to_vec(&sample).expect("serializes")
    );
}

#[test]
fn damaged_bytes_are_an_error_not_a_panic() {
    let damaged = PackedStatus::pack(&decided()).truncated();
    assert!(damaged.unpack().is_err());
}
