//! Compensations on a real node: alice asks, bob approves exactly the frozen request, the API
//! server's admission policies (the chart's very files) refuse everything else, and the
//! operator — in this process, as its own ServiceAccount — claims the compensationId, runs the
//! reference worker once as a Job (Kubernetes' own Job controller, a restricted namespace) and
//! records what it reports. Duplicates, preconditions that moved on, unknown outcomes and
//! operator restarts each get a test.

mod support;

use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use backlog_operator::api::compensation::{Compensation, CompensationPhase, SubActionState};
use backlog_operator::controller::Scope;
use backlog_operator::controller::compensation::{LABEL_ID, id_label};
use backlog_operator::core::compensation_plan::child_name;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use support::four_eyes::{CompensationReview, digest_as_the_operator, review_compensation};
use support::operator::Operator;
use support::refusal::{assert_mentions, refused};
use support::{TestEnv, wait_until};

/// How long the operator may take for one step.
const STEP: Duration = Duration::from_secs(60);
/// How long the worker's Job may take on the node.
const JOB_RUN: Duration = Duration::from_secs(120);
const WORKER_ACCOUNT: &str = "replay-worker";

fn main() -> ExitCode {
    support::run_on_node(
        support::tests![
            the_api_server_enforces_four_eyes_for_compensations,
            an_approved_compensation_records_each_sub_action_and_a_duplicate_runs_nothing,
            two_compensations_with_one_id_created_together_run_once,
            a_precondition_that_moved_on_stops_with_nothing_done,
            an_unknown_outcome_is_recorded_and_never_run_again,
            a_restarted_operator_creates_no_second_job,
            a_template_that_is_not_a_pod_template_holds_up_no_other_compensation,
            a_pod_that_only_carries_the_jobs_label_cannot_report,
        ],
        true,
    )
}

static SET_UP: OnceLock<Result<String, String>> = OnceLock::new();

/// The policies, the operator's ServiceAccount and its token (see `support::four_eyes`).
fn set_up(env: &TestEnv) -> String {
    let result = SET_UP.get_or_init(|| env.block_on(support::four_eyes::install(env)));
    match result {
        Ok(token) => token.clone(),
        Err(problem) => panic!("setting up the cluster for compensations: {problem}"),
    }
}

fn operator_client(env: &TestEnv) -> Client {
    support::identity::client_with_token(env, &set_up(env))
}

fn start_operator(env: &TestEnv, namespace: &str) -> Operator {
    env.block_on(support::identity::ensure_service_account(
        env,
        namespace,
        WORKER_ACCOUNT,
    ));
    Operator::with_client(
        env,
        operator_client(env),
        Scope::Namespace(namespace.to_owned()),
        Some(env.prometheus_url()),
    )
}

/// A refund of order o-123 with two sub-actions, by the reference worker with `worker_env`.
fn body(name: &str, id: &str, requested_by: &str, worker_env: Value) -> Value {
    json!({
        "apiVersion": "backlog.dev/v1alpha1",
        "kind": "Compensation",
        "metadata": {"name": name},
        "spec": {
            "compensationId": id,
            "sourceEventId": "evt-9f2",
            "businessKey": "order/o-123",
            "reasonCode": "DuplicateEffect",
            "requestedBy": requested_by,
            "expectedCurrentStateAndVersion": {"resource": "payments/o-123", "state": "CAPTURED_TWICE", "version": "7"},
            "proposedAction": {
                "description": "refund the second capture and tell the customer",
                "subActions": ["refund", "notify"],
                "parameters": {"amount": "19.90", "currency": "EUR"},
            },
            "affectedResources": ["payments/o-123", "notifications/customer-42"],
            "dryRunEvidence": "dry run 2026-12-01: refund 19.90 EUR of capture c-2; capture c-1 stays",
            "template": {"spec": {"containers": [{
                "name": "worker",
                "image": support::image("backlog-compensation-worker"),
                "env": worker_env,
            }]}},
        }
    })
}

async fn create_as(
    client: &Client,
    namespace: &str,
    body: Value,
) -> Result<Compensation, kube::Error> {
    let compensation: Compensation = serde_json::from_value(body).expect("a Compensation");
    Api::<Compensation>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &compensation)
        .await
}

