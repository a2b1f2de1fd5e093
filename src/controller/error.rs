//! Errors of the controllers. Anything a user can cause ends as a status condition; these are
//! the failures left over, typed so the error policy can tell a hiccup from a lasting problem:
//! every API failure keeps the `kube::Error` it came from (and so its HTTP status) and the call
//! that failed, and [`Error::persistence`] says whether retrying can help.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use kube::Resource;
use thiserror::Error;

use crate::metrics_source::AllowlistError;

/// What an API call was doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verb {
    Get,
    List,
    Create,
    Replace,
    Apply,
    Patch,
    /// A server-side dry run of a create.
    Validate,
    /// API discovery of a kind.
    Discover,
}

impl Verb {
    fn describe(self) -> &'static str {
        match self {
            Verb::Get => "reading",
            Verb::List => "listing",
            Verb::Create => "creating",
            Verb::Replace => "replacing",
            Verb::Apply => "applying",
            Verb::Patch => "patching",
            Verb::Validate => "validating",
            Verb::Discover => "discovering",
        }
    }
}

/// One API call: the verb and the object (or collection) it was about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiCall {
    pub verb: Verb,
    pub kind: Cow<'static, str>,
    /// `status` or `scale` when the call was on a subresource.
    pub subresource: Option<&'static str>,
    pub namespace: Option<String>,
    /// `None` for a collection (a list).
    pub name: Option<String>,
}

impl ApiCall {
    /// `verb` on object `name` of kind `kind` in `namespace`.
    pub fn new(
        verb: Verb,
        kind: impl Into<Cow<'static, str>>,
        namespace: &str,
        name: &str,
    ) -> ApiCall {
        ApiCall {
            verb,
            kind: kind.into(),
            subresource: None,
            namespace: Some(namespace.to_owned()),
            name: Some(name.to_owned()),
        }
    }

    /// `verb` on object `name` of the static kind `K`.
    pub fn on<K: Resource<DynamicType = ()>>(verb: Verb, namespace: &str, name: &str) -> ApiCall {
        ApiCall::new(verb, K::kind(&()).into_owned(), namespace, name)
    }

    /// Listing kind `K`, in `namespace` or in all namespaces.
    pub fn list<K: Resource<DynamicType = ()>>(namespace: Option<&str>) -> ApiCall {
        ApiCall {
            verb: Verb::List,
            kind: K::kind(&()).into_owned().into(),
            subresource: None,
            namespace: namespace.map(str::to_owned),
            name: None,
        }
    }

    /// The same call on a subresource.
    pub fn subresource(mut self, subresource: &'static str) -> ApiCall {
        self.subresource = Some(subresource);
        self
    }
}

impl fmt::Display for ApiCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.verb.describe())?;
        if let Some(subresource) = self.subresource {
            write!(f, " the {subresource} of")?;
        }
        write!(f, " {}", self.kind)?;
        match (&self.namespace, &self.name) {
            (Some(namespace), Some(name)) => write!(f, " {namespace}/{name}"),
            (None, Some(name)) => write!(f, " {name}"),
            (Some(namespace), None) => write!(f, "s in namespace {namespace}"),
            (None, None) => write!(f, "s in all namespaces"),
        }
    }
}

/// Whether trying again can help.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Persistence {
    /// A timeout, an unreachable or overloaded server (5xx, 429), a conflicting write, a
    /// discovery hiccup: the same call may well succeed soon.
    Transient,
    /// Invalid input, a missing RBAC rule (403), a missing object (404), a response the
    /// client cannot read: the same call fails the same way until someone changes something.
    Permanent,
}

/// How leadership ended.
#[derive(Debug, Error)]
pub enum LeadershipLost {
    #[error("Lease {namespace}/{name} is held by another replica")]
    TakenOver { namespace: String, name: String },
    #[error("Lease {namespace}/{name} not renewed within {}s", within.as_secs())]
    NotRenewed {
        namespace: String,
        name: String,
        within: Duration,
    },
}

