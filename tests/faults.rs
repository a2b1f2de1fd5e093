//! Faults against the real control plane, with the operator as a process of its own: a frozen
//! leader, a stalled connection, Prometheus and the API server killed mid-run, an HPA created
//! while the operator was down, a second writer of spec.replicas, and an admission webhook
//! that refuses every scale write. Writes are counted from
//! the API server's audit log, by the User-Agent that names each replica.
//!
//! Each test prints one `fault-report:` line with its numbers (run with `--nocapture`).
//! Tests that kill a shared process (Prometheus, the API server) run alone.

mod support;

use std::process::ExitCode;
use std::sync::RwLock;
use std::time::{Duration, Instant, SystemTime};

use backlog_operator::api::backlog_budget::{BacklogBudget, BudgetPhase};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use local_cluster::{AuditEvent, PausableProxy, Restartable};
use serde_json::{Value, json};
use support::exporter::Exporter;
use support::process::{Election, Launch, OperatorProcess, kubeconfig_through};
use support::workload::{deployment, replicas};
use support::{TestEnv, wait_until};

fn main() -> ExitCode {
    support::run_audited(
        support::tests![
            a_frozen_leader_is_replaced_and_writes_nothing_after,
            a_leader_cut_off_from_the_api_server_stops_before_its_lease_expires,
            a_prometheus_outage_writes_nothing_and_recovers,
            an_autoscaler_created_while_the_operator_is_down_is_respected_after_restart,
            a_second_writer_of_replicas_is_overridden_once_with_an_event,
            an_api_server_restart_is_survived_without_invalid_flaps,
            a_termination_during_an_api_server_outage_ends_within_the_grace_period,
            a_lasting_failure_to_scale_is_reported_once_and_cleared,
            a_steady_budget_neither_writes_nor_reads_its_status,
            a_hundred_steady_budgets_send_nothing_but_watches,
        ],
        true,
    )
}

/// Tests that kill a process every test shares take it for writing; the others for reading.
static SHARED_PROCESSES: RwLock<()> = RwLock::new(());

const STEP: Duration = Duration::from_secs(30);
/// The budgets' poll interval.
const POLL: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------------------------
// A budget whose load the test sets

/// A Deployment, a budget on it with 6 partitions of 200/s each, and an exporter serving its
/// metrics to the real Prometheus.
struct Load {
    exporter: Exporter,
    job: String,
    name: String,
}

impl Load {
    async fn start(env: &TestEnv, namespace: &str, name: &str, initial_replicas: u32) -> Load {
        let exporter = Exporter::start();
        let job = format!("faults-{namespace}");
        env.add_scrape_target(&job, &exporter.target(), &[]);
        let load = Load {
            exporter,
            job,
            name: name.to_owned(),
        };
        load.light();
        deployment(env, namespace, name, initial_replicas).await;
        Api::<BacklogBudget>::namespaced(env.admin(), namespace)
            .patch(
                name,
                &PatchParams::apply("faults-test").force(),
                &Patch::Apply(budget_body(name, &load.job)),
            )
            .await
            .expect("apply the budget");
        load
    }

    /// A light load (a few replicas).
    fn light(&self) {
        self.set(500.0, 500.0);
    }

    /// A heavy load: 3000 events/s and a backlog of 50,000 ask for the partition cap, 6.
    fn heavy(&self) {
        self.set(3000.0, 50_000.0);
    }

    fn set(&self, rate: f64, backlog: f64) {
        let labels = [("group", self.name.as_str())];
        self.exporter.set("faults_lag", &labels, backlog);
        self.exporter.set("faults_oldest_age_seconds", &labels, 5.0);
        self.exporter.set("faults_produce_rate", &labels, rate);
    }

    fn stop(self, env: &TestEnv) {
        env.remove_scrape_target(&self.job);
    }
}

/// A budget on Deployment `name` whose queries read only the series of scrape job `job`: the
/// tests run side by side, each with its own exporter of the same metric names.
fn budget_body(name: &str, job: &str) -> Value {
    let series = |metric: &str| format!("{metric}{{group=\"{name}\", job=\"{job}\"}}");
    json!({
        "apiVersion": "backlog.dev/v1alpha1",
        "kind": "BacklogBudget",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": 1,
            "maxReplicas": 20,
            "completionDeadline": "10m",
            "partitionCount": 6,
            "pollInterval": format!("{}s", POLL.as_secs()),
            "metrics": {
                "backlog": format!("sum({})", series("faults_lag")),
                "oldestUnfinishedAge": format!("max({})", series("faults_oldest_age_seconds")),
                "produceRate": format!("sum({})", series("faults_produce_rate")),
            },
            "capacity": {"perReplicaRate": 200, "reservedRetryShare": 0},
            "scaling": {"scaleDownStabilization": "0s"},
        }
    })
}

async fn budget(env: &TestEnv, namespace: &str, name: &str) -> Option<BacklogBudget> {
    Api::<BacklogBudget>::namespaced(env.admin(), namespace)
        .get(name)
        .await
        .ok()
}

async fn phase(env: &TestEnv, namespace: &str, name: &str) -> Option<BudgetPhase> {
    budget(env, namespace, name).await?.status?.phase
}

/// Condition `type_` of the budget.
async fn full_condition(
    env: &TestEnv,
    namespace: &str,
    name: &str,
    type_: &str,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    budget(env, namespace, name)
        .await?
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)
}

/// The status of condition `type_` of the budget.
async fn condition(env: &TestEnv, namespace: &str, name: &str, type_: &str) -> Option<String> {
    budget(env, namespace, name)
        .await?
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status)
}