async fn patch_as(
    client: &Client,
    namespace: &str,
    name: &str,
    patch: Value,
) -> Result<Compensation, kube::Error> {
    Api::<Compensation>::namespaced(client.clone(), namespace)
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

async fn get(env: &TestEnv, namespace: &str, name: &str) -> Compensation {
    Api::<Compensation>::namespaced(env.admin(), namespace)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("reading Compensation {name}: {e}"))
}

async fn wait_phase(
    env: &TestEnv,
    namespace: &str,
    name: &str,
    want: CompensationPhase,
) -> Compensation {
    wait_until(
        STEP + JOB_RUN,
        &format!("Compensation {name} is {want:?}"),
        || async {
            let found = get(env, namespace, name).await;
            let status = found.status.clone().unwrap_or_default();
            if status.phase == Some(want) {
                Ok(found)
            } else {
                Err(format!("{:?}: {:?}", status.phase, status.message))
            }
        },
    )
    .await
}

/// alice asks for the plain refund `refund` with compensation id `id`; it, once it awaits
/// approval (its request frozen).
async fn alice_asks_refund(env: &TestEnv, namespace: &str, id: &str) -> Compensation {
    create_as(
        &env.client("alice"),
        namespace,
        body("refund", id, "alice", json!([])),
    )
    .await
    .expect("alice asks");
    wait_phase(
        env,
        namespace,
        "refund",
        CompensationPhase::AwaitingApproval,
    )
    .await
}

/// `approver`'s approval of the request and the spec with these digests.
fn approval(approver: &str, request_sha256: &str, spec_sha256: &str) -> Value {
    CompensationReview {
        request_sha256: request_sha256.to_owned(),
        spec_sha256: spec_sha256.to_owned(),
    }
    .approval(approver)
}

async fn approve(env: &TestEnv, namespace: &str, name: &str) {
    let review = review_compensation(&env.admin(), namespace, name).await;
    patch_as(&env.client("bob"), namespace, name, review.approval("bob"))
        .await
        .expect("bob approves");
}

async fn jobs(env: &TestEnv, namespace: &str) -> Vec<Job> {
    Api::<Job>::namespaced(env.admin(), namespace)
        .list(&ListParams::default())
        .await
        .expect("list Jobs")
        .items
}

async fn pods(env: &TestEnv, namespace: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(env.admin(), namespace)
        .list(&ListParams::default())
        .await
        .expect("list Pods")
        .items
}

/// The operation ids the worker pods executed, from their logs.
async fn executed(env: &TestEnv, namespace: &str) -> Vec<String> {
    let api = Api::<Pod>::namespaced(env.admin(), namespace);
    let mut done = Vec::new();
    for pod in pods(env, namespace).await {
        let logs = api
            .logs(&pod.name_any(), &LogParams::default())
            .await
            .unwrap_or_default();
        done.extend(logs.lines().filter_map(|line| {
            serde_json::from_str::<Value>(line).ok()?["operationId"]
                .as_str()
                .map(str::to_owned)
        }));
    }
    done
}

