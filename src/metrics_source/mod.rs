//! Where the operator reads metrics: a small trait in front of Prometheus, with the cache that
//! evaluates an expression once per poll however many budgets ask for it.

pub mod allowlist;
pub mod prometheus;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OnceCell, Semaphore};

use crate::core::metric_input::Observation;

pub use allowlist::{Allowlist, AllowlistError, Refused};

/// A future returned by a backend; boxed so the trait stays object-safe for tests.
pub type QueryFuture = Pin<Box<dyn Future<Output = Observation> + Send + 'static>>;

/// One value per series, named by a label: `Err` says why there is none.
pub type Labelled = Result<Vec<(String, f64)>, String>;
pub type LabelledFuture = Pin<Box<dyn Future<Output = Labelled> + Send + 'static>>;

/// Evaluates one instant PromQL query.
pub trait QueryBackend: Send + Sync {
    /// Evaluates `expression` against the server at `address`, giving up after `timeout`.
    fn instant(&self, address: &str, expression: &str, timeout: Duration) -> QueryFuture;

    /// The same, keeping each series' `label` (series without it are named by position).
    fn instant_by_label(
        &self,
        address: &str,
        expression: &str,
        timeout: Duration,
        _label: &str,
    ) -> LabelledFuture {
        let answer = self.instant(address, expression, timeout);
        Box::pin(async move {
            match answer.await {
                Observation::Samples(values) => Ok(values
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| (i.to_string(), v))
                    .collect()),
                Observation::Failed(reason) => Err(reason),
            }
        })
    }
}

/// What is cached per (server, expression): when it was asked and the (pending) answer.
struct Entry {
    asked: Instant,
    answer: Arc<OnceCell<Observation>>,
}

/// Observer of query latencies (the operator's own metrics).
pub trait QueryObserver: Send + Sync {
    fn observe(&self, seconds: f64, failed: bool);
}

/// Queries with a per-query timeout, bounded concurrency and sharing: identical expressions
/// asked within `max_age` of each other (also while the first is in flight) are evaluated once.
pub struct MetricsSource {
    backend: Arc<dyn QueryBackend>,
    /// Servers that may be queried at all; any other address is refused before a request.
    allowlist: Allowlist,
    entries: Mutex<HashMap<(String, String), Entry>>,
    permits: Arc<Semaphore>,
    timeout: Duration,
    observer: Option<Arc<dyn QueryObserver>>,
}

/// Why a query was not asked: nobody named a Prometheus.
pub const NO_PROMETHEUS: &str =
    "no Prometheus: set spec.prometheus.address or start the operator with --prometheus-url";

/// Entries older than this are dropped whatever the callers' max age.
const FORGET_AFTER: Duration = Duration::from_secs(600);

impl MetricsSource {
    pub fn new(backend: Arc<dyn QueryBackend>, concurrency: usize, timeout: Duration) -> Self {
        Self {
            backend,
            allowlist: Allowlist::any(),
            entries: Mutex::new(HashMap::new()),
            permits: Arc::new(Semaphore::new(concurrency.max(1))),
            timeout,
            observer: None,
        }
    }

