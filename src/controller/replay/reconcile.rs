//! One ReplayJob reconcile: read → freeze the scope → decide (core) → record → act.
//!
//! A stage is recorded in the status before its Job is created, the Job is created with a
//! plain create, and the uid of the answer is recorded right after: the stage follows that Job
//! and no other. Every status write is conditional on the version it was decided from, so a
//! decision made on a stale view is never written; records of children this process created
//! are kept in memory until the status shows them.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, PostParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use tracing::{info, warn};

use crate::api::readiness;
use crate::api::replay_job::{ReplayJob, ReplayJobStatus};
use crate::controller::apply::{FIELD_MANAGER, apply_status_at};
use crate::controller::error::{ApiCall, During, Error, Verb};
use crate::controller::plan::Effects;
use crate::core::replay_plan::{
    Action, ApprovalClaim, BatchPlan, CheckOutcome, CheckResult, DEFAULT_VERIFICATION_DELAY,
    FrozenList, Need, Pacing, QueueState, ReplayFacts, ScopeFacts, StageName, StageRecord,
    check_approval, check_result, decide, job_name, queue_state, remembered_stages,
};
use crate::metrics_source::NO_PROMETHEUS;

use super::adopt;
use super::audit::{self, Subject};
use super::facts::{
    created, key, observe_job, queue_key, queue_member, recorded_failure, recorded_halt,
    recorded_stages, recorded_verified,
};
use super::job::{self, Verdict};
use super::memory::{Child, Created};
use super::plan::{self, ReplayStep};
use super::pod_policy;
use super::scope::{self, Freeze};
use super::status::{self, StatusInputs};
use super::{ReplayContext, ended};
use crate::controller::spec_digest::reviewed_replay_sha256;

/// How often a replay that waits for nothing in particular is looked at anyway.
const IDLE_RECHECK: Duration = Duration::from_secs(300);
/// How often a replay that has ended is looked at (its Jobs' watch wakes it sooner).
const ENDED_RECHECK: Duration = Duration::from_secs(3600);
/// Queries older than this are asked again.
const QUERY_MAX_AGE: Duration = Duration::from_secs(1);
/// The longest one API call on the start path may take.
const API_TIMEOUT: Duration = Duration::from_secs(15);
/// The longest a replay waits for its queue's lock before it looks again later.
const QUEUE_LOCK_WAIT: Duration = Duration::from_secs(10);

