//! Planning a replay (pure): how the frozen id list is cut into stages and batches, what each
//! stage's Job is called, whether an approval counts, and the phase machine that says what to
//! do next from what the status recorded and what the Jobs show.
//!
//! Life of a replay (seed 000, section 4: dead letters are a worklist, a replay is a change to
//! production): `AwaitingApproval` → `Approved` → `Canary` (batch 0, a few events) →
//! `Verifying` (PromQL checks on the canary's effects) → `Running` (every other batch) →
//! `Succeeded`; a failed batch or check stops it in `Halted` for good, and `spec.suspend`
//! pauses it in `Suspended`.
//!
//! The controller supplies every fact (status, Jobs, check results, the queue) and the time;
//! nothing here reads a clock or the cluster. Expensive facts are asked for only when needed:
//! a [`Decision`] with a [`Need`] means "give me this and decide again".

use std::fmt;
use std::ops::Range;

use jiff::Timestamp;
use thiserror::Error;

use super::metric_input::Observation;
use super::phase::ReplayPhase;

/// Longest Kubernetes object name usable as a label value (Jobs label their Pods with it).
const MAX_NAME: usize = 63;

// ---------------------------------------------------------------------------------------------
// Stages and batches

/// The two stages of every replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StageName {
    Canary,
    Main,
}

impl StageName {
    pub const ALL: [StageName; 2] = [StageName::Canary, StageName::Main];

    pub fn as_str(self) -> &'static str {
        match self {
            StageName::Canary => "canary",
            StageName::Main => "main",
        }
    }

    pub fn parse(text: &str) -> Option<StageName> {
        StageName::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// The phase while this stage's Job runs.
    pub fn running_phase(self) -> ReplayPhase {
        match self {
            StageName::Canary => ReplayPhase::Canary,
            StageName::Main => ReplayPhase::Running,
        }
    }
}

impl fmt::Display for StageName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the replay is cut: events in the canary batch, events in every later batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchPlan {
    pub canary: u32,
    pub size: u32,
}

/// `spec.batches` that cannot be used (the CRD's schema already refuses these; checked again
/// so that nothing here can divide by zero whatever reaches it).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("spec.batches.{field} is {value}; it must be at least 1")]
pub struct PlanProblem {
    pub field: &'static str,
    pub value: i64,
}

impl BatchPlan {
    pub fn new(canary: i32, size: i32) -> Result<BatchPlan, PlanProblem> {
        let positive = |field, value: i32| {
            u32::try_from(value)
                .ok()
                .filter(|v| *v > 0)
                .ok_or(PlanProblem {
                    field,
                    value: i64::from(value),
                })
        };
        Ok(BatchPlan {
            canary: positive("canary", canary)?,
            size: positive("size", size)?,
        })
    }
}

/// One stage: a contiguous slice of the frozen list, cut into batches, run as one Indexed Job
/// whose index `i` is batch `first_batch + i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stage {
    pub name: StageName,
    /// 0-based line of the frozen list where the stage begins.
    pub first_event: u32,
    pub events: u32,
    pub batch_size: u32,
    /// Replay-wide number of the stage's first batch: the canary is batch 0.
    pub first_batch: u32,
}

impl Stage {
    pub fn batches(&self) -> u32 {
        self.events.div_ceil(self.batch_size.max(1))
    }

    /// The lines of the frozen list that Job index `index` replays.
    pub fn lines(&self, index: u32) -> Option<Range<u32>> {
        if index >= self.batches() {
            return None;
        }
        let offset = u64::from(index) * u64::from(self.batch_size);
        let start = u64::from(self.first_event) + offset;
        let end = (start + u64::from(self.batch_size))
            .min(u64::from(self.first_event) + u64::from(self.events));
        Some(u32::try_from(start).ok()?..u32::try_from(end).ok()?)
    }
}

