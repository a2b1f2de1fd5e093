//! Capacity planning for a partitioned topic and its consumer group, as plain arithmetic:
//!
//! - partitions = ⌈target throughput × headroom / per-partition throughput⌉;
//! - useful consumers ≤ partitions (a consumer beyond the partition count idles);
//! - per-consumer throughput = batch / (processing + commit), or 1 / processing per message;
//! - group throughput = per-consumer throughput × useful consumers with one consumer per
//!   partition; k consumers complete only what their busiest, owning ⌈P/k⌉ partitions, keeps
//!   up with, so the fewest consumers that carry a rate are counted that way;
//! - storage = write rate × message size × retention × replicas;
//! - one batch must take at most half the consumer timeout;
//! - a key always lands on one partition, so a hot key's partition can outgrow one partition
//!   or one consumer however many are added.
//!
//! The broker's limit and the consumer's limit are separate: when the consumers are the
//! bottleneck the plan raises the partition count until enough consumers can run, and says so.

use std::collections::BTreeMap;

use serde::Serialize;
use thiserror::Error;

use crate::drain::replicas_for;

/// How fast one consumer completes events.
#[derive(Clone, Debug, PartialEq)]
pub enum ConsumerSpeed {
    /// Measured events per second of one consumer.
    Rate(f64),
    /// One message at a time, this many seconds each.
    PerMessage { processing_seconds: f64 },
    /// Batches of `size` messages, each processed then committed.
    Batch {
        size: u32,
        processing_seconds: f64,
        commit_seconds: f64,
    },
}

/// What the plan is computed from; the field names are those of the plan file.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanInput {
    /// Events per second the topic must carry at peak.
    pub target_throughput: f64,
    /// Multiplier over the target kept in reserve (≥ 1), e.g. 1.5.
    pub headroom: f64,
    /// Events per second one partition sustains on the broker.
    pub partition_throughput: f64,
    pub consumer: ConsumerSpeed,
    /// Bytes per message as stored (after compression, if the topic compresses).
    pub message_bytes: f64,
    pub retention_seconds: f64,
    /// Copies of every partition the broker keeps.
    pub replicas: u32,
    /// The consumer's session or poll timeout, which bounds one batch's time.
    pub consumer_timeout_seconds: Option<f64>,
    /// Hot partition keys and their share of all traffic (0 to 1); the rest is taken to be
    /// spread evenly over many keys.
    pub key_shares: BTreeMap<String, f64>,
}

/// Which limit sets the partition count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum PartitionBound {
    /// The broker's per-partition throughput.
    PartitionThroughput,
    /// The consumers: more partitions are needed so that enough consumers can run.
    ConsumersNeeded,
}

/// The batch constraint against the consumer timeout.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchLimit {
    pub batch_seconds: f64,
    /// Half the consumer timeout.
    pub limit_seconds: f64,
    pub within_limit: bool,
    /// The largest batch whose processing (linear in its size) plus commit fits the limit; 0
    /// when even the commit alone does not.
    pub largest_batch: u32,
}

/// A key whose traffic alone overloads its partition or its consumer.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SkewWarning {
    pub key: String,
    pub share: f64,
    /// Events per second its partition carries at the target throughput: the key's own and
    /// the partition's part of the evenly spread rest.
    pub rate: f64,
    /// What it exceeds: "partition" or "consumer".
    pub exceeds: &'static str,
    pub limit: f64,
}

/// The plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityPlan {
    /// The partitions to create: enough for the broker and for the consumers.
    pub partitions: u32,
    pub bound: PartitionBound,
    /// ⌈target × headroom / per-partition throughput⌉: what the broker alone needs.
    pub partitions_for_throughput: u32,
    pub consumer_throughput: f64,
    /// What the group completes with one consumer per partition of `partitions_for_throughput`.
    pub group_throughput_at_those: f64,
    /// Fewest consumers that keep up with the target (no headroom).
    pub min_consumers: u32,
    /// Consumers that carry the target with its headroom.
    pub consumers_for_headroom: u32,
    /// Most consumers that do any work: the partition count.
    pub max_useful_consumers: u32,
    /// Group throughput with every useful consumer running.
    pub max_group_throughput: f64,
    pub storage_bytes: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchLimit>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skew_warnings: Vec<SkewWarning>,
}