/// Bounds an API call: a call that hangs fails the reconcile (and is retried) instead of
/// holding a queue's lock or the replay forever.
async fn timed<T>(
    what: impl FnOnce() -> String,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<Result<T, kube::Error>, Error> {
    tokio::time::timeout(API_TIMEOUT, call)
        .await
        .map_err(|_| Error::Timeout {
            what: what(),
            seconds: API_TIMEOUT.as_secs(),
        })
}

/// A stage's Job as the operator would create it, and the API server's verdict on it (a dry
/// run).
async fn checked_job(
    replay: &ReplayJob,
    record: &StageRecord,
    frozen: &crate::api::replay_job::FrozenScope,
    pacing: Pacing,
    worker: &str,
    jobs: &Api<Job>,
) -> Result<(Job, Verdict), Error> {
    let namespace = replay.namespace().unwrap_or_default();
    // The uid was checked before, and a template that does not decode is refused before any
    // stage starts.
    let job = job::build(replay, record, frozen, pacing, worker)
        .ok_or(Error::Inconsistent("a stage's Job cannot be built"))?;
    let verdict = timed(
        || format!("validating Job {namespace}/{}", record.job),
        job::dry_run(jobs, &job),
    )
    .await?
    .during(|| ApiCall::on::<Job>(Verb::Validate, &namespace, &record.job))?;
    Ok((job, verdict))
}

/// Forgets the children the status has caught up with.
fn forget_recorded(ctx: &ReplayContext, uid: &str, status: &ReplayJobStatus) {
    let memory = &ctx.children;
    if let (Some(Created::Uid(remembered)), Some(scope)) =
        (memory.recall(uid, Child::Scope), &status.scope)
        && scope.config_map_uid.as_deref() == Some(remembered.as_str())
    {
        memory.forget(uid, Child::Scope);
    }
    for stage in &status.stages {
        let Some(name) = StageName::parse(&stage.name) else {
            continue;
        };
        if let Some(Created::Uid(remembered)) = memory.recall(uid, Child::Job(name))
            && stage.job_uid.as_deref() == Some(remembered.as_str())
        {
            memory.forget(uid, Child::Job(name));
        }
    }
    if status.audit_config_map.is_some() {
        memory.forget(uid, Child::Audit);
    }
}

/// What the operator itself refuses in the spec: the worker pod policy and the Prometheus
/// allowlist. Each entry names the field and the fix.
fn refusals(ctx: &ReplayContext, replay: &ReplayJob) -> Vec<String> {
    let mut refused = pod_policy::problems(&replay.spec.template, &ctx.base.worker_policy);
    if let Some(prometheus) = &replay.spec.prometheus
        && let Err(problem) = ctx.base.queries.permits(&prometheus.address)
    {
        refused.push(problem.to_string());
    }
    refused
}

/// `spec.verificationDelay`, or the default. The schema checks the duration; one unparsable
/// (from an older schema) counts as the default, never as no wait.
fn verification_delay(replay: &ReplayJob) -> Duration {
    replay
        .spec
        .verification_delay
        .as_deref()
        .and_then(|d| crate::consumer::parse_go_duration(d).ok())
        .unwrap_or(DEFAULT_VERIFICATION_DELAY)
}

fn pacing(replay: &ReplayJob) -> Pacing {
    let batches = &replay.spec.batches;
    Pacing {
        rate_per_second: batches.rate_per_second,
        // The schema checks the duration; an unparsable one (from an older schema) counts as
        // no pause, which only shortens the deadline.
        pause_between_seconds: batches
            .pause_between
            .as_deref()
            .and_then(|p| crate::consumer::parse_go_duration(p).ok())
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0),
        retries_per_batch: u32::try_from(batches.retries_per_batch).unwrap_or(0),
    }
}

