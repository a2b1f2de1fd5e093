//! One pass over a Compensation: read the claim, the Job and the report → decide (core) →
//! apply the one action → write the status if it changed.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::runtime::controller::Action as Requeue;
use kube::{Api, ResourceExt};
use tracing::{info, warn};

use super::CompensationContext;
use super::job;
use super::job_pod;
use super::plan::{self, Built, CompensationStep};
use super::request;
use crate::api::compensation::{
    Compensation, CompensationPhase, CompensationStatus, FrozenRequest, PreconditionStatus,
    SubActionState, SubActionStatus,
};
use crate::api::conditions::merge_conditions;
use crate::api::readiness;
use crate::controller::apply::apply_status_at;
use crate::controller::error::{ApiCall, During, Error, Verb};
use crate::controller::plan::{Effects, execute};
use crate::controller::replay::adopt;
use crate::controller::replay::job::{Verdict, create, dry_run, set_suspend};
use crate::controller::replay::pod_policy;
use crate::controller::spec_digest::reviewed_compensation_sha256;
use crate::core::compensation_plan::{
    Action, ApprovalProblem, Claim, CompensationFacts, Decision, JobEnd, JobSeen, ReportProblem,
    WorkerReport, child_name, decide, operation_id, parse_report,
};

/// How often a running worker is looked at even if its Job does not change.
const RUNNING_RECHECK: Duration = Duration::from_secs(30);
/// How often a duplicate looks for its first's result until there is one.
const DUPLICATE_RECHECK: Duration = Duration::from_secs(60);

