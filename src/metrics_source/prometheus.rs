//! The Prometheus HTTP API as a [`QueryBackend`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_http_query::Client;
use prometheus_http_query::response::{Data, PromqlResult};

use super::{Labelled, LabelledFuture, QueryBackend, QueryFuture};
use crate::core::metric_input::Observation;

/// Clients kept at most, one per server address; the least recently used goes first. The
/// allowlist keeps the addresses few; this bound holds even when it allows any address.
pub const MAX_CLIENTS: usize = 32;

/// How much of an error's text reaches a status: enough to say what went wrong, never a
/// whole response body.
const MAX_ERROR_CHARS: usize = 300;

/// Clients by address, each with the tick it was last used at.
#[derive(Default)]
struct Clients {
    by_address: HashMap<String, (Client, u64)>,
    tick: u64,
}

/// Instant queries over HTTP(S), one client per server address (bounded).
#[derive(Default)]
pub struct PrometheusBackend {
    clients: Mutex<Clients>,
}

impl PrometheusBackend {
    pub fn new() -> Self {
        Self::default()
    }

    /// How many clients are kept.
    pub fn clients(&self) -> usize {
        self.clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .by_address
            .len()
    }

    fn client(&self, address: &str, timeout: Duration) -> Result<Client, String> {
        let mut guard = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Clients { by_address, tick } = &mut *guard;
        *tick += 1;
        if let Some((client, used)) = by_address.get_mut(address) {
            *used = *tick;
            return Ok(client.clone());
        }
        // The per-query deadline is enforced around each query (with a clear message); the
        // client's own timeout is only a backstop behind it. Redirects are not followed: an
        // allowed server must not be able to send the operator elsewhere.
        let http = reqwest::Client::builder()
            .timeout(timeout + Duration::from_secs(1))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
        let client = Client::from(http, address)
            .map_err(|e| format!("{address} is not a usable Prometheus address: {e}"))?;
        while by_address.len() >= MAX_CLIENTS {
            let Some(oldest) = by_address
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(address, _)| address.clone())
            else {
                break;
            };
            by_address.remove(&oldest);
        }
        by_address.insert(address.to_owned(), (client.clone(), *tick));
        Ok(client)
    }
}

/// An error's text cut to a length fit for a status condition.
fn bounded(text: String) -> String {
    if text.chars().count() <= MAX_ERROR_CHARS {
        return text;
    }
    let cut: String = text.chars().take(MAX_ERROR_CHARS).collect();
    format!("{cut}…")
}

/// The samples of a query result; a range vector is a mistake in the query.
pub fn observation_of(data: &Data) -> Observation {
    match data {
        Data::Vector(vector) => {
            Observation::Samples(vector.iter().map(|v| v.sample().value()).collect())
        }
        Data::Scalar(sample) => Observation::Samples(vec![sample.value()]),
        Data::Matrix(_) => Observation::Failed(
            "returned a range vector; write an instant query (e.g. wrap it in rate() or max_over_time())"
                .to_owned(),
        ),
    }
}

/// Evaluates `expression` through `client`, giving up after `timeout`; every error names
/// the server.
async fn evaluate(
    client: Result<Client, String>,
    expression: String,
    address: String,
    timeout: Duration,
) -> Result<PromqlResult, String> {
    let client = client?;
    let timeout_ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
    let query = client.query(&expression).timeout(timeout_ms).get();
    match tokio::time::timeout(timeout, query).await {
        Err(_) => Err(format!(
            "no answer from {address} within {}ms",
            timeout.as_millis()
        )),
        Ok(Err(error)) => Err(bounded(format!("{address}: {error}"))),
        Ok(Ok(result)) => Ok(result),
    }
}

/// One value per series of an instant vector, named by `label` (by position without it).
fn labelled_of(data: &Data, label: &str) -> Labelled {
    match data {
        Data::Vector(vector) => Ok(vector
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let name = v
                    .metric()
                    .get(label)
                    .cloned()
                    .unwrap_or_else(|| i.to_string());
                (name, v.sample().value())
            })
            .collect()),
        _ => Err("must return an instant vector with one series per partition".to_owned()),
    }
}

impl QueryBackend for PrometheusBackend {
    fn instant(&self, address: &str, expression: &str, timeout: Duration) -> QueryFuture {
        let answer = evaluate(
            self.client(address, timeout),
            expression.to_owned(),
            address.to_owned(),
            timeout,
        );
        Box::pin(async move {
            match answer.await {
                Ok(result) => observation_of(result.data()),
                Err(reason) => Observation::Failed(reason),
            }
        })
    }

    fn instant_by_label(
        &self,
        address: &str,
        expression: &str,
        timeout: Duration,
        label: &str,
    ) -> LabelledFuture {
        let answer = evaluate(
            self.client(address, timeout),
            expression.to_owned(),
            address.to_owned(),
            timeout,
        );
        let label = label.to_owned();
        Box::pin(async move { labelled_of(answer.await?.data(), &label) })
    }

    fn instant_grouped(
        &self,
        address: &str,
        expression: &str,
        timeout: Duration,
        label: &str,
    ) -> LabelledFuture {
        let answer = evaluate(
            self.client(address, timeout),
            expression.to_owned(),
            address.to_owned(),
            timeout,
        );
        let label = label.to_owned();
        Box::pin(async move {
            match answer.await?.data() {
                Data::Vector(vector) => Ok(vector
                    .iter()
                    .filter_map(|v| Some((v.metric().get(&label)?.clone(), v.sample().value())))
                    .collect()),
                _ => Err("a grouped query must return an instant vector".to_owned()),
            }
        })
    }
}

impl PrometheusBackend {
    pub fn shared() -> Arc<dyn QueryBackend> {
        Arc::new(Self::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_cache_is_bounded() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let backend = PrometheusBackend::new();
        for port in 0..(MAX_CLIENTS + 20) {
            let address = format!("http://127.0.0.1:{}", 20000 + port);
            backend
                .client(&address, Duration::from_secs(1))
                .expect("a client");
        }
        assert_eq!(backend.clients(), MAX_CLIENTS);
    }

    #[test]
    fn long_errors_are_cut() {
        let cut = bounded("x".repeat(5000));
        assert!(cut.chars().count() <= MAX_ERROR_CHARS + 1);
        assert_eq!(bounded("short".to_owned()), "short");
    }
}
