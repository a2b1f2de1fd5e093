//! The real loop: the operator against a real API server and a real Prometheus that scrapes
//! the workload simulator, whose consumers are the target Deployment's spec.replicas.

mod support;

use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use backlog_operator::api::backlog_budget::{BacklogBudget, BudgetPhase};
use backlog_operator::api::conditions;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use support::operator::Operator;
use support::workload::{apply_budget, budget, budget_status, deployment, model, replicas, serve};
use support::{TestEnv, wait_until};

fn main() -> ExitCode {
    support::run(
        support::tests![
            a_burst_scales_up_to_at_most_the_partitions_and_back_down,
            undrainable_load_is_reported_at_once,
            a_past_peak_the_partitions_cannot_carry_shows_in_the_capacity_plan,
            an_hpa_on_the_target_is_a_conflict_and_nothing_is_written,
            a_statefulset_is_scaled_through_its_scale_subresource,
            a_target_that_cannot_be_scaled_is_named_as_such,
            the_operator_binary_serves_metrics_and_health,
            with_two_replicas_one_leads_and_the_other_takes_over,
            budgets_grouped_by_a_label_share_one_evaluation_and_read_their_own_values,
        ],
        true,
    )
}

/// 12 partitions of 200 events/s per consumer; 300/s with a 5× burst for 5 minutes.
const BURST: &str = r#"
name: loop-burst
duration: 40m
partitions: 12
initialReplicas: 2
production:
  - {from: 0s, rate: 300}
  - {from: 4m, rate: 1500}
  - {from: 9m, rate: 300}
consumer: {perReplicaRate: 200}
podStartDelay: 20s
rebalancePause: 10s
budget:
  minReplicas: 1
  maxReplicas: 20
  completionDeadline: 10m
  capacity: {perReplicaRate: 200, reservedRetryShare: 0}
  scaling: {targetDrainTime: 5m, scaleDownStabilization: 3m, rebalanceCost: 10s}
"#;

/// The same workload with arrivals above what all 12 partitions can complete (2400/s).
const UNDRAINABLE: &str = r#"
name: loop-undrainable
duration: 40m
partitions: 12
initialReplicas: 2
production:
  - {from: 0s, rate: 3000}
consumer: {perReplicaRate: 200}
budget:
  minReplicas: 1
  maxReplicas: 20
  completionDeadline: 10m
  capacity: {perReplicaRate: 200, reservedRetryShare: 0}
"#;

/// A peak of 3000/s, above the 2400/s that 12 partitions of 200/s complete, that is over
/// before the budget exists; maxReplicas is the partition count. The peak lasts 20 s of wall
/// time, so a Prometheus slow to pick up the new target still scrapes it.
const PAST_PEAK: &str = r#"
name: loop-past-peak
duration: 40m
partitions: 12
initialReplicas: 4
production:
  - {from: 0s, rate: 3000}
  - {from: 10m, rate: 300}
consumer: {perReplicaRate: 200}
budget:
  minReplicas: 1
  maxReplicas: 12
  completionDeadline: 10m
  capacity: {perReplicaRate: 200, reservedRetryShare: 0}
"#;

/// The workload clock runs this many times faster than the wall clock.
const SPEED: f64 = 30.0;

/// How often the loops below look at the cluster.
const LOOK: Duration = Duration::from_millis(200);

async fn phase(env: &TestEnv, namespace: &str, name: &str) -> Option<BudgetPhase> {
    budget_status(env, namespace, name).await?.status?.phase
}

async fn prometheus_value(env: &TestEnv, query: &str) -> Option<f64> {
    let client = prometheus_http_query::Client::try_from(env.prometheus_url()).ok()?;
    let result = client.query(query).get().await.ok()?;
    let vector = result.data().as_vector()?;
    vector.first().map(|v| v.sample().value())
}