/// The stages for `event_count` frozen ids: the canary is the first `plan.canary` ids as one
/// batch (batch 0); the rest, if any, is the main stage in batches of `plan.size`.
pub fn stages(event_count: u32, plan: BatchPlan) -> Vec<Stage> {
    if event_count == 0 {
        return Vec::new();
    }
    let canary_events = plan.canary.min(event_count);
    let mut stages = vec![Stage {
        name: StageName::Canary,
        first_event: 0,
        events: canary_events,
        batch_size: canary_events,
        first_batch: 0,
    }];
    if event_count > canary_events {
        stages.push(Stage {
            name: StageName::Main,
            first_event: canary_events,
            events: event_count - canary_events,
            batch_size: plan.size,
            first_batch: 1,
        });
    }
    stages
}

/// Every batch of `ids` in replay order, as the Jobs' indices cut them.
pub fn batches<T>(ids: &[T], plan: BatchPlan) -> Vec<&[T]> {
    let count = u32::try_from(ids.len()).unwrap_or(u32::MAX);
    stages(count, plan)
        .iter()
        .flat_map(|stage| (0..stage.batches()).filter_map(|i| stage.lines(i)))
        .filter_map(|lines| ids.get(lines.start as usize..lines.end as usize))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Names

/// Six characters of the replay's uid: names of one replay never collide with those left
/// behind by a deleted replay of the same name.
fn uid_suffix(uid: &str) -> String {
    uid.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .take(6)
        .collect()
}

fn child_name(replay: &str, part: &str, uid: &str) -> String {
    let suffix = format!("-{part}-{}", uid_suffix(uid));
    let room = MAX_NAME.saturating_sub(suffix.len());
    let stem: String = replay.chars().take(room).collect();
    format!("{}{suffix}", stem.trim_end_matches('-'))
}

/// The Job of a stage: the same replay always gets the same name, so a restarted operator
/// finds the Job it created instead of creating a second one.
pub fn job_name(replay: &str, uid: &str, stage: StageName) -> String {
    child_name(replay, stage.as_str(), uid)
}

/// The immutable ConfigMap holding the frozen ids.
pub fn scope_config_map_name(replay: &str, uid: &str) -> String {
    child_name(replay, "scope", uid)
}

/// The replay's operation id, passed to the worker and recorded with every replayed event.
pub fn operation_id(uid: &str) -> String {
    format!("replay-{uid}")
}

// ---------------------------------------------------------------------------------------------
// Approval

/// Why an approval does not count (the API server's admission policy refuses these already;
/// the operator checks again so that a cluster without the policy still needs two people who
/// approved exactly the frozen list).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ApprovalProblem {
    #[error(
        "waiting for approval: a member of the approvers group other than {requested_by} reviews the frozen list and the spec and sets spec.approval.approvedBy to their own user name, spec.approval.scopeSha256 to status.scope.sha256 and spec.approval.specSha256 to status.specSha256"
    )]
    Missing { requested_by: String },
    #[error("spec.approval.approvedBy is empty: the approver sets it to their own user name")]
    Blank,
    #[error(
        "spec.approval.approvedBy {approved_by:?} is the requester (spec.requestedBy {requested_by:?}): a replay needs a second person's approval; another approver must approve it"
    )]
    SelfApproved {
        approved_by: String,
        requested_by: String,
    },
    #[error(
        "spec.approval was given before the scope was frozen (status.scope is empty), so it names no list: an approver removes spec.approval and approves again with scopeSha256 set to status.scope.sha256 once the scope is frozen"
    )]
    BeforeFreeze,
    #[error(
        "spec.approval.scopeSha256 {approved} is not the frozen list's sha256 (status.scope.sha256 {frozen}): the approval covers another list. An approver reviews ConfigMap {config_map} and approves again with scopeSha256 {frozen}"
    )]
    ScopeMismatch {
        approved: String,
        frozen: String,
        config_map: String,
    },
    #[error(
        "spec.approval.specSha256 {approved} is not the sha256 of the spec as it stands ({current}, status.specSha256): the spec changed after it was reviewed, and the approval does not cover the change. An approver reads the spec again and approves with specSha256 {current}"
    )]
    SpecMismatch { approved: String, current: String },
}

