//! One ReplayJob reconcile: read → freeze the scope → decide (core) → record → act.
//!
//! A stage is recorded in the status before its Job is created, and the Job is created only if
//! none exists under its deterministic name: an operator stopped at any point creates no second
//! Job for a stage and skips none.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use thiserror::Error;
use tracing::{info, warn};

use crate::api::readiness;
use crate::api::replay_job::{ReplayJob, ReplayJobStatus, ReplayPhase};
use crate::controller::apply::apply_params;
use crate::controller::error::{Error, KubeContext};
use crate::core::replay_plan::{
    Action, BatchPlan, CheckOutcome, CheckResult, Need, QueueState, ReplayFacts, ScopeFacts,
    StageName, check_approval, check_result, decide, job_name, queue_state,
};

use super::facts::{
    created, key, observe_job, queue_member, recorded_halt, recorded_stages, recorded_verified,
};
use super::job::{self, Verdict};
use super::scope::{self, Freeze};
use super::status::{self, StatusInputs};
use super::{CONTROLLER, ReplayContext, ended};

/// How often a replay that waits for nothing in particular is looked at anyway.
const IDLE_RECHECK: Duration = Duration::from_secs(300);
/// How often a replay that has ended is looked at (its Jobs' watch wakes it sooner).
const ENDED_RECHECK: Duration = Duration::from_secs(3600);
/// Queries older than this are asked again.
const QUERY_MAX_AGE: Duration = Duration::from_secs(1);

#[derive(Debug, Error)]
pub enum ReplayError {
    #[error(transparent)]
    Controller(#[from] Error),
    #[error(
        "ReplayJob {namespace}/{name} has no uid; only objects read from the API server are reconciled"
    )]
    MissingUid { namespace: String, name: String },
}

impl ReplayError {
    fn kind(&self) -> &'static str {
        match self {
            ReplayError::Controller(error) => error.kind(),
            ReplayError::MissingUid { .. } => "missing_uid",
        }
    }
}

pub async fn reconcile(
    replay: Arc<ReplayJob>,
    ctx: Arc<ReplayContext>,
) -> Result<Requeue, ReplayError> {
    let started = Instant::now();
    let result = reconcile_inner(&replay, &ctx).await;
    ctx.base
        .metrics
        .reconciled(CONTROLLER, started.elapsed().as_secs_f64());
    result
}

/// Retries a failed reconcile after a short pause.
pub fn error_policy(
    replay: Arc<ReplayJob>,
    error: &ReplayError,
    ctx: Arc<ReplayContext>,
) -> Requeue {
    warn!(replay = %replay.name_any(), %error, "reconcile failed");
    ctx.base.metrics.failed(CONTROLLER, error.kind());
    Requeue::requeue(Duration::from_secs(5))
}