#[derive(Debug, Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("{call}: {source}")]
    Api {
        call: Box<ApiCall>,
        #[source]
        source: kube::Error,
    },
    #[error("{kind} {name} has no namespace; the operator only handles namespaced objects")]
    MissingNamespace { kind: &'static str, name: String },
    #[error(
        "{kind} {namespace}/{name} has no uid; only objects read from the API server are reconciled"
    )]
    MissingUid {
        kind: &'static str,
        namespace: String,
        name: String,
    },
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
    Leadership(#[from] LeadershipLost),
    /// The operator's own settings are unusable.
    #[error(transparent)]
    Settings(#[from] AllowlistError),
    /// A call that did not answer in time (it did not fail: it hung).
    #[error("{what} took longer than {seconds}s")]
    Timeout { what: String, seconds: u64 },
    /// What this process packed for keeping does not read back (a bug, never the user's
    /// doing).
    #[error("cannot read the cached {what}: {source}")]
    Cached {
        what: &'static str,
        #[source]
        source: crate::controller::budget::packed::UnpackError,
    },
    /// A plan the shell cannot carry out (a bug, never the user's doing).
    #[error("inconsistent plan: {0}")]
    Inconsistent(&'static str),
}

impl Error {
    /// `call` failed with `source`.
    pub fn api(call: ApiCall, source: kube::Error) -> Error {
        Error::Api {
            call: Box::new(call),
            source,
        }
    }

    /// Whether retrying can help.
    pub fn persistence(&self) -> Persistence {
        match self {
            Error::Api { source, .. } | Error::Client(source) => persistence_of(source),
            // Leadership is lost for this process; a restart may get it back.
            Error::Leadership(_) => Persistence::Transient,
            Error::Serve { .. } | Error::Timeout { .. } => Persistence::Transient,
            Error::MissingNamespace { .. }
            | Error::Settings(_)
            | Error::MissingUid { .. }
            | Error::Encode { .. }
            | Error::Cached { .. }
            | Error::Inconsistent(_) => Persistence::Permanent,
        }
    }

    /// A short label for metrics: what kind of failure, finer for API errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Api { source, .. } => api_error_kind(source),
            Error::MissingNamespace { .. } => "missing_namespace",
            Error::MissingUid { .. } => "missing_uid",
            Error::Encode { .. } => "encode",
            Error::Client(_) => "client",
            Error::Serve { .. } => "serve",
            Error::Leadership(_) => "leadership",
            Error::Settings(_) => "settings",
            Error::Timeout { .. } => "timeout",
            Error::Cached { .. } => "cached",
            Error::Inconsistent(_) => "inconsistent",
        }
    }

    /// One line for people: the call and what the API server said (its message, code and
    /// reason, without the rest of its answer), or the error as it displays.
    pub fn summary(&self) -> String {
        match self {
            Error::Api {
                call,
                source: kube::Error::Api(status),
            } => format!(
                "{call}: {} ({} {})",
                status.message, status.code, status.reason
            ),
            other => other.to_string(),
        }
    }

    /// The HTTP status the API server answered with, if it answered.
    pub fn status_code(&self) -> Option<u16> {
        match self {
            Error::Api {
                source: kube::Error::Api(status),
                ..
            } => Some(status.code),
            _ => None,
        }
    }
}

/// Whether a 403 is a ResourceQuota refusing the request for now (it passes once other objects
/// go away), rather than a missing permission.
fn quota_exceeded(status: &kube::core::Status) -> bool {
    status.message.contains("exceeded quota")
}

/// Whether retrying a failed API call can help.
pub fn persistence_of(error: &kube::Error) -> Persistence {
    match error {
        kube::Error::Api(status) => match status.code {
            // Timeout, conflict, too many requests, and every server-side failure.
            408 | 409 | 429 | 500..=599 => Persistence::Transient,
            // Credentials are refreshed by the client (token files rotate).
            401 => Persistence::Transient,
            403 if quota_exceeded(status) => Persistence::Transient,
            _ => Persistence::Permanent,
        },
        // The connection failed, timed out or was reset.
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            Persistence::Transient
        }
        kube::Error::Auth(_) => Persistence::Transient,
        kube::Error::Discovery(discovery) => match discovery {
            // The server does not serve the kind or group: nothing to retry until it does.
            kube::error::DiscoveryError::MissingKind(_)
            | kube::error::DiscoveryError::MissingApiGroup(_)
            | kube::error::DiscoveryError::MissingResource(_)
            | kube::error::DiscoveryError::InvalidGroupVersion(_) => Persistence::Permanent,
            kube::error::DiscoveryError::EmptyApiGroup(_) => Persistence::Transient,
        },
        _ => Persistence::Permanent,
    }
}