/// Waits until the budget has decided on its metrics and the Deployment runs what it decided;
/// returns that count.
async fn wait_settled(env: &TestEnv, namespace: &str, name: &str) -> u32 {
    wait_until(
        STEP,
        &format!("the budget of {name} decides and its Deployment follows"),
        || async {
            let have = replicas(env, namespace, name).await;
            let status = budget(env, namespace, name).await.and_then(|b| b.status);
            let decided = status.as_ref().is_some_and(|s| {
                s.desired_replicas.and_then(|d| u32::try_from(d).ok()) == Some(have)
                    && s.phase
                        .is_some_and(|p| p != BudgetPhase::MetricsUnavailable)
            });
            if decided {
                Ok(have)
            } else {
                Err(format!(
                    "{have} replicas; status {:?}",
                    status.map(|s| (s.phase, s.desired_replicas, s.explanation))
                ))
            }
        },
    )
    .await
}

async fn wait_replicas(env: &TestEnv, namespace: &str, name: &str, want: u32) {
    wait_until(
        STEP,
        &format!("Deployment {name} has {want} replicas"),
        || async {
            let have = replicas(env, namespace, name).await;
            if have == want {
                return Ok(());
            }
            let status = budget(env, namespace, name).await.and_then(|b| b.status);
            Err(format!(
                "{have} replicas; phase {:?}: {:?}",
                status.as_ref().and_then(|s| s.phase),
                status.and_then(|s| s.explanation)
            ))
        },
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// The audit log

fn time_of(event: &AuditEvent) -> Timestamp {
    event
        .request_received_timestamp
        .parse()
        .unwrap_or_else(|e| {
            panic!(
                "audit time stamp {:?}: {e}",
                event.request_received_timestamp
            )
        })
}

/// Every request the audit log keeps (every write, and reads of custom resources,
/// Deployments and StatefulSets) that the replica named `identity` sent, in arrival order.
fn requests_by(env: &TestEnv, identity: &str) -> Vec<AuditEvent> {
    let marker = format!("({identity})");
    env.audit_events()
        .into_iter()
        .filter(|e| e.user_agent.contains(&marker))
        .collect()
}

/// Every write the replica named `identity` sent, in arrival order.
fn writes_by(env: &TestEnv, identity: &str) -> Vec<AuditEvent> {
    requests_by(env, identity)
        .into_iter()
        .filter(|e| e.verb != "get" && e.verb != "list" && e.verb != "watch")
        .collect()
}

/// When the latest of `events` was received. The audit log is in the order requests completed,
/// not arrived: the last line is not always the latest request.
fn latest(events: &[AuditEvent]) -> Option<Timestamp> {
    events.iter().map(time_of).max()
}

fn is_lease(event: &AuditEvent) -> bool {
    event.resource() == "leases"
}

fn is_scale(event: &AuditEvent) -> bool {
    event.resource() == "deployments"
}

fn describe(events: &[AuditEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            let object = e.object_ref.clone().unwrap_or_default();
            format!(
                "{} {} {}/{} {:?} → {:?} at {}",
                e.verb,
                object.resource,
                object.namespace.unwrap_or_default(),
                object.name.unwrap_or_default(),
                object.subresource,
                e.code(),
                e.request_received_timestamp
            )
        })
        .collect()
}

/// When the replica `identity` first wrote the Lease successfully after `after`.
fn first_lease_write(env: &TestEnv, identity: &str, after: Timestamp) -> Option<Timestamp> {
    writes_by(env, identity)
        .into_iter()
        .filter(|e| is_lease(e) && e.succeeded())
        .map(|e| time_of(&e))
        .find(|t| *t > after)
}

fn to_timestamp(time: SystemTime) -> Timestamp {
    Timestamp::try_from(time).expect("a time stamp")
}

// ---------------------------------------------------------------------------------------------
// Leader election

fn election(namespace: &str) -> Election {
    Election {
        lease_namespace: namespace.to_owned(),
        lease_name: "backlog-operator".to_owned(),
    }
}

fn launch(env: &TestEnv, namespace: &str, identity: &str, elect: bool) -> Launch {
    Launch {
        identity: identity.to_owned(),
        namespace: namespace.to_owned(),
        prometheus: Some(env.prometheus_url().to_owned()),
        election: elect.then(|| election(namespace)),
        kubeconfig: None,
        args: Vec::new(),
    }
}

async fn holder(env: &TestEnv, namespace: &str) -> Option<(String, Timestamp)> {
    let spec = Api::<Lease>::namespaced(env.admin(), namespace)
        .get_opt("backlog-operator")
        .await
        .ok()??
        .spec?;
    Some((spec.holder_identity?, spec.renew_time?.0))
}

async fn wait_holder(env: &TestEnv, namespace: &str, identity: &str, within: Duration) {
    wait_until(within, &format!("{identity} holds the Lease"), || async {
        let found = holder(env, namespace).await;
        match &found {
            Some((holder, _)) if holder == identity => Ok(()),
            _ => Err(found),
        }
    })
    .await;
}

/// Polls every 50 ms (finer than `wait_until`) until `check` holds; returns when it did.
async fn first_moment<F, Fut>(within: Duration, what: &str, mut check: F) -> Instant
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if check().await {
            return Instant::now();
        }
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the standby `identity` has renewed the Lease `count` more times after `after`:
/// time enough for anything the old leader still had queued to have shown up.
async fn wait_renewals(env: &TestEnv, identity: &str, after: Timestamp, count: usize) {
    wait_until(
        STEP,
        &format!("{identity} renews the Lease {count} times"),
        || async {
            let renewals = writes_by(env, identity)
                .iter()
                .filter(|e| is_lease(e) && e.succeeded() && time_of(e) > after)
                .count();
            (renewals >= count).then_some(()).ok_or(renewals)
        },
    )
    .await;
}

fn a_frozen_leader_is_replaced_and_writes_nothing_after(env: &TestEnv) {
    let _shared = SHARED_PROCESSES.read();
    let namespace = env.fresh_namespace("frozen-leader");
    let name = "orders";
    env.block_on(async {
        let load = Load::start(env, &namespace, name, 1).await;
        let (a, b) = (format!("{namespace}-a"), format!("{namespace}-b"));
        let old = OperatorProcess::start(env, launch(env, &namespace, &a, true));
        wait_holder(env, &namespace, &a, STEP).await;
        wait_settled(env, &namespace, name).await;
        let standby = OperatorProcess::start(env, launch(env, &namespace, &b, true));
        wait_until(STEP, "the standby answers and does not lead", || async {
            standby.leading().await == Some(false)
        })
        .await;
        let frozen_at = Instant::now();
        let frozen_wall = to_timestamp(SystemTime::now());
        old.freeze();
        let taken_at = first_moment(
            Election::LEASE + Duration::from_secs(3),
            "the standby takes the Lease over",
            || async { holder(env, &namespace).await.is_some_and(|(h, _)| h == b) },
        )
        .await;
        let takeover = taken_at - frozen_at;
        assert!(
            takeover <= Election::LEASE + Duration::from_secs(2),
            "the standby led {takeover:?} after the freeze (lease {:?})",
            Election::LEASE
        );
        // The fault lasts twice the lease; meanwhile the new leader works.
        load.heavy();
        tokio::time::sleep_until((frozen_at + 2 * Election::LEASE).into()).await;
        old.thaw();
        let thawed = to_timestamp(SystemTime::now());
        wait_until(STEP, "the old leader stands by", || async {
            old.leading().await == Some(false)
        })
        .await;
        wait_replicas(env, &namespace, name, 6).await;
        wait_renewals(env, &b, thawed, 4).await;

        let took_over = first_lease_write(env, &b, frozen_wall).expect("the standby's takeover");
        let after: Vec<AuditEvent> = writes_by(env, &a)
            .into_iter()
            .filter(|e| time_of(e) > took_over)
            .collect();
        assert!(
            after.is_empty(),
            "the old leader wrote after the takeover: {:?}\n{}",
            describe(&after),
            old.log_tail(30)
        );
        let before: Vec<AuditEvent> = writes_by(env, &b)
            .into_iter()
            .filter(|e| time_of(e) < took_over)
            .collect();
        assert!(
            before.is_empty(),
            "the standby wrote before it led: {:?}",
            describe(&before)
        );
        let new_leader_writes = writes_by(env, &b)
            .iter()
            .filter(|e| !is_lease(e))
            .count();
        assert!(new_leader_writes > 0, "the new leader reconciles");
        eprintln!(
            "fault-report: frozen leader: standby leads {:.2}s after SIGSTOP (lease {}s); old leader's writes after takeover: {}; new leader's non-lease writes: {new_leader_writes}",
            takeover.as_secs_f64(),
            Election::LEASE.as_secs(),
            after.len()
        );
        load.stop(env);
    });
}

fn a_leader_cut_off_from_the_api_server_stops_before_its_lease_expires(env: &TestEnv) {
    let _shared = SHARED_PROCESSES.read();
    let namespace = env.fresh_namespace("cut-off-leader");
    let name = "orders";
    let apiserver = env
        .cluster()
        .apiserver_url()
        .trim_start_matches("https://")
        .parse()
        .expect("the API server's address");
    let proxy = PausableProxy::start(apiserver).expect("a proxy to the API server");
    env.block_on(async {
        let load = Load::start(env, &namespace, name, 1).await;
        let (a, b) = (format!("{namespace}-a"), format!("{namespace}-b"));
        let mut through_proxy = launch(env, &namespace, &a, true);
        through_proxy.kubeconfig = Some(kubeconfig_through(env, proxy.address(), &a));
        let old = OperatorProcess::start(env, through_proxy);
        wait_holder(env, &namespace, &a, STEP).await;
        wait_settled(env, &namespace, name).await;
        let standby = OperatorProcess::start(env, launch(env, &namespace, &b, true));
        wait_until(STEP, "the standby answers and does not lead", || async {
            standby.leading().await == Some(false)
        })
        .await;

        let stalled_at = to_timestamp(SystemTime::now());
        proxy.pause();
        first_moment(
            Election::LEASE * 2,
            "the cut-off leader steps down",
            || async { old.leading().await == Some(false) },
        )
        .await;
        let stepped_down = to_timestamp(SystemTime::now());
        let (still, renewed) = holder(env, &namespace).await.expect("the Lease");
        assert_eq!(still, a, "nobody took over before the old leader stepped down");
        let expires = renewed + Election::LEASE;
        assert!(
            stepped_down < expires,
            "stepped down at {stepped_down}, the Lease (renewed {renewed}) expires at {expires}"
        );
        // Between the end of its term and the moment it stood down (closed its gate, dropped
        // its controllers), the replica sends no byte on any connection. After that, the only
        // bytes are its reads of the Lease as a standby (on a pooled connection or a new one):
        // with their gate closed, its controllers cannot even send a TLS handshake.
        let term_end = renewed + Election::RENEW_DEADLINE;
        let stood_down = old.logged_at("stopped leading").expect("the old leader stood down");
        let connections = proxy.connections();
        let late: Vec<_> = connections
            .iter()
            .filter_map(|c| c.last_from_client.map(to_timestamp))
            .filter(|last| *last > term_end && *last <= stood_down)
            .collect();
        assert!(
            late.is_empty(),
            "the cut-off leader sent bytes at {late:?}, after its term ended at {term_end} and before it stood down at {stood_down}"
        );
        let last_byte = connections
            .iter()
            .filter(|c| to_timestamp(c.opened) <= term_end)
            .filter_map(|c| c.last_from_client.map(to_timestamp))
            .filter(|last| *last <= term_end)
            .max()
            .expect("the leader used the proxy");
        wait_holder(env, &namespace, &b, STEP).await;
        let took_over = first_lease_write(env, &b, stalled_at).expect("the standby's takeover");
        load.heavy();
        wait_replicas(env, &namespace, name, 6).await;
        // The stalled connections are reset (what they held is lost, as on a real network
        // that gives up on them) and the path works again.
        proxy.cut();
        proxy.resume();
        let resumed = to_timestamp(SystemTime::now());
        wait_renewals(env, &b, resumed, 4).await;
        assert_eq!(old.leading().await, Some(false), "the old leader stands by");
        let after: Vec<AuditEvent> = writes_by(env, &a)
            .into_iter()
            .filter(|e| time_of(e) > took_over)
            .collect();
        assert!(
            after.is_empty(),
            "the old leader wrote after the takeover: {:?}",
            describe(&after)
        );
        eprintln!(
            "fault-report: stalled connection: leader stepped down {:.2}s after the stall, {:.2}s before its Lease expired; last byte sent {:.2}s before its term ended; standby led {:.2}s after the stall; old leader's writes after takeover: {}",
            (stepped_down - stalled_at).total(jiff_seconds()).unwrap_or(f64::NAN),
            (expires - stepped_down).total(jiff_seconds()).unwrap_or(f64::NAN),
            (term_end - last_byte).total(jiff_seconds()).unwrap_or(f64::NAN),
            (took_over - stalled_at).total(jiff_seconds()).unwrap_or(f64::NAN),
            after.len()
        );
        load.stop(env);
    });
}

fn jiff_seconds() -> k8s_openapi::jiff::Unit {
    k8s_openapi::jiff::Unit::Second
}

// ---------------------------------------------------------------------------------------------
// Dependencies going away

fn a_prometheus_outage_writes_nothing_and_recovers(env: &TestEnv) {
    let _alone = SHARED_PROCESSES.write();
    let namespace = env.fresh_namespace("prometheus-killed");
    let name = "orders";
    env.block_on(async {
        let load = Load::start(env, &namespace, name, 1).await;
        let identity = format!("{namespace}-op");
        let _operator = OperatorProcess::start(env, launch(env, &namespace, &identity, false));
        let settled = wait_settled(env, &namespace, name).await;
        wait_until(STEP, "the budget's metrics are available", || async {
            condition(env, &namespace, name, "MetricsAvailable").await == Some("True".into())
        })
        .await;

        let killed_at = Instant::now();
        let killed_wall = to_timestamp(SystemTime::now());
        env.cluster()
            .kill(Restartable::Prometheus)
            .expect("kill Prometheus");
        // Arrivals rise meanwhile: nobody can see it, so nothing may change.
        load.heavy();
        let detected_at = first_moment(STEP, "MetricsAvailable=False", || async {
            condition(env, &namespace, name, "MetricsAvailable").await == Some("False".into())
        })
        .await;
        let detection = detected_at - killed_at;
        assert_eq!(
            phase(env, &namespace, name).await,
            Some(BudgetPhase::MetricsUnavailable)
        );
        assert!(
            detection <= POLL + Duration::from_secs(1),
            "MetricsAvailable=False {detection:?} after the kill; the poll is {POLL:?}"
        );
        // The outage lasts three polls.
        tokio::time::sleep_until((killed_at + 3 * POLL).into()).await;
        assert_eq!(replicas(env, &namespace, name).await, settled);
        let restarted_wall = to_timestamp(SystemTime::now());
        let restarted_at = Instant::now();
        env.cluster()
            .start_again(Restartable::Prometheus)
            .expect("start Prometheus again");
        wait_replicas(env, &namespace, name, 6).await;
        let recovered = restarted_at.elapsed();
        let scale_writes: Vec<AuditEvent> = writes_by(env, &identity)
            .into_iter()
            .filter(|e| is_scale(e) && time_of(e) > killed_wall && time_of(e) < restarted_wall)
            .collect();
        assert!(
            scale_writes.is_empty(),
            "scale writes while Prometheus was down: {:?}",
            describe(&scale_writes)
        );
        eprintln!(
            "fault-report: Prometheus killed: MetricsAvailable=False {:.2}s after the kill (poll {}s); scale writes while down: 0; scaled to the new load {:.2}s after Prometheus was back",
            detection.as_secs_f64(),
            POLL.as_secs(),
            recovered.as_secs_f64()
        );
        load.stop(env);
    });
}

fn an_autoscaler_created_while_the_operator_is_down_is_respected_after_restart(env: &TestEnv) {
    let _shared = SHARED_PROCESSES.read();
    let namespace = env.fresh_namespace("hpa-while-down");
    let name = "orders";
    env.block_on(async {
        let load = Load::start(env, &namespace, name, 1).await;
        let identity = format!("{namespace}-op");
        let mut operator = OperatorProcess::start(env, launch(env, &namespace, &identity, false));
        let settled = wait_settled(env, &namespace, name).await;
        operator.kill();

        // While it is down, another autoscaler takes the Deployment and the load grows: a
        // budget that did not see the HPA would scale to the partition cap.
        let hpa: HorizontalPodAutoscaler = serde_json::from_value(json!({
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "other-autoscaler"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                "minReplicas": 1,
                "maxReplicas": 4,
                "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]
            }
        }))
        .expect("an HPA");
        Api::<HorizontalPodAutoscaler>::namespaced(env.admin(), &namespace)
            .create(&PostParams::default(), &hpa)
            .await
            .expect("create the HPA");
        load.heavy();

        let restarted_wall = to_timestamp(SystemTime::now());
        let restarted_at = Instant::now();
        operator.restart();
        let conflict_at = first_moment(STEP, "the budget reports the conflict", || async {
            phase(env, &namespace, name).await == Some(BudgetPhase::Conflict)
        })
        .await;
        let explanation = budget(env, &namespace, name)
            .await
            .and_then(|b| b.status?.explanation)
            .unwrap_or_default();
        assert!(
            explanation.contains("other-autoscaler"),
            "the status names the HPA: {explanation}"
        );
        // Several polls with a heavy load: still nothing written to the target.
        tokio::time::sleep_until((conflict_at + 3 * POLL).into()).await;
        assert_eq!(replicas(env, &namespace, name).await, settled);
        let target_writes: Vec<AuditEvent> = writes_by(env, &identity)
            .into_iter()
            .filter(|e| is_scale(e) && time_of(e) > restarted_wall)
            .collect();
        assert!(
            target_writes.is_empty(),
            "the restarted operator wrote to the Deployment an HPA owns: {:?}",
            describe(&target_writes)
        );
        eprintln!(
            "fault-report: HPA created while the operator was down: phase Conflict {:.2}s after the restart; writes to the target after the restart: 0",
            (conflict_at - restarted_at).as_secs_f64()
        );
        load.stop(env);
    });
}

