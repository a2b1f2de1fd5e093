//! Errors of the controllers. Anything a user can cause ends as a status condition; these are
//! the failures left over (API calls that failed), retried with backoff.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("{context}: {source}")]
    Kube {
        context: String,
        #[source]
        source: kube::Error,
    },
    #[error("{kind} {name} has no namespace; the operator only handles namespaced objects")]
    MissingNamespace { kind: &'static str, name: String },
    #[error("cannot encode {what}: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot reach the Kubernetes API: {0}")]
    Client(#[source] kube::Error),
    #[error("metrics endpoint on {address}: {source}")]
    Serve {
        address: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("leader election: {0}")]
    Leadership(String),
    #[error("{0}")]
    Settings(String),
    #[error("{what} took longer than {seconds}s")]
    Timeout { what: String, seconds: u64 },
}

impl Error {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::MissingNamespace { .. } => "missing_namespace",
            Error::Encode { .. } => "encode",
            Error::Client(_) => "client",
            Error::Serve { .. } => "serve",
            Error::Leadership(_) => "leadership",
            Error::Settings(_) => "settings",
            Error::Timeout { .. } => "timeout",
        }
    }
}

/// Adds what the operator was doing to a Kubernetes API error.
pub trait KubeContext<T> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T, Error>;
}

impl<T> KubeContext<T> for Result<T, kube::Error> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T, Error> {
        self.map_err(|source| Error::Kube {
            context: context(),
            source,
        })
    }
}

/// Whether the API said the object does not exist.
pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}
