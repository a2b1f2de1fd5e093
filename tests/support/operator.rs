//! The operator's controllers, run in the test process against the test cluster as admin.
//! Stopped when the handle is dropped (or restarted, to test restart safety).

use std::time::Duration;

use backlog_operator::controller::replay::audit::MemoryAudit;
use backlog_operator::controller::{Context, ContextSettings, Scope, build_context, run_scopes};
use kube::Client;
use std::sync::Arc;

use super::TestEnv;

pub struct Operator {
    task: Option<tokio::task::JoinHandle<()>>,
    pub context: Arc<Context>,
    /// The replay audit lines it wrote (kept here instead of on standard output).
    pub audit: Arc<MemoryAudit>,
}

impl Operator {
    /// Starts the controllers watching `namespace`, with `prometheus` as the default server.
    pub fn start(env: &TestEnv, namespace: &str, prometheus: Option<&str>) -> Operator {
        Operator::with_client(
            env,
            env.admin(),
            Scope::Namespace(namespace.to_owned()),
            prometheus,
        )
    }

    /// Starts the controllers on `client` (e.g. authenticated as the chart's ServiceAccount,
    /// to prove its permissions suffice) watching `scope`.
    pub fn with_client(
        env: &TestEnv,
        client: Client,
        scope: Scope,
        prometheus: Option<&str>,
    ) -> Operator {
        let settings =
            ContextSettings::defaults(prometheus.map(str::to_owned), Duration::from_secs(2), 8);
        Operator::with_settings(env, client, vec![scope], settings)
    }

    /// Starts the controllers in each of `scopes` with explicit settings (allowlist, worker
    /// policy).
    pub fn with_settings(
        env: &TestEnv,
        client: Client,
        scopes: Vec<Scope>,
        settings: ContextSettings,
    ) -> Operator {
        let audit = MemoryAudit::shared();
        let context = Arc::new(build_context(client, settings).with_audit(audit.clone()));
        let task = env.runtime().spawn(run_scopes(context.clone(), scopes));
        Operator {
            task: Some(task),
            context,
            audit,
        }
    }

    /// Stops the controllers (as a crash would: no cleanup).
    pub fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.stop();
    }
}
