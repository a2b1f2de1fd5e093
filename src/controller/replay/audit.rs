//! The replay audit trail: one JSON line per transition on the operator's log, with a stable
//! schema, and at the end the whole trail in an immutable ConfigMap that is not owned by the
//! ReplayJob, so it outlives it.
//!
//! Records are derived (purely) from two consecutive statuses; the archived trail is the same
//! derivation from an empty status to the final one, with the times the status recorded.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};

use crate::api::conditions::is_true;
use crate::api::replay_job::{ReplayJob, ReplayJobStatus, ReplayPhase};
use crate::controller::apply::FIELD_MANAGER;
use crate::core::replay_plan::{VERIFIED, operation_id};

use super::job::LABEL_REPLAY;

/// The schema of every record; a change that is not an added field gets a new version.
pub const AUDIT_SCHEMA: &str = "backlog.dev/replayjob-audit/v1";
/// Label on every audit ConfigMap (`replayjob`), for retention by label.
pub const LABEL_AUDIT: &str = "backlog.dev/audit";
/// Label on every audit ConfigMap: the uid of the ReplayJob it records.
pub const LABEL_REPLAY_UID: &str = "backlog.dev/replay-uid";
/// Label on every audit ConfigMap: the month the replay ended, `YYYY-MM` (UTC).
pub const LABEL_ENDED_MONTH: &str = "backlog.dev/ended-month";
/// The audit ConfigMap's keys: the trail, one record per line, and the ReplayJob as it ended.
pub const TRAIL_KEY: &str = "trail.jsonl";
pub const REPLAY_KEY: &str = "replayjob.json";

/// One transition of a replay. Every key is always present (null when it does not apply), so
/// log pipelines can rely on the shape.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    /// [`AUDIT_SCHEMA`].
    pub audit: String,
    /// When it happened (RFC 3339, UTC).
    pub time: String,
    /// `ScopeFrozen`, `Approved`, `ApprovalWithdrawn`, `StageStarted`, `JobCreated`,
    /// `StageFinished`, `Verified`, `PhaseChanged`.
    pub event: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub operation_id: String,
    pub previous_phase: Option<String>,
    pub phase: Option<String>,
    pub requested_by: String,
    pub approved_by: Option<String>,
    pub approval_reference: Option<String>,
    pub scope_sha256: Option<String>,
    pub scope_config_map: Option<String>,
    pub scope_config_map_uid: Option<String>,
    /// The digest of the spec the status was written for (`status.specSha256`): once
    /// approved, the spec the approval named.
    pub spec_sha256: Option<String>,
    pub stage: Option<String>,
    pub job: Option<String>,
    pub job_uid: Option<String>,
    pub message: Option<String>,
}

/// The replay a record is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub requested_by: String,
}

impl Subject {
    pub fn of(replay: &ReplayJob) -> Subject {
        Subject {
            namespace: replay.namespace().unwrap_or_default(),
            name: replay.name_any(),
            uid: replay.uid().unwrap_or_default(),
            requested_by: replay.spec.requested_by.clone(),
        }
    }
}

fn phase_name(phase: Option<ReplayPhase>) -> Option<String> {
    phase.map(|p| format!("{p:?}"))
}

fn record(
    subject: &Subject,
    status: &ReplayJobStatus,
    event: &str,
    time: Timestamp,
) -> AuditRecord {
    let scope = status.scope.as_ref();
    AuditRecord {
        audit: AUDIT_SCHEMA.to_owned(),
        time: time.to_string(),
        event: event.to_owned(),
        namespace: subject.namespace.clone(),
        name: subject.name.clone(),
        uid: subject.uid.clone(),
        operation_id: operation_id(&subject.uid),
        previous_phase: None,
        phase: phase_name(status.phase),
        requested_by: subject.requested_by.clone(),
        approved_by: status.approved_by.clone(),
        approval_reference: status.approval_reference.clone(),
        scope_sha256: scope.map(|s| s.sha256.clone()),
        scope_config_map: scope.map(|s| s.config_map.clone()),
        scope_config_map_uid: scope.and_then(|s| s.config_map_uid.clone()),
        spec_sha256: status.spec_sha256.clone(),
        stage: None,
        job: None,
        job_uid: None,
        message: None,
    }
}