pub async fn reconcile(
    compensation: &Compensation,
    ctx: &CompensationContext,
) -> Result<Requeue, Error> {
    let name = compensation.name_any();
    let namespace = compensation
        .namespace()
        .ok_or_else(|| Error::MissingNamespace {
            kind: "Compensation",
            name: name.clone(),
        })?;
    let uid = compensation.uid().ok_or_else(|| Error::MissingUid {
        kind: "Compensation",
        namespace: namespace.clone(),
        name: name.clone(),
    })?;
    if compensation.metadata.deletion_timestamp.is_some() {
        ctx.forget(&uid);
        return Ok(Requeue::await_change());
    }
    let client = &ctx.base.client;
    let compensations: Api<Compensation> = Api::namespaced(client.clone(), &namespace);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &namespace);
    // The status as the API server has it: the start and the Job uid are the record that keeps
    // the worker from running twice, so never a cached copy.
    let fresh = compensations.get_status(&name).await.during(|| {
        ApiCall::on::<Compensation>(Verb::Get, &namespace, &name).subresource("status")
    })?;
    let version = fresh.resource_version();
    let previous = fresh.status.unwrap_or_default();
    let spec = &compensation.spec;
    let id = &spec.compensation_id;
    let child = child_name(id);
    let now = Timestamp::now();

    let ended = previous
        .phase
        .filter(|p| p.terminal())
        .map(|p| (p, previous.message.clone().unwrap_or_default()));
    let (claim, frozen_at) =
        if ended.is_some() && previous.phase != Some(CompensationPhase::Duplicate) {
            // An end is final; only a duplicate reads the claim again, to follow the first's
            // result.
            let sha256 = previous
                .request
                .as_ref()
                .map(|r| r.sha256.clone())
                .unwrap_or_default();
            (Claim::Ours { sha256 }, None)
        } else {
            read_claim(compensation, &config_maps, &namespace, &child).await?
        };
    let sha = match &claim {
        Claim::Ours { sha256 } => Some(sha256.clone()),
        _ => None,
    };
    let approval = check_approval(compensation, sha.as_deref(), &child);
    let started_at = previous.started_at.as_ref().map(|t| t.0);
    let worker_account = ctx.base.worker_policy.default_account().to_owned();
    let intended = sha
        .as_deref()
        .and_then(|sha| job::build(compensation, &child, sha, &worker_account));

    let mut refused = Vec::new();
    if ended.is_none() && started_at.is_none() && sha.is_some() {
        refused = pod_policy::problems(&spec.template, &ctx.base.worker_policy);
        // Asked of the API server only once someone approved: a template it refuses is said
        // before the start, never after.
        if refused.is_empty()
            && approval.is_ok()
            && let Some(intended) = &intended
            && let Verdict::Refused(message) = dry_run(&jobs, intended)
                .await
                .during(|| ApiCall::on::<Job>(Verb::Validate, &namespace, &child))?
        {
            refused.push(format!(
                "the API server refuses the worker's Job: {message}"
            ));
        }
    }

    let found = if ended.is_none() && started_at.is_some() {
        jobs.get_opt(&child)
            .await
            .during(|| ApiCall::on::<Job>(Verb::Get, &namespace, &child))?
    } else {
        None
    };
    let job_seen = match &found {
        None => JobSeen::Absent,
        Some(found) => {
            classify(
                ctx,
                &uid,
                &previous,
                &jobs,
                intended.as_ref(),
                found,
                &namespace,
            )
            .await?
        }
    };
    let facts = CompensationFacts {
        compensation_id: id.clone(),
        claim,
        approval,
        refused,
        started_at,
        job_uid: previous.job_uid.clone(),
        uid_unrecorded: ctx.remembered(&uid),
        job: job_seen,
        ended,
        now,
    };
    let decision = decide(&facts);

    let mut next = status_of(
        compensation,
        &previous,
        &decision,
        &facts,
        frozen_at,
        &child,
    );
    let mut claim = None;
    match &decision.action {
        Some(Action::Freeze) => {
            let (text, sha) = request::document(compensation).map_err(|source| Error::Encode {
                what: "the compensation request",
                source,
            })?;
            claim = Some(request::claim(compensation, text, &sha));
        }
        // The record of the start comes first: a Job is only ever created for a recorded
        // start, and created suspended until its uid is recorded too.
        Some(Action::Start) if next.started_at.is_none() => {
            next.started_at = Some(Time(now));
            next.job = Some(child.clone());
            next.approved_by = spec.approval.as_ref().map(|a| a.approved_by.clone());
        }
        Some(Action::Resume { uid: job_uid }) => next.job_uid = Some(job_uid.clone()),
        _ => {}
    }
    let result = match next.phase {
        Some(phase) if plan::ends(&previous, &next) => Some(
            request::result(compensation, phase, &next).map_err(|source| Error::Encode {
                what: "the compensation result",
                source,
            })?,
        ),
        _ => None,
    };
    let steps = plan::plan(
        &previous,
        &next,
        decision.action.as_ref(),
        Built {
            claim,
            job: intended.filter(|_| decision.action == Some(Action::Start)),
            result,
        },
    );
    let effects = CompensationEffects {
        ctx,
        compensation,
        uid: &uid,
        namespace: &namespace,
        name: &name,
        compensations: &compensations,
        config_maps: &config_maps,
        jobs: &jobs,
        written: Mutex::new((previous.clone(), version)),
        created: Mutex::new(None),
    };
    let executed = execute(&steps, &effects).await;
    if let Some((index, error)) = &executed.failure
        && error.status_code() == Some(409)
        && matches!(
            steps[*index],
            CompensationStep::WriteStatus(_)
                | CompensationStep::RecordJobUid
                | CompensationStep::CreateJob(_)
        )
    {
        // Changed since it was read, or a Job of the id's name appeared: decided again.
        info!(compensation = %name, namespace = %namespace, %error, "changed since it was read; deciding again");
        return Ok(Requeue::requeue(Duration::from_millis(200)));
    }
    executed.into_result()?;
    Ok(match (&decision.action, decision.phase) {
        // The next pass reads whose the claim is.
        (Some(Action::Freeze), _) => Requeue::requeue(Duration::from_millis(200)),
        (_, CompensationPhase::Executing) => Requeue::requeue(RUNNING_RECHECK),
        (_, CompensationPhase::Duplicate) if !decision.message.contains(" ended ") => {
            Requeue::requeue(DUPLICATE_RECHECK)
        }
        _ => Requeue::await_change(),
    })
}

