//! A deadline on every API request but watches. A watch is meant to stay open (kube's watcher
//! has its own idle timeout); every other call either answers within the deadline or fails as a
//! timeout, so no reconcile, list or lease call waits on a stalled connection.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Request;
use tower::{BoxError, Layer, Service};

/// Applies [`RequestTimeout`].
#[derive(Clone, Copy, Debug)]
pub struct RequestTimeoutLayer {
    timeout: Duration,
}

impl RequestTimeoutLayer {
    pub fn new(timeout: Duration) -> Self {
        Self { timeout }
    }
}

impl<S> Layer<S> for RequestTimeoutLayer {
    type Service = RequestTimeout<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestTimeout {
            inner,
            timeout: self.timeout,
        }
    }
}

#[derive(Clone, Debug)]
pub struct RequestTimeout<S> {
    inner: S,
    timeout: Duration,
}

/// The error of a request that got no response in time.
#[derive(Debug, thiserror::Error)]
#[error("no response from the API server within {0:?}")]
pub struct TimedOut(pub Duration);

/// Whether the request is a watch (`?watch=true` or `?watch=1`), which stays open by design.
pub fn is_watch<B>(request: &Request<B>) -> bool {
    request.uri().query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| matches!(pair, "watch=true" | "watch=1"))
    })
}

impl<S, B> Service<Request<B>> for RequestTimeout<S>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let timeout = (!is_watch(&request)).then_some(self.timeout);
        let response = self.inner.call(request);
        Box::pin(async move {
            match timeout {
                None => response.await.map_err(Into::into),
                Some(timeout) => match tokio::time::timeout(timeout, response).await {
                    Ok(result) => result.map_err(Into::into),
                    Err(_) => Err(Box::new(TimedOut(timeout)) as BoxError),
                },
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(uri: &str) -> Request<()> {
        Request::builder().uri(uri).body(()).unwrap()
    }

    #[test]
    fn only_watches_are_exempt() {
        assert!(is_watch(&request(
            "/apis/backlog.dev/v1alpha1/backlogbudgets?watch=true&resourceVersion=5"
        )));
        assert!(is_watch(&request("/api/v1/pods?labelSelector=a&watch=1")));
        assert!(!is_watch(&request("/api/v1/pods?limit=500")));
        assert!(!is_watch(&request("/api/v1/namespaces/x/configmaps/y")));
        assert!(!is_watch(&request("/api/v1/pods?watch=false")));
        assert!(!is_watch(&request("/api/v1/pods?allowWatchBookmarks=true")));
    }

    #[tokio::test]
    async fn a_silent_server_is_a_timeout_and_a_watch_waits() {
        let never = tower::service_fn(|_: Request<()>| {
            futures::future::pending::<Result<(), std::convert::Infallible>>()
        });
        let mut service = RequestTimeoutLayer::new(Duration::from_millis(20)).layer(never);
        let error = service
            .call(request("/api/v1/namespaces/x/configmaps/y"))
            .await
            .unwrap_err();
        assert!(error.is::<TimedOut>(), "{error}");
        let watch = service.call(request("/api/v1/pods?watch=true"));
        assert!(
            tokio::time::timeout(Duration::from_millis(100), watch)
                .await
                .is_err(),
            "a watch is not cut by the request timeout"
        );
    }
}