/// The transitions from `previous` to `next`, in the order they happen. A record's time is the
/// one the status recorded for it where there is one, else `now`.
pub fn transitions(
    subject: &Subject,
    previous: &ReplayJobStatus,
    next: &ReplayJobStatus,
    now: Timestamp,
) -> Vec<AuditRecord> {
    let mut records = Vec::new();
    if previous.scope.is_none()
        && let Some(scope) = &next.scope
    {
        let mut frozen = record(subject, next, "ScopeFrozen", scope.frozen_at.0);
        frozen.message = Some(format!(
            "{} event id(s) frozen in ConfigMap {}",
            scope.count, scope.config_map
        ));
        records.push(frozen);
    }
    if next.approved_by != previous.approved_by {
        match &next.approved_by {
            Some(_) => records.push(record(
                subject,
                next,
                "Approved",
                next.approved_at.as_ref().map(|t| t.0).unwrap_or(now),
            )),
            None => {
                let mut withdrawn = record(subject, next, "ApprovalWithdrawn", now);
                withdrawn.approved_by = previous.approved_by.clone();
                records.push(withdrawn);
            }
        }
    }
    for stage in &next.stages {
        let before = previous.stages.iter().find(|s| s.name == stage.name);
        let with_stage = |mut r: AuditRecord| {
            r.stage = Some(stage.name.clone());
            r.job = Some(stage.job.clone());
            r.job_uid = stage.job_uid.clone();
            r
        };
        if let Some(started) = &stage.started_at
            && before.and_then(|b| b.started_at.as_ref()).is_none()
        {
            let mut started_record = with_stage(record(subject, next, "StageStarted", started.0));
            started_record.message = Some(format!(
                "{} event(s) in {} batch(es) from line {} of the frozen list",
                stage.events,
                stage.batches,
                stage.first_event + 1
            ));
            records.push(started_record);
        }
        if stage.job_uid.is_some() && before.and_then(|b| b.job_uid.as_ref()).is_none() {
            let at = stage.started_at.as_ref().map(|t| t.0).unwrap_or(now);
            records.push(with_stage(record(subject, next, "JobCreated", at)));
        }
        if let Some(finished) = &stage.finished_at
            && before.and_then(|b| b.finished_at.as_ref()).is_none()
        {
            records.push(with_stage(record(
                subject,
                next,
                "StageFinished",
                finished.0,
            )));
        }
    }
    if is_true(&next.conditions, VERIFIED) && !is_true(&previous.conditions, VERIFIED) {
        records.push(record(subject, next, "Verified", now));
    }
    if next.phase != previous.phase {
        let mut changed = record(subject, next, "PhaseChanged", now);
        changed.previous_phase = phase_name(previous.phase);
        changed.message = next.message.clone();
        records.push(changed);
    }
    records
}

/// The whole trail of a replay that ended, from its final status.
pub fn trail(subject: &Subject, status: &ReplayJobStatus, now: Timestamp) -> Vec<AuditRecord> {
    let mut records = transitions(subject, &ReplayJobStatus::default(), status, now);
    // Times as recorded; transitions of the same moment keep their order.
    records.sort_by_key(|r| r.time.parse::<Timestamp>().ok());
    records
}

/// One JSON document per line.
pub fn lines(records: &[AuditRecord]) -> String {
    records
        .iter()
        .filter_map(|r| serde_json::to_string(r).ok())
        .map(|line| line + "\n")
        .collect()
}