/// Who holds the id, and when the claim was made (the frozen request's time).
async fn read_claim(
    compensation: &Compensation,
    config_maps: &Api<ConfigMap>,
    namespace: &str,
    child: &str,
) -> Result<(Claim, Option<Time>), Error> {
    let found = config_maps
        .get_opt(child)
        .await
        .during(|| ApiCall::on::<ConfigMap>(Verb::Get, namespace, child))?;
    let frozen_at = found
        .as_ref()
        .and_then(|cm| cm.metadata.creation_timestamp.clone());
    let claim = request::claim_of(compensation, found.as_ref(), None);
    if let Claim::Theirs { .. } = claim {
        let result_name = request::result_name(&compensation.spec.compensation_id);
        let result = config_maps
            .get_opt(&result_name)
            .await
            .during(|| ApiCall::on::<ConfigMap>(Verb::Get, namespace, &result_name))?;
        let claim = request::claim_of(compensation, found.as_ref(), result.as_ref());
        return Ok((claim, frozen_at));
    }
    Ok((claim, frozen_at))
}

fn check_approval(
    compensation: &Compensation,
    frozen: Option<&str>,
    config_map: &str,
) -> Result<String, ApprovalProblem> {
    let spec = &compensation.spec;
    let Some(approval) = &spec.approval else {
        return Err(ApprovalProblem::Missing {
            requested_by: spec.requested_by.clone(),
        });
    };
    // Compared as for replays: a user name differing only in letter case or edge spaces is
    // the same person.
    let approver = approval.approved_by.trim();
    if approver.is_empty() || approver.eq_ignore_ascii_case(spec.requested_by.trim()) {
        return Err(ApprovalProblem::SelfApproved {
            approved_by: approval.approved_by.clone(),
        });
    }
    let frozen = frozen.unwrap_or_default();
    if approval.request_sha256 != frozen {
        return Err(ApprovalProblem::Mismatch {
            approved: approval.request_sha256.clone(),
            frozen: frozen.to_owned(),
            config_map: config_map.to_owned(),
        });
    }
    let current = reviewed_compensation_sha256(spec);
    if approval.spec_sha256 != current {
        return Err(ApprovalProblem::SpecMismatch {
            approved: approval.spec_sha256.clone(),
            current,
        });
    }
    Ok(approval.approved_by.clone())
}

/// Whether the Job under the id's name is the operator's: the recorded uid, the uid this
/// process got from its create, or (after a restart between the create and the record) a Job
/// that is exactly the one the operator would create.
async fn classify(
    ctx: &CompensationContext,
    uid: &str,
    previous: &CompensationStatus,
    jobs: &Api<Job>,
    intended: Option<&Job>,
    found: &Job,
    namespace: &str,
) -> Result<JobSeen, Error> {
    let found_uid = found.uid().unwrap_or_default();
    let ours = match previous.job_uid.as_deref() {
        Some(recorded) => recorded == found_uid,
        None if ctx.remembered(uid).as_deref() == Some(found_uid.as_str()) => true,
        None => match intended {
            Some(intended) => adopt::defaulted(jobs, intended)
                .await
                .during(|| ApiCall::on::<Job>(Verb::Validate, namespace, &found.name_any()))?
                .is_some_and(|defaulted| adopt::same_workload(&defaulted, found)),
            None => false,
        },
    };
    if !ours {
        return Ok(JobSeen::Foreign);
    }
    let condition = |type_: &str| {
        found
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == type_ && c.status == "True"))
    };
    // Complete and Failed come once the pod has terminated: its report is there to read.
    let outcome = match (condition("Complete"), condition("Failed")) {
        (false, false) => JobEnd::Running,
        (succeeded, _) => JobEnd::Finished {
            succeeded,
            report: report(ctx, namespace, found).await?,
        },
    };
    Ok(JobSeen::Ours {
        uid: found_uid,
        suspended: found.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false),
        outcome,
    })
}