impl ApprovalProblem {
    pub fn reason(&self) -> &'static str {
        match self {
            ApprovalProblem::Missing { .. } => "AwaitingApproval",
            ApprovalProblem::Blank => "ApproverMissing",
            ApprovalProblem::SelfApproved { .. } => "SelfApproval",
            ApprovalProblem::BeforeFreeze => "ApprovedBeforeFreeze",
            ApprovalProblem::ScopeMismatch { .. } => "ScopeMismatch",
            ApprovalProblem::SpecMismatch { .. } => "SpecChangedSinceReview",
        }
    }
}

/// An approval as the spec states it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApprovalClaim<'a> {
    pub approved_by: &'a str,
    /// The sha256 of the list the approver says they reviewed.
    pub scope_sha256: &'a str,
    /// The sha256 of the rest of the spec the approver says they reviewed.
    pub spec_sha256: &'a str,
}

/// The frozen list an approval must name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrozenList<'a> {
    pub sha256: &'a str,
    pub config_map: &'a str,
}

/// The approver, if the approval counts: present, not blank, not the requester (compared
/// without case and surrounding blanks, so `Alice` cannot approve `alice`'s replay), and
/// signing exactly the frozen list (`frozen` is `None` while the scope is not frozen) and the
/// spec as it stands (`spec_sha256`, without the approval and `suspend`).
pub fn check_approval(
    requested_by: &str,
    approval: Option<ApprovalClaim<'_>>,
    frozen: Option<FrozenList<'_>>,
    spec_sha256: &str,
) -> Result<String, ApprovalProblem> {
    let Some(approval) = approval else {
        return Err(ApprovalProblem::Missing {
            requested_by: requested_by.to_owned(),
        });
    };
    let approver = approval.approved_by.trim();
    if approver.is_empty() {
        return Err(ApprovalProblem::Blank);
    }
    if approver.eq_ignore_ascii_case(requested_by.trim()) {
        return Err(ApprovalProblem::SelfApproved {
            approved_by: approval.approved_by.to_owned(),
            requested_by: requested_by.to_owned(),
        });
    }
    let Some(frozen) = frozen else {
        return Err(ApprovalProblem::BeforeFreeze);
    };
    if approval.scope_sha256 != frozen.sha256 {
        return Err(ApprovalProblem::ScopeMismatch {
            approved: approval.scope_sha256.to_owned(),
            frozen: frozen.sha256.to_owned(),
            config_map: frozen.config_map.to_owned(),
        });
    }
    if approval.spec_sha256 != spec_sha256 {
        return Err(ApprovalProblem::SpecMismatch {
            approved: approval.spec_sha256.to_owned(),
            current: spec_sha256.to_owned(),
        });
    }
    Ok(approver.to_owned())
}

// ---------------------------------------------------------------------------------------------
// What the cluster shows

/// How a stage's Job ended, or that it has not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobOutcome {
    Running,
    Succeeded,
    /// With the Job's reason and message.
    Failed(String),
}

/// A stage's Job as the API server shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobView {
    pub uid: String,
    pub suspended: bool,
    /// Batches (indices) that succeeded.
    pub succeeded: u32,
    /// Batches (indices) that failed for good.
    pub failed: u32,
    pub outcome: JobOutcome,
    /// When the Job finished, if it says.
    pub finished_at: Option<Timestamp>,
    /// The fields of the Job's spec that bound what it may do.
    pub shape: JobShape,
    /// Its controller owner reference names the replay, so the Job goes when the replay goes.
    /// Without it (someone edited `metadata.ownerReferences`) it would run on after a delete.
    pub owned_by_replay: bool,
}