/// A metrics label for an API error.
fn api_error_kind(error: &kube::Error) -> &'static str {
    match error {
        kube::Error::Api(status) => match status.code {
            401 => "api_unauthorized",
            403 if quota_exceeded(status) => "api_quota",
            403 => "api_forbidden",
            404 => "api_not_found",
            408 | 504 => "api_timeout",
            409 => "api_conflict",
            400 | 422 => "api_invalid",
            429 => "api_throttled",
            500..=599 => "api_server_error",
            _ => "api_other",
        },
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            "api_connection"
        }
        kube::Error::Discovery(_) => "api_discovery",
        kube::Error::SerdeError(_) => "api_decode",
        _ => "api_other",
    }
}

/// Names the call that failed.
pub trait During<T> {
    fn during(self, call: impl FnOnce() -> ApiCall) -> Result<T, Error>;
}

impl<T> During<T> for Result<T, kube::Error> {
    fn during(self, call: impl FnOnce() -> ApiCall) -> Result<T, Error> {
        self.map_err(|source| Error::api(call(), source))
    }
}

/// Whether the API said the object does not exist.
pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;

    fn answered(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            message: message.to_owned(),
            ..kube::core::Status::default()
        }))
    }

    #[test]
    fn hiccups_are_transient_and_lasting_problems_permanent() {
        for code in [408, 409, 429, 500, 502, 503, 504] {
            assert_eq!(
                persistence_of(&answered(code, "")),
                Persistence::Transient,
                "{code}"
            );
        }
        for code in [400, 403, 404, 405, 410, 422] {
            assert_eq!(
                persistence_of(&answered(code, "")),
                Persistence::Permanent,
                "{code}"
            );
        }
        let quota = answered(
            403,
            "jobs \"r-canary\" is forbidden: exceeded quota: jobs, requested: count/jobs.batch=1",
        );
        assert_eq!(persistence_of(&quota), Persistence::Transient);
        assert_eq!(
            persistence_of(&kube::Error::Discovery(
                kube::error::DiscoveryError::MissingKind("Rollout".into())
            )),
            Persistence::Permanent
        );
    }

    #[test]
    fn the_error_keeps_the_call_and_the_status() {
        let error = Err::<(), _>(answered(409, "the object has been modified"))
            .during(|| {
                ApiCall::on::<Deployment>(Verb::Apply, "shop", "orders").subresource("scale")
            })
            .unwrap_err();
        assert_eq!(error.status_code(), Some(409));
        assert_eq!(error.persistence(), Persistence::Transient);
        assert_eq!(error.kind(), "api_conflict");
        assert!(
            error
                .to_string()
                .starts_with("applying the scale of Deployment shop/orders: "),
            "{error}"
        );
        let list = ApiCall::list::<Deployment>(None);
        assert_eq!(list.to_string(), "listing Deployments in all namespaces");
    }

    #[test]
    fn a_summary_is_the_call_and_what_the_server_said() {
        let mut status = kube::core::Status {
            code: 500,
            message: "failed calling webhook \"scale\"".to_owned(),
            ..kube::core::Status::default()
        };
        status.reason = "InternalError".to_owned();
        let error = Err::<(), _>(kube::Error::Api(Box::new(status)))
            .during(|| ApiCall::on::<Deployment>(Verb::Apply, "shop", "orders"))
            .unwrap_err();
        assert_eq!(
            error.summary(),
            "applying Deployment shop/orders: failed calling webhook \"scale\" (500 InternalError)"
        );
    }
}