/// The worker's report: the termination message of the worker container (the first of the
/// Job's template; sidecars report nothing) of the Job's one pod. Pods that only carry the
/// Job's label are not read: anyone who may create pods could report through one.
async fn report(
    ctx: &CompensationContext,
    namespace: &str,
    job: &Job,
) -> Result<Result<WorkerReport, ReportProblem>, Error> {
    let job_name = job.name_any();
    let worker = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .map(|c| c.name.clone())
        .unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.base.client.clone(), namespace);
    let listed = pods
        .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job_name}")))
        .await
        .during(|| ApiCall::list::<Pod>(Some(namespace)))?;
    let mut ran = listed.items.iter().filter(|pod| {
        let foreign = job_pod::not_of_job(job, pod);
        if let Some(why) = &foreign {
            warn!(
                pod = %pod.name_any(),
                job = %job_name,
                %why,
                "a pod with the worker Job's label is not the Job's; its report is not read"
            );
        }
        foreign.is_none()
    });
    let message = ran.find_map(|pod| {
        pod.status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .iter()
            .find(|c| c.name == worker)?
            .state
            .as_ref()?
            .terminated
            .as_ref()?
            .message
            .clone()
    });
    Ok(match message {
        Some(text) => parse_report(&text),
        None => Err(ReportProblem::Missing),
    })
}

/// The status a decision leads to (pure).
fn status_of(
    compensation: &Compensation,
    previous: &CompensationStatus,
    decision: &Decision,
    facts: &CompensationFacts,
    frozen_at: Option<Time>,
    child: &str,
) -> CompensationStatus {
    let mut next = previous.clone();
    let now = facts.now;
    next.observed_generation = compensation.metadata.generation;
    // Paired with observed_generation in the same write: the admission policy trusts it only
    // when that is the generation being approved.
    next.spec_sha256 = Some(reviewed_compensation_sha256(&compensation.spec));
    next.phase = Some(decision.phase);
    next.message = Some(decision.message.clone());
    if next.request.is_none()
        && let Claim::Ours { sha256 } = &facts.claim
    {
        next.request = Some(FrozenRequest {
            config_map: child.to_owned(),
            sha256: sha256.clone(),
            frozen_at: frozen_at.unwrap_or(Time(now)),
        });
    }
    if decision.duplicate_of.is_some() {
        next.duplicate_of = decision.duplicate_of.clone();
    }
    if let Some(report) = &decision.report {
        next.precondition = Some(PreconditionStatus {
            held: report.precondition.held,
            observed: report.precondition.observed.clone(),
            message: (!report.precondition.message.is_empty())
                .then(|| report.precondition.message.clone()),
        });
        next.sub_actions = report
            .sub_actions
            .iter()
            .map(|s| SubActionStatus {
                name: s.name.clone(),
                operation_id: s.operation_id.clone(),
                state: s.state,
                started_at: s.started_at.clone(),
                finished_at: s.finished_at.clone(),
                message: (!s.message.is_empty()).then(|| s.message.clone()),
            })
            .collect();
    } else if decision.phase == CompensationPhase::Unknown
        && next.started_at.is_some()
        && next.sub_actions.is_empty()
    {
        // No report: every sub-action may or may not have run; these ids are what to look up.
        let id = &compensation.spec.compensation_id;
        next.sub_actions = compensation
            .spec
            .proposed_action
            .sub_actions
            .iter()
            .enumerate()
            .map(|(index, name)| SubActionStatus {
                name: name.clone(),
                operation_id: operation_id(id, index, name),
                state: SubActionState::Unknown,
                started_at: None,
                finished_at: None,
                message: None,
            })
            .collect();
    }
    if decision.phase.terminal() && next.started_at.is_some() && next.finished_at.is_none() {
        next.finished_at = Some(Time(now));
    }
    let generation = compensation.metadata.generation;
    next.conditions = merge_conditions(&previous.conditions, &decision.conditions, generation, now);
    let readiness = readiness::of_compensation(next.phase, next.message.as_deref());
    next.conditions = readiness::merged(&next.conditions, &readiness, generation, now);
    next
}