fn a_burst_scales_up_to_at_most_the_partitions_and_back_down(env: &TestEnv) {
    let namespace = env.fresh_namespace("burst");
    let name = "orders";
    env.block_on(async {
        let model = model(BURST);
        deployment(env, &namespace, name, model.initial_replicas).await;
        let workload = serve(env, model.clone(), &namespace, name, SPEED, &namespace).await;
        let _operator = Operator::start(env, &namespace, Some(env.prometheus_url()));
        apply_budget(env, &namespace, &budget(name, &model, SPEED, serde_json::json!({}))).await;

        // Follow the loop: replicas never above the partitions; when the backlog first shows
        // in Prometheus and when the resulting scale-up was written.
        let arrivals = format!(
            "sum(rate(kafka_topic_partition_current_offset{{topic=\"{name}\"}}[5s]))"
        );
        let base_rate = 300.0 * SPEED;
        let deadline = Instant::now() + Duration::from_secs_f64(model.duration / SPEED + 30.0);
        let (mut peak, mut burst_seen, mut scaled_up) = (0, None::<Instant>, None::<Instant>);
        let mut phases = Vec::new();
        let mut calm_replicas = model.initial_replicas;
        loop {
            let now = replicas(env, &namespace, name).await;
            assert!(now <= model.partitions, "{now} replicas for {} partitions", model.partitions);
            peak = peak.max(now);
            let snapshot = workload.snapshot();
            if snapshot.model_time < 4.0 * 60.0 {
                calm_replicas = now;
            } else if scaled_up.is_none() && now > calm_replicas {
                scaled_up = Some(Instant::now());
            }
            if burst_seen.is_none()
                && prometheus_value(env, &arrivals).await.unwrap_or(0.0) > 1.5 * base_rate
            {
                burst_seen = Some(Instant::now());
            }
            if let Some(p) = phase(env, &namespace, name).await
                && phases.last() != Some(&p)
            {
                phases.push(p);
            }
            let after_burst = snapshot.model_time > 14.0 * 60.0;
            let drained = snapshot.partition_backlogs.iter().sum::<f64>() < 600.0;
            if after_burst && drained && peak > calm_replicas && now <= 3 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "burst did not play out: model time {:.0}s, backlog {:.0}, replicas {now} (peak {peak}), phases {phases:?}",
                snapshot.model_time,
                snapshot.partition_backlogs.iter().sum::<f64>()
            );
            tokio::time::sleep(LOOK).await;
        }
        // The delay from the burst being visible in Prometheus to the scale-up being written;
        // both are sampled every 200ms, so "0" means within one sample.
        if let (Some(seen), Some(up)) = (burst_seen, scaled_up) {
            eprintln!(
                "measure: burst visible in Prometheus → scale-up written: {:.2}s (poll 1s, scrape 1s, sampled every 0.2s)",
                up.saturating_duration_since(seen).as_secs_f64()
            );
        }
        // The burst needs more than the calm count (how many more depends on how much of the
        // deadline the budget spends), never more than the partitions, and it is absorbed
        // without the oldest event passing the critical fraction.
        assert!(peak <= model.partitions && peak > calm_replicas, "peak {peak}, calm {calm_replicas}");
        assert!(phases.contains(&BudgetPhase::Healthy), "{phases:?}");
        assert!(!phases.contains(&BudgetPhase::Breaching), "{phases:?}");
        // Every scale and phase change is an Event on the budget.
        let reasons = wait_until(Duration::from_secs(10), "scale events on the budget", || async {
            let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(env.admin(), &namespace)
                .list(&Default::default())
                .await
                .ok()?;
            let reasons: Vec<String> = events
                .items
                .into_iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
                .filter_map(|e| e.reason)
                .collect();
            (reasons.iter().any(|r| r == "ScaledUp") && reasons.iter().any(|r| r == "ScaledDown"))
                .then_some(reasons)
        })
        .await;
        // A phase Event says the phase changed: Healthy is announced only after the budget
        // left it, never at its first look.
        let left_healthy = reasons
            .iter()
            .any(|r| ["AtRisk", "Breaching", "Undrainable", "MetricsUnavailable"].contains(&r.as_str()));
        assert!(left_healthy || !reasons.iter().any(|r| r == "Healthy"), "{reasons:?}");
        // The scale is written first, then the status that records it.
        wait_until(Duration::from_secs(10), "status records the scale-down", || async {
            let status = budget_status(env, &namespace, name).await.and_then(|b| b.status);
            let last = status.as_ref().and_then(|s| s.last_scale.clone());
            match last {
                Some(last) if last.to < last.from && last.to <= 3 => Ok(()),
                _ => Err(format!("{status:?}")),
            }
        })
        .await;
    });
}