async fn reconcile_inner(replay: &ReplayJob, ctx: &ReplayContext) -> Result<Requeue, ReplayError> {
    let name = replay.name_any();
    let namespace = replay.namespace().ok_or_else(|| Error::MissingNamespace {
        kind: "ReplayJob",
        name: name.clone(),
    })?;
    let uid = replay.uid().ok_or_else(|| ReplayError::MissingUid {
        namespace: namespace.clone(),
        name: name.clone(),
    })?;
    if replay.metadata.deletion_timestamp.is_some() {
        // Being deleted: its Jobs and ConfigMap go with it (owner references); start nothing.
        return Ok(Requeue::await_change());
    }
    let client = &ctx.base.client;
    let replays: Api<ReplayJob> = Api::namespaced(client.clone(), &namespace);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &namespace);
    let previous = replay.status.clone().unwrap_or_default();
    let spec = &replay.spec;
    let now = Timestamp::now();

    // The scope is frozen on first sight and never read again.
    let frozen = match &previous.scope {
        Some(frozen) => Ok(frozen.clone()),
        None => match scope::freeze(client, replay, &namespace, &uid, now).await? {
            Freeze::Frozen(frozen) => Ok(frozen),
            Freeze::NotFrozen { message, permanent } => Err((message, permanent)),
        },
    };
    let scope_facts = match &frozen {
        Ok(frozen) => ScopeFacts::Frozen {
            count: u32::try_from(frozen.count).unwrap_or(0),
            config_map: frozen.config_map.clone(),
            sha256: frozen.sha256.clone(),
        },
        Err((message, permanent)) => ScopeFacts::NotFrozen {
            message: message.clone(),
            permanent: *permanent,
        },
    };

    // The Jobs under their deterministic names, read from the API server (not a cache).
    let mut observed = Vec::new();
    if frozen.is_ok() {
        for stage in StageName::ALL {
            let job_name = job_name(&name, &uid, stage);
            let found = jobs
                .get_opt(&job_name)
                .await
                .context(|| format!("reading Job {namespace}/{job_name}"))?;
            observed.push((stage, observe_job(found.as_ref(), &uid)));
        }
    }

    let plan = BatchPlan::new(spec.batches.canary, spec.batches.size);
    let approval = check_approval(
        &spec.requested_by,
        spec.approval.as_ref().map(|a| a.approved_by.as_str()),
    );
    let stages = recorded_stages(&previous);
    let started = stages.iter().any(|s| s.started_at.is_some());
    let mut facts = ReplayFacts {
        replay: name.clone(),
        uid: uid.clone(),
        source_queue: spec.source.queue.clone(),
        scope: scope_facts,
        plan: plan.clone(),
        approval: approval.clone(),
        recorded_approver: if started {
            previous.approved_by.clone()
        } else {
            None
        },
        suspend: spec.suspend,
        stages,
        jobs: observed,
        halted: recorded_halt(&previous),
        verified: recorded_verified(&previous),
        has_checks: !spec.verification.is_empty(),
        verification: None,
        queue: None,
        rejected: None,
        now,
    };

    // Decide, fetching what the decision asks for. Deciding to start happens under the start
    // lock, held until the start is recorded.
    let mut decision = decide(&facts);
    let mut start_guard = None;
    loop {
        match decision.need {
            Some(Need::Queue) if facts.queue.is_none() => {
                start_guard = Some(ctx.start_lock.lock().await);
                facts.queue = Some(queue(ctx, replay).await?);
            }
            Some(Need::Verification) if facts.verification.is_none() => {
                facts.verification = Some(verify(ctx, replay).await);
            }
            _ => break,
        }
        decision = decide(&facts);
    }

    // A stage to start: the API server checks its Job first (a dry run), so a template it
    // refuses is reported before the start is recorded and the approval locked.
    let mut to_create = None;
    if let (Some(Action::Start(record)), Ok(frozen)) = (&decision.action, &frozen) {
        let job = job::build(replay, record, frozen).ok_or_else(|| ReplayError::MissingUid {
            namespace: namespace.clone(),
            name: name.clone(),
        })?;
        match job::dry_run(&jobs, &job, &record.job)
            .await
            .context(|| format!("validating Job {namespace}/{}", record.job))?
        {
            Verdict::Valid => to_create = Some((record.clone(), job)),
            Verdict::Refused(message) => {
                facts.rejected = Some((record.stage.name, message));
                decision = decide(&facts);
            }
        }
    }

    let inputs = StatusInputs {
        replay,
        uid: &uid,
        scope: frozen.as_ref().ok(),
        plan: plan.ok(),
        approver: approval.as_deref().ok(),
        now,
    };
    let mut next = status::next(&previous, &inputs, &decision);
    // Ready and Stalled, for GitOps tools (kstatus); transition times stay when unchanged.
    let readiness = readiness::of_replay(next.phase, next.message.as_deref());
    next.conditions =
        readiness::merged(&next.conditions, &readiness, next.observed_generation, now);
    if next != previous {
        // Recording a start is conditional on the replay being the version decided on: had the
        // approval changed meanwhile, the start would rest on an approval that is gone.
        let precondition = to_create.as_ref().and(replay.resource_version());
        match write_status(&replays, &name, &next, precondition.as_deref()).await {
            Err(kube::Error::Api(status)) if status.code == 409 && precondition.is_some() => {
                info!(replay = %name, namespace = %namespace, "changed while starting a stage; deciding again");
                return Ok(Requeue::requeue(Duration::from_secs(1)));
            }
            written => {
                written
                    .context(|| format!("writing the status of ReplayJob {namespace}/{name}"))?;
            }
        }
    }
    drop(start_guard);

    if let Some((record, job)) = to_create {
        job::create(&jobs, &job, &record.job)
            .await
            .context(|| format!("creating Job {namespace}/{}", record.job))?;
        info!(replay = %name, namespace = %namespace, job = %record.job, stage = %record.stage.name, "stage started");
        let lines = record.stage.first_event + 1..=record.stage.first_event + record.stage.events;
        publish(
            ctx,
            replay,
            EventType::Normal,
            "StageStarted",
            format!(
                "{} stage: Job {} replays {} event(s) (lines {}-{} of ConfigMap {}) in {} batch(es)",
                record.stage.name,
                record.job,
                record.stage.events,
                lines.start(),
                lines.end(),
                next.scope.as_ref().map(|s| s.config_map.as_str()).unwrap_or("-"),
                record.stage.batches()
            ),
        )
        .await;
    }
    if let Some(Action::Suspend { job, suspend }) = &decision.action {
        job::set_suspend(&jobs, job, *suspend)
            .await
            .context(|| format!("setting spec.suspend={suspend} on Job {namespace}/{job}"))?;
        let (reason, note) = if *suspend {
            ("JobSuspended", format!("Job {job} suspended"))
        } else {
            ("JobResumed", format!("Job {job} resumed"))
        };
        publish(ctx, replay, EventType::Normal, reason, note).await;
    }
    announce(ctx, replay, &previous, &next).await;

    Ok(Requeue::requeue(decision.recheck_after.unwrap_or(
        if ended(next.phase) {
            ENDED_RECHECK
        } else {
            IDLE_RECHECK
        },
    )))
}

