use super::*;

const SEED: &str = "
targetThroughput: 3000
headroom: 1.5
partitionThroughput: 500
consumer:
  processingTime: 20ms
messageSize: 1KiB
retention: 24h
replicas: 3
";

#[test]
fn the_seed_file_plans_nine_partitions_then_more_for_slow_consumers() {
    let report = plan_text("seed.yaml", SEED).unwrap();
    assert_eq!(report.plan.partitions_for_throughput, 9);
    assert!((report.plan.group_throughput_at_those - 450.0).abs() < 1e-9);
    assert_eq!(report.plan.partitions, 90);
    assert!((report.plan.storage_bytes / 1e9 - 796.26).abs() < 0.01);
    let table = table(&report).unwrap();
    assert!(table.contains("complete only 450/s"), "{table}");
    assert!(table.contains("796.3 GB"), "{table}");
}

#[test]
fn the_budget_skeleton_never_runs_more_replicas_than_partitions_and_is_a_valid_object() {
    let report = plan_text("seed.yaml", SEED).unwrap();
    let spec = &report.budget.spec;
    assert_eq!(spec.max_replicas, 90);
    assert_eq!(spec.partition_count, Some(90));
    assert!(spec.min_replicas <= spec.max_replicas);
    assert_eq!(
        spec.capacity.as_ref().and_then(|c| c.per_replica_rate),
        Some(50.0)
    );
    // What is printed reads back as a BacklogBudget.
    let yaml = serde_yaml::to_string(&report.budget).unwrap();
    let back: BacklogBudget = serde_yaml::from_str(&yaml).unwrap();
    assert_eq!(back.spec, report.budget.spec);
    assert!(yaml.contains("kind: BacklogBudget"));

    let one_partition = plan_text(
        "small.yaml",
        "{targetThroughput: 10, partitionThroughput: 500, consumer: {rate: 100}, messageSize: 100, retention: 1h, replicas: 1}",
    )
    .unwrap();
    assert_eq!(one_partition.budget.spec.max_replicas, 1);
    assert_eq!(one_partition.budget.spec.min_replicas, 1);
}

#[test]
fn the_example_plan_file_plans_and_warns_about_its_hot_merchant() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/plans/orders.yaml");
    let report = plan_file(Path::new(path)).unwrap();
    assert_eq!(report.plan.partitions, 9);
    assert_eq!(report.plan.consumer_throughput.round(), 8333.0);
    assert!(report.plan.batch.as_ref().unwrap().within_limit);
    // 12 % = 360/s plus its share of the rest (85 % over 9 partitions = 283/s) on a partition
    // that sustains 500/s; the medium merchant's partition stays under.
    assert_eq!(report.plan.skew_warnings.len(), 1);
    assert_eq!(report.plan.skew_warnings[0].key, "merchant-big");
    assert_eq!(report.budget.metadata.namespace.as_deref(), Some("shop"));
    for output in [json(&report).unwrap(), yaml(&report).unwrap()] {
        assert!(output.contains("\"partitions\": 9") || output.contains("partitions: 9"));
    }
}

#[test]
fn sizes_take_decimal_and_binary_units() {
    for (text, bytes) in [
        ("512", 512.0),
        ("512B", 512.0),
        ("1KB", 1000.0),
        ("1 KiB", 1024.0),
        ("2MiB", 2.0 * 1024.0 * 1024.0),
        ("1.5GB", 1.5e9),
    ] {
        assert_eq!(
            size_bytes("f", &Size::Text(text.to_owned())).unwrap(),
            bytes,
            "{text}"
        );
    }
    assert!(size_bytes("f", &Size::Text("1 KX".to_owned())).is_err());
}

#[test]
fn bad_files_are_refused_with_the_field_and_the_fix() {
    let cases = [
        (SEED.replace("20ms", "soon"), "consumer.processingTime"),
        (SEED.replace("24h", "a day"), "retention"),
        (SEED.replace("1KiB", "1 parsec"), "messageSize"),
        (SEED.replace("3000", "-1"), "targetThroughput"),
        (SEED.replace("headroom: 1.5", "headroom: 0.5"), "headroom"),
        (SEED.replace("replicas: 3", "replicas: 0"), "replicas"),
        (
            SEED.replace("processingTime: 20ms", "processingTime: 20ms\n  rate: 50"),
            "exactly one of rate",
        ),
        (format!("{SEED}partitons: 3\n"), "partitons"),
    ];
    for (text, field) in cases {
        let message = plan_text("bad.yaml", &text).unwrap_err().to_string();
        assert!(message.contains(field), "{message:?} does not name {field}");
        assert!(
            message.starts_with("bad.yaml"),
            "{message:?} does not name the file"
        );
    }
}
