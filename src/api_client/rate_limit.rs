//! A client-side limit on how fast the controllers send API requests: a token bucket refilled
//! at `qps` per second that holds at most `burst`. Steady state sends nothing, but a start with
//! ten thousand budgets, or a change that touches all of them, would otherwise send as fast as
//! the API server answers, and every other client of the cluster would pay for it (the server's
//! priority and fairness throttles whoever shares our priority level). Requests over the limit
//! wait in order of arrival; the wait is outside the request's deadline and is counted in
//! `/metrics`.
//!
//! Writes that may wait (a control document behind the statuses of budgets created together)
//! take [`SpareCapacity`]: a token no waiting request has reserved, at a moment when no other
//! request is in flight. The second condition matters because the API server, not this limit,
//! is often what paces a crowd of reconciles: their requests keep it busy without a queue
//! forming here.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tower::{BoxError, Layer, Service};

/// Told of every request that had to wait for the limit.
pub trait ThrottleObserver: Send + Sync {
    fn throttled(&self, waited: Duration);
}

/// `qps` requests per second on average, `burst` at once.
pub struct RateLimit {
    qps: f64,
    burst: f64,
    bucket: Mutex<Bucket>,
    observer: Option<Arc<dyn ThrottleObserver>>,
    /// Requests sent and not yet answered (their response headers).
    in_flight: AtomicUsize,
}

/// Tokens left (negative: reserved by requests still waiting) as of `at`.
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl RateLimit {
    /// A full bucket. `qps` must be positive and finite; `burst` at least 1.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps: if qps.is_finite() && qps > 0.0 {
                qps
            } else {
                f64::MAX
            },
            burst,
            bucket: Mutex::new(Bucket {
                tokens: burst,
                at: Instant::now(),
            }),
            observer: None,
            in_flight: AtomicUsize::new(0),
        }
    }

    pub fn with_observer(mut self, observer: Arc<dyn ThrottleObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Takes a token now; how long the request must wait until it is its turn (zero while
    /// the bucket holds one).
    pub fn reserve(&self) -> Duration {
        let now = Instant::now();
        // A poisoned lock only means a holder panicked; the two numbers are still usable.
        let mut bucket = self
            .bucket
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let refilled = now.saturating_duration_since(bucket.at).as_secs_f64() * self.qps;
        bucket.tokens = (bucket.tokens + refilled).min(self.burst) - 1.0;
        bucket.at = now;
        if bucket.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-bucket.tokens / self.qps)
        }
    }

    /// Counts a request as in flight until the guard is dropped.
    fn sending(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(self))
    }

    /// How long until there is capacity to spare, when `own` of the requests in flight are
    /// the caller's own: zero when no other request is in flight and the bucket holds a token
    /// no waiting request has reserved. Takes nothing.
    fn until_spare(&self, own: usize) -> Duration {
        let tokens = self.until_token();
        if !tokens.is_zero() {
            return tokens;
        }
        if self.in_flight.load(Ordering::Acquire) > own {
            IN_FLIGHT_RECHECK
        } else {
            Duration::ZERO
        }
    }

    /// How long until a token is spare: one that no request waiting for the limit has
    /// reserved; zero when the bucket holds a whole token now.
    fn until_token(&self) -> Duration {
        let now = Instant::now();
        let bucket = self
            .bucket
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let refilled = now.saturating_duration_since(bucket.at).as_secs_f64() * self.qps;
        let tokens = (bucket.tokens + refilled).min(self.burst);
        if tokens >= 1.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((1.0 - tokens) / self.qps)
        }
    }
}

/// How often a request that waits for spare capacity looks again while others are in flight.
const IN_FLIGHT_RECHECK: Duration = Duration::from_millis(20);

/// One request in flight, until dropped (also when its future is).
struct InFlight(Arc<RateLimit>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The client's capacity that its other requests leave: writes that may wait wait for it,
/// then go through the client as usual. Without a limit there is always capacity.
#[derive(Clone, Default)]
pub struct SpareCapacity {
    limit: Option<Arc<RateLimit>>,
}

impl SpareCapacity {
    pub fn of(limit: Arc<RateLimit>) -> Self {
        Self { limit: Some(limit) }
    }

    /// Returns once no request but the caller's `own` is in flight and a token is left that
    /// no waiting request has reserved, or once `patience` has passed: a write waits for the
    /// others, but not for ever.
    pub async fn wait(&self, own: &AtomicUsize, patience: Duration) {
        let Some(limit) = &self.limit else {
            return;
        };
        let give_up = Instant::now() + patience;
        loop {
            let wait = limit.until_spare(own.load(Ordering::Acquire));
            let now = Instant::now();
            if wait.is_zero() || now >= give_up {
                return;
            }
            tokio::time::sleep(wait.min(give_up - now)).await;
        }
    }
}

/// Applies [`RateLimited`].
#[derive(Clone)]
pub struct RateLimitLayer {
    limit: Arc<RateLimit>,
}

impl RateLimitLayer {
    pub fn new(limit: Arc<RateLimit>) -> Self {
        Self { limit }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            limit: Arc::clone(&self.limit),
        }
    }
}

