//! One pass over a Compensation: read the claim, the Job and the report → decide (core) →
//! apply the one action → write the status if it changed.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};

use super::CompensationContext;
use super::job;
use super::request;
use crate::api::compensation::{
    Compensation, CompensationPhase, CompensationStatus, FrozenRequest, PreconditionStatus,
    SubActionState, SubActionStatus,
};
use crate::api::conditions::merge_conditions;
use crate::api::readiness;
use crate::controller::apply::apply_status;
use crate::controller::error::{ApiCall, During, Error, Verb};
use crate::controller::replay::adopt;
use crate::controller::replay::job::{Verdict, create, dry_run, set_suspend};
use crate::controller::replay::pod_policy;
use crate::core::compensation_plan::{
    Action, ApprovalProblem, Claim, CompensationFacts, Decision, JobEnd, JobSeen, ReportProblem,
    child_name, decide, operation_id, parse_report,
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
    let previous = compensations
        .get_status(&name)
        .await
        .during(|| ApiCall::on::<Compensation>(Verb::Get, &namespace, &name).subresource("status"))?
        .status
        .unwrap_or_default();
    let spec = &compensation.spec;
    let id = &spec.compensation_id;
    let child = child_name(id);
    let now = Timestamp::now();

    let ended = previous
        .phase
        .filter(|p| p.terminal())
        .map(|p| (p, previous.message.clone().unwrap_or_default()));
    let claim = if ended.is_some() && previous.phase != Some(CompensationPhase::Duplicate) {
        // An end is final; only a duplicate reads the claim again, to follow the first's result.
        Claim::Ours {
            sha256: previous
                .request
                .as_ref()
                .map(|r| r.sha256.clone())
                .unwrap_or_default(),
        }
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
        &config_maps,
        &child,
    )
    .await?;
    match &decision.action {
        None => {}
        Some(Action::Freeze) => {
            let (text, sha) = request::document(compensation).map_err(|source| Error::Encode {
                what: "the compensation request",
                source,
            })?;
            request::create(&config_maps, &request::claim(compensation, text, &sha))
                .await
                .during(|| ApiCall::on::<ConfigMap>(Verb::Create, &namespace, &child))?;
            // The next pass reads whose the claim is.
            return Ok(Requeue::requeue(Duration::from_millis(200)));
        }
        Some(Action::Start) => {
            let Some(intended) = intended.as_ref() else {
                return Err(Error::Inconsistent("a start without a frozen request"));
            };
            // The record of the start comes first: a Job is only ever created for a recorded
            // start, and created suspended until its uid is recorded too.
            if next.started_at.is_none() {
                next.started_at = Some(Time(now));
                next.job = Some(child.clone());
                next.approved_by = spec.approval.as_ref().map(|a| a.approved_by.clone());
                write(&compensations, &name, &previous, &next, &namespace).await?;
            }
            match create(&jobs, intended).await {
                Ok(created) => {
                    let job_uid = created.uid().unwrap_or_default();
                    ctx.remember(&uid, &job_uid);
                    let mut recorded = next.clone();
                    recorded.job_uid = Some(job_uid);
                    write(&compensations, &name, &next, &recorded, &namespace).await?;
                    ctx.forget(&uid);
                    set_suspend(&jobs, &child, false)
                        .await
                        .during(|| ApiCall::on::<Job>(Verb::Patch, &namespace, &child))?;
                    return Ok(Requeue::requeue(RUNNING_RECHECK));
                }
                // Someone's Job under the name: the next pass judges it.
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    return Ok(Requeue::requeue(Duration::from_millis(200)));
                }
                Err(error) => {
                    return Err(error)
                        .during(|| ApiCall::on::<Job>(Verb::Create, &namespace, &child));
                }
            }
        }
        Some(Action::Resume { uid: job_uid }) => {
            next.job_uid = Some(job_uid.clone());
            write(&compensations, &name, &previous, &next, &namespace).await?;
            ctx.forget(&uid);
            set_suspend(&jobs, &child, false)
                .await
                .during(|| ApiCall::on::<Job>(Verb::Patch, &namespace, &child))?;
            return Ok(Requeue::requeue(RUNNING_RECHECK));
        }
    }
    if decision.phase.terminal()
        && decision.phase != CompensationPhase::Duplicate
        && previous.phase != Some(decision.phase)
    {
        // For the duplicates: the result outlives this Compensation, like the claim.
        let result = request::result(compensation, decision.phase, &next).map_err(|source| {
            Error::Encode {
                what: "the compensation result",
                source,
            }
        })?;
        request::create(&config_maps, &result).await.during(|| {
            ApiCall::on::<ConfigMap>(Verb::Create, &namespace, &request::result_name(id))
        })?;
    }
    write(&compensations, &name, &previous, &next, &namespace).await?;
    if previous.phase != next.phase {
        announce(ctx, compensation, &next).await;
    }
    Ok(match decision.phase {
        CompensationPhase::Executing => Requeue::requeue(RUNNING_RECHECK),
        CompensationPhase::Duplicate if !decision.message.contains(" ended ") => {
            Requeue::requeue(DUPLICATE_RECHECK)
        }
        _ => Requeue::await_change(),
    })
}