/// The operator owns `spec.replicas` of a budget's target (README, "Replicas"): a second writer
/// is overridden at the next poll, once, and the override is recorded as an Event.
fn a_second_writer_of_replicas_is_overridden_once_with_an_event(env: &TestEnv) {
    let _shared = SHARED_PROCESSES.read();
    let namespace = env.fresh_namespace("second-writer");
    let name = "orders";
    env.block_on(async {
        let load = Load::start(env, &namespace, name, 1).await;
        let identity = format!("{namespace}-op");
        let _operator = OperatorProcess::start(env, launch(env, &namespace, &identity, false));
        load.heavy();
        wait_replicas(env, &namespace, name, 6).await;

        // Another field manager scales the Deployment through /scale, as `kubectl scale` does.
        let changed_wall = to_timestamp(SystemTime::now());
        let changed_at = Instant::now();
        Api::<Deployment>::namespaced(env.admin(), &namespace)
            .patch_scale(
                name,
                &PatchParams::apply("another-writer").force(),
                &Patch::Apply(json!({
                    "apiVersion": "autoscaling/v1",
                    "kind": "Scale",
                    "spec": {"replicas": 2},
                })),
            )
            .await
            .expect("the other writer scales");
        let restored_at = first_moment(STEP, "the budget restores 6 replicas", || async {
            replicas(env, &namespace, name).await == 6
        })
        .await;
        // The Event recorder folds a repeated reason and action (ScaledUp, ScaleTo6) into a
        // series of the first Event: the takeover shows as its second occurrence.
        let events = Api::<Event>::namespaced(env.admin(), &namespace);
        wait_until(STEP, "a second ScaledUp to 6 is recorded", || async {
            let found = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let occurrences = found
                .items
                .iter()
                .filter(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                        && e.reason.as_deref() == Some("ScaledUp")
                        && e.action.as_deref() == Some("ScaleTo6")
                })
                .map(|e| e.series.as_ref().map_or(1, |s| s.count))
                .sum::<i32>();
            (occurrences >= 2)
                .then_some(())
                .ok_or_else(|| format!("{occurrences} ScaledUp to 6"))
        })
        .await;
        // Three more polls: the budget wrote once and does not keep writing.
        tokio::time::sleep_until((restored_at + 3 * POLL).into()).await;
        assert_eq!(replicas(env, &namespace, name).await, 6);
        let target_writes: Vec<AuditEvent> = writes_by(env, &identity)
            .into_iter()
            .filter(|e| is_scale(e) && time_of(e) > changed_wall)
            .collect();
        assert_eq!(
            target_writes.len(),
            1,
            "one write takes spec.replicas back: {:?}",
            describe(&target_writes)
        );
        eprintln!(
            "fault-report: second writer of spec.replicas: overridden {:.2}s after its write, recorded as a second ScaledUp Event; the budget's writes to the target: 1",
            (restored_at - changed_at).as_secs_f64()
        );
        load.stop(env);
    });
}

