//! The control documents' ConfigMaps from watches, so a steady budget reads none per poll.
//!
//! The operator may not list ConfigMaps cluster-wide: it reads and writes them only in
//! namespaces whose admin opted in (the chart's `-namespace` ClusterRole, or a namespaced
//! install's Role, which grant `list` and `watch` beside `get`). So there is one watch per
//! namespace, of the ConfigMaps the operator manages (a label selector), started when a budget
//! there first asks. Until that watch has listed, or after it failed, the answer is
//! [`Cached::Unknown`] and the caller asks the API server as before: a namespace that did not
//! grant the watch costs a GET per poll and nothing else.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ListParams;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::control_document::MANAGED_BY_LABEL;
use crate::controller::apply::FIELD_MANAGER;
use crate::controller::error::{Persistence, persistence_of};

use super::document_copy::DocumentCopy;

/// What a namespace's watch knows about one ConfigMap.
#[derive(Debug)]
pub enum Cached {
    /// The watch has listed: what the ConfigMap holds, or `None` when there is none.
    Known(Option<Arc<DocumentCopy>>),
    /// The watch has not listed (yet, or again): ask the API server.
    Unknown,
}

/// One watch per namespace that holds budgets.
pub struct ControlDocuments {
    client: Client,
    namespaces: Mutex<HashMap<String, NamespaceWatch>>,
}

impl ControlDocuments {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            namespaces: Mutex::new(HashMap::new()),
        }
    }

    /// The ConfigMap `name` in `namespace`, as the namespace's watch has it; starts that
    /// watch on the first question about the namespace, and waits for its first list at most
    /// [`LIST_PATIENCE`] from that question.
    pub async fn get(&self, namespace: &str, name: &str) -> Cached {
        let (cache, give_up_at) = {
            // A poisoned lock only means a panic elsewhere; the map is still usable.
            let mut namespaces = self
                .namespaces
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let watch = namespaces
                .entry(namespace.to_owned())
                .or_insert_with(|| NamespaceWatch::start(&self.client, namespace));
            (Arc::clone(&watch.cache), watch.started + LIST_PATIENCE)
        };
        let listed = cache.listed_once.notified();
        tokio::pin!(listed);
        listed.as_mut().enable();
        if !cache.has_listed_once.load(Ordering::Acquire) {
            let _ = tokio::time::timeout_at(give_up_at, listed).await;
        }
        cache.get(name)
    }
}

/// How long the questions about a namespace wait for its watch's first list: a start with
/// thousands of budgets would otherwise read each document with a GET while the list is
/// under way. A namespace that does not grant the watch costs this once.
const LIST_PATIENCE: Duration = Duration::from_secs(10);

/// The ConfigMaps one watch has seen, by name, and whether they are complete.
#[derive(Default)]
struct Cache {
    objects: RwLock<HashMap<Box<str>, Arc<DocumentCopy>>>,
    listed: AtomicBool,
    /// Whether the watch has listed at least once, told to those who wait for it.
    has_listed_once: AtomicBool,
    listed_once: Notify,
}

impl Cache {
    fn get(&self, name: &str) -> Cached {
        if !self.listed.load(Ordering::Acquire) {
            return Cached::Unknown;
        }
        let objects = self
            .objects
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Cached::Known(objects.get(name).cloned())
    }

    fn replace(&self, listed: HashMap<Box<str>, Arc<DocumentCopy>>) {
        *self
            .objects
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = listed;
        self.listed.store(true, Ordering::Release);
        self.has_listed_once.store(true, Ordering::Release);
        self.listed_once.notify_waiters();
    }

    fn put(&self, configmap: &ConfigMap) {
        self.objects
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(configmap.name_any().into(), copy_of(configmap));
    }

    fn remove(&self, configmap: &ConfigMap) {
        self.objects
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(configmap.name_any().as_str());
    }

    fn forget(&self) {
        self.listed.store(false, Ordering::Release);
    }
}

/// A running watch; stopped when dropped.
struct NamespaceWatch {
    cache: Arc<Cache>,
    started: Instant,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for NamespaceWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// First wait before watching again after a failure, and the longest.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_CAP: Duration = Duration::from_secs(60);

impl NamespaceWatch {
    fn start(client: &Client, namespace: &str) -> NamespaceWatch {
        let cache = Arc::new(Cache::default());
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let task = tokio::spawn(follow(api, namespace.to_owned(), cache.clone()));
        NamespaceWatch {
            cache,
            started: Instant::now(),
            task,
        }
    }
}

/// Keeps `cache` equal to the operator's ConfigMaps in `namespace`. After any failure the
/// cache is unknown until a fresh list: a watch resumed after an error could have missed a
/// deletion, and a refused one (the namespace revoked its grant) must not leave a stale answer.
async fn follow(api: Api<ConfigMap>, namespace: String, cache: Arc<Cache>) {
    let selector = format!("{MANAGED_BY_LABEL}={FIELD_MANAGER}");
    let mut wait = RETRY_FIRST;
    loop {
        // Asked first, so that a namespace that did not grant the watch is told once per
        // retry at info level, not by the watcher's own warning.
        let probe = ListParams::default().labels(&selector).limit(1);
        if let Err(error) = api.list_metadata(&probe).await {
            cache.forget();
            report(&namespace, &watcher::Error::InitialListFailed(error), wait);
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(RETRY_CAP);
            continue;
        }
        let mut events = watcher(api.clone(), watcher::Config::default().labels(&selector)).boxed();
        let mut listing = HashMap::new();
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Init) => listing.clear(),
                Ok(watcher::Event::InitApply(configmap)) => {
                    listing.insert(configmap.name_any().into(), copy_of(&configmap));
                }
                Ok(watcher::Event::InitDone) => {
                    cache.replace(std::mem::take(&mut listing));
                    wait = RETRY_FIRST;
                }
                Ok(watcher::Event::Apply(configmap)) => cache.put(&configmap),
                Ok(watcher::Event::Delete(configmap)) => cache.remove(&configmap),
                Err(error) => {
                    report(&namespace, &error, wait);
                    break;
                }
            }
        }
        cache.forget();
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(RETRY_CAP);
    }
}

fn copy_of(configmap: &ConfigMap) -> Arc<DocumentCopy> {
    Arc::new(DocumentCopy::of(configmap))
}

fn report(namespace: &str, error: &watcher::Error, retry_in: Duration) {
    let (refused, expired) = match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => (persistence_of(e) == Persistence::Permanent, false),
        // The API server no longer holds the version the watch resumed from: a relist.
        watcher::Error::WatchError(status) => (false, status.code == 410),
        watcher::Error::NoResourceVersion => (false, false),
    };
    if expired {
        debug!(%namespace, "the watch of control documents expired; listing again");
    } else if refused {
        // The namespace did not grant list and watch: its documents are read with a GET.
        info!(%namespace, %error, ?retry_in, "control documents are read per poll here: the operator may not watch this namespace's ConfigMaps");
    } else {
        warn!(%namespace, %error, ?retry_in, "the watch of control documents failed; they are read per poll until it lists again");
    }
}