/// What is found under a stage's Job name. Whose it is, is decided by the uid the status
/// recorded when the operator created it, never by the Job's owner references (anyone who
/// may create Jobs may write those).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobObservation {
    Absent,
    Present(JobView),
}

/// The fields of a stage's Job that bound what it does: one batch per index, one index at a
/// time, a failed batch stops it, a deadline. A Job whose fields differ was edited after the
/// operator created it (`parallelism` can be raised by anyone who may patch Jobs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobShape {
    pub completion_mode: Option<String>,
    pub completions: Option<i64>,
    pub parallelism: Option<i64>,
    pub backoff_limit_per_index: Option<i64>,
    pub max_failed_indexes: Option<i64>,
    pub active_deadline_seconds: Option<i64>,
}

impl JobShape {
    /// The first field that differs from `expected`, as `field: found, expected`.
    pub fn difference(&self, expected: &JobShape) -> Option<String> {
        fn show<T: fmt::Debug>(value: &Option<T>) -> String {
            match value {
                Some(v) => format!("{v:?}"),
                None => "unset".to_owned(),
            }
        }
        let fields: [(&str, String, String); 6] = [
            (
                "completionMode",
                show(&self.completion_mode),
                show(&expected.completion_mode),
            ),
            (
                "completions",
                show(&self.completions),
                show(&expected.completions),
            ),
            (
                "parallelism",
                show(&self.parallelism),
                show(&expected.parallelism),
            ),
            (
                "backoffLimitPerIndex",
                show(&self.backoff_limit_per_index),
                show(&expected.backoff_limit_per_index),
            ),
            (
                "maxFailedIndexes",
                show(&self.max_failed_indexes),
                show(&expected.max_failed_indexes),
            ),
            (
                "activeDeadlineSeconds",
                show(&self.active_deadline_seconds),
                show(&expected.active_deadline_seconds),
            ),
        ];
        fields
            .into_iter()
            .find(|(_, found, wanted)| found != wanted)
            .map(|(field, found, wanted)| format!("spec.{field} is {found}, not {wanted}"))
    }
}

/// How a replay is paced (`spec.batches`), for the Jobs' deadlines and shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pacing {
    pub rate_per_second: f64,
    pub pause_between_seconds: f64,
    pub retries_per_batch: u32,
}

/// Time a batch may take besides replaying its events: a Pod scheduled, its image pulled, the
/// process started and stopped.
pub const BATCH_OVERHEAD_SECONDS: f64 = 120.0;
/// The least deadline of a stage's Job.
pub const MIN_STAGE_DEADLINE_SECONDS: i64 = 600;
/// The largest deadline of a stage's Job (30 days): a replay slower than this is mis-paced.
pub const MAX_STAGE_DEADLINE_SECONDS: i64 = 30 * 24 * 3600;

/// The least time a stage can take at the replay's pace: its events at the rate and the
/// pauses between its batches, with no start-up time and no retry. `None` for a pace that
/// gives no time (a rate of 0).
pub fn stage_least_seconds(stage: &Stage, pacing: Pacing) -> Option<f64> {
    let rate = pacing.rate_per_second;
    if !(rate.is_finite() && rate > 0.0) {
        return None;
    }
    let pauses = f64::from(stage.batches().saturating_sub(1));
    let pause = pacing.pause_between_seconds.max(0.0);
    Some(f64::from(stage.events) / rate + pauses * pause)
}