fn undrainable_load_is_reported_at_once(env: &TestEnv) {
    let namespace = env.fresh_namespace("undrainable");
    let name = "payments";
    env.block_on(async {
        let model = model(UNDRAINABLE);
        deployment(env, &namespace, name, model.initial_replicas).await;
        let _workload = serve(env, model.clone(), &namespace, name, SPEED, &namespace).await;
        let _operator = Operator::start(env, &namespace, Some(env.prometheus_url()));
        apply_budget(
            env,
            &namespace,
            &budget(name, &model, SPEED, serde_json::json!({})),
        )
        .await;
        // Until every query answers the budget holds (MetricsUnavailable). From the first poll
        // whose measured λ exceeds what all 12 partitions complete, the phase is Undrainable:
        // no confirmation over several polls. Measured by Prometheus' rate: a λ read from the
        // backlog's rise sizes the group but does not make the claim alone.
        let capped = 12.0 * 200.0 * SPEED;
        let deadline = Instant::now() + Duration::from_secs(30);
        let decided = loop {
            let status = budget_status(env, &namespace, name)
                .await
                .and_then(|b| b.status);
            let measured = status
                .as_ref()
                .and_then(|s| s.observed.as_ref()?.produce_rate)
                .unwrap_or(0.0);
            let from_rise = status
                .as_ref()
                .and_then(|s| s.explanation.as_deref())
                .is_some_and(|e| e.contains("from the backlog's rise"));
            let phase = status.and_then(|s| s.phase);
            if measured > capped && !from_rise {
                break phase;
            }
            assert!(
                Instant::now() < deadline,
                "λ never measured above {capped}/s (last {measured})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let decided = decided.expect("a phase");
        assert_eq!(decided, BudgetPhase::Undrainable);
        let status = budget_status(env, &namespace, name)
            .await
            .and_then(|b| b.status)
            .expect("status");
        let explanation = status.explanation.unwrap_or_default();
        assert!(explanation.contains("can never catch up"), "{explanation}");
        // maxReplicas 20 over 12 partitions: 8 replicas that could only idle.
        let plan = status
            .conditions
            .iter()
            .find(|condition| condition.type_ == "CapacityPlan")
            .expect("a CapacityPlan condition");
        assert_eq!(
            (plan.status.as_str(), plan.reason.as_str()),
            ("False", "ReplicasAbovePartitions"),
            "{}",
            plan.message
        );
        assert_eq!(
            status.desired_replicas,
            Some(12),
            "the cap: min(maxReplicas 20, 12 partitions)"
        );
        wait_until(
            Duration::from_secs(10),
            "the target runs the partition count",
            || async { replicas(env, &namespace, name).await == 12 },
        )
        .await;
    });
}

/// The CapacityPlan condition of a budget, as (status, reason, message).
async fn capacity_plan(
    env: &TestEnv,
    namespace: &str,
    name: &str,
) -> Option<(String, String, String)> {
    let status = budget_status(env, namespace, name).await?.status?;
    let condition = status
        .conditions
        .iter()
        .find(|condition| condition.type_ == "CapacityPlan")?;
    Some((
        condition.status.clone(),
        condition.reason.clone(),
        condition.message.clone(),
    ))
}

/// The 24-hour peak comes from Prometheus' history, so a budget created after the peak still
/// sees it: healthy now, and told that the partitions cannot carry what yesterday brought.
fn a_past_peak_the_partitions_cannot_carry_shows_in_the_capacity_plan(env: &TestEnv) {
    let namespace = env.fresh_namespace("past-peak");
    let name = "invoices";
    env.block_on(async {
        let model = model(PAST_PEAK);
        deployment(env, &namespace, name, model.initial_replicas).await;
        let _workload = serve(env, model.clone(), &namespace, name, SPEED, &namespace).await;
        let budget = budget(name, &model, SPEED, serde_json::json!({}));
        let rate = budget
            .spec
            .metrics
            .produce_rate
            .clone()
            .expect("the served budget has a produce rate");
        let capped = 12.0 * 200.0 * SPEED;
        wait_until(
            Duration::from_secs(40),
            "Prometheus saw the peak above what 12 partitions complete",
            || async {
                prometheus_value(env, &format!("max_over_time(({rate})[1m:])"))
                    .await
                    .is_some_and(|peak| peak > capped)
            },
        )
        .await;
        wait_until(Duration::from_secs(45), "the peak is over", || async {
            prometheus_value(env, &rate)
                .await
                .is_some_and(|now| now < capped / 2.0)
        })
        .await;

        let _operator = Operator::start(env, &namespace, Some(env.prometheus_url()));
        apply_budget(env, &namespace, &budget).await;
        wait_until(
            Duration::from_secs(30),
            "CapacityPlan reports the peak as undrainable",
            || async {
                capacity_plan(env, &namespace, name)
                    .await
                    .is_some_and(|(status, reason, _)| {
                        status == "False" && reason == "UndrainableAtPeak"
                    })
            },
        )
        .await;
        let (_, _, message) = capacity_plan(env, &namespace, name)
            .await
            .expect("condition");
        // 3000/s over 200/s per replica: 15 partitions; a 5 s rate window reads the peak a
        // little high, never low.
        let needed: u32 = message
            .split(" partitions (and spec.maxReplicas")
            .next()
            .and_then(|before| before.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no partition count in {message:?}"));
        assert!((15..=17).contains(&needed), "{message}");
        // Until a start is seen, a scale-up is planned with the spec's 30 s pod start: with
        // two 1 s polls, three times the 10 s the age may reach (half the 20 s deadline), so
        // the first polls may also say that only replicas already running could hold such a
        // peak. The scale-up to the critical count then measures how long its replicas took
        // to be ready (about a second here), well within those 10 s, and that claim goes.
        wait_until(
            Duration::from_secs(20),
            "the measured pod start replaces the assumed one in the capacity plan",
            || async {
                let measured = budget_status(env, &namespace, name)
                    .await
                    .and_then(|b| b.status?.pod_start_seconds)
                    .is_some_and(|seconds| seconds < 5.0);
                let plan = capacity_plan(env, &namespace, name).await;
                measured
                    && plan.is_some_and(|(_, reason, message)| {
                        reason == "UndrainableAtPeak" && !message.contains("a scale-up works")
                    })
            },
        )
        .await;
        let status = budget_status(env, &namespace, name)
            .await
            .and_then(|b| b.status)
            .expect("status");
        assert_ne!(
            status.phase,
            Some(BudgetPhase::Undrainable),
            "the load of now drains"
        );
        let headroom = status.capacity_headroom.expect("a headroom");
        assert!(
            (0.65..=0.81).contains(&headroom),
            "12 × 200 over 3000 is 0.8, got {headroom}"
        );
    });
}

fn an_hpa_on_the_target_is_a_conflict_and_nothing_is_written(env: &TestEnv) {
    let namespace = env.fresh_namespace("conflict");
    let name = "shipping";
    env.block_on(async {
        let model = model(BURST);
        deployment(env, &namespace, name, model.initial_replicas).await;
        let hpa: HorizontalPodAutoscaler = serde_json::from_value(serde_json::json!({
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "keda-hpa-shipping"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                "minReplicas": 1,
                "maxReplicas": 4,
                "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]
            }
        }))
        .expect("hpa");
        let hpas = Api::<HorizontalPodAutoscaler>::namespaced(env.admin(), &namespace);
        hpas.create(&PostParams::default(), &hpa).await.expect("create the HPA");
        let workload = serve(env, model.clone(), &namespace, name, SPEED, &namespace).await;
        let _operator = Operator::start(env, &namespace, Some(env.prometheus_url()));
        apply_budget(env, &namespace, &budget(name, &model, SPEED, serde_json::json!({}))).await;

        wait_until(Duration::from_secs(20), "the budget reports the conflict", || async {
            let status = budget_status(env, &namespace, name).await?.status?;
            (status.phase == Some(BudgetPhase::Conflict)
                && status.explanation.as_deref().is_some_and(|e| e.contains("HorizontalPodAutoscaler keda-hpa-shipping")))
            .then_some(())
        })
        .await;
        // Through the whole burst the budget writes nothing to the target.
        let deadline = Instant::now() + Duration::from_secs_f64(10.0 * 60.0 / SPEED);
        while workload.snapshot().model_time < 10.0 * 60.0 {
            assert_eq!(replicas(env, &namespace, name).await, model.initial_replicas);
            assert!(Instant::now() < deadline + Duration::from_secs(20), "the burst did not arrive");
            tokio::time::sleep(LOOK).await;
        }
        let deployments = Api::<Deployment>::namespaced(env.admin(), &namespace);
        let managers: Vec<String> = deployments
            .get(name)
            .await
            .expect("deployment")
            .metadata
            .managed_fields
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| m.manager)
            .collect();
        assert!(!managers.iter().any(|m| m == "backlog-operator"), "{managers:?}");

        // Once the HPA is gone the budget takes over.
        hpas.delete("keda-hpa-shipping", &DeleteParams::default()).await.expect("delete the HPA");
        wait_until(Duration::from_secs(20), "the budget takes over", || async {
            matches!(phase(env, &namespace, name).await, Some(p) if p != BudgetPhase::Conflict)
        })
        .await;
    });
}

fn a_statefulset_is_scaled_through_its_scale_subresource(env: &TestEnv) {
    use k8s_openapi::api::apps::v1::StatefulSet;
    let namespace = env.fresh_namespace("statefulset");
    let name = "ledger";
    env.block_on(async {
        let model = model(UNDRAINABLE);
        let set: StatefulSet = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": name},
            "spec": {
                "replicas": 2,
                "serviceName": name,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "consumer", "image": "registry.example.com/ledger:1"}]}
                }
            }
        }))
        .expect("statefulset");
        let sets = Api::<StatefulSet>::namespaced(env.admin(), &namespace);
        sets.create(&PostParams::default(), &set).await.expect("create the statefulset");
        // The workload simulator follows Deployments; a plain exporter stands in for the load.
        let exporter = support::exporter::Exporter::start();
        env.add_scrape_target(&namespace, &exporter.target(), &[]);
        exporter.set("kafka_consumergroup_lag_sum", &[("consumergroup", name)], 50_000.0);
        exporter.set("consumer_oldest_unfinished_event_age_seconds", &[("consumer", name)], 5.0);
        exporter.set("produce_rate", &[("topic", name)], 3000.0);
        let mut budget = budget(name, &model, 1.0, serde_json::json!({}));
        budget.spec.scale_target_ref.kind = "StatefulSet".into();
        budget.spec.metrics.produce_rate = Some(format!("sum(produce_rate{{topic=\"{name}\"}})"));
        budget.spec.metrics.completion_rate = None;
        budget.spec.metrics.partitions = None;
        budget.spec.partition_count = Some(6);
        let _operator = Operator::start(env, &namespace, Some(env.prometheus_url()));
        apply_budget(env, &namespace, &budget).await;
        // 3000/s against 6 partitions of 200/s: the cap, 6 replicas, written through /scale.
        wait_until(Duration::from_secs(30), "the StatefulSet runs 6 replicas", || async {
            let replicas = sets.get(name).await.ok()?.spec?.replicas?;
            (replicas == 6).then_some(())
        })
        .await;
        let status = budget_status(env, &namespace, name).await.and_then(|b| b.status).expect("status");
        assert_eq!(status.phase, Some(BudgetPhase::Undrainable));
    });
}