/// Kubernetes stops a pod with SIGTERM and kills it after its grace period (30 s unless the
/// pod says otherwise). During an API server outage the watches are retrying and the leader
/// cannot give its Lease back: the operator must still end by itself, with time to spare.
fn a_termination_during_an_api_server_outage_ends_within_the_grace_period(env: &TestEnv) {
    const GRACE: Duration = Duration::from_secs(30);
    let _alone = SHARED_PROCESSES.write();
    let namespace = env.fresh_namespace("terminate-outage");
    let identity = format!("{namespace}-op");
    let mut operator = OperatorProcess::start(env, launch(env, &namespace, &identity, true));
    env.block_on(wait_holder(env, &namespace, &identity, STEP));
    env.cluster()
        .kill(Restartable::ApiServer)
        .expect("kill the API server");
    let asked = Instant::now();
    let ended = operator.terminate(GRACE);
    let took = asked.elapsed();
    env.cluster()
        .start_again(Restartable::ApiServer)
        .expect("start the API server again");
    println!(
        "fault-report: SIGTERM during an API server outage: ended by itself {ended}, after {took:?}"
    );
    assert!(
        ended && took < GRACE / 3,
        "SIGTERM during an API server outage: ended by itself {ended} after {took:?} (a third of the grace period is {:?}):\n{}",
        GRACE / 3,
        operator.log_tail(30)
    );
}