async fn read_claim(
    compensation: &Compensation,
    config_maps: &Api<ConfigMap>,
    namespace: &str,
    child: &str,
) -> Result<Claim, Error> {
    let found = config_maps
        .get_opt(child)
        .await
        .during(|| ApiCall::on::<ConfigMap>(Verb::Get, namespace, child))?;
    let claim = request::claim_of(compensation, found.as_ref(), None);
    if let Claim::Theirs { .. } = claim {
        let result_name = request::result_name(&compensation.spec.compensation_id);
        let result = config_maps
            .get_opt(&result_name)
            .await
            .during(|| ApiCall::on::<ConfigMap>(Verb::Get, namespace, &result_name))?;
        return Ok(request::claim_of(
            compensation,
            found.as_ref(),
            result.as_ref(),
        ));
    }
    Ok(claim)
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
    if approval.approved_by.trim().is_empty() || approval.approved_by == spec.requested_by {
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
            report: report(ctx, namespace, &found.name_any()).await?,
        },
    };
    Ok(JobSeen::Ours {
        uid: found_uid,
        suspended: found.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false),
        outcome,
    })
}

/// The worker's report: the termination message of its (one) pod's first container.
async fn report(
    ctx: &CompensationContext,
    namespace: &str,
    job_name: &str,
) -> Result<Result<crate::core::compensation_plan::WorkerReport, ReportProblem>, Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.base.client.clone(), namespace);
    let listed = pods
        .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job_name}")))
        .await
        .during(|| ApiCall::list::<Pod>(Some(namespace)))?;
    let message = listed.items.iter().find_map(|pod| {
        pod.status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .first()?
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

async fn status_of(
    compensation: &Compensation,
    previous: &CompensationStatus,
    decision: &Decision,
    facts: &CompensationFacts,
    config_maps: &Api<ConfigMap>,
    child: &str,
) -> Result<CompensationStatus, Error> {
    let mut next = previous.clone();
    let now = facts.now;
    next.observed_generation = compensation.metadata.generation;
    next.phase = Some(decision.phase);
    next.message = Some(decision.message.clone());
    if next.request.is_none()
        && let Claim::Ours { sha256 } = &facts.claim
    {
        let frozen_at = config_maps
            .get_opt(child)
            .await
            .ok()
            .flatten()
            .and_then(|cm| cm.metadata.creation_timestamp)
            .unwrap_or(Time(now));
        next.request = Some(FrozenRequest {
            config_map: child.to_owned(),
            sha256: sha256.clone(),
            frozen_at,
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
    Ok(next)
}

async fn write(
    api: &Api<Compensation>,
    name: &str,
    previous: &CompensationStatus,
    next: &CompensationStatus,
    namespace: &str,
) -> Result<(), Error> {
    if next == previous {
        return Ok(());
    }
    apply_status(api, name, next).await.during(|| {
        ApiCall::on::<Compensation>(Verb::Apply, namespace, name).subresource("status")
    })?;
    Ok(())
}

async fn announce(
    ctx: &CompensationContext,
    compensation: &Compensation,
    next: &CompensationStatus,
) {
    let Some(phase) = next.phase else {
        return;
    };
    let warning = matches!(
        phase,
        CompensationPhase::Refused
            | CompensationPhase::PreconditionFailed
            | CompensationPhase::Unknown
            | CompensationPhase::Failed
    );
    ctx.base
        .publish(
            compensation,
            if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            &format!("{phase:?}"),
            &format!("{phase:?}"),
            next.message.as_deref().unwrap_or_default(),
        )
        .await;
}
