//! A hot partition: one partition holds most of the backlog while the others have almost
//! none. Its single owner is saturated and more consumers cannot share its work (seed 002
//! §6.1), so the count is sized for the other partitions and the cause is named instead.

/// One series of `metrics.partitionBacklog`.
#[derive(Clone, Debug, PartialEq)]
pub struct PartitionSample {
    /// The series' `partition` label (or its position when it has none).
    pub partition: String,
    pub backlog: f64,
}

impl PartitionSample {
    /// Samples named by their position: partition i holds `backlogs[i]`.
    pub fn numbered(backlogs: &[f64]) -> Vec<Self> {
        backlogs
            .iter()
            .enumerate()
            .map(|(i, backlog)| PartitionSample {
                partition: i.to_string(),
                backlog: *backlog,
            })
            .collect()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Skew {
    pub partition: String,
    /// The hot partition's share of the whole backlog.
    pub share: f64,
    /// What the other partitions hold, scaled to the backlog the decision uses.
    pub others_backlog: f64,
    /// What the hot partition holds, on the same scale.
    pub hot_backlog: f64,
}

impl Skew {
    /// The hot partition's arrivals, estimated from its backlog and the oldest age: a
    /// partition whose head is `oldest_age` old holds what arrived since (it is the one with
    /// the oldest head). `None` without an age to divide by.
    pub fn hot_rate(&self, oldest_age: f64, produce_rate: f64) -> Option<f64> {
        (oldest_age > 0.0 && oldest_age.is_finite())
            .then(|| (self.hot_backlog / oldest_age).min(produce_rate.max(0.0)))
    }
}

/// Share of the backlog above which one partition is hot.
const HOT_SHARE: f64 = 0.5;
/// The hot partition holds at least this many times what the next one does: partitions its
/// consumer also owns lag with it, but each by its own smaller rate.
const HOT_OVER_NEXT: f64 = 3.0;

/// The skew, if one partition holds at least half of the backlog, the backlog is more than
/// `noise` events (what is merely in flight), and no other partition holds a third of the hot
/// one's. `scaling_backlog` is the backlog the decision works on (paused classes excluded).
///
/// `held` is what held event classes leave waiting. Holding moves no event, so it stays on
/// partitions no query tells: the hot partition is credited only with what it holds beyond
/// all of it, the others with all they hold. A class held on one partition (a failing
/// class keyed to one customer) then never passes for a hot key that more consumers cannot
/// help, which would stop the scaling the rest of the work needs.
pub fn detect(
    samples: &[PartitionSample],
    scaling_backlog: f64,
    noise: f64,
    held: f64,
) -> Option<Skew> {
    let valid = samples
        .iter()
        .all(|s| s.backlog.is_finite() && s.backlog >= 0.0);
    if samples.len() < 2 || !valid || !held.is_finite() {
        return None;
    }
    let hot = samples
        .iter()
        .max_by(|a, b| a.backlog.total_cmp(&b.backlog))?;
    let hot_work = (hot.backlog - held.max(0.0)).max(0.0);
    let others: f64 = samples
        .iter()
        .filter(|s| !std::ptr::eq(*s, hot))
        .map(|s| s.backlog)
        .sum();
    let total = hot_work + others;
    if total <= noise.max(0.0) || total <= 0.0 {
        return None;
    }
    let share = hot_work / total;
    let busiest_other = samples
        .iter()
        .filter(|s| !std::ptr::eq(*s, hot))
        .map(|s| s.backlog)
        .fold(0.0, f64::max);
    if share < HOT_SHARE || busiest_other * HOT_OVER_NEXT > hot_work {
        return None;
    }
    Some(Skew {
        partition: hot.partition.clone(),
        share,
        others_backlog: (others / total * scaling_backlog).max(0.0),
        hot_backlog: (share * scaling_backlog).max(0.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn samples(backlogs: &[f64]) -> Vec<PartitionSample> {
        PartitionSample::numbered(backlogs)
    }

    #[test]
    fn one_partition_with_most_of_the_backlog_is_hot() {
        let mut backlogs = vec![100.0; 12];
        backlogs[7] = 50_000.0;
        let skew = detect(&samples(&backlogs), 51_100.0, 1000.0, 0.0).expect("skew");
        assert_eq!(skew.partition, "7");
        assert!((skew.share - 50_000.0 / 51_100.0).abs() < 1e-9);
        assert!((skew.others_backlog - 1100.0).abs() < 1e-6);
    }

    #[test]
    fn an_even_backlog_or_a_small_one_is_not() {
        assert_eq!(detect(&samples(&[5000.0; 12]), 60_000.0, 1000.0, 0.0), None);
        assert_eq!(
            detect(&samples(&[0.0, 0.0, 500.0]), 500.0, 1000.0, 0.0),
            None
        );
        assert_eq!(
            detect(&samples(&[40_000.0, 30_000.0, 0.0]), 70_000.0, 1000.0, 0.0),
            None
        );
        assert_eq!(
            detect(&samples(&[40_000.0, 14_000.0, 0.0]), 54_000.0, 1000.0, 0.0),
            None
        );
    }

    #[test]
    fn the_hot_partitions_rate_follows_from_its_backlog_and_the_oldest_age() {
        // Partition 0 holds 23 000 events whose oldest is 100 s old: about 230/s arrive there.
        let skew = detect(
            &samples(&[23_000.0, 2_560.0, 0.0, 2_560.0]),
            28_120.0,
            400.0,
            0.0,
        )
        .expect("skew");
        let rate = skew.hot_rate(100.0, 410.0).expect("a rate");
        assert!((rate - 230.0).abs() < 1e-6, "{rate}");
        assert_eq!(skew.hot_rate(0.0, 410.0), None);
    }

    #[test]
    fn a_held_class_on_one_partition_is_not_a_hot_key() {
        // Partition 7 holds 50 000 events, 49 000 of them a held class's (they stay where they
        // are): the work waiting there is 1 000 at most, the others hold 1 100.
        let mut backlogs = vec![100.0; 12];
        backlogs[7] = 50_000.0;
        assert_eq!(detect(&samples(&backlogs), 2_100.0, 1000.0, 49_000.0), None);
        // A small held backlog leaves a hot key hot, with its share of the work only.
        let skew = detect(&samples(&backlogs), 50_100.0, 1000.0, 1_000.0).expect("skew");
        assert_eq!(skew.partition, "7");
        assert!((skew.share - 49_000.0 / 50_100.0).abs() < 1e-9);
    }

    proptest! {
        #[test]
        fn no_partition_is_hot_by_what_may_all_be_held(
            backlogs in proptest::collection::vec(0.0..1e6f64, 2..64),
            beyond in 0.0..1e6f64,
        ) {
            let most = backlogs.iter().copied().fold(0.0, f64::max);
            let total: f64 = backlogs.iter().sum();
            let held = most + beyond;
            prop_assert_eq!(
                detect(&samples(&backlogs), (total - held).max(0.0), 100.0, held),
                None
            );
        }

        #[test]
        fn the_others_never_hold_more_than_the_backlog(
            backlogs in proptest::collection::vec(0.0..1e6f64, 2..64),
            scaling in 0.0..1e7f64,
        ) {
            if let Some(skew) = detect(&samples(&backlogs), scaling, 100.0, 0.0) {
                prop_assert!(skew.share >= HOT_SHARE);
                prop_assert!(skew.others_backlog <= scaling * (1.0 - HOT_SHARE) + 1e-6);
            }
        }
    }
}