fn an_api_server_restart_is_survived_without_invalid_flaps(env: &TestEnv) {
    let _alone = SHARED_PROCESSES.write();
    let namespace = env.fresh_namespace("apiserver-restart");
    let name = "orders";
    env.block_on(async {
        let load = Load::start(env, &namespace, name, 1).await;
        let identity = format!("{namespace}-op");
        let mut operator = OperatorProcess::start(env, launch(env, &namespace, &identity, true));
        wait_holder(env, &namespace, &identity, STEP).await;
        wait_settled(env, &namespace, name).await;
        let phases = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let watcher = tokio::spawn({
            let (phases, namespace) = (phases.clone(), namespace.clone());
            let budgets = Api::<BacklogBudget>::namespaced(env.admin(), &namespace);
            async move {
                loop {
                    // Errors are expected while the API server is down.
                    if let Ok(found) = budgets.get(name).await
                        && let Some(status) = found.status
                        && let Some(phase) = status.phase
                    {
                        // Every condition but the ones that report on the load itself.
                        let steady: Vec<(String, String)> = status
                            .conditions
                            .iter()
                            .filter(|c| matches!(c.type_.as_str(), "Ready" | "Stalled" | "Synced"))
                            .map(|c| (c.type_.clone(), c.status.clone()))
                            .collect();
                        phases
                            .lock()
                            .expect("phases")
                            .push((Instant::now(), phase, steady));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        });

        let samples = |after: Instant| {
            phases
                .lock()
                .expect("phases")
                .iter()
                .filter(|(at, _, _)| *at > after)
                .count()
        };
        let watching = Instant::now();
        wait_until(STEP, "the budget's phase is sampled", || async {
            (samples(watching) > 0).then_some(()).ok_or("no sample yet")
        })
        .await;

        let killed_at = Instant::now();
        env.cluster()
            .kill(Restartable::ApiServer)
            .expect("kill the API server");
        load.heavy();
        // Down for longer than the renew deadline: the leader steps down meanwhile.
        tokio::time::sleep_until((killed_at + Election::LEASE).into()).await;
        let restarted_at = Instant::now();
        env.cluster()
            .start_again(Restartable::ApiServer)
            .expect("start the API server again");
        let back = restarted_at.elapsed();
        wait_replicas(env, &namespace, name, 6).await;
        let recovered = restarted_at.elapsed();
        // Watch the phase for three more polls after the recovery.
        let recovered_at = Instant::now();
        wait_until(STEP, "three polls of phases after the recovery", || async {
            let late = phases
                .lock()
                .expect("phases")
                .last()
                .is_some_and(|(at, _, _)| *at > recovered_at + 3 * POLL);
            late.then_some(()).ok_or(samples(recovered_at))
        })
        .await;
        watcher.abort();
        assert!(operator.is_running(), "the operator exited:\n{}", operator.log_tail(30));
        let seen: Vec<BudgetPhase> = phases
            .lock()
            .expect("phases")
            .iter()
            .map(|(_, phase, _)| *phase)
            .collect();
        // An outage shorter than --report-failures-after (1m by default) is no news: Ready
        // stays True, nothing is Stalled, and Synced is never written.
        let conditions_seen: Vec<Vec<(String, String)>> = phases
            .lock()
            .expect("phases")
            .iter()
            .map(|(_, _, conditions)| conditions.clone())
            .collect();
        let steady = vec![
            ("Ready".to_owned(), "True".to_owned()),
            ("Stalled".to_owned(), "False".to_owned()),
        ];
        let moved: Vec<&Vec<(String, String)>> =
            conditions_seen.iter().filter(|c| **c != steady).collect();
        assert!(
            moved.is_empty(),
            "conditions moved during the restart: {:?}",
            moved.first()
        );
        assert!(
            samples(killed_at) > 0,
            "the budget's phase was sampled after the restart"
        );
        assert!(
            !seen.contains(&BudgetPhase::Invalid),
            "the budget flapped to Invalid: {seen:?}"
        );
        eprintln!(
            "fault-report: API server killed for {}s: ready again after {:.2}s; the operator (same process) scaled to the new load {:.2}s after the restart; phases seen: {:?}",
            Election::LEASE.as_secs(),
            back.as_secs_f64(),
            recovered.as_secs_f64(),
            dedup(&seen)
        );
        load.stop(env);
    });
}

fn dedup(phases: &[BudgetPhase]) -> Vec<BudgetPhase> {
    let mut out: Vec<BudgetPhase> = Vec::new();
    for phase in phases {
        if out.last() != Some(phase) {
            out.push(*phase);
        }
    }
    out
}

/// How long the next test's operator lets a transient failure last before it says so.
const REPORT_AFTER: Duration = Duration::from_secs(3);

/// A validating webhook on every update of the namespace's Deployments and their scale,
/// whose server is not there: the API server answers each such write with a 500, a transient
/// failure as far as the operator can tell, that lasts until the webhook is removed.
fn unreachable_webhook(namespace: &str) -> ValidatingWebhookConfiguration {
    // A loopback port nothing listens on: each call is refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": format!("{namespace}-scale")},
        "webhooks": [{
            "name": "scale.faults.backlog.dev",
            "clientConfig": {"url": format!("https://127.0.0.1:{port}/validate")},
            "rules": [{
                "apiGroups": ["apps"],
                "apiVersions": ["v1"],
                "operations": ["UPDATE"],
                "resources": ["deployments", "deployments/scale"],
                "scope": "Namespaced",
            }],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 1,
        }],
    }))
    .expect("a webhook configuration")
}