pub async fn reconcile(replay: &ReplayJob, ctx: &ReplayContext) -> Result<Requeue, Error> {
    let name = replay.name_any();
    let namespace = replay.namespace().ok_or_else(|| Error::MissingNamespace {
        kind: "ReplayJob",
        name: name.clone(),
    })?;
    let uid = replay.uid().ok_or_else(|| Error::MissingUid {
        kind: "ReplayJob",
        namespace: namespace.clone(),
        name: name.clone(),
    })?;
    if replay.metadata.deletion_timestamp.is_some() {
        // Being deleted: its Jobs and ConfigMap go with it (owner references), but only once
        // it is gone, which a finalizer anyone may add puts off for as long as it stays.
        // Meanwhile its Jobs would run on unwatched, and the replays waiting behind it on
        // the queue start beside them: they are suspended now (which stops their pods).
        let jobs: Api<Job> = Api::namespaced(ctx.base.client.clone(), &namespace);
        for stage in [StageName::Canary, StageName::Main] {
            let job_name = job_name(&name, &uid, stage);
            let found = jobs
                .get_opt(&job_name)
                .await
                .during(|| ApiCall::on::<Job>(Verb::Get, &namespace, &job_name))?;
            let ours_and_running = found.is_some_and(|found| {
                found.owner_references().iter().any(|o| o.uid == uid)
                    && found.spec.as_ref().and_then(|s| s.suspend) != Some(true)
            });
            if ours_and_running {
                job::set_suspend(&jobs, &job_name, true)
                    .await
                    .during(|| ApiCall::on::<Job>(Verb::Patch, &namespace, &job_name))?;
            }
        }
        for child in [
            Child::Scope,
            Child::Audit,
            Child::Job(StageName::Canary),
            Child::Job(StageName::Main),
        ] {
            ctx.children.forget(&uid, child);
        }
        return Ok(Requeue::await_change());
    }
    let client = &ctx.base.client;
    let replays: Api<ReplayJob> = Api::namespaced(client.clone(), &namespace);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &namespace);
    let previous = replay.status.clone().unwrap_or_default();
    forget_recorded(ctx, &uid, &previous);
    let spec = &replay.spec;
    let now = Timestamp::now();
    let subject = Subject::of(replay);

    // The scope is frozen on first sight and never read from its source again.
    let frozen = match &previous.scope {
        Some(frozen) => Ok(frozen.clone()),
        None => match scope::freeze(client, replay, &namespace, &uid, now, &ctx.children).await? {
            Freeze::Frozen(frozen) => Ok(frozen),
            Freeze::NotFrozen { message, permanent } => {
                Err(ScopeFacts::NotFrozen { message, permanent })
            }
            Freeze::Foreign { message } => Err(ScopeFacts::Foreign { message }),
        },
    };
    let scope_facts = match &frozen {
        Ok(frozen) => ScopeFacts::Frozen {
            count: u32::try_from(frozen.count).unwrap_or(0),
            config_map: frozen.config_map.clone(),
            sha256: frozen.sha256.clone(),
        },
        Err(facts) => facts.clone(),
    };

    // The Jobs under their deterministic names, read from the API server (not a cache).
    let mut found_jobs = Vec::new();
    if frozen.is_ok() {
        for stage in StageName::ALL {
            let job_name = job_name(&name, &uid, stage);
            let found = jobs
                .get_opt(&job_name)
                .await
                .during(|| ApiCall::on::<Job>(Verb::Get, &namespace, &job_name))?;
            found_jobs.push((stage, found));
        }
    }
    let observed = found_jobs
        .iter()
        .map(|(stage, found)| (*stage, observe_job(found.as_ref(), &uid)))
        .collect();

    let plan = BatchPlan::new(spec.batches.canary, spec.batches.size);
    let pacing = pacing(replay);
    if let Ok(frozen) = &frozen {
        adopt_unrecorded_jobs(ctx, replay, &jobs, &previous, frozen, pacing, &found_jobs).await?;
    }
    let spec_sha256 = reviewed_replay_sha256(spec);
    let approval = check_approval(
        &spec.requested_by,
        spec.approval.as_ref().map(|a| ApprovalClaim {
            approved_by: &a.approved_by,
            scope_sha256: &a.scope_sha256,
            spec_sha256: &a.spec_sha256,
        }),
        frozen.as_ref().ok().map(|f| FrozenList {
            sha256: &f.sha256,
            config_map: &f.config_map,
        }),
        &spec_sha256,
    );
    let stages = remembered_stages(recorded_stages(&previous), &ctx.children.jobs(&uid));
    let started = stages.iter().any(|s| s.started_at.is_some());
    // Jobs this process created (or adopted) whose uid the status does not record yet.
    let uid_unrecorded = recorded_stages(&previous)
        .into_iter()
        .filter(|record| record.started_at.is_some() && record.job_uid.is_none())
        .map(|record| record.stage.name)
        .filter(|stage| {
            matches!(
                ctx.children.recall(&uid, Child::Job(*stage)),
                Some(Created::Uid(_))
            )
        })
        .collect();
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
        failed: recorded_failure(&previous),
        verified: recorded_verified(&previous),
        has_checks: !spec.verification.is_empty(),
        verification_delay: verification_delay(replay),
        verification: None,
        queue: None,
        rejected: None,
        refused: refusals(ctx, replay),
        pacing,
        scope_check: None,
        uid_unrecorded,
        now,
    };

    // Decide, fetching what the decision asks for. Deciding to start happens under the lock of
    // the replay's queue, held until the start is recorded.
    let mut decision = decide(&facts);
    let mut queue_guard = None;
    loop {
        match decision.need {
            Some(Need::Queue) if facts.queue.is_none() => {
                let key = queue_key(replay);
                let Some(guard) = ctx.queue_locks.acquire(&key, QUEUE_LOCK_WAIT).await else {
                    info!(replay = %name, namespace = %namespace, queue = %key, "another replay of the queue is starting; looking again shortly");
                    return Ok(Requeue::requeue(Duration::from_secs(2)));
                };
                queue_guard = Some(guard);
                facts.queue = Some(queue(ctx, replay).await?);
            }
            Some(Need::Verification) if facts.verification.is_none() => {
                facts.verification = Some(verify(ctx, replay).await);
            }
            Some(Need::ScopeCheck) if facts.scope_check.is_none() => {
                let Ok(recorded) = &frozen else {
                    break;
                };
                let what = || {
                    format!(
                        "checking the frozen scope {namespace}/{}",
                        recorded.config_map
                    )
                };
                let check =
                    tokio::time::timeout(API_TIMEOUT, scope::check(client, &namespace, recorded))
                        .await
                        .map_err(|_| Error::Timeout {
                            what: what(),
                            seconds: API_TIMEOUT.as_secs(),
                        })??;
                facts.scope_check = Some(check);
            }
            _ => break,
        }
        decision = decide(&facts);
    }

    // A stage to start: the API server checks its Job first (a dry run), so a template it
    // refuses is reported before the start is recorded and the approval locked.
    let mut to_create = None;
    if let (Some(Action::Start(record)), Ok(frozen)) = (decision.action.clone(), &frozen) {
        let worker = ctx.base.worker_policy.default_account();
        let checked = |record| checked_job(replay, record, frozen, pacing, worker, &jobs);
        let (job, verdict) = checked(&record).await?;
        // Before the canary, the main stage's Job is checked too: one the API server refuses
        // (its size, its pods' names) would stop the replay after the canary had run.
        let verdict = match (verdict, record.stage.name) {
            (Verdict::Valid, StageName::Canary) => {
                match decision
                    .stages
                    .iter()
                    .find(|s| s.stage.name == StageName::Main)
                {
                    Some(main) => {
                        let (_, main_verdict) = checked(main).await?;
                        match main_verdict {
                            Verdict::Refused(message) => {
                                facts.rejected = Some((StageName::Main, message));
                                decision = decide(&facts);
                                None
                            }
                            // Taken or not, the main stage's name is looked at when it starts.
                            Verdict::Valid | Verdict::Exists => Some(Verdict::Valid),
                        }
                    }
                    None => Some(Verdict::Valid),
                }
            }
            (verdict, _) => Some(verdict),
        };
        match verdict {
            None => {}
            Some(Verdict::Valid) => to_create = Some((record, job)),
            Some(Verdict::Refused(message)) => {
                facts.rejected = Some((record.stage.name, message));
                decision = decide(&facts);
            }
            Some(Verdict::Exists) => {
                // Someone created a Job under the stage's name since it was read: look at it.
                let found = jobs
                    .get_opt(&record.job)
                    .await
                    .during(|| ApiCall::on::<Job>(Verb::Get, &namespace, &record.job))?;
                facts.jobs.retain(|(stage, _)| *stage != record.stage.name);
                facts
                    .jobs
                    .push((record.stage.name, observe_job(found.as_ref(), &uid)));
                decision = decide(&facts);
                if matches!(decision.action, Some(Action::Start(_))) {
                    // Gone again meanwhile: decide afresh next time rather than loop here.
                    return Ok(Requeue::requeue(Duration::from_secs(1)));
                }
            }
        }
    }

    let inputs = StatusInputs {
        replay,
        uid: &uid,
        scope: frozen.as_ref().ok(),
        plan: plan.ok(),
        approver: approval.as_deref().ok(),
        spec_sha256: &spec_sha256,
        now,
    };
    let mut next = status::next(&previous, &inputs, &decision);
    // Ready and Stalled, for GitOps tools (kstatus); transition times stay when unchanged.
    let readiness = readiness::of_replay(next.phase, next.message.as_deref());
    next.conditions =
        readiness::merged(&next.conditions, &readiness, next.observed_generation, now);
    let steps = plan::plan(
        &previous,
        &next,
        decision.action.as_ref(),
        to_create.map(|(record, job)| (record.stage.name, job)),
    );
    let effects = ReplayEffects {
        ctx,
        replay,
        subject: &subject,
        namespace: &namespace,
        name: &name,
        uid: &uid,
        now,
        replays: &replays,
        jobs: &jobs,
        written: Mutex::new((previous.clone(), replay.resource_version())),
        created: Mutex::new(None),
    };
    let executed = crate::controller::plan::execute(&steps, &effects).await;
    // The start is recorded (or not): another replay of the queue may decide now.
    drop(queue_guard);
    if let Some((index, error)) = &executed.failure
        && error.status_code() == Some(409)
        && matches!(
            steps[*index],
            ReplayStep::WriteStatus(_)
                | ReplayStep::RecordJobUid { .. }
                | ReplayStep::CreateJob { .. }
        )
    {
        // The replay changed since it was read (a write onto its version), or a Job of the
        // stage's name appeared: decided again, on what is there now.
        info!(replay = %name, namespace = %namespace, %error, "changed since it was read; deciding again");
        return Ok(Requeue::requeue(Duration::from_secs(1)));
    }
    executed.into_result()?;

    Ok(Requeue::requeue(decision.recheck_after.unwrap_or(
        if ended(next.phase) {
            ENDED_RECHECK
        } else {
            IDLE_RECHECK
        },
    )))
}

