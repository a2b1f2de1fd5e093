//! Who a test acts as besides the token users: ServiceAccounts (the operator's, the chart's)
//! through the TokenRequest API.

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client, Config};
use serde_json::json;

use super::TestEnv;

/// Creates `namespace/name` as admin unless it exists.
pub async fn ensure_service_account(env: &TestEnv, namespace: &str, name: &str) {
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    match Api::<ServiceAccount>::namespaced(env.admin(), namespace)
        .create(&PostParams::default(), &account)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => panic!("creating ServiceAccount {namespace}/{name}: {e}"),
    }
}

/// A token of `namespace/service_account` from the TokenRequest API.
pub async fn service_account_token(
    env: &TestEnv,
    namespace: &str,
    service_account: &str,
) -> String {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(), // the API server's own
            expiration_seconds: Some(3600),
            bound_object_ref: None,
        },
        ..TokenRequest::default()
    };
    let issued = Api::<ServiceAccount>::namespaced(env.admin(), namespace)
        .create_token_request(service_account, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token for {namespace}/{service_account}: {e}"));
    issued
        .status
        .map(|s| s.token)
        .filter(|t| !t.is_empty())
        .expect("the TokenRequest returns a token")
}

/// A client of the test cluster (its URL and CA) authenticated with `token` only.
pub fn client_with_token(env: &TestEnv, token: &str) -> Client {
    let mut config: Config = env.config("admin");
    config.auth_info =
        serde_json::from_value(json!({ "token": token })).expect("auth info with a token");
    let _guard = env.runtime().enter();
    Client::try_from(config).expect("a client with the ServiceAccount's token")
}

/// The user name the API server gives `namespace/name`.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}