/// Transient failures change nothing a user sees until they last: the budget stays Ready and
/// keeps its phase; once the failing scale writes have lasted `--report-failures-after`, its
/// `Synced` condition says so once, naming the call; the first success sets it back.
fn a_lasting_failure_to_scale_is_reported_once_and_cleared(env: &TestEnv) {
    let _shared = SHARED_PROCESSES.read();
    let namespace = env.fresh_namespace("scale-refused");
    let name = "orders";
    env.block_on(async {
        let load = Load::start(env, &namespace, name, 1).await;
        let identity = format!("{namespace}-op");
        let mut launched = launch(env, &namespace, &identity, false);
        launched.args = vec![format!("--report-failures-after={}s", REPORT_AFTER.as_secs())];
        let mut operator = OperatorProcess::start(env, launched);
        let settled = wait_settled(env, &namespace, name).await;
        // The heavy load below needs more replicas than this: a scale write the webhook refuses.
        assert!(settled < 6, "{settled} replicas before the load rises");
        assert_eq!(full_condition(env, &namespace, name, "Synced").await, None, "nothing to report yet");

        let webhooks = Api::<ValidatingWebhookConfiguration>::all(env.admin());
        let webhook = unreachable_webhook(&namespace);
        let webhook_name = webhook.metadata.name.clone().expect("a name");
        webhooks
            .create(&PostParams::default(), &webhook)
            .await
            .expect("create the webhook");
        // The API server loads webhook configurations asynchronously: it is in effect once a
        // dry-run scale write is refused by it (dry runs call webhooks without side effects).
        let deployments = Api::<Deployment>::namespaced(env.admin(), &namespace);
        wait_until(STEP, "the webhook refuses scale writes", || async {
            let dry_run = PatchParams {
                dry_run: true,
                ..PatchParams::default()
            };
            let scale = Patch::Merge(json!({"spec": {"replicas": settled + 1}}));
            match deployments.patch_scale(name, &dry_run, &scale).await {
                Err(kube::Error::Api(status)) if status.message.contains("failed calling webhook") => {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        let refused_wall = to_timestamp(SystemTime::now());
        let refused_at = Instant::now();
        load.heavy();
        let reported_at = first_moment(STEP, "Synced=False", || async {
            full_condition(env, &namespace, name, "Synced")
                .await
                .is_some_and(|c| c.status == "False")
        })
        .await;
        let reported = full_condition(env, &namespace, name, "Synced")
            .await
            .expect("Synced");
        assert_eq!(reported.reason, "ApiServerError", "{}", reported.message);
        for word in ["scale of Deployment", name, "webhook", "retried with backoff"] {
            assert!(reported.message.contains(word), "{word:?} in {:?}", reported.message);
        }
        let quiet = reported_at - refused_at;
        assert!(
            quiet >= REPORT_AFTER,
            "reported {quiet:?} after the first refusal; the threshold is {REPORT_AFTER:?}"
        );
        // Meanwhile nothing else a user sees moved: the target, the phase, Ready.
        assert_eq!(replicas(env, &namespace, name).await, settled);
        let status = budget(env, &namespace, name).await.and_then(|b| b.status).expect("status");
        assert_ne!(status.phase, Some(BudgetPhase::Invalid));
        assert_eq!(
            condition(env, &namespace, name, "Ready").await.as_deref(),
            Some("True"),
            "a transient failure does not make the budget unready"
        );
        // Said once: three more polls of failures write the condition no more.
        tokio::time::sleep_until((reported_at + 3 * POLL).into()).await;
        let after = full_condition(env, &namespace, name, "Synced").await.expect("Synced");
        assert_eq!(after.last_transition_time, reported.last_transition_time);
        assert_eq!(after.message, reported.message, "the condition was not rewritten");

        webhooks
            .delete(&webhook_name, &Default::default())
            .await
            .expect("remove the webhook");
        let removed_wall = to_timestamp(SystemTime::now());
        let removed_at = Instant::now();
        wait_replicas(env, &namespace, name, 6).await;
        wait_until(STEP, "Synced=True after the first success", || async {
            let synced = full_condition(env, &namespace, name, "Synced").await;
            match synced {
                Some(c) if c.status == "True" && c.reason == "Reconciled" => Ok(()),
                other => Err(other.map(|c| (c.status, c.reason))),
            }
        })
        .await;
        let recovered = removed_at.elapsed();
        let attempts = writes_by(env, &identity)
            .into_iter()
            .filter(|e| is_scale(e) && time_of(e) > refused_wall && time_of(e) < removed_wall)
            .count();
        assert!(operator.is_running(), "the operator exited");
        eprintln!(
            "fault-report: scale writes refused by an unreachable webhook for {:.1}s: Synced=False {:.2}s after the first refusal (threshold {}s), written once; {attempts} refused scale attempts (backoff); scaled and Synced=True {:.2}s after the webhook was removed",
            (removed_at - refused_at).as_secs_f64(),
            quiet.as_secs_f64(),
            REPORT_AFTER.as_secs(),
            recovered.as_secs_f64()
        );
        load.stop(env);
    });
}

// ---------------------------------------------------------------------------------------------
// Steady state

/// How many budget reconciles the operator process has run, from its /metrics.
async fn budget_reconciles(operator: &OperatorProcess) -> Option<f64> {
    let text = operator.metrics().await?;
    text.lines()
        .filter_map(|line| {
            line.strip_prefix("backlog_operator_reconciles_total{controller=\"backlogbudget\"} ")
        })
        .find_map(|value| value.trim().parse().ok())
}

/// With metrics that do not move, a settled budget is polled every second and the operator
/// sends no write and no read of the budget, its target, its control document's ConfigMap or
/// any custom resource: the decision's memory is the operator's own, numbers that did not move
/// are no news, and the target and the document come from watch caches. The window is ten polls without one such request,
/// checked against the API server's audit log (it keeps every write and those reads); an
/// operator that writes or reads any of them every poll never has one.
fn a_steady_budget_neither_writes_nor_reads_its_status(env: &TestEnv) {
    let _shared = SHARED_PROCESSES.read();
    let namespace = env.fresh_namespace("steady");
    let name = "orders";
    env.block_on(async {
        let load = Load::start(env, &namespace, name, 1).await;
        let identity = format!("{namespace}-op");
        let operator = OperatorProcess::start(env, launch(env, &namespace, &identity, false));
        let settled = wait_settled(env, &namespace, name).await;
        const QUIET_POLLS: f64 = 10.0;
        let (quiet_since, reconciles) = wait_until(
            STEP,
            "ten polls without a write, or a read of a workload, a control document or a custom resource",
            || async {
                let on_budget = requests_by(env, &identity);
                let last = latest(&on_budget);
                let now = Timestamp::now();
                let reconciles = budget_reconciles(&operator).await;
                match last {
                    Some(last)
                        if now.duration_since(last).as_secs_f64()
                            >= QUIET_POLLS * POLL.as_secs_f64() =>
                    {
                        Ok((last, reconciles))
                    }
                    _ => Err(format!(
                        "last request at {last:?}, now {now}; the last few: {:?}",
                        describe(&on_budget[on_budget.len().saturating_sub(4)..])
                    )),
                }
            },
        )
        .await;
        // The operator kept polling meanwhile (a stopped loop is quiet too), and decided the
        // same all along.
        let polled_after = wait_until(STEP, "more budget reconciles", || async {
            let now = budget_reconciles(&operator).await?;
            (now >= reconciles? + QUIET_POLLS / 2.0).then_some(now)
        })
        .await;
        assert_eq!(replicas(env, &namespace, name).await, settled);
        let sent_after: Vec<AuditEvent> = requests_by(env, &identity)
            .into_iter()
            .filter(|e| time_of(e) > quiet_since)
            .collect();
        assert!(
            sent_after.is_empty(),
            "requests in the steady window: {:?}",
            describe(&sent_after)
        );
        eprintln!(
            "fault-report: steady budget: no status write or read for {QUIET_POLLS} polls of {}s and {} reconciles since",
            POLL.as_secs(),
            polled_after - reconciles.unwrap_or(0.0)
        );
        load.stop(env);
    });
}

/// `make bench-scale` in small: 100 budgets with metrics that do not move, half of them
/// grouping their queries (`metrics.groupBy`), on one operator process. Once settled, the
/// operator sends no write and no read (of budgets, targets, control documents or any custom
/// resource) for ten polls while it keeps polling every budget, checked against the API
/// server's audit log; an operator that wrote a status or read anything per poll would never
/// be quiet that long with a hundred budgets.
fn a_hundred_steady_budgets_send_nothing_but_watches(env: &TestEnv) {
    const N: usize = 100;
    const EVERY: Duration = Duration::from_secs(2);
    let _shared = SHARED_PROCESSES.read();
    let namespace = env.fresh_namespace("hundred");
    env.block_on(async {
        let exporter = Exporter::start();
        let job = format!("faults-{namespace}");
        env.add_scrape_target(&job, &exporter.target(), &[]);
        let names: Vec<String> = (0..N).map(|i| format!("c{i:03}")).collect();
        for name in &names {
            let labels = [("group", name.as_str())];
            exporter.set("faults_lag", &labels, 500.0);
            exporter.set("faults_oldest_age_seconds", &labels, 5.0);
            exporter.set("faults_produce_rate", &labels, 500.0);
        }
        let budgets = Api::<BacklogBudget>::namespaced(env.admin(), &namespace);
        for (i, name) in names.iter().enumerate() {
            deployment(env, &namespace, name, 3).await;
            let mut body = budget_body(name, &job);
            body["spec"]["pollInterval"] = json!(format!("{}s", EVERY.as_secs()));
            if i % 2 == 1 {
                body["spec"]["metrics"]["groupBy"] = json!("group");
            }
            budgets
                .patch(name, &PatchParams::apply("faults-test").force(), &Patch::Apply(body))
                .await
                .expect("apply the budget");
        }
        let identity = format!("{namespace}-op");
        let operator = OperatorProcess::start(env, launch(env, &namespace, &identity, false));
        wait_until(Duration::from_secs(90), "every budget has observed its metrics", || async {
            let list = budgets.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
            let observed = list
                .items
                .iter()
                .filter(|b| {
                    b.status.as_ref().is_some_and(|s| {
                        s.phase.is_some_and(|p| p != BudgetPhase::MetricsUnavailable)
                    })
                })
                .count();
            if observed == N { Ok(()) } else { Err(format!("{observed} of {N}")) }
        })
        .await;
        const QUIET_POLLS: f64 = 10.0;
        let (quiet_since, reconciles) = wait_until(
            Duration::from_secs(180),
            "ten polls without a write or a read by the operator",
            || async {
                let sent = requests_by(env, &identity);
                let last = latest(&sent);
                let now = Timestamp::now();
                let reconciles = budget_reconciles(&operator).await;
                match last {
                    Some(last)
                        if now.duration_since(last).as_secs_f64()
                            >= QUIET_POLLS * EVERY.as_secs_f64() =>
                    {
                        Ok((last, reconciles))
                    }
                    _ => Err(format!(
                        "{} requests, the last at {last:?}, now {now}; the last few: {:?}",
                        sent.len(),
                        describe(&sent[sent.len().saturating_sub(4)..])
                    )),
                }
            },
        )
        .await;
        // It kept polling every budget meanwhile: a stopped loop is quiet too.
        let polled = wait_until(STEP, "five more polls of every budget", || async {
            let now = budget_reconciles(&operator).await?;
            (now >= reconciles? + 5.0 * N as f64).then_some(now)
        })
        .await;
        let sent_after: Vec<AuditEvent> = requests_by(env, &identity)
            .into_iter()
            .filter(|e| time_of(e) > quiet_since)
            .collect();
        assert!(sent_after.is_empty(), "requests while steady: {:?}", describe(&sent_after));
        eprintln!(
            "fault-report: {N} steady budgets: no write or read for {QUIET_POLLS} polls of {}s and {} reconciles since",
            EVERY.as_secs(),
            polled - reconciles.unwrap_or(0.0)
        );
        env.remove_scrape_target(&job);
    });
}
