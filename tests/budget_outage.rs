//! Prometheus stops answering in the middle of a run: the budget changes nothing, says which
//! query failed, and recovers by itself when Prometheus is back. In its own test binary because
//! it freezes the Prometheus every test of a binary shares.

mod support;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use backlog_operator::api::backlog_budget::BudgetPhase;
use support::operator::Operator;
use support::workload::{apply_budget, budget, budget_status, deployment, model, replicas, serve};
use support::{TestEnv, wait_until};

fn main() -> ExitCode {
    support::run(
        support::tests![a_prometheus_outage_changes_nothing_and_recovers],
        true,
    )
}

const STEADY: &str = r#"
name: loop-steady
duration: 60m
partitions: 12
initialReplicas: 3
production:
  - {from: 0s, rate: 500}
consumer: {perReplicaRate: 200}
budget:
  minReplicas: 1
  maxReplicas: 20
  completionDeadline: 10m
  capacity: {perReplicaRate: 200, reservedRetryShare: 0}
  scaling: {targetDrainTime: 5m, scaleDownStabilization: 3m, rebalanceCost: 10s}
"#;

const SPEED: f64 = 30.0;

/// Freezes a process and resumes it when dropped, also if the test panics.
struct Frozen(libc::pid_t);

impl Frozen {
    fn freeze(pid: u32) -> Frozen {
        let pid = libc::pid_t::try_from(pid).expect("pid");
        // SAFETY: kill(2) with a pid this test's cluster started; no memory is involved.
        let sent = unsafe { libc::kill(pid, libc::SIGSTOP) };
        assert_eq!(sent, 0, "SIGSTOP to Prometheus");
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe {
            libc::kill(self.0, libc::SIGCONT);
        }
    }
}

fn a_prometheus_outage_changes_nothing_and_recovers(env: &TestEnv) {
    let namespace = env.fresh_namespace("outage");
    let name = "orders";
    let prometheus_pid = env
        .cluster()
        .pids()
        .into_iter()
        .find(|(process, _)| *process == "prometheus")
        .map(|(_, pid)| pid)
        .expect("the cluster runs Prometheus");
    env.block_on(async {
        let model = model(STEADY);
        deployment(env, &namespace, name, model.initial_replicas).await;
        let _workload = serve(env, model.clone(), &namespace, name, SPEED, &namespace).await;
        let _operator = Operator::start(env, &namespace, Some(env.prometheus_url()));
        apply_budget(
            env,
            &namespace,
            &budget(name, &model, SPEED, serde_json::json!({})),
        )
        .await;
        wait_until(
            Duration::from_secs(30),
            "the budget decides with all its metrics",
            || async {
                let status = budget_status(env, &namespace, name).await?.status?;
                matches!(status.phase, Some(p) if p != BudgetPhase::MetricsUnavailable)
                    .then_some(())
            },
        )
        .await;

        let before = replicas(env, &namespace, name).await;
        let frozen = Frozen::freeze(prometheus_pid);
        let message = wait_until(
            Duration::from_secs(20),
            "the budget holds with MetricsUnavailable",
            || async {
                let status = budget_status(env, &namespace, name).await?.status?;
                if status.phase != Some(BudgetPhase::MetricsUnavailable) {
                    return None;
                }
                let condition = status
                    .conditions
                    .iter()
                    .find(|c| c.type_ == "MetricsAvailable")?;
                (condition.status == "False").then(|| condition.message.clone())
            },
        )
        .await;
        assert!(message.contains("spec.metrics.backlog"), "{message}");
        assert!(
            message.contains("failed") && message.contains(env.prometheus_url()),
            "{message}"
        );
        // The outage lasts a while; nothing is written to the target meanwhile.
        let until = Instant::now() + Duration::from_secs(8);
        while Instant::now() < until {
            assert_eq!(
                replicas(env, &namespace, name).await,
                before,
                "replicas changed during the outage"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        drop(frozen);
        wait_until(
            Duration::from_secs(30),
            "the budget recovers by itself",
            || async {
                let status = budget_status(env, &namespace, name).await?.status?;
                matches!(status.phase, Some(p) if p != BudgetPhase::MetricsUnavailable)
                    .then_some(())
            },
        )
        .await;
    });
}