fn sub_action_states(compensation: &Compensation) -> Vec<(String, String, SubActionState)> {
    compensation
        .status
        .iter()
        .flat_map(|s| s.sub_actions.iter())
        .map(|s| (s.name.clone(), s.operation_id.clone(), s.state))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The tests

fn the_api_server_enforces_four_eyes_for_compensations(env: &TestEnv) {
    set_up(env);
    let namespace = env.fresh_restricted_namespace("comp-four-eyes");
    let (alice, bob, carol, admin) = (
        env.client("alice"),
        env.client("bob"),
        env.client("carol"),
        env.admin(),
    );
    env.block_on(async {
        // (a) Nobody asks on someone else's behalf, admins included.
        let message = refused(
            create_as(&alice, &namespace, body("for-bob", "c-1", "bob", json!([]))).await,
            "alice creating a compensation requested by bob",
        );
        assert_mentions(
            &message,
            &["spec.requestedBy must be the user creating the Compensation (alice)"],
            "(a)",
        );
        refused(
            create_as(
                &admin,
                &namespace,
                body("by-admin", "c-1", "alice", json!([])),
            )
            .await,
            "admin creating a compensation requested by alice",
        );
        create_as(
            &alice,
            &namespace,
            body("refund", "c-1", "alice", json!([])),
        )
        .await
        .expect("alice asks");

        // (f) No approval before the request is frozen.
        let early = approval("bob", &"0".repeat(64), &"0".repeat(64));
        let message = refused(
            patch_as(&bob, &namespace, "refund", early).await,
            "bob approving before the freeze",
        );
        assert_mentions(
            &message,
            &["spec.approval is refused before the request is frozen"],
            "(f)",
        );
        // The status is the operator's alone; the test writes what it would, as its account.
        let sha = "a".repeat(64);
        let frozen = json!({"status": {"request": {
            "configMap": "compensation-x", "sha256": sha, "frozenAt": Timestamp::now().to_string(),
        }}});
        let message = refused(
            Api::<Compensation>::namespaced(admin.clone(), &namespace)
                .patch_status(
                    "refund",
                    &PatchParams::default(),
                    &Patch::Merge(frozen.clone()),
                )
                .await,
            "an admin writing the status",
        );
        assert_mentions(
            &message,
            &["is written only by the operator", "not by admin"],
            "status",
        );
        Api::<Compensation>::namespaced(operator_client(env), &namespace)
            .patch_status("refund", &PatchParams::default(), &Patch::Merge(frozen))
            .await
            .expect("the operator writes the status");
        let spec_sha = "b".repeat(64);
        digest_as_the_operator::<Compensation>(&operator_client(env), &namespace, "refund", &spec_sha).await;

        // (f) An approval of another request names the frozen one.
        let other = approval("bob", &"f".repeat(64), &spec_sha);
        let message = refused(
            patch_as(&bob, &namespace, "refund", other).await,
            "bob approving another request",
        );
        assert_mentions(
            &message,
            &[
                "spec.approval.requestSha256 must equal status.request.sha256",
                &sha,
                "compensation-x",
            ],
            "(f)",
        );
        // (b) Only approvers approve.
        let by_carol = approval("carol", &sha, &spec_sha);
        let message = refused(
            patch_as(&carol, &namespace, "refund", by_carol).await,
            "carol approving",
        );
        assert_mentions(
            &message,
            &["member of the group backlog-approvers", "carol is not one"],
            "(b)",
        );
        // (c) In one's own name only ...
        let as_alice_by_bob = approval("mallory", &sha, &spec_sha);
        let message = refused(
            patch_as(&bob, &namespace, "refund", as_alice_by_bob).await,
            "bob approving as mallory",
        );
        assert_mentions(
            &message,
            &["must be the user setting the approval (bob)"],
            "(c)",
        );
        // ... and never one's own request (alice is an approver too).
        let self_approval = approval("alice", &sha, &spec_sha);
        let message = refused(
            patch_as(&alice, &namespace, "refund", self_approval).await,
            "alice approving her own",
        );
        assert_mentions(
            &message,
            &["must differ from", "requestedBy"],
            "self-approval",
        );
        // The id is immutable.
        let message = refused(
            patch_as(
                &alice,
                &namespace,
                "refund",
                json!({"spec": {"compensationId": "c-2"}}),
            )
            .await,
            "alice changing the id",
        );
        assert_mentions(&message, &["compensationId is immutable"], "id");

        // (g) The approval changes nothing else: bob cannot pick the worker's image himself.
        let mut with_image = approval("bob", &sha, &spec_sha);
        with_image["spec"]["template"] = json!({"spec": {"containers": [{"name": "worker", "image": "registry.example.com/bob/tool:1"}]}});
        let message = refused(
            patch_as(&bob, &namespace, "refund", with_image).await,
            "bob approving with an image of his own",
        );
        assert_mentions(&message, &["may change nothing else in spec"], "(g)");
        // (h) alice changes the worker's image after bob read the spec: the approval of what
        // he read is refused, before the operator digested the edit and after.
        patch_as(
            &alice,
            &namespace,
            "refund",
            json!({"spec": {"template": {"spec": {"containers": [{"name": "worker", "image": "registry.example.com/alice/tool:2"}]}}}}),
        )
        .await
        .expect("alice edits the unapproved compensation");
        let message = refused(
            patch_as(&bob, &namespace, "refund", approval("bob", &sha, &spec_sha)).await,
            "bob approving before the operator digested alice's edit",
        );
        assert_mentions(&message, &["changes the operator has not digested yet"], "(h)");
        let edited_sha = "c".repeat(64);
        digest_as_the_operator::<Compensation>(&operator_client(env), &namespace, "refund", &edited_sha).await;
        let message = refused(
            patch_as(&bob, &namespace, "refund", approval("bob", &sha, &spec_sha)).await,
            "bob approving the spec he read before alice's edit",
        );
        assert_mentions(
            &message,
            &["spec.approval.specSha256 must equal status.specSha256", &edited_sha],
            "(h)",
        );
        patch_as(&bob, &namespace, "refund", approval("bob", &sha, &edited_sha))
            .await
            .expect("bob approves the frozen request and the spec he read last");
        // (e) The approved spec stays what was approved.
        let message = refused(
            patch_as(
                &alice,
                &namespace,
                "refund",
                json!({"spec": {"dryRunEvidence": "something else"}}),
            )
            .await,
            "alice editing an approved compensation",
        );
        assert_mentions(
            &message,
            &["spec is approved (spec.approval is set), so it cannot change"],
            "(e)",
        );
        // (d) Once started, the approval stays.
        Api::<Compensation>::namespaced(operator_client(env), &namespace)
            .patch_status(
                "refund",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"startedAt": Timestamp::now().to_string()}})),
            )
            .await
            .expect("the operator records a start");
        let message = refused(
            patch_as(
                &bob,
                &namespace,
                "refund",
                json!({"spec": {"approval": null}}),
            )
            .await,
            "bob withdrawing after the start",
        );
        assert_mentions(
            &message,
            &["cannot be changed or removed once the worker has started"],
            "(d)",
        );
    });
}

