//! `partitionWeights`: how production splits across partitions (a hot key makes one
//! partition's share larger than the others').

use serde::{Deserialize, Serialize};

use super::ScenarioError;

/// Partition `partition` receives `weight` times the share of an unlisted partition.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PartitionWeight {
    pub partition: u32,
    pub weight: f64,
}

const FIELD: &str = "partitionWeights";

/// Each partition's share of production (index = partition number), summing to 1; unlisted
/// partitions weigh 1.
pub fn partition_shares(
    partitions: u32,
    weights: &[PartitionWeight],
) -> Result<Vec<f64>, ScenarioError> {
    let invalid = |problem: String| ScenarioError::Invalid {
        field: FIELD,
        problem,
    };
    let mut listed = vec![false; partitions as usize];
    let mut raw = vec![1.0; partitions as usize];
    for entry in weights {
        let index = entry.partition as usize;
        let Some(seen) = listed.get_mut(index) else {
            return Err(invalid(format!(
                "partition {} does not exist (partitions: {partitions})",
                entry.partition
            )));
        };
        if *seen {
            return Err(invalid(format!(
                "partition {} is listed twice",
                entry.partition
            )));
        }
        if !(entry.weight.is_finite() && entry.weight > 0.0) {
            return Err(invalid(format!(
                "partition {}: weight must be a finite number greater than 0",
                entry.partition
            )));
        }
        *seen = true;
        raw[index] = entry.weight;
    }
    let total: f64 = raw.iter().sum();
    Ok(raw.into_iter().map(|weight| weight / total).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weight(partition: u32, weight: f64) -> PartitionWeight {
        PartitionWeight { partition, weight }
    }

    #[test]
    fn unlisted_partitions_weigh_one_and_shares_sum_to_one() {
        let shares = partition_shares(4, &[weight(2, 5.0)]).unwrap();
        assert_eq!(shares, vec![0.125, 0.125, 0.625, 0.125]);
        assert_eq!(partition_shares(2, &[]).unwrap(), vec![0.5, 0.5]);
    }

    #[test]
    fn bad_entries_are_refused_naming_the_field() {
        for weights in [
            vec![weight(4, 2.0)],
            vec![weight(1, 2.0), weight(1, 3.0)],
            vec![weight(0, 0.0)],
            vec![weight(0, -1.0)],
            vec![weight(0, f64::NAN)],
            vec![weight(0, f64::INFINITY)],
        ] {
            let error = partition_shares(4, &weights).unwrap_err();
            assert!(
                matches!(error, ScenarioError::Invalid { field: FIELD, .. }),
                "{weights:?}: {error}"
            );
        }
    }
}
