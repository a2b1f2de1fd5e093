//! The operator's clients of the Kubernetes API: kube's usual stack (base URI, credentials that
//! refresh, extra headers) over connections that time out and write only while a
//! [`WriteGate`] is open, with a deadline on every request but watches and a User-Agent that
//! names the replica, so audit logs tell replicas apart.

pub mod connector;
pub mod gate;
pub mod rate_limit;
pub mod timeout;

use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use http::header::USER_AGENT;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use kube::{Client, Config};
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};

pub use connector::{GateClosed, GatedConnector};
pub use gate::WriteGate;
pub use rate_limit::{RateLimit, RateLimitLayer, SpareCapacity, ThrottleObserver};
pub use timeout::{RequestTimeoutLayer, TimedOut};

/// How the operator talks to the API server.
#[derive(Clone, Debug)]
pub struct ClientSettings {
    /// Establishing a TCP connection.
    pub connect_timeout: Duration,
    /// Any request but a watch, from sending it to the response's headers.
    pub request_timeout: Duration,
    /// Who is calling, for the API server's audit log: the replica's identity, if it has one.
    pub identity: Option<String>,
    /// Requests per second on average ([`RateLimit`]); 0 sends without a limit.
    pub qps: f64,
    /// Requests at once above the average.
    pub burst: u32,
    /// How long an idle connection stays open for the next request.
    pub idle_timeout: Duration,
}

impl Default for ClientSettings {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            identity: None,
            qps: DEFAULT_QPS,
            burst: DEFAULT_BURST,
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// The client-side limit by default: a tenth of what one operator sent per second at 1,000
/// budgets before its steady state was made silent, and enough to write first statuses for
/// 10,000 budgets within a minute.
pub const DEFAULT_QPS: f64 = 200.0;
pub const DEFAULT_BURST: u32 = 400;

/// `backlog-operator/VERSION (IDENTITY)`.
pub fn user_agent(identity: Option<&str>) -> String {
    let product = concat!("backlog-operator/", env!("CARGO_PKG_VERSION"));
    match identity {
        Some(identity) => format!("{product} ({identity})"),
        None => product.to_owned(),
    }
}

/// A client whose connections write only while `gate` is open, and whose requests keep to
/// the settings' rate limit (each wait told to `throttled`).
pub fn build(
    config: Config,
    settings: &ClientSettings,
    gate: WriteGate,
    throttled: Option<Arc<dyn ThrottleObserver>>,
) -> Result<Client, kube::Error> {
    build_with_spare(config, settings, gate, throttled).map(|(client, _)| client)
}

/// The most a connection's read buffer grows to. A buffer keeps its largest size, and a
/// watch inherits the connection its kind's list was read on: with hyper's default (about
/// 400 KB) every watch of a kind with thousands of objects kept the buffer a list page
/// filled. Bodies are passed on as they are read, so a smaller buffer only means more reads
/// (a list page of 500 budgets, about 3 MB, in 200 reads instead of 50); at 64 KiB the
/// watches' and idle connections' buffers were still about a megabyte.
const READ_BUFFER_LIMIT: usize = 16 * 1024;

/// Idle connections kept at most: enough for the reconciles in flight at the client's rate.
const IDLE_CONNECTIONS_KEPT: usize = 32;

/// [`build`], with the capacity its limit leaves to writes that may wait.
pub fn build_with_spare(
    mut config: Config,
    settings: &ClientSettings,
    gate: WriteGate,
    throttled: Option<Arc<dyn ThrottleObserver>>,
) -> Result<(Client, SpareCapacity), kube::Error> {
    let limit = (settings.qps > 0.0).then(|| {
        let limit = RateLimit::new(settings.qps, settings.burst);
        Arc::new(match throttled {
            Some(observer) => limit.with_observer(observer),
            None => limit,
        })
    });
    let agent = HeaderValue::from_str(&user_agent(settings.identity.as_deref()))
        .unwrap_or_else(|_| HeaderValue::from_static("backlog-operator"));
    config.headers.retain(|(name, _)| *name != USER_AGENT);
    config.headers.push((USER_AGENT, agent));

    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(settings.connect_timeout));
    let https = config.rustls_https_connector_with_connector(GatedConnector::new(http, gate))?;
    // Idle connections close after a while. Without a timer the pool only checks their age
    // when it hands one out, so every connection a start's burst of writes opened (a hundred
    // at thousands of budgets, each with its buffers and TLS state) stayed open for good.
    let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(settings.idle_timeout)
        .pool_max_idle_per_host(IDLE_CONNECTIONS_KEPT)
        .http1_max_buf_size(READ_BUFFER_LIMIT)
        .build(https);
    let spare = limit.clone().map(SpareCapacity::of).unwrap_or_default();
    let service = ServiceBuilder::new()
        // Outermost: waiting for the limit is not part of a request's deadline.
        .option_layer(limit.map(RateLimitLayer::new))
        .layer(config.base_uri_layer())
        // 429, 503 and 504 are retried with backoff, as kube's own stack does.
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .layer(RequestTimeoutLayer::new(settings.request_timeout))
        .map_err(BoxError::from)
        .service(hyper);
    Ok((Client::new(service, config.default_namespace), spare))
}

/// Whether a failed call failed because this replica's write gate is closed (it does not lead).
pub fn refused_by_gate(error: &kube::Error) -> bool {
    caused_by::<GateClosed>(error)
}

/// Whether a failed call timed out in [`RequestTimeoutLayer`].
pub fn timed_out(error: &kube::Error) -> bool {
    caused_by::<TimedOut>(error)
}

/// Whether `E` is somewhere in the chain of `error`, also inside an I/O error (whose `source`
/// skips the error it wraps).
fn caused_by<E: std::error::Error + 'static>(error: &kube::Error) -> bool {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = current {
        if error.is::<E>() {
            return true;
        }
        if let Some(wrapped) = error
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            && wrapped.is::<E>()
        {
            return true;
        }
        current = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// An HTTP/1.1 server on loopback that answers every request with `{}`, counting the
    /// connections open to it.
    async fn counting_server() -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let address = listener.local_addr().expect("its address");
        let open = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&open);
        tokio::spawn(async move {
            while let Ok((mut connection, _)) = listener.accept().await {
                let open = Arc::clone(&counted);
                open.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buffer = [0_u8; 4096];
                    // One read per request is enough for these small GETs.
                    while let Ok(read) = connection.read(&mut buffer).await {
                        if read == 0 {
                            break;
                        }
                        // Slow enough that the requests overlap and need connections of their own.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
                        if connection.write_all(answer).await.is_err() {
                            break;
                        }
                    }
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        (format!("http://{address}"), open)
    }

    #[tokio::test]
    async fn idle_connections_close_after_the_idle_timeout() {
        let (url, open) = counting_server().await;
        let config = Config::new(url.parse().expect("a URL"));
        let settings = ClientSettings {
            qps: 0.0,
            idle_timeout: Duration::from_millis(300),
            ..ClientSettings::default()
        };
        let client = build(config, &settings, WriteGate::always_open(), None).expect("a client");
        let requests = (0..8).map(|_| {
            let client = client.clone();
            async move {
                let request = http::Request::get("/version")
                    .body(Vec::new())
                    .expect("a request");
                client.request_text(request).await
            }
        });
        for answer in futures::future::join_all(requests).await {
            assert_eq!(answer.expect("answered"), "{}");
        }
        assert!(
            open.load(Ordering::SeqCst) > 1,
            "the burst used several connections"
        );
        // The pool closes them once idle for the timeout, not at its next checkout.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while open.load(Ordering::SeqCst) > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} idle connections still open",
                open.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