fn an_approved_compensation_records_each_sub_action_and_a_duplicate_runs_nothing(env: &TestEnv) {
    set_up(env);
    let namespace = env.fresh_restricted_namespace("comp-run");
    let _operator = start_operator(env, &namespace);
    let alice = env.client("alice");
    env.block_on(async {
        let waiting = alice_asks_refund(env, &namespace, "refund-o-123").await;
        assert!(
            jobs(env, &namespace).await.is_empty(),
            "nothing runs before the approval"
        );
        assert!(waiting.status.and_then(|s| s.request).is_some());
        approve(env, &namespace, "refund").await;
        let done = wait_phase(env, &namespace, "refund", CompensationPhase::Succeeded).await;
        let states = sub_action_states(&done);
        assert_eq!(
            states,
            vec![
                (
                    "refund".to_owned(),
                    "refund-o-123/0-refund".to_owned(),
                    SubActionState::Succeeded
                ),
                (
                    "notify".to_owned(),
                    "refund-o-123/1-notify".to_owned(),
                    SubActionState::Succeeded
                ),
            ]
        );
        let status = done.status.clone().expect("status");
        assert!(
            status
                .sub_actions
                .iter()
                .all(|s| s.started_at.is_some() && s.finished_at.is_some())
        );
        assert_eq!(status.precondition.as_ref().map(|p| p.held), Some(true));
        assert_eq!(status.approved_by.as_deref(), Some("bob"));
        assert_eq!(
            executed(env, &namespace).await,
            ["refund-o-123/0-refund", "refund-o-123/1-notify"]
        );
        // The label index finds what the id owns: its claim, its result and its one Job; the
        // result keeps the whole status, for the audit, beyond the Compensation's life.
        let selector = format!("{LABEL_ID}={}", id_label("refund-o-123"));
        let owned = Api::<ConfigMap>::namespaced(env.admin(), &namespace)
            .list(&ListParams::default().labels(&selector))
            .await
            .expect("list ConfigMaps");
        assert_eq!(owned.items.len(), 2, "the claim and the result");
        let recorded = owned
            .items
            .iter()
            .find_map(|cm| cm.data.as_ref()?.get("status.json").cloned())
            .expect("the result keeps the status");
        assert_mentions(
            &recorded,
            &["refund-o-123/1-notify", "\"approvedBy\": \"bob\""],
            "result",
        );
        let labelled_jobs = Api::<Job>::namespaced(env.admin(), &namespace)
            .list(&ListParams::default().labels(&selector))
            .await
            .expect("list Jobs");
        assert_eq!(labelled_jobs.items.len(), 1);

        // A resubmission under another name: the first result, no second effect.
        create_as(
            &alice,
            &namespace,
            body("refund-again", "refund-o-123", "alice", json!([])),
        )
        .await
        .expect("alice resubmits");
        let duplicate = wait_phase(
            env,
            &namespace,
            "refund-again",
            CompensationPhase::Duplicate,
        )
        .await;
        let status = duplicate.status.clone().expect("status");
        assert_eq!(status.duplicate_of.as_deref(), Some("refund"));
        assert_mentions(
            status.message.as_deref().unwrap_or_default(),
            &["belongs to Compensation refund", "Succeeded"],
            "duplicate",
        );
        assert_eq!(jobs(env, &namespace).await.len(), 1, "one Job for the id");
        assert_eq!(
            executed(env, &namespace).await.len(),
            2,
            "nothing ran twice"
        );
    });
}

