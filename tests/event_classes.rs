//! Event classes, the consumer control document and retry policies against the real API
//! server and a real Prometheus: the operator runs in-process, a test exporter serves each
//! class's failure ratio and execution rate, and every test works in its own namespace with
//! short windows (`for: 2s`, `openDuration: 3s`, `pollInterval: 1s`).

mod support;

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use backlog_operator::api::backlog_budget::{BacklogBudget, ClassState, EventClassStatus};
use backlog_operator::api::conditions;
use backlog_operator::api::retry_policy::RetryPolicy;
use backlog_operator::consumer::{CONTROL_DOCUMENT_CONFIGMAP_KEY, ControlDocument};
use backlog_operator::telemetry::ControllerLabels;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::exporter::Exporter;
use support::operator::Operator;
use support::{TestEnv, wait_until};

fn main() -> ExitCode {
    support::run(
        support::tests![
            a_failing_class_is_paused_within_for_plus_one_poll_and_a_healthy_one_stays_active,
            probing_goes_back_to_paused_with_a_doubled_pause_and_then_to_active,
            the_mode_overrides_the_breaker_in_both_directions,
            no_state_changes_while_prometheus_is_down_or_the_series_are_stale,
            the_document_validates_and_its_revision_grows_only_on_change,
            policy_conditions_appear_and_clear,
            explain_prints_the_known_policy,
        ],
        true,
    )
}

const BUDGET: &str = "orders";
const TARGET: &str = "orders-consumer";
const FIELD_MANAGER: &str = "event-classes-test";
const FOR: f64 = 2.0;
const POLL: f64 = 1.0;
const OPEN: f64 = 3.0;

/// Generous bound for anything that needs a few polls.
const SOON: Duration = Duration::from_secs(20);

/// One test's namespace, exporter, scrape job and operator.
struct Fixture<'e> {
    env: &'e TestEnv,
    namespace: String,
    exporter: Exporter,
    operator: Operator,
}

impl<'e> Fixture<'e> {
    /// A namespace with the scale target, an exporter Prometheus scrapes (job = namespace),
    /// healthy gauges for `classes`, and the operator watching the namespace.
    fn start(env: &'e TestEnv, prefix: &str, classes: &[&str]) -> Self {
        let namespace = env.fresh_namespace(prefix);
        let exporter = Exporter::start();
        exporter.set("consumer_backlog", &[], 0.0);
        for class in classes {
            exporter.set("class_failure_ratio", &[("class", class)], 0.0);
            exporter.set("class_execution_rate", &[("class", class)], 10.0);
        }
        env.add_scrape_target(&namespace, &exporter.target(), &[]);
        env.block_on(deployment(env, &namespace));
        let operator = Operator::start(env, &namespace, Some(env.prometheus_url()));
        Fixture {
            env,
            namespace,
            exporter,
            operator,
        }
    }

    fn set_class(&self, class: &str, ratio: f64, rate: f64) {
        self.exporter
            .set("class_failure_ratio", &[("class", class)], ratio);
        self.exporter
            .set("class_execution_rate", &[("class", class)], rate);
    }

    fn class(&self, name: &str) -> Value {
        json!({
            "name": name,
            "failureRatio": format!("max(class_failure_ratio{{job=\"{}\",class=\"{name}\"}})", self.namespace),
            "executionRate": format!("max(class_execution_rate{{job=\"{}\",class=\"{name}\"}})", self.namespace),
            "minRate": 1,
            "pausePolicy": {
                "threshold": 0.5,
                "for": "2s",
                "openDuration": "3s",
                "maxOpenDuration": "12s",
                "probeRatio": 0.25
            }
        })
    }

    /// The budget with these classes (and any other spec fields in `extra`).
    fn budget(&self, classes: Vec<Value>, extra: Value) -> Value {
        let mut spec = json!({
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": TARGET},
            "minReplicas": 1,
            "maxReplicas": 2,
            "completionDeadline": "10m",
            "metrics": {"backlog": format!("max(consumer_backlog{{job=\"{}\"}})", self.namespace)},
            "partitionCount": 2,
            "pollInterval": "1s",
            "capacity": {"perReplicaRate": 100},
            "eventClasses": classes,
        });
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        json!({
            "apiVersion": "backlog.dev/v1alpha1",
            "kind": "BacklogBudget",
            "metadata": {"name": BUDGET},
            "spec": spec,
        })
    }