/// A served kind without /scale, or one outside any namespace, is said to be that: not an
/// object to create, nor a permission to grant. Nothing else is needed to tell, so no load.
fn a_target_that_cannot_be_scaled_is_named_as_such(env: &TestEnv) {
    use k8s_openapi::api::core::v1::ConfigMap;
    let namespace = env.fresh_namespace("unscalable");
    env.block_on(async {
        let model = model(UNDRAINABLE);
        let maps = Api::<ConfigMap>::namespaced(env.admin(), &namespace);
        let map: ConfigMap = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}
        }))
        .expect("config map");
        maps.create(&PostParams::default(), &map)
            .await
            .expect("create the config map");
        let _operator = Operator::start(env, &namespace, Some(env.prometheus_url()));
        for (name, kind, target, expected) in [
            (
                "settings",
                "ConfigMap",
                "settings",
                "kind ConfigMap in v1 has no /scale subresource",
            ),
            (
                "nodes",
                "Node",
                "node-1",
                "kind Node in v1 is cluster-scoped",
            ),
        ] {
            let mut budget = budget(name, &model, 1.0, serde_json::json!({}));
            budget.spec.scale_target_ref.api_version = "v1".into();
            budget.spec.scale_target_ref.kind = kind.into();
            budget.spec.scale_target_ref.name = target.into();
            apply_budget(env, &namespace, &budget).await;
            wait_until(
                Duration::from_secs(20),
                &format!("the budget on a {kind} says why"),
                || async {
                    let status = budget_status(env, &namespace, name).await?.status?;
                    let condition = conditions::find(&status.conditions, "ScalingActive")?;
                    (condition.status == "False"
                        && condition.reason == "TargetUnavailable"
                        && condition.message.contains(expected))
                    .then_some(())
                },
            )
            .await;
        }
    });
}

