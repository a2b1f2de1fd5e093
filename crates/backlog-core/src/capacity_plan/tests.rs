use proptest::prelude::*;

use super::*;
use crate::drain::group_capacity;

/// The seed's worked example: 3000/s, headroom 1.5, 500/s per partition, 1 KiB messages kept
/// 24 h on three replicas.
fn seed_input(consumer: ConsumerSpeed) -> PlanInput {
    PlanInput {
        target_throughput: 3000.0,
        headroom: 1.5,
        partition_throughput: 500.0,
        consumer,
        message_bytes: 1024.0,
        retention_seconds: 86_400.0,
        replicas: 3,
        consumer_timeout_seconds: None,
        key_shares: BTreeMap::new(),
    }
}

fn fast_consumer() -> ConsumerSpeed {
    ConsumerSpeed::Rate(1000.0)
}

#[test]
fn seed_partitions_for_3000_per_second_with_headroom_1_5() {
    let plan = plan(&seed_input(fast_consumer())).unwrap();
    assert_eq!(plan.partitions_for_throughput, 9);
    assert_eq!(plan.partitions, 9);
    assert_eq!(plan.bound, PartitionBound::PartitionThroughput);
    assert_eq!(plan.max_useful_consumers, 9);
}

#[test]
fn seed_nine_consumers_at_20ms_per_message_carry_450_per_second() {
    let plan = plan(&seed_input(ConsumerSpeed::PerMessage {
        processing_seconds: 0.020,
    }))
    .unwrap();
    assert!((plan.consumer_throughput - 50.0).abs() < 1e-9);
    assert_eq!(plan.partitions_for_throughput, 9);
    assert!((plan.group_throughput_at_those - 450.0).abs() < 1e-9);
    // The bottleneck is the consumer logic: 4500/s with headroom needs 90 consumers, and so
    // 90 partitions.
    assert_eq!(plan.bound, PartitionBound::ConsumersNeeded);
    assert_eq!(plan.partitions, 90);
    // 3000/s is 60 consumers' worth, but 60 over 90 partitions leave 30 of them two, and
    // the group completes what 45 do (2250/s): every partition needs its own consumer.
    assert_eq!(plan.min_consumers, 90);
    assert_eq!(plan.consumers_for_headroom, 90);
}

#[test]
fn seed_storage_of_a_day_at_1_kib_on_three_replicas_is_796_gb() {
    let plan = plan(&seed_input(fast_consumer())).unwrap();
    assert_eq!(plan.storage_bytes, 3000.0 * 1024.0 * 86_400.0 * 3.0);
    assert!((plan.storage_bytes / 1e9 - 796.26).abs() < 0.01);
}

#[test]
fn seed_batch_of_500_in_50ms_plus_10ms_commit_is_8333_per_second() {
    let plan = plan(&seed_input(ConsumerSpeed::Batch {
        size: 500,
        processing_seconds: 0.050,
        commit_seconds: 0.010,
    }))
    .unwrap();
    assert_eq!(plan.consumer_throughput.round(), 8333.0);
}

#[test]
fn a_batch_over_half_the_consumer_timeout_is_flagged_with_the_largest_that_fits() {
    let mut input = seed_input(ConsumerSpeed::Batch {
        size: 1000,
        processing_seconds: 8.0,
        commit_seconds: 1.0,
    });
    input.consumer_timeout_seconds = Some(10.0);
    let batch = plan(&input).unwrap().batch.unwrap();
    assert!(!batch.within_limit);
    assert_eq!(batch.limit_seconds, 5.0);
    // (5 s − 1 s commit) / 8 ms per message.
    assert_eq!(batch.largest_batch, 500);

    input.consumer_timeout_seconds = Some(30.0);
    assert!(plan(&input).unwrap().batch.unwrap().within_limit);
}

#[test]
fn a_hot_key_whose_partition_outgrows_one_partition_is_warned_about() {
    let mut input = seed_input(fast_consumer());
    // 15 % of 3000/s = 450/s, plus 85 % of the rest spread over 9 partitions = 283/s: 733/s on
    // one partition that sustains 500/s.
    input.key_shares = [
        ("merchant-1".to_owned(), 0.15),
        ("merchant-2".to_owned(), 0.01),
    ]
    .into();
    let warnings = plan(&input).unwrap().skew_warnings;
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].key, "merchant-1");
    assert!((warnings[0].rate - (450.0 + 0.84 * 3000.0 / 9.0)).abs() < 1e-9);
    assert_eq!(warnings[0].exceeds, "partition");

    // A key no bigger than an even partition's share is no hot spot.
    input.key_shares = [("order-1".to_owned(), 0.01)].into();
    assert!(plan(&input).unwrap().skew_warnings.is_empty());
}