/// The immutable audit ConfigMap of a replay that ended: named by the API server (a name
/// nobody can take first), not owned by the ReplayJob (it outlives it), labelled for
/// retention.
pub fn archive(replay: &ReplayJob, status: &ReplayJobStatus, now: Timestamp) -> ConfigMap {
    let subject = Subject::of(replay);
    let mut recorded = replay.clone();
    // The ids are in the frozen ConfigMap and their sha256 in the trail; a long inline list
    // would not fit next to them.
    recorded.spec.scope.event_ids = Vec::new();
    recorded.metadata.managed_fields = None;
    recorded.status = Some(status.clone());
    let stem: String = subject.name.chars().take(40).collect();
    let month: String = now.to_string().chars().take(7).collect();
    ConfigMap {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-audit-", stem.trim_end_matches('-'))),
            namespace: Some(subject.namespace.clone()),
            labels: Some(BTreeMap::from([
                (
                    "app.kubernetes.io/managed-by".to_owned(),
                    FIELD_MANAGER.to_owned(),
                ),
                (LABEL_AUDIT.to_owned(), "replayjob".to_owned()),
                (LABEL_REPLAY.to_owned(), subject.name.clone()),
                (LABEL_REPLAY_UID.to_owned(), subject.uid.clone()),
                (LABEL_ENDED_MONTH.to_owned(), month),
            ])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([
            (TRAIL_KEY.to_owned(), lines(&trail(&subject, status, now))),
            (
                REPLAY_KEY.to_owned(),
                serde_json::to_string_pretty(&recorded).unwrap_or_default(),
            ),
        ])),
        immutable: Some(true),
        ..ConfigMap::default()
    }
}

/// Where audit records go.
pub trait AuditSink: Send + Sync {
    fn write(&self, record: &AuditRecord);
}

/// One line per record on standard output, next to the operator's log lines.
pub struct StdoutAudit;

impl AuditSink for StdoutAudit {
    fn write(&self, record: &AuditRecord) {
        if let Ok(line) = serde_json::to_string(record) {
            // One write of the whole line under the lock: lines never interleave.
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
        }
    }
}

/// Records kept in memory (tests read them back).
#[derive(Default)]
pub struct MemoryAudit {
    records: Mutex<Vec<AuditRecord>>,
}

impl MemoryAudit {
    pub fn shared() -> Arc<MemoryAudit> {
        Arc::new(MemoryAudit::default())
    }

