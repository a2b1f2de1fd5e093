//! One RetryPolicy reconcile: read the budgets that use it → decide the status (pure) → write
//! it when it changed, with an Event per condition that changed.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};

use crate::api::retry_policy::RetryPolicy;
use crate::controller::apply::apply_status;
use crate::controller::error::{ApiCall, During, Error, Verb};

use super::status::{DEADLINE_CONFLICT, READY, next_status, transitions};
use super::{PolicyContext, users};

/// Budgets and policies are watched, so this is only a safety net.
const RESYNC: Duration = Duration::from_secs(600);

pub async fn reconcile(policy: &RetryPolicy, ctx: &PolicyContext) -> Result<Action, Error> {
    let name = policy.name_any();
    let namespace = policy.namespace().ok_or_else(|| Error::MissingNamespace {
        kind: "RetryPolicy",
        name: name.clone(),
    })?;
    // Until the budgets are listed, `usedBy` would be empty and a conflict would seem to clear.
    if ctx.budgets.wait_until_ready().await.is_err() {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let api: Api<RetryPolicy> = Api::namespaced(ctx.base.client.clone(), &namespace);
    // The status as the API server has it: the watch cache can lag behind the status written
    // by the previous reconcile, and comparing with an older one would announce a transition
    // twice.
    let previous = api
        .get(&name)
        .await
        .during(|| ApiCall::on::<RetryPolicy>(Verb::Get, &namespace, &name))?
        .status
        .unwrap_or_default();
    let users = users(&ctx.budgets.state(), &namespace, &name);
    let next = next_status(
        &previous,
        &policy.spec,
        &users,
        policy.meta().generation,
        Timestamp::now(),
    );
    if next != previous {
        apply_status(&api, &name, &next).await.during(|| {
            ApiCall::on::<RetryPolicy>(Verb::Apply, &namespace, &name).subresource("status")
        })?;
        for (type_, status, reason, message) in transitions(&previous, &next) {
            let warning = (type_ == READY && status != "True")
                || (type_ == DEADLINE_CONFLICT && status == "True");
            publish(
                ctx,
                policy,
                if warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                &reason,
                message,
            )
            .await;
        }
    }
    Ok(Action::requeue(RESYNC))
}

async fn publish(
    ctx: &PolicyContext,
    policy: &RetryPolicy,
    type_: EventType,
    reason: &str,
    note: String,
) {
    ctx.base
        .publish(policy, type_, reason, "Reconcile", &note)
        .await;
}
