//! The controllers (`backlog-operator run`): one reconciler per kind, each thin —
//! read → decide (in `core`) → apply (server-side apply) → status.

pub mod apply;
pub mod budget;
pub mod context;
pub mod error;
pub mod leader;
pub mod replay;
pub mod retry_policy;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tracing::info;

use crate::http::{Health, serve};
use crate::metrics_source::MetricsSource;
use crate::metrics_source::prometheus::PrometheusBackend;
use crate::telemetry::Metrics;

pub use context::Context;
pub use error::Error;

/// Which namespaces the controllers watch.
#[derive(Clone, Debug)]
pub enum Scope {
    All,
    Namespace(String),
}

impl Scope {
    pub fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        match self {
            Scope::All => Api::all(client.clone()),
            Scope::Namespace(namespace) => Api::namespaced(client.clone(), namespace),
        }
    }
}

/// Settings of `backlog-operator run`.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub prometheus_url: Option<String>,
    pub scope: Scope,
    pub listen: SocketAddr,
    pub query_timeout: Duration,
    pub query_concurrency: usize,
    /// With several replicas: only the holder of this Lease reconciles.
    pub leader_election: Option<leader::LeaseSettings>,
}

/// The shared context for a client: metrics, the query cache and the event recorder.
pub fn context(
    client: Client,
    prometheus_url: Option<String>,
    query_timeout: Duration,
    query_concurrency: usize,
) -> Arc<Context> {
    let metrics = Arc::new(Metrics::default());
    let queries = Arc::new(
        MetricsSource::new(
            PrometheusBackend::shared(),
            query_concurrency,
            query_timeout,
        )
        .with_observer(metrics.clone()),
    );
    Arc::new(Context::new(client, metrics, queries, prometheus_url))
}

/// Runs every controller on `context` until they stop (on a termination signal).
pub async fn run_controllers(context: Arc<Context>, scope: Scope) {
    tokio::join!(
        budget::run(context.clone(), scope.clone()),
        replay::run(context.clone(), scope.clone()),
        retry_policy::run(context.clone(), scope.clone())
    );
}

/// Runs every controller until a termination signal.
pub async fn run(options: RunOptions) -> Result<(), Error> {
    let client = Client::try_default().await.map_err(Error::Client)?;
    let context = context(
        client,
        options.prometheus_url.clone(),
        options.query_timeout,
        options.query_concurrency,
    );
    let health = Health {
        metrics: context.metrics.clone(),
        ready: Default::default(),
    };
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    let listen = options.listen;
    let server = tokio::spawn(serve(listen, health.clone(), bound_tx));
    if let Ok(address) = bound_rx.await {
        info!(%address, "serving /metrics, /healthz and /readyz");
    }
    // A standby replica is healthy and ready; it just does not reconcile.
    health.ready.store(true, Ordering::Relaxed);
    let leadership = async {
        match &options.leader_election {
            Some(settings) => {
                leader::acquire(context.client.clone(), settings).await?;
                Ok(Some(settings.clone()))
            }
            None => Ok::<_, Error>(None),
        }
    };
    let leading = tokio::select! {
        leading = leadership => leading?,
        served = server => return served_error(listen, served),
    };
    info!(scope = ?options.scope, prometheus = ?options.prometheus_url, "controllers starting");
    let lost = async {
        match leading {
            Some(settings) => leader::keep(context.client.clone(), settings).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = run_controllers(context.clone(), options.scope.clone()) => {}
        error = lost => return Err(error),
    }
    info!("controllers stopped");
    Ok(())
}

fn served_error(
    address: SocketAddr,
    served: Result<std::io::Result<()>, tokio::task::JoinError>,
) -> Result<(), Error> {
    match served {
        Ok(Err(source)) => Err(Error::Serve { address, source }),
        _ => Ok(()),
    }
}