    async fn apply(&self, budget: Value) {
        Api::<BacklogBudget>::namespaced(self.env.admin(), &self.namespace)
            .patch(
                BUDGET,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(budget),
            )
            .await
            .expect("apply the budget");
    }

    async fn status_classes(&self) -> Vec<EventClassStatus> {
        Api::<BacklogBudget>::namespaced(self.env.admin(), &self.namespace)
            .get(BUDGET)
            .await
            .ok()
            .and_then(|b| b.status)
            .map(|s| s.event_classes)
            .unwrap_or_default()
    }

    async fn class_status(&self, name: &str) -> Option<EventClassStatus> {
        self.status_classes()
            .await
            .into_iter()
            .find(|c| c.name == name)
    }

    async fn state(&self, name: &str) -> Option<ClassState> {
        self.class_status(name).await.map(|c| c.state)
    }

    async fn condition(
        &self,
        type_: &str,
    ) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
        let budget = Api::<BacklogBudget>::namespaced(self.env.admin(), &self.namespace)
            .get(BUDGET)
            .await
            .ok()?;
        conditions::find(&budget.status?.conditions, type_).cloned()
    }

    /// Waits until class `name` is in `state` and returns its status entry.
    async fn until_state(
        &self,
        name: &str,
        state: ClassState,
        timeout: Duration,
    ) -> EventClassStatus {
        wait_until(timeout, &format!("class {name} is {state:?}"), || async {
            match self.class_status(name).await {
                Some(status) if status.state == state => Ok(status),
                other => Err(format!("{other:?}")),
            }
        })
        .await
    }

    /// The control document and the ConfigMap's resourceVersion.
    async fn document(&self) -> Option<(ControlDocument, String, ConfigMap)> {
        let configmap = Api::<ConfigMap>::namespaced(self.env.admin(), &self.namespace)
            .get(&format!("{BUDGET}-control"))
            .await
            .ok()?;
        let json = configmap
            .data
            .as_ref()?
            .get(CONTROL_DOCUMENT_CONFIGMAP_KEY)?
            .clone();
        let document = ControlDocument::parse_and_validate(&json).expect("a valid document");
        let version = configmap.metadata.resource_version.clone()?;
        Some((document, version, configmap))
    }

    async fn document_state(&self, class: &str) -> Option<ClassState> {
        let (document, _, _) = self.document().await?;
        document.event_class(class).map(|c| c.state)
    }

    /// Budget reconciles so far (each test's operator runs one budget).
    fn reconciles(&self) -> u64 {
        self.operator
            .context
            .metrics
            .reconciles
            .get_or_create(&ControllerLabels {
                controller: "backlogbudget".to_owned(),
            })
            .get()
    }

    /// Event reasons on object `name`.
    async fn event_reasons(&self, name: &str) -> Vec<(String, String)> {
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(self.env.admin(), &self.namespace)
            .list(&Default::default())
            .await
            .map(|list| {
                list.items
                    .into_iter()
                    .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
                    .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Observes for at least `span` and at least `polls` budget reconciles that `check` holds
    /// throughout (a property that nothing changes cannot be shown in less time).
    async fn holds_for<F, Fut>(&self, span: Duration, polls: u64, what: &str, check: F)
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let started = Instant::now();
        let first = self.reconciles();
        loop {
            if let Err(problem) = check().await {
                panic!(
                    "{what} stopped holding after {:.1}s: {problem}",
                    started.elapsed().as_secs_f64()
                );
            }
            if started.elapsed() >= span && self.reconciles() >= first + polls {
                return;
            }
            assert!(
                started.elapsed() < span + SOON,
                "the operator reconciled only {} times in {:.1}s",
                self.reconciles() - first,
                started.elapsed().as_secs_f64()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Fixture<'_> {
    fn drop(&mut self) {
        self.env.remove_scrape_target(&self.namespace);
    }
}

async fn deployment(env: &TestEnv, namespace: &str) {
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": TARGET},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": TARGET}},
            "template": {
                "metadata": {"labels": {"app": TARGET}},
                "spec": {"containers": [{"name": "consumer", "image": "registry.example.com/consumer:1"}]}
            }
        }
    }))
    .expect("deployment");
    Api::<Deployment>::namespaced(env.admin(), namespace)
        .create(&PostParams::default(), &deployment)
        .await
        .expect("create the scale target");
}

