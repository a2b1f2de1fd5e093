//! Where the operator reads metrics: a small trait in front of Prometheus, with the cache that
//! evaluates an expression once per poll however many budgets ask for it.

pub mod allowlist;
pub mod prometheus;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OnceCell, OwnedSemaphorePermit, Semaphore};

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

/// The answers by (server, expression), and when entries older than [`FORGET_AFTER`] were last
/// dropped: sweeping on a schedule keeps each lookup O(1) however many budgets ask.
struct Answers {
    entries: HashMap<(String, String), Entry>,
    swept: Instant,
}

/// Queries with a timeout, bounded concurrency per server and sharing: identical expressions
/// asked within `max_age` of each other (also while the first is in flight) are evaluated once.
pub struct MetricsSource {
    backend: Arc<dyn QueryBackend>,
    /// Servers that may be queried at all; any other address is refused before a request.
    allowlist: Allowlist,
    answers: Mutex<Answers>,
    /// Queries in flight at once, per server: one slow Prometheus does not hold the slots of
    /// the budgets that read another.
    concurrency: usize,
    limiters: Mutex<HashMap<String, Arc<Semaphore>>>,
    timeout: Duration,
    observer: Option<Arc<dyn QueryObserver>>,
}

/// Why a query was not asked: nobody named a Prometheus.
pub const NO_PROMETHEUS: &str =
    "no Prometheus: set spec.prometheus.address or start the operator with --prometheus-url";

/// Entries older than this are dropped whatever the callers' max age.
const FORGET_AFTER: Duration = Duration::from_secs(600);
/// How often old entries are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

impl MetricsSource {
    pub fn new(backend: Arc<dyn QueryBackend>, concurrency: usize, timeout: Duration) -> Self {
        Self {
            backend,
            allowlist: Allowlist::any(),
            answers: Mutex::new(Answers {
                entries: HashMap::new(),
                swept: Instant::now(),
            }),
            concurrency: concurrency.max(1),
            limiters: Mutex::new(HashMap::new()),
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
                let started = Instant::now();
                let observation = match self.slot(address).await {
                    Ok(_slot) => {
                        self.backend
                            .instant(address, expression, self.timeout)
                            .await
                    }
                    Err(reason) => Observation::Failed(reason),
                };
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

    /// One of `address`'s query slots, once free. The wait is not bounded by the query
    /// timeout: at a thousand budgets the slots are busy for seconds at a time, and a query
    /// failed for waiting would turn a steady budget's metrics unavailable (a status write, an
    /// Event) although the server answers fine.
    async fn slot(&self, address: &str) -> Result<OwnedSemaphorePermit, String> {
        self.limiter(address)
            .acquire_owned()
            .await
            .map_err(|_| "query limiter closed".to_owned())
    }

    /// The slots of `address`, created on first use (the allowlist bounds the addresses).
    fn limiter(&self, address: &str) -> Arc<Semaphore> {
        let mut limiters = self
            .limiters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Looked up before inserting: a query is no reason to allocate the address again.
        if let Some(limiter) = limiters.get(address) {
            return Arc::clone(limiter);
        }
        let limiter = Arc::new(Semaphore::new(self.concurrency));
        limiters.insert(address.to_owned(), Arc::clone(&limiter));
        limiter
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
        let started = Instant::now();
        let answer = match self.slot(address).await {
            Ok(_slot) => {
                self.backend
                    .instant_by_label(address, expression, self.timeout, label)
                    .await
            }
            Err(reason) => Err(reason),
        };
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
        let mut answers = self
            .answers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if answers.swept.elapsed() >= SWEEP_EVERY {
            answers
                .entries
                .retain(|_, entry| entry.asked.elapsed() < FORGET_AFTER);
            answers.swept = Instant::now();
        }
        let entries = &mut answers.entries;
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

    /// Answers after `delay`, and records the time each query was given.
    struct Slow {
        delay: Duration,
        given: Mutex<Vec<Duration>>,
    }

    impl QueryBackend for Slow {
        fn instant(&self, _: &str, _: &str, timeout: Duration) -> QueryFuture {
            self.given
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(timeout);
            let delay = self.delay;
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                Observation::Samples(vec![1.0])
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn each_server_has_its_own_query_slots() {
        let backend = Arc::new(Slow {
            delay: Duration::from_secs(3),
            given: Mutex::new(Vec::new()),
        });
        // One slot per server, a server that takes 3 s.
        let source = MetricsSource::new(backend.clone(), 1, Duration::from_secs(5));
        let started = tokio::time::Instant::now();
        let elsewhere_done = async {
            let answer = source.query("http://other", "a", Duration::ZERO).await;
            (answer, started.elapsed())
        };
        let (first, second, (elsewhere, elsewhere_after)) = tokio::join!(
            source.query("http://slow", "a", Duration::ZERO),
            source.query("http://slow", "b", Duration::ZERO),
            elsewhere_done,
        );
        assert_eq!(first, Observation::Samples(vec![1.0]));
        assert_eq!(second, Observation::Samples(vec![1.0]));
        assert_eq!(elsewhere, Observation::Samples(vec![1.0]));
        // The other server's query did not wait for the slow one's slot; the slow server's
        // second query did, and still had the whole timeout.
        assert_eq!(elsewhere_after, Duration::from_secs(3));
        assert_eq!(started.elapsed(), Duration::from_secs(6));
        let given = backend
            .given
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        assert_eq!(given, vec![Duration::from_secs(5); 3]);
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
