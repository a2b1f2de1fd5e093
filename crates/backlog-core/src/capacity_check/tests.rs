use proptest::prelude::*;

use super::*;

fn fitting() -> CapacityFacts {
    CapacityFacts {
        max_replicas: 12,
        partitions: Some(12),
        per_replica_rate: Some(250.0),
        reserved_retry_share: 0.0,
        peak_produce_rate: Some(1500.0),
        deadline_seconds: 600.0,
        age_limit_seconds: 300.0,
        min_replicas: 1,
        reaction: quick(),
        retry_worst_case: Some(("orders-retry".to_owned(), 120.0)),
    }
}

/// 70 s from a rise to new pods working.
fn quick() -> Reaction {
    Reaction {
        poll_seconds: 15.0,
        pod_start_seconds: 30.0,
        pod_start_seen: false,
        rebalance_seconds: 10.0,
    }
}

/// 158 s from a rise to new pods working: 15 s polls, 88 s pod starts, 40 s rebalances.
fn slow() -> Reaction {
    Reaction {
        poll_seconds: 15.0,
        pod_start_seconds: 88.0,
        pod_start_seen: true,
        rebalance_seconds: 40.0,
    }
}

/// A 2-minute deadline, warned at half, and slow pods.
fn tight(min_replicas: u32) -> CapacityFacts {
    CapacityFacts {
        deadline_seconds: 120.0,
        age_limit_seconds: 60.0,
        min_replicas,
        reaction: slow(),
        retry_worst_case: None,
        ..fitting()
    }
}