/// Remembers, as if this process had created it, the Job of a started stage that the status
/// does not record when it is exactly the Job the operator would create (see [`adopt`]): the
/// create whose answer a killed operator never recorded. Anything else stays foreign.
async fn adopt_unrecorded_jobs(
    ctx: &ReplayContext,
    replay: &ReplayJob,
    jobs: &Api<Job>,
    previous: &ReplayJobStatus,
    frozen: &crate::api::replay_job::FrozenScope,
    pacing: Pacing,
    found_jobs: &[(StageName, Option<Job>)],
) -> Result<(), Error> {
    let uid = replay.uid().unwrap_or_default();
    let namespace = replay.namespace().unwrap_or_default();
    for record in recorded_stages(previous) {
        let stage = record.stage.name;
        if record.started_at.is_none()
            || record.job_uid.is_some()
            || ctx.children.recall(&uid, Child::Job(stage)).is_some()
        {
            continue;
        }
        let Some(found) = found_jobs
            .iter()
            .find(|(s, _)| *s == stage)
            .and_then(|(_, job)| job.as_ref())
        else {
            continue;
        };
        let worker = ctx.base.worker_policy.default_account();
        let Some(intended) = job::build(replay, &record, frozen, pacing, worker) else {
            continue;
        };
        let defaulted = timed(
            || format!("validating Job {namespace}/{} to compare it", record.job),
            adopt::defaulted(jobs, &intended),
        )
        .await?
        .during(|| ApiCall::on::<Job>(Verb::Validate, &namespace, &record.job))?;
        if defaulted.is_some_and(|defaulted| adopt::same_workload(&defaulted, found)) {
            let job_uid = found.uid().unwrap_or_default();
            info!(replay = %replay.name_any(), namespace = %namespace, job = %record.job, job_uid = %job_uid, stage = %stage, "adopted the stage's Job whose create was not recorded: it is exactly the Job the operator creates");
            ctx.children
                .remember(&uid, Child::Job(stage), Created::Uid(job_uid));
        }
    }
    Ok(())
}

