//! Drain math: how fast the workload must complete events to meet its deadline, and how long
//! the backlog takes to drain at a given capacity (B / (μ − λ), seed 000 section 5).

/// Completion rate (events/s) that clears `backlog` within `window_seconds` while `produce_rate`
/// keeps arriving: μ* = λ + B / T.
pub fn required_rate(produce_rate: f64, backlog: f64, window_seconds: f64) -> f64 {
    produce_rate + backlog / window_seconds
}

/// The time the backlog may take: the target drain time, or less when the oldest event is
/// already close to its deadline. Bounded below by `floor_seconds` so a deadline that has
/// already passed asks for the most capacity instead of dividing by zero.
pub fn drain_window(
    target_drain_seconds: f64,
    deadline_seconds: f64,
    oldest_age_seconds: f64,
    floor_seconds: f64,
) -> f64 {
    target_drain_seconds
        .min(deadline_seconds - oldest_age_seconds)
        .max(floor_seconds)
}

/// Events per second `replicas` consumers complete when `partitions` evenly loaded partitions
/// are spread over them. The busiest consumer owns ⌈P/n⌉ partitions and the group keeps up
/// only as long as it does, so a count that does not divide the partitions wastes capacity
/// (12 partitions: 5 consumers complete no more than 4).
pub fn group_capacity(replicas: u32, partitions: u32, per_replica_rate: f64) -> f64 {
    if replicas == 0 || partitions == 0 {
        return 0.0;
    }
    let busiest = partitions.div_ceil(replicas.min(partitions));
    per_replica_rate * f64::from(partitions) / f64::from(busiest)
}

/// The fewest of `replicas` consumers that own `with_work` of `partitions` partitions: a
/// balanced assignment gives each at least ⌊P / n⌋ and at most ⌈P / n⌉, so the partitions
/// with work need ⌈k / ⌈P / n⌉⌉ owners, and the idle ones cannot fill more than
/// ⌊(P − k) / ⌊P / n⌋⌋ consumers. Those owners are saturated, so what the group completes,
/// divided by them, bounds one replica's rate from above whichever consumers own what.
pub fn fewest_owners(replicas: u32, partitions: u32, with_work: u32) -> u32 {
    let owners = replicas.min(partitions);
    if owners == 0 {
        return 0;
    }
    let with_work = with_work.min(partitions);
    let (least, most) = (partitions / owners, partitions.div_ceil(owners));
    let all_idle_at_most = (partitions - with_work) / least;
    with_work
        .div_ceil(most)
        .max(owners.saturating_sub(all_idle_at_most))
}

/// How many partitions the busiest of `replicas` consumers owns, where the replicas do not
/// divide the partitions evenly (then the group completes only what fewer replicas would);
/// `None` where they do, or where every consumer owns at most one.
pub fn uneven_busiest_share(replicas: u32, partitions: u32) -> Option<u32> {
    (replicas > 0 && replicas < partitions && !partitions.is_multiple_of(replicas))
        .then(|| partitions.div_ceil(replicas))
}

/// [`group_capacity`] when one partition receives `hot_share` of all arrivals and the others
/// share the rest evenly: the λ at which the busiest consumer (the hot partition's owner, or
/// one owning the most other partitions) saturates. Its owner owns ⌈P/n⌉ partitions.
pub fn skewed_group_capacity(
    replicas: u32,
    partitions: u32,
    per_replica_rate: f64,
    hot_share: f64,
) -> f64 {
    if replicas == 0 || partitions < 2 || !(0.0..=1.0).contains(&hot_share) {
        return group_capacity(replicas, partitions, per_replica_rate);
    }
    let owned = f64::from(partitions.div_ceil(replicas.min(partitions)));
    let other_share = (1.0 - hot_share) / f64::from(partitions - 1);
    let busiest = (hot_share + (owned - 1.0) * other_share).max(owned * other_share);
    if busiest <= 0.0 {
        return group_capacity(replicas, partitions, per_replica_rate);
    }
    per_replica_rate / busiest
}

/// How consumers fall behind when arrivals exceed what some of them can do.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shortfall {
    /// Events per second the backlog grows by (0 when everyone keeps up).
    pub backlog_growth: f64,
    /// Seconds per second the busiest consumer's oldest event ages by.
    pub age_growth: f64,
}

