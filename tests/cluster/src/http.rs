//! A small blocking HTTP(S) client for readiness probes and the few API calls
//! made before any test code runs (CRD installation). It trusts only the
//! cluster's throwaway CA and never goes through a proxy: all traffic stays on
//! loopback.

use std::time::Duration;

use ureq::Agent;
use ureq::tls::{Certificate, RootCerts, TlsConfig};

use crate::Error;

/// One answer: status code and body. Non-2xx answers are not errors here;
/// callers decide what a status means.
pub(crate) struct Answer {
    pub status: u16,
    pub body: String,
}

impl Answer {
    pub(crate) fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

pub(crate) struct Http {
    agent: Agent,
}

impl Http {
    /// A client that trusts `ca_pem` (if given) and nothing else.
    pub(crate) fn new(ca_pem: Option<&str>) -> Result<Self, Error> {
        let mut tls = TlsConfig::builder();
        if let Some(pem) = ca_pem {
            let cert = Certificate::from_pem(pem.as_bytes())
                .map_err(|e| Error::Pki(format!("cannot read the generated CA: {e}")))?;
            tls = tls.root_certs(RootCerts::new_with_certs(&[cert]));
        }
        let config = Agent::config_builder()
            .tls_config(tls.build())
            // Never pick up HTTP(S)_PROXY from the environment.
            .proxy(None)
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build();
        Ok(Http {
            agent: Agent::new_with_config(config),
        })
    }

    pub(crate) fn get(&self, url: &str, bearer: Option<&str>) -> Result<Answer, String> {
        let mut request = self.agent.get(url);
        if let Some(token) = bearer {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        answer(request.call())
    }

    pub(crate) fn patch(
        &self,
        url: &str,
        bearer: &str,
        content_type: &str,
        body: &[u8],
    ) -> Result<Answer, String> {
        let request = self
            .agent
            .patch(url)
            .header("Authorization", format!("Bearer {bearer}"))
            .content_type(content_type);
        answer(request.send(body))
    }
}

fn answer(result: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Result<Answer, String> {
    let mut response = result.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .read_to_string()
        .map_err(|e| format!("HTTP {status}, unreadable body: {e}"))?;
    Ok(Answer { status, body })
}
