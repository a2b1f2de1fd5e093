//! One RetryPolicy reconcile: read the status and the budgets that use it → decide (pure,
//! [`super::decide`]) → apply the plan.

use std::future::Future;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};

use crate::api::retry_policy::RetryPolicy;
use crate::controller::apply::apply_status;
use crate::controller::error::{ApiCall, During, Error, Verb};
use crate::controller::plan::{Effects, execute};

use super::decide::{PolicyStep, decide};
use super::{PolicyContext, users};

/// How soon to look again when the budgets are not listed yet.
const BUDGETS_NOT_LISTED: std::time::Duration = std::time::Duration::from_secs(5);

pub async fn reconcile(policy: &RetryPolicy, ctx: &PolicyContext) -> Result<Action, Error> {
    let name = policy.name_any();
    let namespace = policy.namespace().ok_or_else(|| Error::MissingNamespace {
        kind: "RetryPolicy",
        name: name.clone(),
    })?;
    // Until the budgets are listed, `usedBy` would be empty and a conflict would seem to clear.
    if ctx.budgets_listed.wait().await.is_err() {
        return Ok(Action::requeue(BUDGETS_NOT_LISTED));
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
    let plan = decide(
        &policy.spec,
        &users,
        &previous,
        policy.meta().generation,
        Timestamp::now(),
    );
    let effects = PolicyEffects {
        ctx,
        policy,
        api: &api,
        namespace: &namespace,
    };
    execute(&plan.steps, &effects).await.into_result()?;
    Ok(Action::requeue(plan.requeue))
}

struct PolicyEffects<'a> {
    ctx: &'a PolicyContext,
    policy: &'a RetryPolicy,
    api: &'a Api<RetryPolicy>,
    namespace: &'a str,
}

impl PolicyEffects<'_> {
    async fn perform_step(&self, step: &PolicyStep) -> Result<(), Error> {
        match step {
            PolicyStep::WriteStatus(status) => {
                let name = self.policy.name_any();
                apply_status(self.api, &name, status.as_ref())
                    .await
                    .during(|| {
                        ApiCall::on::<RetryPolicy>(Verb::Apply, self.namespace, &name)
                            .subresource("status")
                    })?;
            }
            PolicyStep::Publish(event) => {
                self.ctx.base.publish_planned(self.policy, event).await;
            }
        }
        Ok(())
    }
}

impl Effects<PolicyStep> for PolicyEffects<'_> {
    fn perform(&self, step: &PolicyStep) -> impl Future<Output = Result<(), Error>> + Send {
        self.perform_step(step)
    }
}