/// The value Prometheus returns for `query` now.
async fn prometheus_value(env: &TestEnv, query: &str) -> Option<f64> {
    let client = prometheus_http_query::Client::try_from(env.prometheus_url()).ok()?;
    let result = client.query(query).get().await.ok()?;
    let vector = result.data().as_vector()?;
    vector.first().map(|v| v.sample().value())
}

// ---------------------------------------------------------------------------

fn a_failing_class_is_paused_within_for_plus_one_poll_and_a_healthy_one_stays_active(
    env: &TestEnv,
) {
    let fixture = Fixture::start(env, "classes-pause", &["refund", "order"]);
    env.block_on(async {
        fixture
            .apply(fixture.budget(vec![fixture.class("refund"), fixture.class("order")], json!({})))
            .await;
        fixture.until_state("refund", ClassState::Active, SOON).await;
        wait_until(SOON, "the document lists both classes Active", || async {
            let (document, _, _) = fixture.document().await?;
            let states: Vec<_> = document.event_classes.iter().map(|c| (c.name.clone(), c.state)).collect();
            (states == [("refund".to_owned(), ClassState::Active), ("order".to_owned(), ClassState::Active)]).then_some(())
        })
        .await;
        // The operator must have seen usable data for the class before the ratio rises.
        wait_until(SOON, "the class ratio is seen", || async {
            fixture.class_status("refund").await?.failure_ratio
        })
        .await;

        fixture.set_class("refund", 0.9, 10.0);
        let query = format!("max(class_failure_ratio{{job=\"{}\",class=\"refund\"}})", fixture.namespace);
        wait_until(SOON, "Prometheus serves the failing ratio", || async {
            (prometheus_value(env, &query).await? >= 0.9).then_some(())
        })
        .await;
        let crossed = Instant::now();
        // for + one poll; plus half a poll of query sharing and the second the API's whole-second
        // timestamps can add (a timer starts at the next whole second, never early), plus
        // the time to write and read back.
        let bound = FOR + POLL + 0.5 * POLL + 1.0 + 0.5;
        let paused = fixture
            .until_state("refund", ClassState::Paused, Duration::from_secs_f64(bound + 5.0))
            .await;
        let took = crossed.elapsed().as_secs_f64();
        eprintln!("measure: ratio visible in Prometheus → class Paused in status: {took:.2}s (for 2s, poll 1s)");
        assert!(took <= bound, "paused {took:.2}s after the ratio crossed the threshold (bound {bound}s)");
        assert_eq!(paused.transition_ratio, Some(0.9));
        assert!(paused.message.starts_with("failure ratio 0.9 ≥ threshold 0.5 for 2s"), "{}", paused.message);
        assert_eq!(paused.open_duration.as_deref(), Some("3s"));

        // The ConfigMap shows it, written in the same reconcile.
        wait_until(Duration::from_secs(2), "the document shows refund Paused", || async {
            (fixture.document_state("refund").await? == ClassState::Paused).then_some(())
        })
        .await;
        let (document, _, _) = fixture.document().await.expect("document");
        assert!(!document.should_process("refund", "evt-1"));
        assert!(document.should_process("order", "evt-1"));
        let budget = Api::<BacklogBudget>::namespaced(env.admin(), &fixture.namespace)
            .get(BUDGET)
            .await
            .expect("budget");
        let status = budget.status.expect("status");
        assert_eq!(status.paused_classes, ["refund"]);
        let condition = conditions::find(&status.conditions, "ClassesPaused").expect("ClassesPaused");
        assert_eq!(condition.status, "True");
        assert!(condition.message.starts_with("refund Paused: failure ratio 0.9"), "{}", condition.message);

        let events = wait_until(SOON, "a ClassPaused event on the budget", || async {
            let events = fixture.event_reasons(BUDGET).await;
            events.iter().any(|(reason, _)| reason == "ClassPaused").then_some(events)
        })
        .await;
        let note = &events.iter().find(|(r, _)| r == "ClassPaused").expect("event").1;
        assert!(note.starts_with("class refund: Active → Paused (FailureRatioHigh): failure ratio 0.9"), "{note}");

        // The healthy class stayed Active all along, and stays so.
        fixture
            .holds_for(Duration::from_secs(3), 3, "order Active", || async {
                match fixture.state("order").await {
                    Some(ClassState::Active) => Ok(()),
                    other => Err(format!("order is {other:?}")),
                }
            })
            .await;
        let order = fixture.class_status("order").await.expect("order");
        assert_eq!(order.transition_ratio, None, "order never changed state");
    });
}