/// `activeDeadlineSeconds` of a stage's Job: twice the time its batches need at the replay's
/// rate, with their pauses, a start-up allowance per batch and every allowed retry, so a worker
/// that hangs cannot hold the queue forever while a healthy one never meets it.
pub fn stage_deadline_seconds(stage: &Stage, pacing: Pacing) -> i64 {
    let batches = f64::from(stage.batches());
    let rate = if pacing.rate_per_second.is_finite() && pacing.rate_per_second > 0.0 {
        pacing.rate_per_second
    } else {
        // The schema refuses a rate of 0; were one to reach here, no deadline could be computed
        // from it, so the longest one applies.
        return MAX_STAGE_DEADLINE_SECONDS;
    };
    let pause = pacing.pause_between_seconds.max(0.0);
    let one_pass = f64::from(stage.events) / rate + batches * (pause + BATCH_OVERHEAD_SECONDS);
    let attempts = f64::from(pacing.retries_per_batch) + 1.0;
    let seconds = (2.0 * one_pass * attempts).ceil();
    if seconds.is_finite() && seconds < MAX_STAGE_DEADLINE_SECONDS as f64 {
        (seconds as i64).max(MIN_STAGE_DEADLINE_SECONDS)
    } else {
        MAX_STAGE_DEADLINE_SECONDS
    }
}

/// The shape the operator gives a stage's Job.
pub fn expected_shape(stage: &Stage, pacing: Pacing) -> JobShape {
    JobShape {
        completion_mode: Some("Indexed".to_owned()),
        completions: Some(i64::from(stage.batches())),
        // One batch at a time, in order: the rate limit holds and a failure stops the replay
        // at a known line.
        parallelism: Some(1),
        backoff_limit_per_index: Some(i64::from(pacing.retries_per_batch)),
        // The first batch that fails for good fails the Job: no later batch runs.
        max_failed_indexes: Some(0),
        active_deadline_seconds: Some(stage_deadline_seconds(stage, pacing)),
    }
}

/// The number of indices in a Job's `completedIndexes`/`failedIndexes` list (`"1,3-5"` → 4).
pub fn count_indexes(list: &str) -> Result<u32, String> {
    let mut count: u32 = 0;
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        let parse = |text: &str| {
            text.trim()
                .parse::<u32>()
                .map_err(|_| format!("{part:?} in index list {list:?} is not an index or range"))
        };
        let (first, last) = (parse(first)?, parse(last)?);
        if last < first {
            return Err(format!("range {part:?} in {list:?} runs backwards"));
        }
        count = count.saturating_add(last - first + 1);
    }
    Ok(count)
}

/// A stage as recorded in the status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageRecord {
    pub stage: Stage,
    pub job: String,
    pub job_uid: Option<String>,
    /// Set when the operator decided to start the stage, before its Job is created: from then
    /// on the approval is locked (the admission policy reads this) and the stage is never
    /// skipped.
    pub started_at: Option<Timestamp>,
    /// Set once the stage's Job succeeded; a failed stage halts the replay instead.
    pub finished_at: Option<Timestamp>,
    pub succeeded: u32,
    pub failed: u32,
}

impl StageRecord {
    fn planned(stage: Stage, replay: &str, uid: &str) -> StageRecord {
        StageRecord {
            stage,
            job: job_name(replay, uid, stage.name),
            job_uid: None,
            started_at: None,
            finished_at: None,
            succeeded: 0,
            failed: 0,
        }
    }
}

/// Why a replay stopped for good.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Halt {
    /// CamelCase: `BatchFailed`, `VerificationFailed`, ...
    pub reason: String,
    pub message: String,
}

/// What one verification check returned.
#[derive(Clone, Debug, PartialEq)]
pub enum CheckResult {
    /// One sample, not zero.
    Holds(f64),
    /// One sample, zero.
    Fails(f64),
    /// No usable sample, and why.
    Unknown(String),
}

/// A check's result under its name.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckOutcome {
    pub name: String,
    pub query: String,
    pub result: CheckResult,
}