#[test]
fn a_hot_key_above_one_consumer_names_the_consumer() {
    let mut input = seed_input(ConsumerSpeed::Rate(100.0));
    input.key_shares = [("big".to_owned(), 0.05)].into();
    // 150/s of its own: within a partition's 500/s, above one consumer's 100/s.
    let warnings = plan(&input).unwrap().skew_warnings;
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].exceeds, "consumer");
}

/// One edit of the seed input.
type Change = Box<dyn Fn(&mut PlanInput)>;

#[test]
fn every_unusable_input_names_its_field() {
    let cases: Vec<(Change, &str)> = vec![
        (Box::new(|i| i.target_throughput = 0.0), "targetThroughput"),
        (
            Box::new(|i| i.target_throughput = f64::NAN),
            "targetThroughput",
        ),
        (Box::new(|i| i.headroom = 0.9), "headroom"),
        (
            Box::new(|i| i.partition_throughput = -1.0),
            "partitionThroughput",
        ),
        (
            Box::new(|i| i.consumer = ConsumerSpeed::Rate(0.0)),
            "consumer.rate",
        ),
        (
            Box::new(|i| {
                i.consumer = ConsumerSpeed::Batch {
                    size: 0,
                    processing_seconds: 1.0,
                    commit_seconds: 0.0,
                }
            }),
            "consumer.batch.size",
        ),
        (
            Box::new(|i| {
                i.consumer = ConsumerSpeed::Batch {
                    size: 10,
                    processing_seconds: 1.0,
                    commit_seconds: -1.0,
                }
            }),
            "consumer.batch.commitTime",
        ),
        (Box::new(|i| i.message_bytes = 0.0), "messageSize"),
        (Box::new(|i| i.retention_seconds = 0.0), "retention"),
        (Box::new(|i| i.replicas = 0), "replicas"),
        (
            Box::new(|i| i.consumer_timeout_seconds = Some(0.0)),
            "consumerTimeout",
        ),
        (
            Box::new(|i| i.key_shares = [("k".to_owned(), 1.5)].into()),
            "keySkew.k",
        ),
        (
            Box::new(|i| i.key_shares = [("a".to_owned(), 0.6), ("b".to_owned(), 0.6)].into()),
            "keySkew",
        ),
        (Box::new(|i| i.target_throughput = 1e12), "target"),
    ];
    for (change, field) in cases {
        let mut input = seed_input(fast_consumer());
        change(&mut input);
        let message = plan(&input).unwrap_err().to_string();
        assert!(message.contains(field), "{message:?} does not name {field}");
    }
}

fn any_input() -> impl Strategy<Value = PlanInput> {
    (1.0f64..1e6, 1.0f64..3.0, 10.0f64..1e5, 1.0f64..1e5, 1u32..6).prop_map(
        |(target, headroom, partition, consumer, replicas)| PlanInput {
            target_throughput: target,
            headroom,
            partition_throughput: partition,
            consumer: ConsumerSpeed::Rate(consumer),
            message_bytes: 512.0,
            retention_seconds: 3600.0,
            replicas,
            consumer_timeout_seconds: None,
            key_shares: BTreeMap::new(),
        },
    )
}

proptest! {
    #[test]
    fn partitions_are_monotone_in_throughput(input in any_input(), more in 1.0f64..10.0) {
        let Ok(base) = plan(&input) else { return Ok(()) };
        let mut larger = input.clone();
        larger.target_throughput *= more;
        if let Ok(larger) = plan(&larger) {
            prop_assert!(larger.partitions >= base.partitions);
            prop_assert!(larger.partitions_for_throughput >= base.partitions_for_throughput);
        }
    }

    #[test]
    fn consumers_never_exceed_partitions_and_carry_the_target(input in any_input()) {
        let Ok(plan) = plan(&input) else { return Ok(()) };
        prop_assert!(plan.min_consumers <= plan.consumers_for_headroom);
        prop_assert!(plan.consumers_for_headroom <= plan.max_useful_consumers);
        prop_assert_eq!(plan.max_useful_consumers, plan.partitions);
        // The planned partitions carry the target with headroom, on the broker and in the group.
        let with_headroom = input.target_throughput * input.headroom;
        prop_assert!(f64::from(plan.partitions) * input.partition_throughput >= with_headroom * (1.0 - 1e-9));
        prop_assert!(plan.max_group_throughput >= with_headroom * (1.0 - 1e-9));
        // The fewest consumers named carry the target, as the group completes it, and one
        // fewer does not.
        let completes = |k: u32| group_capacity(k, plan.partitions, plan.consumer_throughput);
        let target = input.target_throughput * (1.0 - 1e-9);
        prop_assert!(completes(plan.min_consumers) >= target);
        prop_assert!(completes(plan.min_consumers - 1) < target);
        prop_assert!(completes(plan.consumers_for_headroom) >= with_headroom * (1.0 - 1e-9));
    }
}
