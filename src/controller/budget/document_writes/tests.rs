use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use tokio::sync::Semaphore;

use super::*;
use crate::api_client::RateLimit;

fn document(revision: &str) -> ConfigMap {
    ConfigMap {
        data: Some([("document".to_owned(), revision.to_owned())].into()),
        ..ConfigMap::default()
    }
}

fn revision(configmap: &ConfigMap) -> String {
    configmap
        .data
        .as_ref()
        .and_then(|data| data.get("document").cloned())
        .unwrap_or_default()
}

/// A writer that records what it wrote, once `gate` lets each write through, and fails the
/// revisions named in `failing`.
#[derive(Clone)]
struct Recording {
    written: Arc<Mutex<Vec<(String, String)>>>,
    gate: Arc<Semaphore>,
    failing: &'static [&'static str],
}

impl Recording {
    fn new(open: usize, failing: &'static [&'static str]) -> Self {
        Self {
            written: Arc::default(),
            gate: Arc::new(Semaphore::new(open)),
            failing,
        }
    }

    fn written(&self) -> Vec<(String, String)> {
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn write(
        &self,
    ) -> impl Fn(String, Arc<ConfigMap>) -> futures::future::BoxFuture<'static, Result<(), Error>> + use<>
    {
        let this = self.clone();
        move |namespace, configmap| {
            let this = this.clone();
            Box::pin(async move {
                let permit = this
                    .gate
                    .acquire()
                    .await
                    .map_err(|_| Error::Inconsistent("gate"))?;
                permit.forget();
                let revision = revision(&configmap);
                this.written
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((namespace, revision.clone()));
                if this.failing.contains(&revision.as_str()) {
                    return Err(Error::Inconsistent("refused"));
                }
                Ok(())
            })
        }
    }
}

/// Runs the writers of `writes` with `recording`'s writer until the handle is aborted.
fn spawn_writers(
    writes: &Arc<DocumentWrites>,
    recording: &Recording,
    spare: SpareCapacity,
) -> tokio::task::JoinHandle<()> {
    let (writes, write) = (Arc::clone(writes), recording.write());
    tokio::spawn(async move { writes.write_handed(spare, write).await })
}

/// Lets the spawned writers run until nothing more can happen without time passing.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_handed_document_waits_for_spare_capacity_and_counts_as_our_own_until_the_grace_ends() {
    let writes = Arc::new(DocumentWrites::default());
    let limit = Arc::new(RateLimit::new(10.0, 1));
    let recording = Recording::new(usize::MAX >> 4, &[]);
    let writer = spawn_writers(&writes, &recording, SpareCapacity::of(Arc::clone(&limit)));
    // Ordinary requests hold the limit for the next 300 ms.
    for _ in 0..3 {
        limit.reserve();
    }
    writes.submit("shop", "orders", Some("u-1"), document("rev 1"));
    settle().await;
    assert!(
        recording.written().is_empty(),
        "written before the statuses"
    );
    let now = Timestamp::now();
    assert_eq!(
        writes
            .own_write("shop", "orders", Some("u-1"), now)
            .map(|c| revision(&c)),
        Some("rev 1".to_owned())
    );
    assert_eq!(writes.own_write("shop", "orders", Some("u-2"), now), None);
    tokio::time::sleep(Duration::from_millis(400)).await;
    settle().await;
    assert_eq!(
        recording.written(),
        vec![("shop".to_owned(), "rev 1".to_owned())]
    );
    // Written: it still counts during the grace, and not after it.
    let written = Timestamp::now();
    assert!(
        writes
            .own_write("shop", "orders", Some("u-1"), written)
            .is_some()
    );
    let later = written + OWN_WRITE_GRACE + Duration::from_secs(1);
    assert_eq!(writes.own_write("shop", "orders", Some("u-1"), later), None);
    assert!(writes.take_failure("shop", "orders", Some("u-1")).is_none());
    // And then forgotten: the watch holds it.
    assert!(writes.lock().by_budget.is_empty());
    writer.abort();
}

