//! Budgets woken by a renewed grouped answer ([`crate::metrics_source::wake`]): each budget
//! asks under its `namespace/name`, and a wake for that name reconciles it now instead of at
//! its next poll.

use futures::Stream;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::broadcast;

use kube::Resource;

use super::cached::CachedBudget;

/// The name a budget asks its queries under: `namespace/name`, also what the target index and
/// the poll clock know a budget by.
pub fn asker(budget: &impl Resource) -> String {
    let meta = budget.meta();
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// The budget an asker name stands for, as the controller queues it.
pub fn budget_of(asker: &str) -> Option<ObjectRef<CachedBudget>> {
    let (namespace, name) = asker.split_once('/')?;
    Some(ObjectRef::new(name).within(namespace))
}

/// The budgets to reconcile now, by asker name. Wakes missed while the triggers were busy are
/// skipped: those budgets still poll.
pub fn woken(wakes: broadcast::Receiver<String>) -> impl Stream<Item = String> + Send + 'static {
    futures::stream::unfold(wakes, |mut wakes| async move {
        loop {
            match wakes.recv().await {
                Ok(asker) => return Some((asker, wakes)),
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    #[tokio::test]
    async fn a_wake_names_the_budget_that_asked() {
        let spec: crate::api::BacklogBudgetSpec = serde_yaml::from_str(
            "{scaleTargetRef: {kind: Deployment, name: w}, minReplicas: 1, maxReplicas: 2, completionDeadline: 1m, metrics: {backlog: x}, partitionCount: 2, capacity: {perReplicaRate: 1}}",
        )
        .unwrap();
        let mut budget = crate::api::BacklogBudget::new("orders", spec);
        budget.metadata.namespace = Some("shop".into());
        let (sender, receiver) = broadcast::channel(4);
        let mut woken = Box::pin(woken(receiver));
        sender.send(asker(&budget)).unwrap();
        drop(sender);
        let woke = woken.next().await.expect("a wake");
        let cached = CachedBudget::from(budget);
        assert_eq!(budget_of(&woke), Some(ObjectRef::from_obj(&cached)));
        assert_eq!(woken.next().await, None);
        assert_eq!(budget_of("not a budget"), None);
    }
}