fn two_compensations_with_one_id_created_together_run_once(env: &TestEnv) {
    set_up(env);
    let namespace = env.fresh_restricted_namespace("comp-race");
    let _operator = start_operator(env, &namespace);
    let alice = env.client("alice");
    env.block_on(async {
        let (first, second) = tokio::join!(
            create_as(
                &alice,
                &namespace,
                body("one", "refund-o-777", "alice", json!([]))
            ),
            create_as(
                &alice,
                &namespace,
                body("two", "refund-o-777", "alice", json!([]))
            ),
        );
        first.expect("one");
        second.expect("two");
        // Exactly one claims the id; the other is its duplicate.
        let (holder, duplicate) = wait_until(
            STEP,
            "one holds the id, the other is a duplicate",
            || async {
                let phases = [
                    get(env, &namespace, "one")
                        .await
                        .status
                        .and_then(|s| s.phase),
                    get(env, &namespace, "two")
                        .await
                        .status
                        .and_then(|s| s.phase),
                ];
                match phases {
                    [
                        Some(CompensationPhase::AwaitingApproval),
                        Some(CompensationPhase::Duplicate),
                    ] => Ok(("one", "two")),
                    [
                        Some(CompensationPhase::Duplicate),
                        Some(CompensationPhase::AwaitingApproval),
                    ] => Ok(("two", "one")),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
        approve(env, &namespace, holder).await;
        wait_phase(env, &namespace, holder, CompensationPhase::Succeeded).await;
        let duplicate = get(env, &namespace, duplicate).await;
        assert_eq!(
            duplicate.status.and_then(|s| s.duplicate_of).as_deref(),
            Some(holder)
        );
        assert_eq!(jobs(env, &namespace).await.len(), 1);
        assert_eq!(executed(env, &namespace).await.len(), 2);
    });
}

fn a_precondition_that_moved_on_stops_with_nothing_done(env: &TestEnv) {
    set_up(env);
    let namespace = env.fresh_restricted_namespace("comp-precondition");
    let _operator = start_operator(env, &namespace);
    env.block_on(async {
        // Someone already refunded it by hand: the state is no longer the expected one.
        let moved = json!([{"name": "COMPENSATION_WORKER_CURRENT", "value": "REFUNDED@8"}]);
        create_as(
            &env.client("alice"),
            &namespace,
            body("refund", "refund-o-124", "alice", moved),
        )
        .await
        .expect("alice asks");
        approve(env, &namespace, "refund").await;
        let stopped = wait_phase(
            env,
            &namespace,
            "refund",
            CompensationPhase::PreconditionFailed,
        )
        .await;
        let status = stopped.status.clone().expect("status");
        let precondition = status
            .precondition
            .clone()
            .expect("the precondition as read");
        assert!(!precondition.held);
        assert_eq!(precondition.observed, "REFUNDED@8");
        assert!(
            status.sub_actions.is_empty(),
            "no sub-action: {:?}",
            status.sub_actions
        );
        assert!(
            executed(env, &namespace).await.is_empty(),
            "nothing was done"
        );
        let held = status
            .conditions
            .iter()
            .find(|c| c.type_ == "PreconditionHeld")
            .expect("PreconditionHeld");
        assert_eq!(held.status, "False");
        assert_eq!(jobs(env, &namespace).await.len(), 1);
    });
}

fn an_unknown_outcome_is_recorded_and_never_run_again(env: &TestEnv) {
    set_up(env);
    let namespace = env.fresh_restricted_namespace("comp-unknown");
    let mut operator = start_operator(env, &namespace);
    env.block_on(async {
        let lost = json!([{"name": "COMPENSATION_WORKER_LOSE", "value": "notify"}]);
        create_as(
            &env.client("alice"),
            &namespace,
            body("refund", "refund-o-125", "alice", lost),
        )
        .await
        .expect("alice asks");
        approve(env, &namespace, "refund").await;
        let unknown = wait_phase(env, &namespace, "refund", CompensationPhase::Unknown).await;
        assert_eq!(
            sub_action_states(&unknown),
            vec![
                (
                    "refund".to_owned(),
                    "refund-o-125/0-refund".to_owned(),
                    SubActionState::Succeeded
                ),
                (
                    "notify".to_owned(),
                    "refund-o-125/1-notify".to_owned(),
                    SubActionState::Unknown
                ),
            ]
        );
        assert_mentions(
            unknown
                .status
                .and_then(|s| s.message)
                .as_deref()
                .unwrap_or_default(),
            &["notify (refund-o-125/1-notify)", "never runs them again"],
            "unknown",
        );
    });
    // A new operator reconciles it again from scratch: still one Job, one pod, one refund. The
    // sign that it looked: a compensation created after its start is frozen, which takes two
    // passes of the same controller that lists the unknown one first.
    operator.stop();
    let _again = start_operator(env, &namespace);
    env.block_on(async {
        create_as(
            &env.client("alice"),
            &namespace,
            body("marker", "marker", "alice", json!([])),
        )
        .await
        .expect("a marker");
        review_compensation(&env.admin(), &namespace, "marker").await;
        let still = get(env, &namespace, "refund").await;
        assert_eq!(
            still.status.and_then(|s| s.phase),
            Some(CompensationPhase::Unknown)
        );
        assert_eq!(jobs(env, &namespace).await.len(), 1, "no second Job");
        assert_eq!(pods(env, &namespace).await.len(), 1, "no second pod");
        assert_eq!(executed(env, &namespace).await, ["refund-o-125/0-refund"]);
    });
}

fn a_restarted_operator_creates_no_second_job(env: &TestEnv) {
    set_up(env);
    let namespace = env.fresh_restricted_namespace("comp-restart");
    let mut operator = start_operator(env, &namespace);
    env.block_on(async {
        let slow = json!([{"name": "COMPENSATION_WORKER_STEP_SECONDS", "value": "3"}]);
        create_as(
            &env.client("alice"),
            &namespace,
            body("refund", "refund-o-126", "alice", slow),
        )
        .await
        .expect("alice asks");
        approve(env, &namespace, "refund").await;
        // Stopped the moment the start is recorded: the Job may or may not exist yet.
        wait_until(STEP, "the start is recorded", || async {
            get(env, &namespace, "refund")
                .await
                .status
                .and_then(|s| s.started_at)
        })
        .await;
    });
    operator.stop();
    let mut second = start_operator(env, &namespace);
    env.block_on(async {
        // Stopped again while the worker runs.
        wait_until(STEP, "the worker's pod runs", || async {
            pods(env, &namespace)
                .await
                .iter()
                .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        })
        .await;
    });
    second.stop();
    let _third = start_operator(env, &namespace);
    env.block_on(async {
        wait_phase(env, &namespace, "refund", CompensationPhase::Succeeded).await;
        assert_eq!(
            jobs(env, &namespace).await.len(),
            1,
            "one Job across three operators"
        );
        assert_eq!(pods(env, &namespace).await.len(), 1, "one pod");
        assert_eq!(
            executed(env, &namespace).await,
            ["refund-o-126/0-refund", "refund-o-126/1-notify"]
        );
    });
}

/// A worker template with a value of the wrong type outside the outline the CRD checks is
/// stored; it is refused on its own Compensation, naming the field, and stops no other.
fn a_template_that_is_not_a_pod_template_holds_up_no_other_compensation(env: &TestEnv) {
    set_up(env);
    let namespace = env.fresh_restricted_namespace("comp-mistyped");
    let _operator = start_operator(env, &namespace);
    let alice = env.client("alice");
    env.block_on(async {
        let mut mistyped = body("mistyped", "refund-o-1", "alice", json!([]));
        mistyped["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!("thirty");
        create_as(&alice, &namespace, mistyped)
            .await
            .expect("the API server stores a template it does not check");
        alice_asks_refund(env, &namespace, "refund-o-2").await;
        let refused = wait_phase(env, &namespace, "mistyped", CompensationPhase::Refused).await;
        let message = refused.status.and_then(|s| s.message).unwrap_or_default();
        assert_mentions(
            &message,
            &[
                "spec.template.spec.terminationGracePeriodSeconds is not what a Pod takes",
                "invalid type",
            ],
            "mistyped template",
        );
    });
}

fn a_pod_that_only_carries_the_jobs_label_cannot_report(env: &TestEnv) {
    // Anyone who may create pods can label one as the worker Job's and make its container end
    // with any termination message. Here it says the precondition had moved on and nothing
    // ran, while the real worker refunds: read, it would invite a second refund.
    set_up(env);
    let namespace = env.fresh_restricted_namespace("comp-forged");
    let _operator = start_operator(env, &namespace);
    env.block_on(async {
        let waiting = alice_asks_refund(env, &namespace, "refund-o-77").await;
        let request = waiting
            .status
            .and_then(|s| s.request)
            .expect("the frozen request");
        let forged_report = json!({
            "requestSha256": request.sha256,
            "precondition": {"held": false, "observed": "REFUNDED/8", "message": "already refunded"},
            "subActions": [],
        });
        // Named to be listed before the Job's own pod; never scheduled (a scheduling gate), its
        // status written as a kubelet would.
        let pods_api = Api::<Pod>::namespaced(env.admin(), &namespace);
        let forged: Pod = serde_json::from_value(json!({
            "metadata": {"name": "a-forged", "labels": {
                "batch.kubernetes.io/job-name": child_name("refund-o-77"),
                "job-name": child_name("refund-o-77"),
            }},
            "spec": {
                "schedulingGates": [{"name": "example.com/never"}],
                "securityContext": {"runAsNonRoot": true, "runAsUser": 1000,
                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "worker",
                    "image": "registry.example.com/forger:1",
                    "securityContext": {"allowPrivilegeEscalation": false,
                        "capabilities": {"drop": ["ALL"]}},
                }],
            },
        }))
        .expect("a Pod");
        pods_api
            .create(&PostParams::default(), &forged)
            .await
            .expect("the forged pod is created");
        pods_api
            .patch_status(
                "a-forged",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"containerStatuses": [{
                    "name": "worker",
                    "ready": false,
                    "restartCount": 0,
                    "image": "registry.example.com/forger:1",
                    "imageID": "",
                    "state": {"terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "message": forged_report.to_string(),
                    }},
                }]}})),
            )
            .await
            .expect("the forged pod's status is written");

        approve(env, &namespace, "refund").await;
        let done = wait_until(STEP + JOB_RUN, "the compensation ends", || async {
            let found = get(env, &namespace, "refund").await;
            let phase = found.status.as_ref().and_then(|s| s.phase);
            match phase {
                Some(CompensationPhase::AwaitingApproval | CompensationPhase::Executing) | None => {
                    Err(format!("{phase:?}"))
                }
                Some(_) => Ok(found),
            }
        })
        .await;
        let status = done.status.clone().expect("status");
        assert_eq!(
            status.phase,
            Some(CompensationPhase::Succeeded),
            "the real worker's report, not the forged one: {:?}",
            status.message
        );
        assert_eq!(status.precondition.as_ref().map(|p| p.held), Some(true));
        assert_eq!(
            sub_action_states(&done),
            vec![
                (
                    "refund".to_owned(),
                    "refund-o-77/0-refund".to_owned(),
                    SubActionState::Succeeded
                ),
                (
                    "notify".to_owned(),
                    "refund-o-77/1-notify".to_owned(),
                    SubActionState::Succeeded
                ),
            ]
        );
        assert!(
            pods_api.get_opt("a-forged").await.expect("read").is_some(),
            "the forged pod was there all along"
        );
    });
}