/// Stops the child process when the test ends, also when it panics.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

async fn http_get(address: &str, path: &str) -> Option<(u16, String)> {
    let response = reqwest::get(format!("http://{address}{path}")).await.ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.ok()?))
}

fn the_operator_binary_serves_metrics_and_health(env: &TestEnv) {
    let namespace = env.fresh_namespace("binary");
    let name = "invoices";
    let address = format!("127.0.0.1:{}", free_port());
    env.block_on(async {
        let model = model(BURST);
        deployment(env, &namespace, name, model.initial_replicas).await;
        let _workload = serve(env, model.clone(), &namespace, name, SPEED, &namespace).await;
        let _operator = Running(
            Command::new(env!("CARGO_BIN_EXE_backlog-operator"))
                .args(["run", "--namespace", &namespace, "--listen", &address])
                .args(["--prometheus-url", env.prometheus_url()])
                .env("KUBECONFIG", env.kubeconfig_path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start backlog-operator run"),
        );
        apply_budget(
            env,
            &namespace,
            &budget(name, &model, SPEED, serde_json::json!({})),
        )
        .await;
        wait_until(
            Duration::from_secs(20),
            "/healthz and /readyz answer",
            || async {
                let health = http_get(&address, "/healthz").await?;
                let ready = http_get(&address, "/readyz").await?;
                (health.0 == 200 && ready.0 == 200).then_some(())
            },
        )
        .await;
        let metrics = wait_until(
            Duration::from_secs(30),
            "/metrics shows the budget's phase",
            || async {
                let (_, body) = http_get(&address, "/metrics").await?;
                body.contains(&format!("name=\"{name}\"")).then_some(body)
            },
        )
        .await;
        for series in [
            "backlog_operator_budget_phase",
            "backlog_operator_budget_desired_replicas",
            "backlog_operator_budget_drain_time_seconds",
            "backlog_operator_reconciles_total",
            "backlog_operator_reconcile_duration_seconds",
            "backlog_operator_prometheus_query_duration_seconds",
        ] {
            assert!(
                metrics.contains(series),
                "/metrics lacks {series}:\n{metrics}"
            );
        }
        wait_until(
            Duration::from_secs(20),
            "the binary's decision is in status",
            || async {
                budget_status(env, &namespace, name)
                    .await?
                    .status?
                    .desired_replicas
            },
        )
        .await;
        // A deleted budget's series leave /metrics as the watch sees the deletion (one budget
        // deleted never reaches the sweep that forgets deleted budgets in bulk).
        Api::<BacklogBudget>::namespaced(env.admin(), &namespace)
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete the budget");
        let budget_series = format!("name=\"{name}\"");
        wait_until(
            Duration::from_secs(20),
            "/metrics drops the deleted budget's series",
            || async {
                let (_, body) = http_get(&address, "/metrics").await?;
                (!body.lines().any(|line| {
                    line.starts_with("backlog_operator_budget_") && line.contains(&budget_series)
                }))
                .then_some(())
            },
        )
        .await;
    });
}

fn operator_binary(env: &TestEnv, namespace: &str, identity: &str) -> Running {
    Running(
        Command::new(env!("CARGO_BIN_EXE_backlog-operator"))
            .args(["run", "--namespace", namespace, "--listen", "127.0.0.1:0"])
            .args(["--prometheus-url", env.prometheus_url()])
            .args([
                "--leader-elect",
                "--lease-namespace",
                namespace,
                "--lease-duration",
                "3s",
                "--lease-renew-deadline",
                "2s",
                "--lease-retry-period",
                "500ms",
            ])
            .env("KUBECONFIG", env.kubeconfig_path())
            .env("POD_NAME", identity)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start backlog-operator run"),
    )
}

fn with_two_replicas_one_leads_and_the_other_takes_over(env: &TestEnv) {
    use k8s_openapi::api::coordination::v1::Lease;
    let namespace = env.fresh_namespace("leader");
    let name = "refunds";
    env.block_on(async {
        let model = model(BURST);
        deployment(env, &namespace, name, model.initial_replicas).await;
        let _workload = serve(env, model.clone(), &namespace, name, SPEED, &namespace).await;
        apply_budget(
            env,
            &namespace,
            &budget(name, &model, SPEED, serde_json::json!({})),
        )
        .await;
        let leases = Api::<Lease>::namespaced(env.admin(), &namespace);
        let holder = || async {
            leases
                .get_opt("backlog-operator")
                .await
                .ok()??
                .spec?
                .holder_identity
        };
        let first = operator_binary(env, &namespace, "replica-a");
        wait_until(Duration::from_secs(20), "replica-a leads", || async {
            (holder().await.as_deref() == Some("replica-a")).then_some(())
        })
        .await;
        let _second = operator_binary(env, &namespace, "replica-b");
        wait_until(Duration::from_secs(20), "the leader reconciles", || async {
            budget_status(env, &namespace, name)
                .await?
                .status?
                .desired_replicas
        })
        .await;
        // replica-b stands by while replica-a renews.
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            assert_eq!(holder().await.as_deref(), Some("replica-a"));
            tokio::time::sleep(LOOK).await;
        }
        drop(first);
        wait_until(Duration::from_secs(20), "replica-b takes over", || async {
            (holder().await.as_deref() == Some("replica-b")).then_some(())
        })
        .await;
        // ... and reconciles: the status keeps moving with the workload.
        let before = budget_status(env, &namespace, name)
            .await
            .and_then(|b| b.status?.observed?.at);
        wait_until(
            Duration::from_secs(20),
            "replica-b writes status",
            || async {
                let at = budget_status(env, &namespace, name)
                    .await?
                    .status?
                    .observed?
                    .at;
                (at != before).then_some(())
            },
        )
        .await;
    });
}

