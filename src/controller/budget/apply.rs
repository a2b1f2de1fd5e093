//! Performing a budget plan's steps against the API server.

use std::future::Future;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Patch;
use kube::{Api, ResourceExt};
use tracing::info;

use crate::api::backlog_budget::BacklogBudget;
use crate::controller::apply::{apply_params, apply_status};
use crate::controller::context::Context;
use crate::controller::error::{ApiCall, During, Error, Verb};
use crate::controller::plan::Effects;

use super::decide::BudgetStep;
use super::document_writes::DocumentWrites;
use super::facts::TargetApi;
use super::target;

/// The API calls of one budget's plan.
pub struct BudgetEffects<'a> {
    pub ctx: &'a Context,
    pub budget: &'a BacklogBudget,
    pub namespace: &'a str,
    /// The target's API; a plan scales only a target it could read.
    pub target: &'a TargetApi,
    /// Where the document goes: written on the capacity the other requests leave.
    pub documents: &'a DocumentWrites,
}

impl BudgetEffects<'_> {
    async fn perform_step(&self, step: &BudgetStep) -> Result<(), Error> {
        let name = self.budget.name_any();
        let namespace = self.namespace;
        match step {
            BudgetStep::Scale(change) => {
                let target = &self.budget.spec.scale_target_ref;
                let call = || {
                    ApiCall::new(Verb::Apply, target.kind.clone(), namespace, &target.name)
                        .subresource("scale")
                };
                // The decision scales only a target it read, through the API it read it with.
                let Some(api) = self.target else {
                    return Err(Error::Inconsistent("a scale step without the target's API"));
                };
                target::scale(api, &target.name, change.to)
                    .await
                    .during(call)?;
                info!(budget = %name, namespace, from = change.from, to = change.to, reason = %change.reason, "scaled");
            }
            BudgetStep::WriteStatus(status) => {
                let api: Api<BacklogBudget> = Api::namespaced(self.ctx.client.clone(), namespace);
                apply_status(&api, &name, status.as_ref())
                    .await
                    .during(|| {
                        ApiCall::on::<BacklogBudget>(Verb::Apply, namespace, &name)
                            .subresource("status")
                    })?;
            }
            BudgetStep::Publish(event) => {
                info!(budget = %name, namespace, reason = %event.reason, note = %event.note, "event");
                self.ctx.publish_planned(self.budget, event).await;
            }
            // Handed over after the status that records its revision; a failed write fails
            // the budget's next reconcile.
            BudgetStep::WriteDocument(configmap) => {
                let uid = self.budget.metadata.uid.as_deref();
                self.documents
                    .submit(namespace, &name, uid, configmap.as_ref().clone());
            }
        }
        Ok(())
    }
}

/// Applies a control document's ConfigMap.
pub async fn apply_document(
    client: kube::Client,
    namespace: &str,
    configmap: &ConfigMap,
) -> Result<(), Error> {
    let configmap_name = configmap.name_any();
    let api: Api<ConfigMap> = Api::namespaced(client, namespace);
    api.patch(&configmap_name, &apply_params(), &Patch::Apply(configmap))
        .await
        .during(|| ApiCall::on::<ConfigMap>(Verb::Apply, namespace, &configmap_name))?;
    info!(configmap = %configmap_name, namespace, "control document published");
    Ok(())
}

impl Effects<BudgetStep> for BudgetEffects<'_> {
    fn perform(&self, step: &BudgetStep) -> impl Future<Output = Result<(), Error>> + Send {
        self.perform_step(step)
    }
}