/// The minReplicas a reaction problem asks for, if it asks for one.
fn asked_min_replicas(message: &str) -> Option<u32> {
    message
        .split("raise spec.minReplicas to ")
        .nth(1)?
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[test]
fn a_budget_that_fits_says_by_how_much() {
    let result = check(&fitting());
    assert_eq!(result.condition.status, Truth::True);
    assert_eq!(result.condition.reason, "Fits");
    assert_eq!(result.headroom, Some(2.0));
    assert!(
        result.condition.message.contains("2.0×"),
        "{}",
        result.condition.message
    );
}

#[test]
fn replicas_above_the_partitions_are_named_with_the_fix() {
    let result = check(&CapacityFacts {
        max_replicas: 24,
        ..fitting()
    });
    assert_eq!(result.condition.status, Truth::False);
    assert_eq!(result.condition.reason, "ReplicasAbovePartitions");
    assert!(
        result
            .condition
            .message
            .contains("lower spec.maxReplicas to 12")
    );
    // The idle replicas add no capacity: the headroom counts 12.
    assert_eq!(result.headroom, Some(2.0));
}

#[test]
fn a_peak_above_the_partitions_names_the_partitions_needed() {
    let result = check(&CapacityFacts {
        peak_produce_rate: Some(5000.0),
        reserved_retry_share: 0.2,
        ..fitting()
    });
    assert_eq!(result.condition.status, Truth::False);
    assert_eq!(result.condition.reason, "UndrainableAtPeak");
    // 250/s × 0.8 = 200/s per replica: 25 replicas, so 25 partitions.
    assert!(
        result.condition.message.contains("25 partitions"),
        "{}",
        result.condition.message
    );
    assert_eq!(result.headroom, Some(0.48));
}

#[test]
fn a_peak_above_a_low_max_replicas_asks_for_more_replicas_not_partitions() {
    let result = check(&CapacityFacts {
        max_replicas: 4,
        peak_produce_rate: Some(1400.0),
        ..fitting()
    });
    assert_eq!(result.condition.reason, "UndrainableAtPeak");
    // 1400/s is 5.6 replicas' worth, and 6 replicas own two of the 12 partitions each.
    assert!(
        result
            .condition
            .message
            .contains("raise spec.maxReplicas to 6"),
        "{}",
        result.condition.message
    );
}

#[test]
fn a_reaction_slower_than_the_age_limit_names_the_replicas_a_rise_needs_running() {
    let result = check(&tight(1));
    assert_eq!(result.condition.status, Truth::False);
    assert_eq!(result.condition.reason, "ReactionSlowerThanAgeLimit");
    let message = &result.condition.message;
    // 1500/s × (158 - 60) / (158 - 40) = 1246/s: 5 replicas over 12 partitions complete
    // 1000/s, 6 complete 1500/s.
    assert!(
        message.contains("a scale-up works 2m38s after a rise is seen"),
        "{message}"
    );
    assert!(
        message.contains("a 1m28s pod start (the last seen)"),
        "{message}"
    );
    assert!(message.contains("they must complete 1.2k/s"), "{message}");
    assert!(message.contains("raise spec.minReplicas to 6"), "{message}");
    // The cap still carries the peak.
    assert_eq!(result.headroom, Some(2.0));
}

#[test]
fn replicas_held_by_min_replicas_or_a_quick_reaction_fit() {
    assert_eq!(check(&tight(6)).condition.reason, "Fits");
    assert_eq!(
        check(&CapacityFacts {
            reaction: quick(),
            ..tight(1)
        })
        .condition
        .reason,
        "Fits"
    );
    // Only a rise above what the running replicas complete needs a reaction.
    assert_eq!(
        check(&CapacityFacts {
            peak_produce_rate: Some(250.0),
            ..tight(1)
        })
        .condition
        .reason,
        "Fits"
    );
}

#[test]
fn a_reaction_no_count_below_the_cap_outlasts_says_so() {
    // 4 replicas over 12 partitions complete 1000/s; a rise to 1300/s needs 1080/s running.
    let result = check(&CapacityFacts {
        max_replicas: 4,
        peak_produce_rate: Some(1300.0),
        ..tight(1)
    });
    assert_eq!(result.condition.reason, "UndrainableAtPeak");
    let message = &result.condition.message;
    assert!(message.contains("raise spec.maxReplicas to 6"), "{message}");
    assert!(
        message.contains("not even the 4 replicas of the cap do"),
        "{message}"
    );
}

#[test]
fn replicas_that_leave_a_consumer_more_partitions_complete_what_fewer_do() {
    // 8 replicas over 12 partitions: four own two, so the group completes what 6 do
    // (1500/s), not 8 × 250/s.
    let result = check(&CapacityFacts {
        max_replicas: 8,
        peak_produce_rate: Some(1800.0),
        ..fitting()
    });
    assert_eq!(result.condition.reason, "UndrainableAtPeak");
    let message = &result.condition.message;
    assert!(message.contains("1.5k/s"), "{message}");
    assert!(
        message.contains("the busiest owning 2 of the 12 partitions"),
        "{message}"
    );
    // 1800/s needs a consumer per partition.
    assert!(
        message.contains("raise spec.maxReplicas to 12"),
        "{message}"
    );
    assert_eq!(result.headroom, Some(0.83));
}

#[test]
fn a_deadline_below_the_retry_worst_case_links_the_policy() {
    let result = check(&CapacityFacts {
        retry_worst_case: Some(("orders-retry".to_owned(), 900.0)),
        ..fitting()
    });
    assert_eq!(result.condition.reason, "DeadlineBelowRetryWorstCase");
    assert!(
        result
            .condition
            .message
            .contains("RetryPolicy orders-retry")
    );
    assert!(result.condition.message.contains("DeadlineConflict"));
}

#[test]
fn every_problem_is_in_the_message_and_the_first_is_the_reason() {
    let result = check(&CapacityFacts {
        max_replicas: 24,
        peak_produce_rate: Some(9000.0),
        retry_worst_case: Some(("p".to_owned(), 900.0)),
        ..fitting()
    });
    assert_eq!(result.condition.reason, "ReplicasAbovePartitions");
    for part in [
        "spec.maxReplicas 24",
        "cannot drain",
        "worst-case retry delay",
    ] {
        assert!(result.condition.message.contains(part), "{part}");
    }
}

#[test]
fn unknown_measurements_are_unknown_never_zero() {
    for facts in [
        CapacityFacts {
            per_replica_rate: None,
            ..fitting()
        },
        CapacityFacts {
            peak_produce_rate: None,
            ..fitting()
        },
        CapacityFacts {
            peak_produce_rate: Some(f64::NAN),
            ..fitting()
        },
        CapacityFacts {
            partitions: None,
            ..fitting()
        },
    ] {
        let result = check(&facts);
        assert_eq!(result.condition.status, Truth::Unknown, "{facts:?}");
        assert_eq!(result.headroom, None);
    }
    // What is known is still checked.
    let result = check(&CapacityFacts {
        max_replicas: 30,
        per_replica_rate: None,
        ..fitting()
    });
    assert_eq!(result.condition.reason, "ReplicasAbovePartitions");
}

proptest! {
    /// Holding the replicas a reaction problem asks for clears it, and one useful count
    /// fewer does not: the advice is the least that works.
    #[test]
    fn the_min_replicas_asked_for_is_the_least_that_outlasts_a_reaction(
        partitions in 1u32..64, rate in 1.0f64..1000.0, peak_share in 0.05f64..1.0,
        poll in 1.0f64..60.0, pod_start in 0.0f64..180.0, rebalance in 0.0f64..60.0,
        deadline in 10.0f64..1800.0, warning in 0.1f64..0.9,
    ) {
        let cap_capacity = f64::from(partitions) * rate;
        let facts = CapacityFacts {
            max_replicas: partitions,
            partitions: Some(partitions),
            per_replica_rate: Some(rate),
            reserved_retry_share: 0.0,
            peak_produce_rate: Some(peak_share * cap_capacity),
            deadline_seconds: deadline,
            age_limit_seconds: warning * deadline,
            min_replicas: 1,
            reaction: Reaction {
                poll_seconds: poll,
                pod_start_seconds: pod_start,
                pod_start_seen: true,
                rebalance_seconds: rebalance,
            },
            retry_worst_case: None,
        };
        let result = check(&facts);
        if let Some(asked) = asked_min_replicas(&result.condition.message) {
            prop_assert_eq!(result.condition.reason, "ReactionSlowerThanAgeLimit");
            prop_assert!(asked > 1);
            let held = check(&CapacityFacts { min_replicas: asked, ..facts.clone() });
            prop_assert_eq!(held.condition.reason, "Fits");
            // The age at the end of the reaction, with the asked-for replicas running.
            let total = facts.reaction.seconds();
            let age = |replicas: u32| {
                let completing = group_capacity(replicas, partitions, rate);
                let peak = peak_share * cap_capacity;
                if completing >= peak { 0.0 } else { total - completing * (total - rebalance) / peak }
            };
            prop_assert!(age(asked) <= facts.age_limit_seconds + 1e-6);
            prop_assert!(age(asked - 1) > facts.age_limit_seconds);
        } else if facts.reaction.seconds() > facts.age_limit_seconds {
            // No advice: one replica is enough, or nothing below the cap is.
            prop_assert!(
                result.condition.reason == "Fits"
                    || result.condition.message.contains("not even the")
            );
        }
    }

    #[test]
    fn fits_exactly_when_the_cap_carries_the_peak(
        max in 1u32..64, partitions in 1u32..64, rate in 1.0f64..1000.0,
        reserve in 0.0f64..0.9, peak in 0.0f64..50_000.0,
    ) {
        let facts = CapacityFacts {
            max_replicas: max,
            partitions: Some(partitions),
            per_replica_rate: Some(rate),
            reserved_retry_share: reserve,
            peak_produce_rate: Some(peak),
            deadline_seconds: 600.0,
            age_limit_seconds: 300.0,
            min_replicas: 1,
            reaction: quick(),
            retry_worst_case: None,
        };
        let result = check(&facts);
        let usable = rate * (1.0 - reserve);
        let carries = group_capacity(max.min(partitions), partitions, usable) >= peak;
        let fits = result.condition.status == Truth::True;
        prop_assert_eq!(fits, carries && max <= partitions);
        if result.condition.reason == "UndrainableAtPeak" {
            prop_assert!(!carries);
            // The replicas it asks for are the fewest that carry the peak.
            if let Some(asked) = result.condition.message
                .split("raise spec.maxReplicas to ")
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|digits| digits.parse::<u32>().ok())
            {
                prop_assert!(group_capacity(asked, partitions, usable) >= peak * (1.0 - 1e-9));
                prop_assert!(group_capacity(asked - 1, partitions, usable) < peak);
            }
        }
    }
}