/// What `replicas` consumers leave undone of `produce_rate` spread evenly over `partitions`:
/// each consumer falls behind by what its partitions bring beyond its rate, and the busiest
/// one's head advances at (rate / its arrivals) of real time.
pub fn shortfall(
    replicas: u32,
    partitions: u32,
    per_replica_rate: f64,
    produce_rate: f64,
) -> Shortfall {
    let active = replicas.min(partitions);
    if active == 0 || produce_rate <= 0.0 {
        return Shortfall {
            backlog_growth: produce_rate.max(0.0),
            age_growth: if produce_rate > 0.0 { 1.0 } else { 0.0 },
        };
    }
    let per_partition = produce_rate / f64::from(partitions);
    let busiest = partitions.div_ceil(active);
    // `heavy` consumers own `busiest` partitions, the rest one fewer.
    let heavy = partitions - active * (busiest - 1);
    let excess = |owned: u32| (f64::from(owned) * per_partition - per_replica_rate).max(0.0);
    let backlog_growth =
        f64::from(heavy) * excess(busiest) + f64::from(active - heavy) * excess(busiest - 1);
    let busiest_arrivals = f64::from(busiest) * per_partition;
    Shortfall {
        backlog_growth,
        age_growth: (1.0 - per_replica_rate / busiest_arrivals).max(0.0),
    }
}

/// Fewest replicas whose group capacity reaches `rate`; `None` when even one consumer per
/// partition cannot.
pub fn replicas_for(rate: f64, per_replica_rate: f64, partitions: u32) -> Option<u32> {
    if rate.is_nan() || rate <= 0.0 {
        return Some(0);
    }
    if partitions == 0 || per_replica_rate.is_nan() || per_replica_rate <= 0.0 {
        return None;
    }
    // The most partitions one consumer may own and still keep up (tolerating rounding).
    let most = (per_replica_rate * f64::from(partitions) / rate * (1.0 + 1e-9)).floor();
    if most < 1.0 {
        return None;
    }
    let most = most.min(f64::from(partitions)) as u32;
    Some(partitions.div_ceil(most))
}

/// Replicas for `rate` ignoring partitions: how many consumers would be needed if more than
/// one per partition could help (for explanations).
pub fn unbounded_replicas_for(rate: f64, per_replica_rate: f64) -> u64 {
    let replicas = (rate / per_replica_rate).ceil();
    if replicas.is_finite() && replicas > 0.0 {
        replicas.min(f64::from(u32::MAX)) as u64
    } else {
        0
    }
}

/// Seconds to drain `backlog` when completing at `completion_rate` while `produce_rate`
/// arrives; `None` when the backlog cannot shrink.
pub fn drain_seconds(backlog: f64, produce_rate: f64, completion_rate: f64) -> Option<f64> {
    if backlog <= 0.0 {
        Some(0.0)
    } else if completion_rate > produce_rate {
        Some(backlog / (completion_rate - produce_rate))
    } else {
        None
    }
}