/// An input the plan cannot use; the message names the field of the plan file.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum PlanError {
    #[error("{field} must be a finite number greater than 0 (got {value})")]
    NotPositive { field: &'static str, value: f64 },
    #[error("headroom must be at least 1 (1.5 keeps half again in reserve; got {0})")]
    HeadroomBelowOne(f64),
    #[error("replicas must be at least 1 (the copies of each partition the broker keeps)")]
    NoReplicas,
    #[error("consumer.batch.size must be at least 1")]
    EmptyBatch,
    #[error(
        "keySkew.{key} must be the key's share of all traffic, above 0 and at most 1 (got {value})"
    )]
    BadShare { key: String, value: f64 },
    #[error("keySkew's shares add up to {0}, above 1: give each hot key's share of all traffic")]
    SharesAboveOne(f64),
    #[error(
        "the plan needs {partitions} partitions, above the {limit} this planner sizes: lower the target or raise the per-partition and per-consumer throughput"
    )]
    TooManyPartitions { partitions: f64, limit: u32 },
}

/// The most partitions the planner hands out; beyond it the inputs are almost surely wrong.
pub const MAX_PARTITIONS: u32 = 100_000;

fn positive(field: &'static str, value: f64) -> Result<f64, PlanError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(PlanError::NotPositive { field, value })
    }
}

/// Events per second of one consumer.
pub fn consumer_throughput(speed: &ConsumerSpeed) -> Result<f64, PlanError> {
    match *speed {
        ConsumerSpeed::Rate(rate) => positive("consumer.rate", rate),
        ConsumerSpeed::PerMessage { processing_seconds } => {
            Ok(1.0 / positive("consumer.processingTime", processing_seconds)?)
        }
        ConsumerSpeed::Batch {
            size,
            processing_seconds,
            commit_seconds,
        } => {
            if size == 0 {
                return Err(PlanError::EmptyBatch);
            }
            let processing = positive("consumer.batch.processingTime", processing_seconds)?;
            if !(commit_seconds.is_finite() && commit_seconds >= 0.0) {
                return Err(PlanError::NotPositive {
                    field: "consumer.batch.commitTime",
                    value: commit_seconds,
                });
            }
            Ok(f64::from(size) / (processing + commit_seconds))
        }
    }
}

/// ⌈value⌉ as a count, refusing counts the planner does not size.
fn count(value: f64) -> Result<u32, PlanError> {
    // A tiny tolerance so that 3000 × 1.5 / 500 is 9, not 10 from rounding error.
    let ceiled = (value - 1e-9).ceil().max(1.0);
    if ceiled > f64::from(MAX_PARTITIONS) {
        return Err(PlanError::TooManyPartitions {
            partitions: ceiled,
            limit: MAX_PARTITIONS,
        });
    }
    Ok(ceiled as u32)
}

fn batch_limit(speed: &ConsumerSpeed, timeout_seconds: f64) -> Option<BatchLimit> {
    let limit_seconds = timeout_seconds / 2.0;
    let (size, processing, commit) = match *speed {
        ConsumerSpeed::Batch {
            size,
            processing_seconds,
            commit_seconds,
        } => (size, processing_seconds, commit_seconds),
        ConsumerSpeed::PerMessage { processing_seconds } => (1, processing_seconds, 0.0),
        ConsumerSpeed::Rate(_) => return None,
    };
    let batch_seconds = processing + commit;
    let per_message = processing / f64::from(size);
    let largest = ((limit_seconds - commit) / per_message).floor();
    Some(BatchLimit {
        batch_seconds,
        limit_seconds,
        within_limit: batch_seconds <= limit_seconds,
        largest_batch: if largest.is_finite() && largest >= 1.0 {
            largest.min(f64::from(u32::MAX)) as u32
        } else {
            0
        },
    })
}