#[derive(Clone)]
pub struct RateLimited<S> {
    inner: S,
    limit: Arc<RateLimit>,
}

impl<S, R> Service<R> for RateLimited<S>
where
    S: Service<R> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let wait = self.limit.reserve();
        // The service that was polled ready is the one called; a fresh clone stays behind.
        let fresh = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, fresh);
        let observer = self.limit.observer.clone();
        let limit = Arc::clone(&self.limit);
        Box::pin(async move {
            if !wait.is_zero() {
                if let Some(observer) = observer {
                    observer.throttled(wait);
                }
                tokio::time::sleep(wait).await;
            }
            let _in_flight = limit.sending();
            ready.call(request).await.map_err(Into::into)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[derive(Default)]
    struct Counting {
        waits: Mutex<Vec<Duration>>,
    }

    impl ThrottleObserver for Counting {
        fn throttled(&self, waited: Duration) {
            self.waits
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(waited);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_passes_and_the_rest_follow_at_the_rate_in_order() {
        let observer = Arc::new(Counting::default());
        let limit = Arc::new(RateLimit::new(10.0, 3).with_observer(observer.clone()));
        let sent = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let counter = Arc::clone(&sent);
        let service = tower::service_fn(move |i: usize| {
            counter.fetch_add(1, Ordering::SeqCst);
            let at = started.elapsed();
            async move { Ok::<_, std::convert::Infallible>((i, at)) }
        });
        let mut limited = RateLimitLayer::new(limit).layer(service);
        let calls: Vec<_> = (0..6).map(|i| limited.call(i)).collect();
        let answers = futures::future::join_all(calls).await;
        let times: Vec<(usize, Duration)> = answers
            .into_iter()
            .map(|answer| answer.expect("answered"))
            .collect();
        let ms = |n: u64| Duration::from_millis(n);
        assert_eq!(
            times,
            vec![
                (0, ms(0)),
                (1, ms(0)),
                (2, ms(0)),
                (3, ms(100)),
                (4, ms(200)),
                (5, ms(300))
            ]
        );
        assert_eq!(sent.load(Ordering::SeqCst), 6);
        let waits = observer
            .waits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        assert_eq!(waits, vec![ms(100), ms(200), ms(300)]);
        // After a quiet second the bucket is full again, never fuller than the burst.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let limit = RateLimit::new(10.0, 3);
        tokio::time::sleep(Duration::from_secs(10)).await;
        let free = (0..4).map(|_| limit.reserve()).collect::<Vec<_>>();
        assert_eq!(free, vec![ms(0), ms(0), ms(0), ms(100)]);
    }

    #[tokio::test(start_paused = true)]
    async fn spare_capacity_waits_for_every_reserved_turn_and_every_other_request_in_flight() {
        let limit = Arc::new(RateLimit::new(10.0, 2));
        let spare = SpareCapacity::of(Arc::clone(&limit));
        let (none, patience) = (AtomicUsize::new(0), Duration::from_secs(60));
        let started = Instant::now();
        // A full bucket is spare.
        spare.wait(&none, patience).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        // Two requests empty it and three more wait in line: the last has its turn at 300 ms,
        // and a whole token is spare 100 ms after that.
        for _ in 0..5 {
            limit.reserve();
        }
        spare.wait(&none, patience).await;
        assert_eq!(started.elapsed(), Duration::from_millis(400));
        // Waiting took nothing: an ordinary request goes at once.
        assert_eq!(limit.reserve(), Duration::ZERO);
        tokio::time::sleep(Duration::from_secs(1)).await;
        // A request in flight that is not the caller's own holds it back until answered.
        let in_flight = limit.sending();
        let answered = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            drop(in_flight);
        });
        let before = Instant::now();
        spare.wait(&AtomicUsize::new(0), patience).await;
        assert!(
            before.elapsed() >= Duration::from_millis(500),
            "{:?}",
            before.elapsed()
        );
        answered.await.expect("answered");
        // Its own requests do not hold the caller back.
        let own = limit.sending();
        let before = Instant::now();
        spare.wait(&AtomicUsize::new(1), patience).await;
        assert_eq!(before.elapsed(), Duration::ZERO);
        // Nor does any request for longer than the caller's patience.
        let before = Instant::now();
        spare.wait(&none, Duration::from_secs(2)).await;
        assert_eq!(before.elapsed(), Duration::from_secs(2));
        drop(own);
        // Without a limit nothing waits.
        let before = Instant::now();
        SpareCapacity::default().wait(&none, patience).await;
        assert_eq!(before.elapsed(), Duration::ZERO);
    }
}