/// Estimated age of the oldest unfinished event when no query reports it: by Little's law
/// the wait in a FIFO queue is B / λ; with nothing arriving, the time to work through it.
pub fn estimate_oldest_age(backlog: f64, produce_rate: f64, completion_capacity: f64) -> f64 {
    if backlog <= 0.0 {
        0.0
    } else if produce_rate > 0.0 {
        backlog / produce_rate
    } else if completion_capacity > 0.0 {
        backlog / completion_capacity
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn required_rate_adds_the_backlog_share() {
        assert_eq!(required_rate(1000.0, 60_000.0, 300.0), 1200.0);
    }

    #[test]
    fn window_shrinks_near_the_deadline_and_never_reaches_zero() {
        assert_eq!(drain_window(300.0, 600.0, 100.0, 15.0), 300.0);
        assert_eq!(drain_window(300.0, 600.0, 400.0, 15.0), 200.0);
        assert_eq!(drain_window(300.0, 600.0, 700.0, 15.0), 15.0);
    }

    #[test]
    fn group_capacity_is_set_by_the_busiest_consumer() {
        assert_eq!(group_capacity(4, 12, 250.0), 1000.0);
        assert_eq!(group_capacity(5, 12, 250.0), 1000.0);
        assert_eq!(group_capacity(6, 12, 250.0), 1500.0);
        assert_eq!(group_capacity(20, 12, 250.0), 3000.0);
        assert_eq!(group_capacity(3, 16, 250.0), 250.0 * 16.0 / 6.0);
    }

    #[test]
    fn the_partitions_with_work_keep_at_least_their_fewest_owners_busy() {
        // 23 partitions on 12 consumers: 11 own two, one owns one.
        assert_eq!(fewest_owners(12, 23, 23), 12);
        assert_eq!(fewest_owners(12, 23, 22), 11);
        assert_eq!(fewest_owners(12, 23, 1), 1);
        // 12 partitions on 5 consumers (3, 3, 2, 2, 2): all busy, all five are.
        assert_eq!(fewest_owners(5, 12, 12), 5);
        assert_eq!(fewest_owners(5, 12, 10), 4);
        // More consumers than partitions: the extra ones own none.
        assert_eq!(fewest_owners(12, 8, 8), 8);
        assert_eq!(fewest_owners(0, 8, 8), 0);
        assert_eq!(fewest_owners(4, 0, 0), 0);
    }

    proptest::proptest! {
        /// However the partitions with work fall on a balanced assignment (round-robin
        /// here), they have at least the fewest owners.
        #[test]
        fn partitions_with_work_never_have_fewer_owners_than_the_fewest(
            replicas in 1u32..40,
            partitions in 1u32..64,
            mask in proptest::prelude::any::<u64>(),
        ) {
            let with_work: Vec<u32> = (0..partitions).filter(|p| mask >> p & 1 == 1).collect();
            let owners: std::collections::BTreeSet<u32> =
                with_work.iter().map(|p| p % replicas).collect();
            let count = u32::try_from(with_work.len()).unwrap_or(u32::MAX);
            proptest::prop_assert!(owners.len() as u32 >= fewest_owners(replicas, partitions, count));
        }
    }

    #[test]
    fn a_hot_partition_sets_the_capacity_through_its_owner() {
        // 8 partitions, partition 0 receives 9/16 of the arrivals: its owner keeps up only
        // once it owns little else (2 replicas: 4 partitions, 3: 3, 4: 2, 8: 1).
        let share = 9.0 / 16.0;
        let capacity = |k| skewed_group_capacity(k, 8, 250.0, share);
        assert!((capacity(2) - 250.0 / (12.0 / 16.0)).abs() < 1e-9);
        assert!((capacity(4) - 250.0 / (10.0 / 16.0)).abs() < 1e-9);
        assert!((capacity(8) - 250.0 / share).abs() < 1e-9);
        // Even shares are the plain group capacity.
        for k in 1..=8 {
            assert!(
                (skewed_group_capacity(k, 8, 250.0, 1.0 / 8.0) - group_capacity(k, 8, 250.0)).abs()
                    < 1e-9
            );
        }
    }

    #[test]
    fn shortfall_counts_only_the_consumers_that_fall_behind() {
        // 16 partitions at 200/s each over 14 consumers: two own two partitions (400/s).
        let s = shortfall(14, 16, 250.0, 3200.0);
        assert!((s.backlog_growth - 300.0).abs() < 1e-9, "{s:?}");
        assert!((s.age_growth - 0.375).abs() < 1e-9, "{s:?}");
        let fine = shortfall(16, 16, 250.0, 3200.0);
        assert_eq!(fine.backlog_growth, 0.0);
        assert_eq!(fine.age_growth, 0.0);
        let even = shortfall(3, 12, 250.0, 950.0);
        assert!((even.backlog_growth - 200.0).abs() < 1e-9, "{even:?}");
    }

    #[test]
    fn replicas_skip_counts_that_add_no_capacity() {
        assert_eq!(replicas_for(1000.0, 250.0, 12), Some(4));
        assert_eq!(replicas_for(1001.0, 250.0, 12), Some(6));
        assert_eq!(replicas_for(0.0, 250.0, 12), Some(0));
        assert_eq!(replicas_for(3000.0, 250.0, 12), Some(12));
        assert_eq!(replicas_for(3001.0, 250.0, 12), None);
        assert_eq!(unbounded_replicas_for(3001.0, 250.0), 13);
    }

    #[test]
    fn drain_time_is_b_over_mu_minus_lambda() {
        assert_eq!(drain_seconds(60_000.0, 1000.0, 1200.0), Some(300.0));
        assert_eq!(drain_seconds(60_000.0, 1000.0, 1000.0), None);
        assert_eq!(drain_seconds(0.0, 1000.0, 10.0), Some(0.0));
    }

    #[test]
    fn oldest_age_estimate_uses_littles_law() {
        assert_eq!(estimate_oldest_age(3000.0, 100.0, 500.0), 30.0);
        assert_eq!(estimate_oldest_age(3000.0, 0.0, 500.0), 6.0);
        assert_eq!(estimate_oldest_age(0.0, 100.0, 500.0), 0.0);
    }
}