    pub fn with_observer(mut self, observer: Arc<dyn QueryObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Queries only the servers of `allowlist`.
    pub fn with_allowlist(mut self, allowlist: Allowlist) -> Self {
        self.allowlist = allowlist;
        self
    }

    /// Whether `address` may be queried, or why not (naming `spec.prometheus.address`).
    pub fn permits(&self, address: &str) -> Result<(), Refused> {
        self.allowlist.check(address)
    }

    /// The result of `expression` at `address`, evaluated now or reused if asked less than
    /// `max_age` ago. An address outside the allowlist is a failed query, and no request is
    /// sent.
    pub async fn query(&self, address: &str, expression: &str, max_age: Duration) -> Observation {
        if let Err(refused) = self.permits(address) {
            return Observation::Failed(refused.to_string());
        }
        let answer = self.entry(address, expression, max_age);
        answer
            .get_or_init(|| async {
                let Ok(_permit) = self.permits.acquire().await else {
                    return Observation::Failed("query limiter closed".to_owned());
                };
                let started = Instant::now();
                let observation = self
                    .backend
                    .instant(address, expression, self.timeout)
                    .await;
                if let Some(observer) = &self.observer {
                    observer.observe(
                        started.elapsed().as_secs_f64(),
                        matches!(observation, Observation::Failed(_)),
                    );
                }
                observation
            })
            .await
            .clone()
    }

    /// One value per series of `expression`, named by `label`; not cached (one budget asks
    /// it), but it waits for a permit like every query.
    pub async fn query_by_label(
        &self,
        address: Option<&str>,
        expression: &str,
        label: &str,
    ) -> Labelled {
        let Some(address) = address else {
            return Err(NO_PROMETHEUS.to_owned());
        };
        self.permits(address)
            .map_err(|refused| refused.to_string())?;
        let Ok(_permit) = self.permits.acquire().await else {
            return Err("query limiter closed".to_owned());
        };
        let started = Instant::now();
        let answer = self
            .backend
            .instant_by_label(address, expression, self.timeout, label)
            .await;
        // Counted in the operator's query metrics like every other query.
        if let Some(observer) = &self.observer {
            observer.observe(started.elapsed().as_secs_f64(), answer.is_err());
        }
        answer
    }

    /// Like [`query`](Self::query), with the server the object resolved to; without one the
    /// query fails with [`NO_PROMETHEUS`].
    pub async fn query_at(
        &self,
        address: Option<&str>,
        expression: &str,
        max_age: Duration,
    ) -> Observation {
        match address {
            Some(address) => self.query(address, expression, max_age).await,
            None => Observation::Failed(NO_PROMETHEUS.to_owned()),
        }
    }

    fn entry(
        &self,
        address: &str,
        expression: &str,
        max_age: Duration,
    ) -> Arc<OnceCell<Observation>> {
        // A poisoned lock only means another query panicked; the map itself is still usable.
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        entries.retain(|_, entry| entry.asked.elapsed() < FORGET_AFTER);
        let key = (address.to_owned(), expression.to_owned());
        match entries.get(&key) {
            Some(entry) if entry.asked.elapsed() <= max_age => Arc::clone(&entry.answer),
            _ => {
                let answer = Arc::new(OnceCell::new());
                entries.insert(
                    key,
                    Entry {
                        asked: Instant::now(),
                        answer: Arc::clone(&answer),
                    },
                );
                answer
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    struct Counting {
        calls: AtomicUsize,
    }

    impl QueryBackend for Counting {
        fn instant(&self, _: &str, expression: &str, _: Duration) -> QueryFuture {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let value = expression.len() as f64;
            Box::pin(async move {
                tokio::task::yield_now().await;
                Observation::Samples(vec![value])
            })
        }
    }

    #[tokio::test]
    async fn identical_expressions_are_evaluated_once_per_poll() {
        let backend = Arc::new(Counting {
            calls: AtomicUsize::new(0),
        });
        let source = MetricsSource::new(backend.clone(), 4, Duration::from_secs(1));
        let poll = Duration::from_secs(60);
        let (a, b) = tokio::join!(
            source.query("http://p", "sum(lag)", poll),
            source.query("http://p", "sum(lag)", poll)
        );
        assert_eq!(a, b);
        let _ = source.query("http://p", "sum(lag)", poll).await;
        assert_eq!(backend.calls.load(Ordering::SeqCst), 1);
        let _ = source.query("http://other", "sum(lag)", poll).await;
        let _ = source.query("http://p", "max(age)", poll).await;
        assert_eq!(backend.calls.load(Ordering::SeqCst), 3);
        let _ = source.query("http://p", "sum(lag)", Duration::ZERO).await;
        assert_eq!(backend.calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn an_address_outside_the_allowlist_is_never_asked() {
        let backend = Arc::new(Counting {
            calls: AtomicUsize::new(0),
        });
        let allowlist = Allowlist::new(&[], Some("http://p:9090")).unwrap();
        let source = MetricsSource::new(backend.clone(), 4, Duration::from_secs(1))
            .with_allowlist(allowlist);
        let refused = source
            .query("http://169.254.169.254", "up", Duration::ZERO)
            .await;
        let Observation::Failed(reason) = refused else {
            panic!("refused addresses fail: {refused:?}");
        };
        assert!(reason.contains("spec.prometheus.address http://169.254.169.254"));
        assert_eq!(backend.calls.load(Ordering::SeqCst), 0);
        let _ = source.query("http://p:9090", "up", Duration::ZERO).await;
        assert_eq!(backend.calls.load(Ordering::SeqCst), 1);
    }
}