/// Reads a check's query result: exactly one finite sample is an answer (non-zero holds);
/// anything else is not yet an answer — an empty result is missing data, never a pass.
pub fn check_result(query: &str, observation: &Observation) -> CheckResult {
    match observation {
        Observation::Failed(reason) => CheckResult::Unknown(format!("the query failed: {reason}")),
        Observation::Samples(samples) => match samples.as_slice() {
            [] if compares_without_bool(query) => CheckResult::Unknown(
                "the query returned no sample (missing data is not a pass); a comparison \
                 without bool, such as == 0, returns nothing when it is false and so can \
                 never fail or pass: write it with bool (== bool 0)"
                    .to_owned(),
            ),
            [] => CheckResult::Unknown(
                "the query returned no sample (missing data is not a pass)".to_owned(),
            ),
            [value] if !value.is_finite() => {
                CheckResult::Unknown(format!("the query returned {value}"))
            }
            [value] if *value == 0.0 => CheckResult::Fails(*value),
            [value] => CheckResult::Holds(*value),
            many => CheckResult::Unknown(format!(
                "the query returned {} series; it must return one (aggregate it, e.g. with sum)",
                many.len()
            )),
        },
    }
}

/// Whether `query` compares (`==`, `!=`, `>`, `<`, `>=`, `<=`) without the `bool` modifier:
/// such a comparison filters its left side, so the check gets no sample whenever it is false.
/// Label matchers and quoted strings are skipped; a hint, not a parser.
pub fn compares_without_bool(query: &str) -> bool {
    let mut outside = String::with_capacity(query.len());
    let (mut braces, mut quote) = (0_u32, None);
    for c in query.chars() {
        match (quote, c) {
            (Some(open), c) if c == open => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'' | '`') => quote = Some(c),
            (None, '{') => braces += 1,
            (None, '}') => braces = braces.saturating_sub(1),
            (None, c) if braces == 0 => outside.push(c),
            (None, _) => {}
        }
    }
    let bytes = outside.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let two = bytes.get(i..i + 2);
        let width = match (bytes[i], two) {
            (_, Some(b"==" | b"!=" | b">=" | b"<=")) => 2,
            (b'>' | b'<', _) => 1,
            _ => 0,
        };
        if width > 0 {
            if !outside[i + width..].trim_start().starts_with("bool") {
                return true;
            }
            i += width;
        } else {
            i += 1;
        }
    }
    false
}

/// Another replay of the same source queue, as far as the queue is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueMember {
    /// `namespace/name`.
    pub key: String,
    pub created: Timestamp,
    /// A stage started and the replay has not ended.
    pub active: bool,
    /// Approved and waiting for the queue (phase `Approved`).
    pub queued: bool,
}

/// Whether this replay may start on its source queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueueState {
    Free,
    /// `holder` is replaying the queue (`active`) or was queued first.
    Busy {
        holder: String,
        active: bool,
    },
}

/// At most one replay per source queue: a replay may start when no other is active on it and
/// none queued before it (older, or as old and first by name) is waiting.
pub fn queue_state(key: &str, created: Timestamp, others: &[QueueMember]) -> QueueState {
    let mut others: Vec<&QueueMember> = others.iter().filter(|m| m.key != key).collect();
    others.sort_by(|a, b| (a.created, &a.key).cmp(&(b.created, &b.key)));
    if let Some(active) = others.iter().find(|m| m.active) {
        return QueueState::Busy {
            holder: active.key.clone(),
            active: true,
        };
    }
    match others
        .iter()
        .find(|m| m.queued && (m.created, m.key.as_str()) < (created, key))
    {
        Some(first) => QueueState::Busy {
            holder: first.key.clone(),
            active: false,
        },
        None => QueueState::Free,
    }
}

mod machine;

pub use machine::{
    ADMITTED, APPROVED, Action, DEFAULT_VERIFICATION_DELAY, Decision, HALTED, JOB_ACCEPTED, Need,
    RECORD_RETRY, ReplayFacts, SCOPE_FROZEN, SCOPE_RETRY, ScopeCheck, ScopeFacts,
    VERIFICATION_PATIENCE, VERIFICATION_RETRY, VERIFIED, WAIT_RETRY, WAITING, decide,
    remembered_stages,
};

#[cfg(test)]
mod tests;