/// Whether another replay holds the source queue, from a live list (not the cache).
async fn queue(ctx: &ReplayContext, replay: &ReplayJob) -> Result<QueueState, Error> {
    let all = ctx
        .scope
        .api::<ReplayJob>(&ctx.base.client)
        .list(&ListParams::default())
        .await
        .context(|| "listing ReplayJobs to find the replays of the same source queue".to_owned())?;
    let members: Vec<_> = all
        .items
        .iter()
        .filter(|other| other.spec.source.queue == replay.spec.source.queue)
        .map(queue_member)
        .collect();
    Ok(queue_state(&key(replay), created(replay), &members))
}

/// Evaluates every verification check.
async fn verify(ctx: &ReplayContext, replay: &ReplayJob) -> Vec<CheckOutcome> {
    let address = replay
        .spec
        .prometheus
        .as_ref()
        .map(|p| p.address.clone())
        .or_else(|| ctx.base.default_prometheus.clone());
    let checks = replay.spec.verification.iter().map(|check| {
        let address = address.clone();
        async move {
            let result = match address {
                Some(address) => check_result(
                    &ctx.base
                        .queries
                        .query(&address, &check.query, QUERY_MAX_AGE)
                        .await,
                ),
                None => CheckResult::Unknown(
                    "no Prometheus: set spec.prometheus.address or start the operator with --prometheus-url"
                        .to_owned(),
                ),
            };
            CheckOutcome {
                name: check.name.clone(),
                query: check.query.clone(),
                result,
            }
        }
    });
    futures::future::join_all(checks).await
}

/// Applies the status; with `resource_version`, only onto that version of the replay.
async fn write_status(
    api: &Api<ReplayJob>,
    name: &str,
    status: &ReplayJobStatus,
    resource_version: Option<&str>,
) -> Result<ReplayJob, kube::Error> {
    let mut body = serde_json::json!({
        "apiVersion": ReplayJob::api_version(&()),
        "kind": ReplayJob::kind(&()),
        "status": status,
    });
    if let Some(version) = resource_version {
        body["metadata"] = serde_json::json!({ "resourceVersion": version });
    }
    api.patch_status(name, &apply_params(), &Patch::Apply(body))
        .await
}

/// An Event for every transition the status shows.
async fn announce(
    ctx: &ReplayContext,
    replay: &ReplayJob,
    previous: &ReplayJobStatus,
    next: &ReplayJobStatus,
) {
    if previous.scope.is_none()
        && let Some(scope) = &next.scope
    {
        let note = format!(
            "{} event id(s) frozen in ConfigMap {} (sha256 {})",
            scope.count, scope.config_map, scope.sha256
        );
        publish(ctx, replay, EventType::Normal, "ScopeFrozen", note).await;
    }
    if next.approved_by != previous.approved_by
        && let Some(approver) = &next.approved_by
    {
        let reference = next
            .approval_reference
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        let note = format!(
            "approved by {approver}{reference}; requested by {}",
            replay.spec.requested_by
        );
        publish(ctx, replay, EventType::Normal, "Approved", note).await;
    }
    if previous.phase != next.phase
        && let Some(phase) = next.phase
    {
        let warning = matches!(phase, ReplayPhase::Halted | ReplayPhase::Failed);
        publish(
            ctx,
            replay,
            if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            &format!("{phase:?}"),
            next.message.clone().unwrap_or_default(),
        )
        .await;
    }
}

async fn publish(
    ctx: &ReplayContext,
    replay: &ReplayJob,
    type_: EventType,
    reason: &str,
    note: String,
) {
    ctx.base
        .publish(replay, type_, reason, "Replay", &note)
        .await;
}