/// Writes one audit line per transition.
fn write_audit(
    ctx: &ReplayContext,
    subject: &Subject,
    previous: &ReplayJobStatus,
    next: &ReplayJobStatus,
    now: Timestamp,
) {
    for record in audit::transitions(subject, previous, next, now) {
        ctx.base.audit.write(&record);
    }
}

/// Writes the trail of a replay that ended into an immutable ConfigMap it does not own, once,
/// and records its name.
async fn archive(
    ctx: &ReplayContext,
    replay: &ReplayJob,
    status: &ReplayJobStatus,
    version: Option<&str>,
    now: Timestamp,
) -> Result<(), Error> {
    let name = replay.name_any();
    let namespace = replay.namespace().unwrap_or_default();
    let uid = replay.uid().unwrap_or_default();
    let archived = match ctx.children.recall(&uid, Child::Audit) {
        Some(Created::Uid(archived)) => archived,
        _ => {
            let config_maps: Api<ConfigMap> = Api::namespaced(ctx.base.client.clone(), &namespace);
            let params = PostParams {
                field_manager: Some(FIELD_MANAGER.to_owned()),
                ..PostParams::default()
            };
            let written = match config_maps
                .create(&params, &audit::archive(replay, status, now))
                .await
            {
                Ok(written) => written,
                Err(kube::Error::Api(refusal)) if refusal.code == 403 => {
                    // The log lines are the trail then; say once per reconcile why.
                    warn!(replay = %name, namespace = %namespace, refusal = %refusal.message, "the operator may not create the audit ConfigMap in this namespace");
                    return Ok(());
                }
                Err(error) => {
                    return Err(error)
                        .during(|| ApiCall::on::<ConfigMap>(Verb::Create, &namespace, &name));
                }
            };
            let archived = written.name_any();
            ctx.children
                .remember(&uid, Child::Audit, Created::Uid(archived.clone()));
            info!(replay = %name, namespace = %namespace, configmap = %archived, "audit trail archived");
            archived
        }
    };
    let mut recorded = status.clone();
    recorded.audit_config_map = Some(archived);
    let replays: Api<ReplayJob> = Api::namespaced(ctx.base.client.clone(), &namespace);
    if let Err(error) = apply_status_at(&replays, &name, &recorded, version).await {
        // The memory keeps the name; the next reconcile records it without a second archive.
        info!(replay = %name, namespace = %namespace, %error, "the audit ConfigMap's name is not recorded yet");
    }
    Ok(())
}