    pub fn records(&self) -> Vec<AuditRecord> {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl AuditSink for MemoryAudit {
    fn write(&self, record: &AuditRecord) {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(record.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::replay_job::{FrozenScope, StageStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn subject() -> Subject {
        Subject {
            namespace: "team".into(),
            name: "orders".into(),
            uid: "u-1".into(),
            requested_by: "alice".into(),
        }
    }

    fn frozen() -> ReplayJobStatus {
        ReplayJobStatus {
            phase: Some(ReplayPhase::AwaitingApproval),
            scope: Some(FrozenScope {
                config_map: "orders-scope-u1".into(),
                config_map_uid: Some("cm-1".into()),
                count: 3,
                sha256: "abc".into(),
                frozen_at: Time(at(10)),
            }),
            ..ReplayJobStatus::default()
        }
    }

    fn started(mut status: ReplayJobStatus, job_uid: Option<&str>) -> ReplayJobStatus {
        status.phase = Some(ReplayPhase::Canary);
        status.approved_by = Some("bob".into());
        status.approved_at = Some(Time(at(20)));
        status.approval_reference = Some("CAB-1".into());
        status.stages = vec![StageStatus {
            name: "canary".into(),
            job: "orders-canary-u1".into(),
            job_uid: job_uid.map(str::to_owned),
            batches: 1,
            first_event: 0,
            events: 1,
            batch_size: 1,
            first_batch: 0,
            started_at: Some(Time(at(30))),
            finished_at: None,
            succeeded: 0,
            failed: 0,
        }];
        status
    }

    #[test]
    fn each_transition_is_one_record_with_who_what_and_which_job() {
        let first = transitions(&subject(), &ReplayJobStatus::default(), &frozen(), at(11));
        let events: Vec<&str> = first.iter().map(|r| r.event.as_str()).collect();
        assert_eq!(events, ["ScopeFrozen", "PhaseChanged"]);
        assert_eq!(first[0].time, at(10).to_string());
        assert_eq!(first[0].scope_sha256.as_deref(), Some("abc"));
        assert_eq!(first[0].operation_id, "replay-u-1");

        let start = started(frozen(), None);
        let events: Vec<String> = transitions(&subject(), &frozen(), &start, at(31))
            .into_iter()
            .map(|r| r.event)
            .collect();
        assert_eq!(events, ["Approved", "StageStarted", "PhaseChanged"]);

        let created = started(frozen(), Some("job-1"));
        let records = transitions(&subject(), &start, &created, at(32));
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].event, "JobCreated");
        assert_eq!(records[0].job_uid.as_deref(), Some("job-1"));
        assert_eq!(records[0].approved_by.as_deref(), Some("bob"));
        assert_eq!(records[0].requested_by, "alice");
        // Nothing new, nothing written.
        assert!(transitions(&subject(), &created, &created, at(33)).is_empty());
    }

    #[test]
    fn records_keep_a_stable_shape() {
        let record = &transitions(&subject(), &ReplayJobStatus::default(), &frozen(), at(11))[0];
        let json = serde_json::to_value(record).unwrap();
        let mut keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "approvalReference",
                "approvedBy",
                "audit",
                "event",
                "job",
                "jobUid",
                "message",
                "name",
                "namespace",
                "operationId",
                "phase",
                "previousPhase",
                "requestedBy",
                "scopeConfigMap",
                "scopeConfigMapUid",
                "scopeSha256",
                "specSha256",
                "stage",
                "time",
                "uid",
            ]
        );
        assert_eq!(json["audit"], AUDIT_SCHEMA);
        let line = lines(std::slice::from_ref(record));
        assert_eq!(line.matches('\n').count(), 1);
        let back: AuditRecord = serde_json::from_str(line.trim_end()).unwrap();
        assert_eq!(&back, record);
    }

    #[test]
    fn the_archived_trail_is_in_time_order_and_not_owned() {
        let mut done = started(frozen(), Some("job-1"));
        done.phase = Some(ReplayPhase::Succeeded);
        done.stages[0].finished_at = Some(Time(at(40)));
        let trail = trail(&subject(), &done, at(50));
        let events: Vec<&str> = trail.iter().map(|r| r.event.as_str()).collect();
        assert_eq!(
            events,
            [
                "ScopeFrozen",
                "Approved",
                "StageStarted",
                "JobCreated",
                "StageFinished",
                "PhaseChanged"
            ]
        );
        let spec: crate::api::replay_job::ReplayJobSpec =
            serde_json::from_value(serde_json::json!({
                "source": {"queue": "q"},
                "scope": {"eventIds": ["a", "b", "c"]},
                "reason": "r",
                "requestedBy": "alice",
                "batches": {"size": 1, "canary": 1, "ratePerSecond": 1},
                "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}},
            }))
            .unwrap();
        let mut replay = ReplayJob::new("orders", spec);
        replay.metadata.namespace = Some("team".into());
        replay.metadata.uid = Some("u-1".into());
        let archive = archive(&replay, &done, at(50));
        assert_eq!(archive.immutable, Some(true));
        assert!(archive.metadata.owner_references.is_none());
        assert_eq!(
            archive.metadata.generate_name.as_deref(),
            Some("orders-audit-")
        );
        let labels = archive.metadata.labels.unwrap();
        assert_eq!(labels[LABEL_AUDIT], "replayjob");
        assert_eq!(labels[LABEL_ENDED_MONTH], "1970-01");
        let data = archive.data.unwrap();
        assert_eq!(data[TRAIL_KEY].lines().count(), 6);
        assert!(!data[REPLAY_KEY].contains("\"eventIds\""));
    }
}