fn probing_goes_back_to_paused_with_a_doubled_pause_and_then_to_active(env: &TestEnv) {
    let fixture = Fixture::start(env, "classes-probe", &["refund"]);
    env.block_on(async {
        fixture.set_class("refund", 0.9, 10.0);
        fixture
            .apply(fixture.budget(vec![fixture.class("refund")], json!({})))
            .await;
        let paused = fixture
            .until_state("refund", ClassState::Paused, SOON)
            .await;
        assert_eq!(paused.open_duration.as_deref(), Some("3s"));

        // After openDuration it probes; the probes fail at once, so it pauses again for twice
        // as long (Probing may last a single reconcile, too short to be seen in between).
        let repaused = wait_until(
            Duration::from_secs_f64(OPEN + 8.0),
            "refund paused again for 6s",
            || async {
                match fixture.class_status("refund").await {
                    Some(s)
                        if s.state == ClassState::Paused
                            && s.open_duration.as_deref() == Some("6s") =>
                    {
                        Ok(s)
                    }
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
        assert!(
            repaused
                .message
                .starts_with("probes failing: failure ratio 0.9"),
            "{}",
            repaused.message
        );
        assert_eq!(repaused.transition_ratio, Some(0.9));

        // The dependency is fixed: the next probes are healthy for `for`, and it is Active.
        fixture.set_class("refund", 0.0, 10.0);
        let probing = fixture
            .until_state(
                "refund",
                ClassState::Probing,
                Duration::from_secs_f64(2.0 * OPEN + 5.0),
            )
            .await;
        let (document, _, _) = fixture.document().await.expect("document");
        let control = document
            .event_class("refund")
            .expect("refund in the document");
        assert_eq!(control.state, ClassState::Probing);
        assert_eq!(control.probe_ratio, Some(0.25));
        assert_eq!(probing.probe_ratio, Some(0.25));
        let active = fixture
            .until_state(
                "refund",
                ClassState::Active,
                Duration::from_secs_f64(FOR + 5.0),
            )
            .await;
        assert_eq!(active.open_duration, None);
        assert_eq!(active.probe_ratio, None);
        assert!(
            active.message.starts_with("probes healthy for 2s"),
            "{}",
            active.message
        );
        wait_until(
            Duration::from_secs(2),
            "the document shows refund Active",
            || async {
                (fixture.document_state("refund").await? == ClassState::Active).then_some(())
            },
        )
        .await;
        let notes: Vec<String> = fixture
            .event_reasons(BUDGET)
            .await
            .into_iter()
            .map(|(r, n)| format!("{r}: {n}"))
            .collect();
        for transition in [
            "ClassPaused: class refund: Active → Paused (FailureRatioHigh)",
            "ClassProbing: class refund: Paused → Probing (OpenDurationElapsed)",
            "ClassPaused: class refund: Probing → Paused (ProbesFailing)",
            "ClassActive: class refund: Probing → Active (ProbesHealthy)",
        ] {
            assert!(
                notes.iter().any(|n| n.starts_with(transition)),
                "{transition} missing from {notes:#?}"
            );
        }
    });
}

fn the_mode_overrides_the_breaker_in_both_directions(env: &TestEnv) {
    let fixture = Fixture::start(env, "classes-mode", &["refund"]);
    env.block_on(async {
        let with_mode = |mode: &str| {
            let mut class = fixture.class("refund");
            class["mode"] = json!(mode);
            fixture.budget(vec![class], json!({}))
        };
        // Paused by hand although healthy.
        fixture.apply(with_mode("Paused")).await;
        let paused = fixture
            .until_state("refund", ClassState::Paused, SOON)
            .await;
        assert!(
            paused.message.starts_with("paused by spec (mode: Paused)"),
            "{}",
            paused.message
        );
        fixture
            .holds_for(
                Duration::from_secs_f64(OPEN + 2.0),
                4,
                "refund Paused by hand",
                || async {
                    match fixture.state("refund").await {
                        Some(ClassState::Paused) => Ok(()),
                        other => Err(format!("{other:?}")),
                    }
                },
            )
            .await;

        // Active by hand although failing.
        fixture.set_class("refund", 1.0, 10.0);
        fixture.apply(with_mode("Active")).await;
        fixture
            .until_state("refund", ClassState::Active, SOON)
            .await;
        wait_until(SOON, "the breaker sees the failing ratio", || async {
            (fixture.class_status("refund").await?.failure_ratio? >= 1.0).then_some(())
        })
        .await;
        fixture
            .holds_for(
                Duration::from_secs_f64(FOR + 2.0),
                4,
                "refund Active by hand",
                || async {
                    match fixture.state("refund").await {
                        Some(ClassState::Active) => Ok(()),
                        other => Err(format!("{other:?}")),
                    }
                },
            )
            .await;
        assert_eq!(
            fixture.document_state("refund").await,
            Some(ClassState::Active)
        );

        // Back to Auto: the breaker decides again.
        fixture.apply(with_mode("Auto")).await;
        fixture
            .until_state(
                "refund",
                ClassState::Paused,
                Duration::from_secs_f64(FOR + 8.0),
            )
            .await;
        let reasons: Vec<String> = fixture
            .event_reasons(BUDGET)
            .await
            .into_iter()
            .map(|(_, n)| n)
            .collect();
        assert!(
            reasons.iter().any(|n| n.contains("(PausedBySpec)")),
            "{reasons:?}"
        );
        assert!(
            reasons.iter().any(|n| n.contains("(ActivatedBySpec)")),
            "{reasons:?}"
        );
        assert!(
            reasons.iter().any(|n| n.contains("(FailureRatioHigh)")),
            "{reasons:?}"
        );
    });
}

fn no_state_changes_while_prometheus_is_down_or_the_series_are_stale(env: &TestEnv) {
    let fixture = Fixture::start(env, "classes-outage", &["refund", "order"]);
    env.block_on(async {
        fixture.set_class("refund", 0.9, 10.0);
        let budget = |extra: Value| {
            fixture.budget(vec![fixture.class("refund"), fixture.class("order")], extra)
        };
        fixture.apply(budget(json!({}))).await;
        fixture
            .until_state("refund", ClassState::Paused, SOON)
            .await;
        let before = fixture.status_classes().await;
        let states = |classes: &[EventClassStatus]| -> Vec<(String, ClassState, String)> {
            classes
                .iter()
                .map(|c| (c.name.clone(), c.state, format!("{:?}", c.since)))
                .collect()
        };
        let unchanged = || async {
            let now = fixture.status_classes().await;
            if states(&now) == states(&before) {
                Ok(())
            } else {
                Err(format!("{:?} became {:?}", states(&before), states(&now)))
            }
        };

        // Prometheus unreachable: a closed port.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let dead = format!("http://{}", closed.local_addr().expect("address"));
        drop(closed);
        fixture
            .apply(budget(json!({"prometheus": {"address": dead}})))
            .await;
        wait_until(
            SOON,
            "ClassMetricsAvailable is False (QueryFailed)",
            || async {
                let condition = fixture.condition("ClassMetricsAvailable").await?;
                (condition.status == "False" && condition.reason == "QueryFailed").then_some(())
            },
        )
        .await;
        // Long enough for the pause to end and for `for` to pass twice over, were data there.
        fixture
            .holds_for(
                Duration::from_secs_f64(OPEN + 2.0 * FOR + POLL),
                5,
                "every class's state",
                &unchanged,
            )
            .await;

        // Prometheus back, the series stale: the target is gone, so its samples are marked
        // stale and the queries return nothing.
        env.remove_scrape_target(&fixture.namespace);
        let query = format!(
            "max(class_execution_rate{{job=\"{}\",class=\"refund\"}})",
            fixture.namespace
        );
        wait_until(
            SOON,
            "Prometheus has no sample for the removed target",
            || async { prometheus_value(env, &query).await.is_none().then_some(()) },
        )
        .await;
        fixture.apply(budget(json!({}))).await;
        wait_until(
            SOON,
            "ClassMetricsAvailable is False (NoUsableData)",
            || async {
                let condition = fixture.condition("ClassMetricsAvailable").await?;
                (condition.status == "False" && condition.reason == "NoUsableData")
                    .then_some(condition)
            },
        )
        .await;
        let condition = fixture
            .condition("ClassMetricsAvailable")
            .await
            .expect("condition");
        assert!(
            condition
                .message
                .contains("spec.eventClasses[refund].executionRate returned no sample"),
            "{}",
            condition.message
        );
        fixture
            .holds_for(
                Duration::from_secs_f64(OPEN + 2.0 * FOR + POLL),
                5,
                "every class's state",
                &unchanged,
            )
            .await;

        // Data back: the breaker resumes (the pause has long run out, so the class probes).
        env.add_scrape_target(&fixture.namespace, &fixture.exporter.target(), &[]);
        wait_until(SOON, "ClassMetricsAvailable is True again", || async {
            (fixture.condition("ClassMetricsAvailable").await?.status == "True").then_some(())
        })
        .await;
        wait_until(SOON, "refund probes once data is back", || async {
            let transitions: Vec<String> = fixture
                .event_reasons(BUDGET)
                .await
                .into_iter()
                .map(|(_, n)| n)
                .collect();
            transitions
                .iter()
                .any(|n| n.contains("(OpenDurationElapsed)"))
                .then_some(())
        })
        .await;
        assert_eq!(fixture.state("order").await, Some(ClassState::Active));
    });
}

fn the_document_validates_and_its_revision_grows_only_on_change(env: &TestEnv) {
    let fixture = Fixture::start(env, "classes-document", &["refund"]);
    env.block_on(async {
        let policies = Api::<RetryPolicy>::namespaced(env.admin(), &fixture.namespace);
        let policy = |max_attempts: i32| {
            json!({
                "apiVersion": "backlog.dev/v1alpha1",
                "kind": "RetryPolicy",
                "metadata": {"name": "standard"},
                "spec": {"maxAttempts": max_attempts, "backoff": {"base": "100ms", "cap": "10s"}}
            })
        };
        policies
            .patch(
                "standard",
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(policy(5)),
            )
            .await
            .expect("create the policy");
        fixture
            .apply(fixture.budget(
                vec![fixture.class("refund")],
                json!({"retryPolicyRef": {"name": "standard"}}),
            ))
            .await;

        let schema: Value = serde_json::from_str(include_str!(
            "../crates/backlog-consumer/src/control-document.schema.json"
        ))
        .expect("the committed schema is JSON");
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .should_validate_formats(true)
            .build(&schema)
            .expect("a valid schema");
        let validate = |configmap: &ConfigMap| {
            let text = configmap
                .data
                .as_ref()
                .and_then(|d| d.get(CONTROL_DOCUMENT_CONFIGMAP_KEY))
                .expect("the key");
            let value: Value = serde_json::from_str(text).expect("JSON");
            let errors: Vec<String> = validator
                .iter_errors(&value)
                .map(|e| e.to_string())
                .collect();
            assert!(errors.is_empty(), "{errors:?}\n{value:#}");
        };

        // The published policy is the RetryPolicy's, with the hash its status shows.
        let policy_hash = wait_until(SOON, "the RetryPolicy publishes its hash", || async {
            policies.get("standard").await.ok()?.status?.policy_hash
        })
        .await;
        let (first, first_version, configmap) =
            wait_until(SOON, "the document carries the policy", || async {
                let (document, version, configmap) = fixture.document().await?;
                (document.retry_policy.as_ref()?.policy_hash == policy_hash
                    && !document.event_classes.is_empty())
                .then_some((document, version, configmap))
            })
            .await;
        validate(&configmap);
        assert_eq!(first.budget.namespace, fixture.namespace);
        assert_eq!(first.budget.name, BUDGET);
        let owner = configmap
            .metadata
            .owner_references
            .clone()
            .unwrap_or_default();
        assert_eq!(owner.len(), 1);
        assert_eq!(
            (
                owner[0].kind.as_str(),
                owner[0].name.as_str(),
                owner[0].controller
            ),
            ("BacklogBudget", BUDGET, Some(true))
        );
        let managers: Vec<String> = configmap
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|f| f.manager.clone())
            .collect();
        assert_eq!(managers, ["backlog-operator"]);

        // Nothing changes: nothing is rewritten.
        fixture
            .holds_for(
                Duration::from_secs(3),
                3,
                "the document as it is",
                || async {
                    match fixture.document().await {
                        Some((_, version, _)) if version == first_version => Ok(()),
                        other => Err(format!(
                            "rewritten: {:?}",
                            other.map(|(d, v, _)| (d.revision, v))
                        )),
                    }
                },
            )
            .await;
        let status = Api::<BacklogBudget>::namespaced(env.admin(), &fixture.namespace)
            .get(BUDGET)
            .await
            .expect("budget")
            .status
            .expect("status");
        assert_eq!(status.control_document.as_deref(), Some("orders-control"));
        assert_eq!(
            status.control_document_revision,
            Some(first.revision as i64)
        );

        // The policy changes: a new revision with the new hash.
        policies
            .patch(
                "standard",
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(policy(3)),
            )
            .await
            .expect("update the policy");
        let (second, _, configmap) =
            wait_until(SOON, "the document carries the new policy", || async {
                let (document, version, configmap) = fixture.document().await?;
                (document.retry_policy.as_ref()?.policy.max_attempts == 3)
                    .then_some((document, version, configmap))
            })
            .await;
        validate(&configmap);
        assert!(second.revision > first.revision);
        assert_ne!(
            second.retry_policy.as_ref().map(|p| &p.policy_hash),
            Some(&policy_hash)
        );

        // A class pauses: a new revision.
        fixture.set_class("refund", 1.0, 10.0);
        let (third, _, configmap) =
            wait_until(SOON, "the document shows refund Paused", || async {
                let (document, version, configmap) = fixture.document().await?;
                (document.event_class("refund")?.state == ClassState::Paused)
                    .then_some((document, version, configmap))
            })
            .await;
        validate(&configmap);
        assert!(third.revision > second.revision);
        assert!(third.supersedes(&second));

        // Deleted by hand: recreated, and the revision still grows.
        Api::<ConfigMap>::namespaced(env.admin(), &fixture.namespace)
            .delete("orders-control", &DeleteParams::default())
            .await
            .expect("delete the ConfigMap");
        let (fourth, _, configmap) = wait_until(SOON, "the document is back", || async {
            let (document, version, configmap) = fixture.document().await?;
            (document.revision > third.revision).then_some((document, version, configmap))
        })
        .await;
        validate(&configmap);
        assert!(fourth.supersedes(&third));
        assert!(fourth.event_class("refund").is_some());
    });
}

fn policy_conditions_appear_and_clear(env: &TestEnv) {
    let fixture = Fixture::start(env, "classes-deadline", &[]);
    env.block_on(async {
        let policies = Api::<RetryPolicy>::namespaced(env.admin(), &fixture.namespace);
        policies
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "backlog.dev/v1alpha1",
                    "kind": "RetryPolicy",
                    "metadata": {"name": "standard"},
                    "spec": {"maxAttempts": 5, "backoff": {"base": "100ms", "cap": "10s"}}
                }))
                .expect("policy"),
            )
            .await
            .expect("create the policy");
        let with_deadline = |deadline: &str| {
            fixture.budget(
                vec![],
                json!({"retryPolicyRef": {"name": "standard"}, "completionDeadline": deadline}),
            )
        };
        fixture.apply(with_deadline("1s")).await;
        let status = wait_until(SOON, "DeadlineConflict is True", || async {
            let status = policies.get("standard").await.ok()?.status?;
            (conditions::find(&status.conditions, "DeadlineConflict")?.status == "True").then_some(status)
        })
        .await;
        let conflict = conditions::find(&status.conditions, "DeadlineConflict").expect("condition");
        assert!(
            conflict.message.starts_with("BacklogBudget orders has completionDeadline 1s, 500ms shorter than the worst-case retry delay 1.5s"),
            "{}",
            conflict.message
        );
        assert_eq!(conditions::find(&status.conditions, "Ready").map(|c| c.status.as_str()), Some("True"));
        assert_eq!(status.used_by, [BUDGET]);
        assert_eq!(status.worst_case_retry_delay.as_deref(), Some("1.5s"));
        assert_eq!(status.amplification, Some(5));
        assert_eq!(status.budgeted_amplification, Some(1.1));
        assert!(status.policy_hash.is_some_and(|h| h.starts_with("sha256:")));

        fixture.apply(with_deadline("10m")).await;
        let status = wait_until(SOON, "DeadlineConflict is False", || async {
            let status = policies.get("standard").await.ok()?.status?;
            (conditions::find(&status.conditions, "DeadlineConflict")?.status == "False").then_some(status)
        })
        .await;
        assert_eq!(status.used_by, [BUDGET]);
        let reasons = wait_until(SOON, "Events on the policy", || async {
            let reasons: Vec<String> = fixture.event_reasons("standard").await.into_iter().map(|(r, _)| r).collect();
            (reasons.iter().any(|r| r == "DeadlineShorterThanRetries") && reasons.iter().any(|r| r == "DeadlinesFit"))
                .then_some(reasons)
        })
        .await;
        assert!(reasons.iter().any(|r| r == "Valid"), "{reasons:?}");

        // A later rule lists a code the first already classes otherwise: the policy stays
        // usable (the first match wins) and says which listing never takes effect.
        policies
            .patch(
                "standard",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"classification": [
                    {"errorCodes": ["HTTP_503"], "class": "Transient"},
                    {"errorCodes": ["HTTP_400", "HTTP_503"], "class": "Business"}
                ]}})),
            )
            .await
            .expect("list a code under two classes");
        let ready = wait_until(SOON, "Ready says CodeInTwoClasses", || async {
            let status = policies.get("standard").await.ok()?.status?;
            let ready = conditions::find(&status.conditions, "Ready")?.clone();
            (ready.reason == "CodeInTwoClasses").then_some(ready)
        })
        .await;
        assert_eq!(ready.status, "True");
        assert!(
            ready.message.contains("spec.classification[1] lists HTTP_503 as Business, but spec.classification[0] already classes it Transient"),
            "{}",
            ready.message
        );
        wait_until(SOON, "a CodeInTwoClasses Event", || async {
            fixture
                .event_reasons("standard")
                .await
                .iter()
                .any(|(reason, _)| reason == "CodeInTwoClasses")
                .then_some(())
        })
        .await;

        // The budget leaves: the policy is used by nobody.
        Api::<BacklogBudget>::namespaced(env.admin(), &fixture.namespace)
            .delete(BUDGET, &DeleteParams::default())
            .await
            .expect("delete the budget");
        wait_until(SOON, "usedBy is empty", || async {
            policies.get("standard").await.ok()?.status?.used_by.is_empty().then_some(())
        })
        .await;
    });
}