#[tokio::test(start_paused = true)]
async fn the_last_document_wanted_wins_and_one_budget_is_written_in_order() {
    let writes = Arc::new(DocumentWrites::default());
    let recording = Recording::new(0, &[]);
    let writer = spawn_writers(&writes, &recording, SpareCapacity::default());
    // Replaced while waiting: only the later one is written.
    writes.submit("shop", "orders", Some("u-1"), document("rev 1"));
    writes.submit("shop", "orders", Some("u-1"), document("rev 2"));
    settle().await;
    // The write of rev 2 is under way (held by the gate); rev 3 comes after it, not beside it.
    writes.submit("shop", "orders", Some("u-1"), document("rev 3"));
    settle().await;
    recording.gate.add_permits(1);
    settle().await;
    assert_eq!(recording.written().len(), 1);
    recording.gate.add_permits(1);
    settle().await;
    let revisions: Vec<String> = recording.written().into_iter().map(|(_, r)| r).collect();
    assert_eq!(revisions, vec!["rev 2", "rev 3"]);
    assert_eq!(
        writes
            .own_write("shop", "orders", Some("u-1"), Timestamp::now())
            .map(|c| revision(&c)),
        Some("rev 3".to_owned())
    );
    writer.abort();
}

#[tokio::test(start_paused = true)]
async fn a_failed_write_is_told_once_and_no_longer_counts_as_written() {
    let writes = Arc::new(DocumentWrites::default());
    let recording = Recording::new(usize::MAX >> 4, &["rev 1"]);
    let writer = spawn_writers(&writes, &recording, SpareCapacity::default());
    writes.submit("shop", "orders", Some("u-1"), document("rev 1"));
    settle().await;
    assert_eq!(recording.written().len(), 1);
    let now = Timestamp::now();
    assert_eq!(writes.own_write("shop", "orders", Some("u-1"), now), None);
    // Not a successor's failure.
    assert!(writes.take_failure("shop", "orders", Some("u-2")).is_none());
    let failure = writes.take_failure("shop", "orders", Some("u-1"));
    assert!(
        failure.is_some_and(|error| error.to_string().contains("refused")),
        "the failure is told"
    );
    assert!(writes.take_failure("shop", "orders", Some("u-1")).is_none());
    writer.abort();
}

#[tokio::test(start_paused = true)]
async fn a_deleted_budgets_waiting_document_is_not_written_but_a_successors_is() {
    let writes = Arc::new(DocumentWrites::default());
    let recording = Recording::new(usize::MAX >> 4, &[]);
    writes.submit("shop", "orders", Some("u-1"), document("rev 1"));
    writes.submit("shop", "old", Some("u-9"), document("old"));
    // The deletion of a predecessor seen late does not touch its successor.
    writes.forget("shop", "orders", Some("u-0"));
    writes.forget("shop", "old", Some("u-9"));
    let writer = spawn_writers(&writes, &recording, SpareCapacity::default());
    settle().await;
    let revisions: Vec<String> = recording.written().into_iter().map(|(_, r)| r).collect();
    assert_eq!(revisions, vec!["rev 1"]);
    writer.abort();
}

#[tokio::test(start_paused = true)]
async fn a_successors_document_handed_while_its_predecessors_is_written_is_written_too() {
    let writes = Arc::new(DocumentWrites::default());
    let recording = Recording::new(0, &[]);
    let writer = spawn_writers(&writes, &recording, SpareCapacity::default());
    writes.submit("shop", "orders", Some("u-1"), document("old"));
    settle().await;
    // The predecessor's write is under way when it is deleted and its successor hands its own.
    writes.forget("shop", "orders", Some("u-1"));
    writes.submit("shop", "orders", Some("u-2"), document("new"));
    recording.gate.add_permits(2);
    settle().await;
    let revisions: Vec<String> = recording.written().into_iter().map(|(_, r)| r).collect();
    assert_eq!(revisions, vec!["old", "new"]);
    writer.abort();
}