fn skew_warnings(
    shares: &BTreeMap<String, f64>,
    target: f64,
    partitions: u32,
    partition_throughput: f64,
    consumer_throughput: f64,
) -> Result<Vec<SkewWarning>, PlanError> {
    for (key, &share) in shares {
        if !(share.is_finite() && share > 0.0 && share <= 1.0) {
            return Err(PlanError::BadShare {
                key: key.clone(),
                value: share,
            });
        }
    }
    let named: f64 = shares.values().sum();
    if named > 1.0 + 1e-9 {
        return Err(PlanError::SharesAboveOne(named));
    }
    // A key's events all go to one partition and so to one consumer: neither more
    // partitions nor more consumers spread it. Its partition also gets its part of the
    // traffic that is spread over many keys.
    let spread_per_partition = (1.0 - named).max(0.0) * target / f64::from(partitions);
    let limit = partition_throughput.min(consumer_throughput);
    let exceeds = if partition_throughput <= consumer_throughput {
        "partition"
    } else {
        "consumer"
    };
    let mut warnings: Vec<SkewWarning> = shares
        .iter()
        .map(|(key, &share)| (key, share, share * target + spread_per_partition))
        .filter(|&(_, _, rate)| rate > limit)
        .map(|(key, share, rate)| SkewWarning {
            key: key.clone(),
            share,
            rate,
            exceeds,
            limit,
        })
        .collect();
    warnings.sort_by(|a, b| b.share.total_cmp(&a.share).then(a.key.cmp(&b.key)));
    Ok(warnings)
}

/// The plan for `input`.
pub fn plan(input: &PlanInput) -> Result<CapacityPlan, PlanError> {
    let target = positive("targetThroughput", input.target_throughput)?;
    if !(input.headroom.is_finite() && input.headroom >= 1.0) {
        return Err(PlanError::HeadroomBelowOne(input.headroom));
    }
    let partition_throughput = positive("partitionThroughput", input.partition_throughput)?;
    let consumer = consumer_throughput(&input.consumer)?;
    let message_bytes = positive("messageSize", input.message_bytes)?;
    let retention = positive("retention", input.retention_seconds)?;
    if input.replicas == 0 {
        return Err(PlanError::NoReplicas);
    }
    let timeout = input
        .consumer_timeout_seconds
        .map(|value| positive("consumerTimeout", value))
        .transpose()?;

    let with_headroom = target * input.headroom;
    let partitions_for_throughput = count(with_headroom / partition_throughput)?;
    let consumers_for_headroom = count(with_headroom / consumer)?;
    let (partitions, bound) = if consumers_for_headroom > partitions_for_throughput {
        (consumers_for_headroom, PartitionBound::ConsumersNeeded)
    } else {
        (
            partitions_for_throughput,
            PartitionBound::PartitionThroughput,
        )
    };
    // Consumers are counted as the group completes them: k consumers over the partitions
    // keep up only as far as the busiest (⌈P/k⌉ partitions) does, so 60 consumers over 90
    // partitions complete what 45 do.
    let carrying = |rate: f64| replicas_for(rate, consumer, partitions).unwrap_or(partitions);
    let min_consumers = carrying(target);
    let consumers_for_headroom = carrying(with_headroom);
    Ok(CapacityPlan {
        partitions,
        bound,
        partitions_for_throughput,
        consumer_throughput: consumer,
        group_throughput_at_those: consumer * f64::from(partitions_for_throughput),
        min_consumers,
        consumers_for_headroom,
        max_useful_consumers: partitions,
        max_group_throughput: consumer * f64::from(partitions),
        storage_bytes: target * message_bytes * retention * f64::from(input.replicas),
        batch: timeout.and_then(|timeout| batch_limit(&input.consumer, timeout)),
        skew_warnings: skew_warnings(
            &input.key_shares,
            target,
            partitions,
            partition_throughput,
            consumer,
        )?,
    })
}

#[cfg(test)]
mod tests;