/// The API calls of one compensation's plan. It keeps the status as last written (and its
/// resourceVersion), so that each write goes onto the version the pass wrote before, and the
/// uid the create answered with, for the step that records it.
struct CompensationEffects<'a> {
    ctx: &'a CompensationContext,
    compensation: &'a Compensation,
    uid: &'a str,
    namespace: &'a str,
    name: &'a str,
    compensations: &'a Api<Compensation>,
    config_maps: &'a Api<ConfigMap>,
    jobs: &'a Api<Job>,
    written: Mutex<(CompensationStatus, Option<String>)>,
    created: Mutex<Option<String>>,
}

impl CompensationEffects<'_> {
    fn written(&self) -> (CompensationStatus, Option<String>) {
        self.written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Writes `status` onto the version last written, then announces the transition.
    async fn write(&self, status: &CompensationStatus) -> Result<(), Error> {
        let (before, version) = self.written();
        let (namespace, name) = (self.namespace, self.name);
        let written = apply_status_at(self.compensations, name, status, version.as_deref())
            .await
            .during(|| {
                ApiCall::on::<Compensation>(Verb::Apply, namespace, name).subresource("status")
            })?;
        *self
            .written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            (status.clone(), written.resource_version());
        if status.job_uid.is_some() {
            // Recorded: the memory of the create is no longer needed.
            self.ctx.forget(self.uid);
        }
        for event in plan::announcements(&before, status) {
            self.ctx
                .base
                .publish_planned(self.compensation, &event)
                .await;
        }
        Ok(())
    }

    async fn perform_step(&self, step: &CompensationStep) -> Result<(), Error> {
        let namespace = self.namespace;
        match step {
            CompensationStep::CreateClaim(config_map)
            | CompensationStep::CreateResult(config_map) => {
                let config_map_name = config_map.name_any();
                request::create(self.config_maps, config_map)
                    .await
                    .during(|| ApiCall::on::<ConfigMap>(Verb::Create, namespace, &config_map_name))
            }
            CompensationStep::WriteStatus(status) => self.write(status).await,
            CompensationStep::CreateJob(job) => {
                let job_name = job.name_any();
                let created = create(self.jobs, job)
                    .await
                    .during(|| ApiCall::on::<Job>(Verb::Create, namespace, &job_name))?;
                let job_uid = created.uid().unwrap_or_default();
                self.ctx.remember(self.uid, &job_uid);
                *self
                    .created
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(job_uid);
                Ok(())
            }
            CompensationStep::RecordJobUid => {
                let created = self
                    .created
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone();
                let Some(job_uid) = created else {
                    return Err(Error::Inconsistent("recording a Job uid before its create"));
                };
                let (mut recorded, _) = self.written();
                recorded.job_uid = Some(job_uid);
                self.write(&recorded).await
            }
            CompensationStep::ResumeJob(job) => {
                set_suspend(self.jobs, job, false)
                    .await
                    .during(|| ApiCall::on::<Job>(Verb::Patch, namespace, job))?;
                Ok(())
            }
        }
    }
}

impl Effects<CompensationStep> for CompensationEffects<'_> {
    fn perform(&self, step: &CompensationStep) -> impl Future<Output = Result<(), Error>> + Send {
        self.perform_step(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn approved_by(approver: &str) -> Compensation {
        let mut compensation = super::request::tests::compensation("refund", "u-1");
        compensation.spec.approval = Some(
            serde_json::from_value(json!({"approvedBy": approver,
                "requestSha256": "a".repeat(64), "specSha256": "b".repeat(64)}))
            .expect("an approval"),
        );
        compensation
    }

    #[test]
    fn the_requester_in_another_letter_case_is_still_the_requester() {
        for approver in ["alice", "Alice", " ALICE ", " "] {
            let problem = check_approval(&approved_by(approver), Some(&"a".repeat(64)), "c")
                .expect_err(approver);
            assert!(
                matches!(problem, ApprovalProblem::SelfApproved { .. }),
                "{approver:?}: {problem:?}"
            );
        }
        // Someone else gets past the four-eyes check (to the digests).
        let other = check_approval(&approved_by("bob"), Some(&"a".repeat(64)), "c");
        assert!(
            matches!(other, Err(ApprovalProblem::SpecMismatch { .. })),
            "{other:?}"
        );
    }
}