fn explain_prints_the_known_policy(_env: &TestEnv) {
    let dir = std::env::temp_dir().join(format!("explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("standard.yaml");
    std::fs::write(
        &file,
        "apiVersion: backlog.dev/v1alpha1\nkind: RetryPolicy\nmetadata:\n  name: standard\nspec:\n  maxAttempts: 5\n  backoff: {base: 100ms, cap: 10s}\n",
    )
    .expect("write the policy");
    let binary = env!("CARGO_BIN_EXE_backlog-operator");

    let output = Command::new(binary)
        .arg("explain")
        .arg(&file)
        .output()
        .expect("run explain");
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8(output.stdout).expect("UTF-8");
    let bounds: Vec<&str> = text
        .lines()
        .skip_while(|line| !line.starts_with("attempt"))
        .skip(1)
        .take_while(|line| line.starts_with(' '))
        .map(|line| line.split_whitespace().nth(1).unwrap_or_default())
        .collect();
    assert_eq!(bounds, ["100ms", "200ms", "400ms", "800ms"], "{text}");
    assert!(text.contains("worst-case retry delay:    1.5s\n"), "{text}");
    assert!(
        text.contains("worst-case amplification:  5 executions per event\n"),
        "{text}"
    );
    assert!(
        text.contains("retries at most 10% of primary executions"),
        "{text}"
    );

    let output = Command::new(binary)
        .args(["explain", "--deadline", "1s", "--output", "json"])
        .arg(&file)
        .output()
        .expect("run explain");
    assert_eq!(
        output.status.code(),
        Some(2),
        "the worst case does not fit 1s: {output:?}"
    );
    let json: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(json["worstCaseRetryDelay"], "1.5s");
    assert_eq!(json["worstCaseAmplification"], 5);
    assert_eq!(json["deadline"]["fits"], false);
    assert_eq!(json["deadline"]["shortBy"], "500ms");
    let uppers: Vec<&str> = json["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .skip(1)
        .filter_map(|a| a["upperBound"].as_str())
        .collect();
    assert_eq!(uppers, ["100ms", "200ms", "400ms", "800ms"]);

    let output = Command::new(binary)
        .args(["explain", "--deadline", "10s"])
        .arg(&file)
        .output()
        .expect("run explain");
    assert!(output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stdout)
            .contains("deadline 10s:              fits, 8.5s to spare")
    );
    let _ = std::fs::remove_dir_all(&dir);
}
