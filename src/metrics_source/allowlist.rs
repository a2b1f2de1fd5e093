//! Which Prometheus servers the operator may be pointed at (pure).
//!
//! `spec.prometheus.address` is written by whoever may create a BacklogBudget or a ReplayJob;
//! without a limit it makes the operator's pod send requests to any address it can reach (the
//! cloud metadata service, the API server, anything in the cluster network) and show the
//! answers' errors in a status. Only the servers the operator's administrator named
//! (`--allowed-prometheus-url`, by default just `--prometheus-url`) are ever queried.

use thiserror::Error;
use url::Url;

/// The allowed servers; `None` allows every address (`--allowed-prometheus-url='*'`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allowlist {
    servers: Option<Vec<Server>>,
}

/// A server as compared: scheme, host, port and path without a trailing `/`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Server {
    scheme: String,
    host: String,
    port: u16,
    path: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum AllowlistError {
    #[error(
        "--allowed-prometheus-url {0:?} is not a plain http:// or https:// URL (no user, query or fragment)"
    )]
    NotAUrl(String),
}

/// Why an address is not queried; names the field that holds it.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error(
    "spec.prometheus.address {address} is not a Prometheus this operator may query (allowed: {allowed}); remove spec.prometheus.address to use the operator's default, or ask the operator's administrator to allow it with --allowed-prometheus-url"
)]
pub struct Refused {
    pub address: String,
    pub allowed: String,
}

fn server(text: &str) -> Option<Server> {
    let url = Url::parse(text.trim()).ok()?;
    if !matches!(url.scheme(), "http" | "https")
        || !url.username().is_empty()
        || url.password().is_some()
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return None;
    }
    Some(Server {
        scheme: url.scheme().to_owned(),
        host: url.host_str()?.to_ascii_lowercase(),
        port: url.port_or_known_default()?,
        path: url.path().trim_end_matches('/').to_owned(),
    })
}

impl Allowlist {
    /// No address at all.
    pub fn none() -> Allowlist {
        Allowlist {
            servers: Some(Vec::new()),
        }
    }

    /// Every address: the old behaviour, for an administrator who chooses it.
    pub fn any() -> Allowlist {
        Allowlist { servers: None }
    }

    /// From `--allowed-prometheus-url` values (`*` allows every address) and the default
    /// server, which is always allowed.
    pub fn new(entries: &[String], default: Option<&str>) -> Result<Allowlist, AllowlistError> {
        if entries.iter().any(|e| e.trim() == "*") {
            return Ok(Allowlist::any());
        }
        let mut servers = Vec::new();
        for entry in entries.iter().map(String::as_str).chain(default) {
            let parsed = server(entry).ok_or_else(|| AllowlistError::NotAUrl(entry.to_owned()))?;
            if !servers.contains(&parsed) {
                servers.push(parsed);
            }
        }
        Ok(Allowlist {
            servers: Some(servers),
        })
    }

    /// Whether `address` may be queried, or why not.
    pub fn check(&self, address: &str) -> Result<(), Refused> {
        let Some(servers) = &self.servers else {
            return Ok(());
        };
        match server(address) {
            Some(found) if servers.contains(&found) => Ok(()),
            _ => Err(Refused {
                address: address.to_owned(),
                allowed: self.describe(),
            }),
        }
    }

    /// How many servers are allowed (`None`: any).
    pub fn servers(&self) -> Option<usize> {
        self.servers.as_ref().map(Vec::len)
    }

    fn describe(&self) -> String {
        match &self.servers {
            None => "any".to_owned(),
            Some(servers) if servers.is_empty() => "none".to_owned(),
            Some(servers) => servers
                .iter()
                .map(|s| format!("{}://{}:{}{}", s.scheme, s.host, s.port, s.path))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn list(entries: &[&str], default: Option<&str>) -> Allowlist {
        let entries: Vec<String> = entries.iter().map(|e| (*e).to_owned()).collect();
        Allowlist::new(&entries, default).unwrap()
    }

    #[test]
    fn only_the_default_is_allowed_unless_more_are_named() {
        let allowed = list(&[], Some("http://prometheus.monitoring:9090"));
        assert_eq!(allowed.check("http://prometheus.monitoring:9090"), Ok(()));
        assert_eq!(allowed.check("http://Prometheus.Monitoring:9090/"), Ok(()));
        for address in [
            "http://169.254.169.254/latest/meta-data",
            "https://kubernetes.default.svc",
            "http://prometheus.monitoring:9091",
            "https://prometheus.monitoring:9090",
            "http://prometheus.monitoring:9090/other",
            "http://user:secret@prometheus.monitoring:9090",
            "http://prometheus.monitoring:9090?x=1",
            "file:///etc/passwd",
            "not a url",
        ] {
            let refused = allowed.check(address).unwrap_err();
            assert!(refused.to_string().contains("spec.prometheus.address"));
            assert!(refused.to_string().contains("--allowed-prometheus-url"));
        }
        let none = list(&[], None);
        assert!(none.check("http://prometheus.monitoring:9090").is_err());
        assert_eq!(none.servers(), Some(0));
    }

    #[test]
    fn named_servers_and_the_wildcard() {
        let allowed = list(
            &["https://thanos.example:443/query", "http://p2:9090"],
            Some("http://p1:9090"),
        );
        assert_eq!(allowed.servers(), Some(3));
        assert_eq!(allowed.check("https://thanos.example/query/"), Ok(()));
        assert_eq!(allowed.check("http://p2:9090"), Ok(()));
        assert!(allowed.check("https://thanos.example/").is_err());
        assert_eq!(list(&["*"], None).check("http://anything:1"), Ok(()));
        assert!(matches!(
            Allowlist::new(&["ftp://x".to_owned()], None),
            Err(AllowlistError::NotAUrl(_))
        ));
    }

    proptest! {
        /// An address is allowed exactly when it is the same server as an entry.
        #[test]
        fn allowed_means_listed(host in "[a-z]{1,8}", port in 1u16.., other in "[a-z]{1,8}") {
            let entry = format!("http://{host}:{port}");
            let allowed = list(&[&entry], None);
            prop_assert!(allowed.check(&entry).is_ok());
            let elsewhere = format!("http://{other}x:{port}");
            prop_assert!(allowed.check(&elsewhere).is_err());
        }
    }
}