/// The value of an unlabelled counter (or a histogram's `_count`) in the operator's metrics.
fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(name)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Budgets whose queries differ only in `consumergroup` and say `groupBy: consumergroup`:
/// each reads its own group's numbers, the queries are evaluated for all of them at once (far
/// fewer evaluations than reconciles, where one per query and reconcile is the ungrouped
/// floor), and a budget whose backlog query cannot be grouped is answered alone and says why.
fn budgets_grouped_by_a_label_share_one_evaluation_and_read_their_own_values(env: &TestEnv) {
    const GROUPED: usize = 20;
    let namespace = env.fresh_namespace("grouped");
    env.block_on(async {
        let exporter = support::exporter::Exporter::start();
        env.add_scrape_target(&namespace, &exporter.target(), &[]);
        let groups: Vec<String> = (0..=GROUPED).map(|i| format!("g{i:02}")).collect();
        for (i, group) in groups.iter().enumerate() {
            let labels = [("consumergroup", group.as_str())];
            exporter.set("grouped_lag", &labels, 1000.0 + i as f64);
            exporter.set("grouped_produce_rate", &labels, 100.0 + i as f64);
            deployment(env, &namespace, group, 1).await;
        }
        wait_until(Duration::from_secs(60), "Prometheus has every group's series", || async {
            let count = prometheus_value(env, "count(grouped_lag)").await?;
            (count as usize == groups.len()).then_some(())
        })
        .await;
        let operator = Operator::start(env, &namespace, Some(env.prometheus_url()));
        let api = Api::<BacklogBudget>::namespaced(env.admin(), &namespace);
        for (i, group) in groups.iter().enumerate() {
            let backlog = if i == GROUPED {
                // `or vector(0)` would make a missing group zero: evaluated alone.
                format!("sum(grouped_lag{{consumergroup=\"{group}\"}}) or vector(0)")
            } else {
                format!("sum(grouped_lag{{consumergroup=\"{group}\"}})")
            };
            let budget: BacklogBudget = serde_json::from_value(serde_json::json!({
                "apiVersion": "backlog.dev/v1alpha1",
                "kind": "BacklogBudget",
                "metadata": {"name": group},
                "spec": {
                    "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": group},
                    "minReplicas": 1,
                    "maxReplicas": 8,
                    "completionDeadline": "10m",
                    "partitionCount": 8,
                    "pollInterval": "1s",
                    "capacity": {"perReplicaRate": 200},
                    "metrics": {
                        "backlog": backlog,
                        "produceRate": format!("sum(grouped_produce_rate{{consumergroup=\"{group}\"}})"),
                        "groupBy": "consumergroup",
                    },
                },
            }))
            .expect("a budget");
            api.create(&PostParams::default(), &budget).await.expect("create the budget");
        }
        for (i, group) in groups.iter().enumerate() {
            let status = wait_until(Duration::from_secs(60), "the budget observed its own group", || async {
                let status = budget_status(env, &namespace, group).await?.status?;
                let observed = status.observed.clone()?;
                (observed.backlog == Some(1000.0 + i as f64)
                    && observed.produce_rate == Some(100.0 + i as f64))
                .then_some(status)
            })
            .await;
            let grouped = status
                .conditions
                .iter()
                .find(|c| c.type_ == "QueriesGrouped")
                .unwrap_or_else(|| panic!("{group} has a QueriesGrouped condition: {:?}", status.conditions));
            if i == GROUPED {
                assert_eq!(grouped.status, "False", "{grouped:?}");
                assert!(grouped.message.contains("spec.metrics.backlog: vector() invents"), "{}", grouped.message);
            } else {
                assert_eq!(grouped.status, "True", "{grouped:?}");
                assert!(grouped.message.contains(&format!("consumergroup=\"{group}\"")), "{}", grouped.message);
            }
        }
        // Over a window of polls: evaluations per reconcile.
        let counts = || {
            let text = operator.context.metrics.encode();
            (
                metric_value(&text, "backlog_operator_prometheus_query_duration_seconds_count"),
                metric_value(&text, "backlog_operator_reconciles_total{controller=\"backlogbudget\"}"),
            )
        };
        let (Some(queries_before), Some(reconciles_before)) = counts() else {
            panic!("the operator's metrics count queries and reconciles: {}", operator.context.metrics.encode());
        };
        let (queries, reconciles) = wait_until(Duration::from_secs(60), "ten polls of every budget", || async {
            let (Some(queries), Some(reconciles)) = counts() else { return None };
            let reconciles = reconciles - reconciles_before;
            (reconciles >= 10.0 * groups.len() as f64).then_some((queries - queries_before, reconciles))
        })
        .await;
        // Ungrouped, each reconcile evaluates at least its two own queries.
        assert!(
            queries <= 0.5 * reconciles,
            "{queries} evaluations for {reconciles} reconciles"
        );
        eprintln!("grouped queries: {queries} evaluations for {reconciles} budget reconciles of {} budgets", groups.len());
    });
}