/// Whether another replay of the namespace holds the source queue, from a live list (not the
/// cache). Replays of other namespaces never count: a tenant cannot hold up another's replay.
async fn queue(ctx: &ReplayContext, replay: &ReplayJob) -> Result<QueueState, Error> {
    let namespace = replay.namespace().unwrap_or_default();
    let what = || {
        format!(
            "listing the ReplayJobs of namespace {namespace} to find the replays of the same source queue"
        )
    };
    let all = timed(
        what,
        Api::<ReplayJob>::namespaced(ctx.base.client.clone(), &namespace)
            .list(&ListParams::default()),
    )
    .await?
    .during(|| ApiCall::list::<ReplayJob>(Some(&namespace)))?;
    let queue = queue_key(replay);
    let members: Vec<_> = all
        .items
        .iter()
        .filter(|other| queue_key(other) == queue)
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
                    &check.query,
                    &ctx.base
                        .queries
                        .query(&address, &check.query, QUERY_MAX_AGE)
                        .await,
                ),
                None => CheckResult::Unknown(NO_PROMETHEUS.to_owned()),
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

/// The API calls of one replay's plan. It keeps the status as last written (and its
/// resourceVersion), so that each write goes onto the version the pass wrote before, and the
/// uid the create answered with, for the step that records it.
struct ReplayEffects<'a> {
    ctx: &'a ReplayContext,
    replay: &'a ReplayJob,
    subject: &'a Subject,
    namespace: &'a str,
    name: &'a str,
    uid: &'a str,
    now: Timestamp,
    replays: &'a Api<ReplayJob>,
    jobs: &'a Api<Job>,
    written: Mutex<(ReplayJobStatus, Option<String>)>,
    created: Mutex<Option<(StageName, String)>>,
}

impl ReplayEffects<'_> {
    fn written(&self) -> (ReplayJobStatus, Option<String>) {
        self.written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Writes `status` onto the version last written, then audits and announces the
    /// transition it records.
    async fn write(&self, status: &ReplayJobStatus) -> Result<(), Error> {
        let (before, version) = self.written();
        let (namespace, name) = (self.namespace, self.name);
        let written = timed(
            || format!("writing the status of ReplayJob {namespace}/{name}"),
            apply_status_at(self.replays, name, status, version.as_deref()),
        )
        .await?
        .during(|| ApiCall::on::<ReplayJob>(Verb::Apply, namespace, name).subresource("status"))?;
        *self
            .written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            (status.clone(), written.resource_version());
        write_audit(self.ctx, self.subject, &before, status, self.now);
        for event in plan::announcements(&self.replay.spec.requested_by, &before, status) {
            self.ctx.base.publish_planned(self.replay, &event).await;
        }
        Ok(())
    }

    async fn perform_step(&self, step: &ReplayStep) -> Result<(), Error> {
        let (namespace, name, uid) = (self.namespace, self.name, self.uid);
        match step {
            ReplayStep::WriteStatus(status) => self.write(status).await,
            ReplayStep::CreateJob { stage, job } => {
                let job_name = job.name_any();
                let created = timed(
                    || format!("creating Job {namespace}/{job_name}"),
                    job::create(self.jobs, job),
                )
                .await?;
                let created = match created {
                    Ok(created) => created,
                    Err(kube::Error::Api(status)) if status.code != 409 => {
                        // The API server answered that it did not create it: it may be
                        // created again.
                        self.ctx
                            .children
                            .remember(uid, Child::Job(*stage), Created::Refused);
                        return Err(kube::Error::Api(status))
                            .during(|| ApiCall::on::<Job>(Verb::Create, namespace, &job_name));
                    }
                    // A 409: someone created it first; the next pass finds it and halts.
                    Err(error) => {
                        return Err(error)
                            .during(|| ApiCall::on::<Job>(Verb::Create, namespace, &job_name));
                    }
                };
                let job_uid = created.uid().unwrap_or_default();
                self.ctx
                    .children
                    .remember(uid, Child::Job(*stage), Created::Uid(job_uid.clone()));
                info!(replay = %name, namespace = %namespace, job = %job_name, job_uid = %job_uid, stage = %stage, "stage started");
                *self
                    .created
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((*stage, job_uid));
                Ok(())
            }
            ReplayStep::RecordJobUid { stage } => {
                let created = self
                    .created
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone();
                let Some((created_stage, job_uid)) = created.filter(|(s, _)| s == stage) else {
                    return Err(Error::Inconsistent("recording a Job uid before its create"));
                };
                // Until this write, the memory vouches for the Job, which stays suspended.
                let (before, _) = self.written();
                self.write(&status::with_job_uid(&before, created_stage, &job_uid))
                    .await
            }
            ReplayStep::ResumeJob { job } => {
                job::set_suspend(self.jobs, job, false)
                    .await
                    .during(|| ApiCall::on::<Job>(Verb::Patch, namespace, job))?;
                Ok(())
            }
            ReplayStep::SetSuspend { job, suspend } => {
                job::set_suspend(self.jobs, job, *suspend)
                    .await
                    .during(|| ApiCall::on::<Job>(Verb::Patch, namespace, job))?;
                let (reason, note) = if *suspend {
                    ("JobSuspended", format!("Job {job} suspended"))
                } else {
                    ("JobResumed", format!("Job {job} resumed"))
                };
                self.ctx
                    .base
                    .publish(self.replay, EventType::Normal, reason, "Replay", &note)
                    .await;
                Ok(())
            }
            ReplayStep::Archive => {
                let (status, version) = self.written();
                archive(self.ctx, self.replay, &status, version.as_deref(), self.now).await
            }
        }
    }
}

impl Effects<ReplayStep> for ReplayEffects<'_> {
    fn perform(&self, step: &ReplayStep) -> impl Future<Output = Result<(), Error>> + Send {
        self.perform_step(step)
    }
}
