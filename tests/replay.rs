//! Replays on a real node with the real Prometheus: alice asks, bob approves, the API server's
//! admission policies (the chart's very files) refuse everything else, and the operator —
//! running in this process as its own ServiceAccount, the only user the status policy admits —
//! freezes the scope, runs the canary, checks Prometheus, runs the rest, halts on failure and
//! survives restarts. The Jobs are run by Kubernetes' own Job
//! controller: their pods are the reference worker (`make image`), in namespaces that enforce
//! the restricted Pod Security Standard, and their logs show every event replayed.

mod support;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use backlog_operator::api::replay_job::{ReplayJob, ReplayPhase};
use backlog_operator::controller::Scope;
use backlog_operator::controller::replay::{
    EVENT_IDS_FILE, EVENT_IDS_KEY, LABEL_REPLAY, LABEL_STAGE,
};
use backlog_operator::core::digest::sha256_hex;
use backlog_operator::core::replay_plan::{StageName, job_name};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use support::exporter::Exporter;
use support::four_eyes::{digest_as_the_operator, review_replay};
use support::operator::Operator;
use support::process::{Launch, OperatorProcess, kubeconfig_with_token};
use support::refusal::{assert_mentions, refused};
use support::{TestEnv, wait_until};

/// The ServiceAccount the operator gives workers whose template names none.
const WORKER_ACCOUNT: &str = "replay-worker";
/// How long the operator may take for one step (a reconcile, a Prometheus scrape, a retry).
const STEP: Duration = Duration::from_secs(60);
/// How long a Job may take on the node: its pods start one batch after the other.
const JOB_RUN: Duration = Duration::from_secs(120);
const SOURCE: &str = "orders.dlq";

fn main() -> ExitCode {
    support::run_on_node(
        support::tests![
            a_new_replay_freezes_its_scope_and_awaits_approval,
            the_api_server_enforces_four_eyes,
            an_approved_replay_runs_the_canary_then_the_rest,
            a_failed_canary_halts_without_a_main_job,
            a_failed_verification_halts_without_a_main_job,
            suspend_and_resume_toggle_the_running_job,
            the_scope_is_frozen_from_its_source_and_cannot_be_edited,
            a_second_replay_of_the_same_source_waits_for_the_first,
            a_restarted_operator_creates_one_job_per_stage,
            the_jobs_indices_cover_every_id_exactly_once,
            a_template_the_api_server_refuses_is_reported_before_the_start,
            a_main_stage_job_the_api_server_refuses_is_refused_before_the_canary,
            a_pace_no_job_can_keep_is_refused_before_the_approval,
            kill_9_at_random_points_never_duplicates_or_skips_a_batch,
        ],
        true,
    )
}

// ---------------------------------------------------------------------------------------------
// Cluster-wide set-up, once per test binary

static SET_UP: OnceLock<Result<String, String>> = OnceLock::new();

/// Installs the admission policies from the chart, the operator's ServiceAccount and what it
/// may do, and lets alice, bob and carol work with replays (RBAC); waits until the policies
/// refuse what they must. Returns the operator's token. Call outside `block_on`.
fn set_up(env: &TestEnv) -> String {
    let result = SET_UP.get_or_init(|| env.block_on(install(env)));
    match result {
        Ok(token) => token.clone(),
        Err(problem) => panic!("setting up the cluster for replays: {problem}"),
    }
}

/// The operator's controllers in this process, as the operator's ServiceAccount, watching
/// `namespace`, whose workers run as the `replay-worker` ServiceAccount created here.
fn start_operator(env: &TestEnv, namespace: &str) -> Operator {
    env.block_on(support::identity::ensure_service_account(
        env,
        namespace,
        WORKER_ACCOUNT,
    ));
    let client = support::identity::client_with_token(env, &set_up(env));
    Operator::with_client(
        env,
        client,
        Scope::Namespace(namespace.to_owned()),
        Some(env.prometheus_url()),
    )
}

/// A client of the operator's ServiceAccount (writing status as the operator would).
fn operator_client(env: &TestEnv) -> Client {
    support::identity::client_with_token(env, &set_up(env))
}

async fn install(env: &TestEnv) -> Result<String, String> {
    support::four_eyes::install(env).await
}

// ---------------------------------------------------------------------------------------------
// Objects

fn ids(prefix: &str, count: usize) -> Vec<String> {
    (1..=count).map(|i| format!("{prefix}-{i:04}")).collect()
}

/// A replay of `ids` in batches of 2 with a canary of 2, at 50 events per second, by the
/// reference worker.
fn replay_body(name: &str, requested_by: &str, ids: &[&str], verification: Option<&str>) -> Value {
    let mut body = json!({
        "apiVersion": "backlog.dev/v1alpha1",
        "kind": "ReplayJob",
        "metadata": {"name": name},
        "spec": {
            "source": {"queue": SOURCE},
            "destination": {"queue": "orders"},
            "scope": {"eventType": "order.created", "eventIds": ids, "tenant": "acme"},
            "reason": "order.created events failed schema validation before the fix",
            "requestedBy": requested_by,
            "rootCauseFix": {"reference": "CHANGE-4711", "verified": true},
            "batches": {"size": 2, "canary": 2, "ratePerSecond": 50, "pauseBetween": "0s"},
            "template": {"spec": {"containers": [{
                "name": "replay",
                "image": support::image("backlog-replay-worker"),
            }]}},
        }
    });
    if let Some(query) = verification {
        body["spec"]["verification"] = json!([{"name": "no-duplicates", "query": query}]);
        // The test exporter is scraped every second.
        body["spec"]["verificationDelay"] = json!("1s");
    }
    body
}

async fn create_as(
    client: &Client,
    namespace: &str,
    body: Value,
) -> Result<ReplayJob, kube::Error> {
    let replay: ReplayJob = serde_json::from_value(body).expect("a ReplayJob");
    Api::<ReplayJob>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &replay)
        .await
}

async fn patch_as(
    client: &Client,
    namespace: &str,
    name: &str,
    patch: Value,
) -> Result<ReplayJob, kube::Error> {
    Api::<ReplayJob>::namespaced(client.clone(), namespace)
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

/// `approver` approves the frozen scope and the spec of the replay, as its status shows them.
async fn approve_as(
    client: &Client,
    namespace: &str,
    name: &str,
    approver: &str,
) -> Result<ReplayJob, kube::Error> {
    let review = review_replay(client, namespace, name).await;
    patch_as(
        client,
        namespace,
        name,
        review.approval(approver, "CAB-2026-118"),
    )
    .await
}

// ---------------------------------------------------------------------------------------------
// Observing

async fn get_replay(client: &Client, namespace: &str, name: &str) -> ReplayJob {
    Api::<ReplayJob>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("reading ReplayJob {namespace}/{name}: {e}"))
}

fn phase(replay: &ReplayJob) -> Option<ReplayPhase> {
    replay.status.as_ref().and_then(|s| s.phase)
}

fn condition<'a>(
    replay: &'a ReplayJob,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    replay
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

async fn wait_phase(client: &Client, namespace: &str, name: &str, want: ReplayPhase) -> ReplayJob {
    wait_until(STEP, &format!("ReplayJob {name} is {want:?}"), || async {
        let replay = get_replay(client, namespace, name).await;
        if phase(&replay) == Some(want) {
            Ok(replay)
        } else {
            Err(format!(
                "phase {:?}: {:?}",
                phase(&replay),
                replay.status.as_ref().and_then(|s| s.message.clone())
            ))
        }
    })
    .await
}

/// Waits until the replay has started a stage (its phase is Canary or later); on the node a
/// short stage may be over before a poll sees it.
async fn wait_started(client: &Client, namespace: &str, name: &str) -> ReplayJob {
    use ReplayPhase::{Canary, Running, Succeeded, Verifying};
    wait_until(STEP, &format!("ReplayJob {name} has started"), || async {
        let replay = get_replay(client, namespace, name).await;
        match phase(&replay) {
            Some(Canary | Verifying | Running | Succeeded) => Ok(replay),
            other => Err(format!("phase {other:?}")),
        }
    })
    .await
}

/// The Jobs of a replay, by stage.
async fn jobs_of(client: &Client, namespace: &str, replay: &str) -> BTreeMap<String, Vec<Job>> {
    let listed = Api::<Job>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&format!("{LABEL_REPLAY}={replay}")))
        .await
        .unwrap_or_else(|e| panic!("listing Jobs in {namespace}: {e}"));
    let mut by_stage: BTreeMap<String, Vec<Job>> = BTreeMap::new();
    for job in listed.items {
        let stage = job.labels().get(LABEL_STAGE).cloned().unwrap_or_default();
        by_stage.entry(stage).or_default().push(job);
    }
    by_stage
}

async fn all_jobs(client: &Client, namespace: &str) -> Vec<Job> {
    Api::<Job>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("listing Jobs in {namespace}: {e}"))
        .items
}

/// Waits for the Job of `stage` and returns it; there must be exactly one.
async fn wait_stage_job(client: &Client, namespace: &str, replay: &str, stage: &str) -> Job {
    wait_until(
        STEP,
        &format!("the {stage} Job of {replay} exists"),
        || async {
            let mut jobs = jobs_of(client, namespace, replay).await;
            match jobs.remove(stage) {
                Some(mut found) if found.len() == 1 => Ok(found.remove(0)),
                Some(found) => panic!("{} {stage} Jobs of {replay}", found.len()),
                None => Err(format!("Jobs: {:?}", jobs.keys().collect::<Vec<_>>())),
            }
        },
    )
    .await
}

/// Waits until the status records `job`'s uid for `stage`.
async fn wait_job_recorded(client: &Client, namespace: &str, name: &str, stage: &str, job: &Job) {
    wait_until(
        STEP,
        &format!("the {stage} Job's uid is recorded"),
        || async {
            let replay = get_replay(client, namespace, name).await;
            let recorded = replay
                .status
                .iter()
                .flat_map(|s| s.stages.iter())
                .find(|s| s.name == stage)
                .and_then(|s| s.job_uid.clone());
            (recorded == job.uid()).then_some(()).ok_or(recorded)
        },
    )
    .await;
}

/// Until the operator resumes `job`: it creates Jobs suspended and resumes one once the status
/// records its uid.
async fn wait_job_released(client: &Client, namespace: &str, job: &Job) {
    let jobs = Api::<Job>::namespaced(client.clone(), namespace);
    let name = job.name_any();
    wait_until(STEP, &format!("Job {name} is resumed"), || async {
        let suspend = jobs
            .get(&name)
            .await
            .map(|job| job.spec.and_then(|spec| spec.suspend));
        match suspend {
            Ok(Some(false)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// alice asks for `body`, bob approves it, and the canary Job appears: the start of most tests.
async fn approved_until_canary(env: &TestEnv, namespace: &str, name: &str, body: Value) -> Job {
    create_as(&env.client("alice"), namespace, body)
        .await
        .expect("alice creates");
    approve_as(&env.client("bob"), namespace, name, "bob")
        .await
        .expect("bob approves");
    wait_stage_job(&env.admin(), namespace, name, "canary").await
}

fn env_of(job: &Job) -> BTreeMap<String, String> {
    let pod = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("a pod template");
    pod.containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

fn number(env: &BTreeMap<String, String>, key: &str) -> usize {
    env.get(key)
        .unwrap_or_else(|| panic!("no {key} in {env:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("{key}: {e}"))
}

async fn event_reasons(client: &Client, namespace: &str, replay: &str) -> Vec<String> {
    Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(replay))
        .filter_map(|e| e.reason)
        .collect()
}

/// The replay's trail: one audit line per transition on the operator's log, and once it
/// ended, the whole trail in an immutable ConfigMap the ReplayJob does not own.
async fn assert_audit_trail(
    admin: &Client,
    operator: &Operator,
    namespace: &str,
    name: &str,
    jobs: &[&Job],
) {
    use backlog_operator::controller::replay::audit::{AUDIT_SCHEMA, AuditRecord, TRAIL_KEY};
    let archived = wait_until(STEP, "the audit ConfigMap is recorded", || async {
        get_replay(admin, namespace, name)
            .await
            .status
            .and_then(|s| s.audit_config_map)
    })
    .await;
    let config_map = Api::<ConfigMap>::namespaced(admin.clone(), namespace)
        .get(&archived)
        .await
        .expect("the audit ConfigMap");
    assert_eq!(config_map.immutable, Some(true));
    assert!(
        config_map.owner_references().is_empty(),
        "it outlives the ReplayJob"
    );
    assert_eq!(config_map.labels()["backlog.dev/audit"], "replayjob");
    let trail: Vec<AuditRecord> = config_map.data.expect("data")[TRAIL_KEY]
        .lines()
        .map(|l| serde_json::from_str(l).expect("an audit record"))
        .collect();
    let logged = operator.audit.records();
    for job in jobs {
        for records in [&trail, &logged] {
            assert!(
                records.iter().any(|r| r.event == "JobCreated"
                    && r.job_uid == job.uid()
                    && r.approved_by.as_deref() == Some("bob")
                    && r.requested_by == "alice"
                    && r.scope_sha256.is_some()),
                "no JobCreated record of {}: {records:?}",
                job.name_any()
            );
        }
    }
    assert!(
        trail
            .iter()
            .all(|r| r.audit == AUDIT_SCHEMA && r.name == name)
    );
    assert_eq!(trail.last().map(|r| r.event.as_str()), Some("PhaseChanged"));
    assert_eq!(
        trail.last().and_then(|r| r.phase.as_deref()),
        Some("Succeeded")
    );
}

/// The operator's own metrics show no failed replay reconcile: every outcome of these tests is
/// a decision, not an error that was retried.
fn assert_no_reconcile_errors(operator: &Operator) {
    let metrics = operator.context.metrics.encode();
    let errors: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("backlog_operator_reconcile_errors") && l.contains("replayjob"))
        .collect();
    assert!(errors.is_empty(), "failed reconciles: {errors:?}");
}

// ---------------------------------------------------------------------------------------------
// Jobs, run by the Job controller on the node

/// Waits until the Job finished (Complete or Failed) and returns it.
async fn wait_job_finished(env: &TestEnv, namespace: &str, job: &Job) -> Job {
    let jobs = Api::<Job>::namespaced(env.admin(), namespace);
    let name = job.name_any();
    wait_until(JOB_RUN, &format!("Job {name} finishes"), || async {
        let job = jobs.get(&name).await.map_err(|e| e.to_string())?;
        let finished = job
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter()
                    .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
            });
        if finished {
            Ok(job)
        } else {
            Err(format!("{:?}", job.status))
        }
    })
    .await
}

/// The condition of a finished Job (`Complete` or `Failed`) with its reason.
fn job_outcome(job: &Job) -> Option<(String, String)> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        .map(|c| (c.type_.clone(), c.reason.clone().unwrap_or_default()))
}

/// What the worker pods of `job` printed on stdout: one JSON line per event, in index order.
async fn worker_lines(env: &TestEnv, namespace: &str, job: &str) -> Vec<Value> {
    let pods = Api::<Pod>::namespaced(env.admin(), namespace);
    let mut listed = pods
        .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}")))
        .await
        .unwrap_or_else(|e| panic!("listing the pods of Job {job}: {e}"))
        .items;
    let index = |pod: &Pod| -> usize {
        pod.annotations()
            .get("batch.kubernetes.io/job-completion-index")
            .and_then(|i| i.parse().ok())
            .unwrap_or(usize::MAX)
    };
    listed.sort_by_key(index);
    let mut lines = Vec::new();
    for pod in listed {
        let logs = pods
            .logs(&pod.name_any(), &LogParams::default())
            .await
            .unwrap_or_else(|e| panic!("logs of {}: {e}", pod.name_any()));
        lines.extend(
            logs.lines()
                .filter_map(|line| serde_json::from_str::<Value>(line).ok()),
        );
    }
    lines
}

/// The event ids the worker pods of `job` replayed, in order.
async fn replayed_ids(env: &TestEnv, namespace: &str, job: &str) -> Vec<String> {
    worker_lines(env, namespace, job)
        .await
        .into_iter()
        .filter(|line| line["outcome"] == "replayed")
        .filter_map(|line| line["eventId"].as_str().map(str::to_owned))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Prometheus

/// A gauge of duplicate side effects, labelled with the test's namespace, scraped by the real
/// Prometheus; and the check that must hold after the canary.
struct Duplicates {
    exporter: Exporter,
    job_name: String,
    namespace: String,
}

impl Duplicates {
    fn start(env: &TestEnv, namespace: &str, value: f64) -> Duplicates {
        let exporter = Exporter::start();
        exporter.set(
            "replay_test_duplicate_side_effects",
            &[("test", namespace)],
            value,
        );
        let job_name = format!("replay-{namespace}");
        env.add_scrape_target(&job_name, &exporter.target(), &[]);
        Duplicates {
            exporter,
            job_name,
            namespace: namespace.to_owned(),
        }
    }

    fn check(&self) -> String {
        format!(
            "sum(replay_test_duplicate_side_effects{{test=\"{}\"}}) == bool 0",
            self.namespace
        )
    }

    fn stop(self, env: &TestEnv) {
        env.remove_scrape_target(&self.job_name);
        drop(self.exporter);
    }
}

// ---------------------------------------------------------------------------------------------
// Tests

fn a_new_replay_freezes_its_scope_and_awaits_approval(env: &TestEnv) {
    set_up(env);
    let namespace = env.fresh_restricted_namespace("replay-new");
    let operator = start_operator(env, &namespace);
    let alice = env.client("alice");
    let list = ids("evt", 5);
    let refs: Vec<&str> = list.iter().map(String::as_str).collect();
    env.block_on(async {
        let created = create_as(
            &alice,
            &namespace,
            replay_body("orders", "alice", &refs, None),
        )
        .await
        .expect("alice creates her replay");
        let replay = wait_phase(&alice, &namespace, "orders", ReplayPhase::AwaitingApproval).await;
        let status = replay.status.clone().expect("status");
        let scope = status.scope.clone().expect("the scope is frozen");
        let text: String = list.iter().map(|id| format!("{id}\n")).collect();
        let sha = sha256_hex(text.as_bytes());
        assert_eq!(scope.count, 5);
        assert_eq!(scope.sha256, sha);
        assert_eq!(status.requested_by.as_deref(), Some("alice"));
        assert_eq!(status.approved_by, None);
        assert_eq!(status.batches_total, Some(3));
        let uid = created.uid().expect("uid");
        assert_eq!(
            status.operation_id.as_deref(),
            Some(format!("replay-{uid}").as_str())
        );
        let approved = condition(&replay, "Approved").expect("Approved condition");
        assert_eq!(approved.status, "False");
        assert_mentions(&approved.message, &["spec.approval.approvedBy"], "Approved");

        let frozen = Api::<ConfigMap>::namespaced(env.admin(), &namespace)
            .get(&scope.config_map)
            .await
            .expect("the frozen scope ConfigMap");
        assert_eq!(frozen.immutable, Some(true));
        assert_eq!(
            frozen.data.as_ref().and_then(|d| d.get(EVENT_IDS_KEY)),
            Some(&text)
        );
        let owner = &frozen.owner_references()[0];
        assert_eq!(
            (owner.uid.as_str(), owner.controller),
            (uid.as_str(), Some(true))
        );

        assert!(
            all_jobs(&alice, &namespace).await.is_empty(),
            "no Job before approval"
        );
        wait_until(STEP, "the freeze is an Event", || async {
            event_reasons(&alice, &namespace, "orders")
                .await
                .contains(&"ScopeFrozen".to_owned())
        })
        .await;
    });
    assert_no_reconcile_errors(&operator);
}

fn the_api_server_enforces_four_eyes(env: &TestEnv) {
    set_up(env);
    let namespace = env.fresh_restricted_namespace("replay-four-eyes");
    let (alice, bob, carol, admin) = (
        env.client("alice"),
        env.client("bob"),
        env.client("carol"),
        env.admin(),
    );
    env.block_on(async {
        // (a) Nobody requests a replay on someone else's behalf, admins included.
        let message = refused(
            create_as(&alice, &namespace, replay_body("for-bob", "bob", &["a"], None)).await,
            "alice creating a replay requested by bob",
        );
        assert_mentions(
            &message,
            &["spec.requestedBy must be the user creating the ReplayJob (alice)"],
            "(a)",
        );
        refused(
            create_as(&admin, &namespace, replay_body("by-admin", "alice", &["a"], None)).await,
            "admin creating a replay requested by alice",
        );
        create_as(&alice, &namespace, replay_body("orders", "alice", &["a", "b", "c"], None))
            .await
            .expect("alice creates her own replay");

        // (f) No approval before the scope is frozen: it would name no list.
        let early = json!({"spec": {"approval": {"approvedBy": "bob", "scopeSha256": "0".repeat(64), "specSha256": "0".repeat(64)}}});
        let message = refused(
            patch_as(&bob, &namespace, "orders", early).await,
            "bob approving before the freeze",
        );
        assert_mentions(&message, &["spec.approval is refused before the scope is frozen"], "(f)");
        // The status is the operator's alone (no operator runs here: the test writes what it
        // would, as its ServiceAccount).
        let frozen = json!({"status": {"scope": {
            "configMap": "orders-scope-x", "count": 3, "frozenAt": Timestamp::now().to_string(),
            "sha256": sha256_hex(b"a\nb\nc\n"),
        }}});
        let message = refused(
            Api::<ReplayJob>::namespaced(admin.clone(), &namespace)
                .patch_status("orders", &PatchParams::default(), &Patch::Merge(frozen.clone()))
                .await,
            "an admin writing the status",
        );
        assert_mentions(&message, &["is written only by the operator", "not by admin"], "status");
        Api::<ReplayJob>::namespaced(operator_client(env), &namespace)
            .patch_status("orders", &PatchParams::default(), &Patch::Merge(frozen))
            .await
            .expect("the operator writes the status");
        let first_spec = sha256_hex(b"the spec alice asked for");
        digest_as_the_operator::<ReplayJob>(&operator_client(env), &namespace, "orders", &first_spec).await;
        // (f) An approval of another list is refused, naming the frozen one.
        let other = json!({"spec": {"approval": {"approvedBy": "bob", "scopeSha256": "f".repeat(64), "specSha256": first_spec}}});
        let message = refused(
            patch_as(&bob, &namespace, "orders", other).await,
            "bob approving another list",
        );
        assert_mentions(
            &message,
            &["spec.approval.scopeSha256 must equal status.scope.sha256", &sha256_hex(b"a\nb\nc\n"), "orders-scope-x"],
            "(f)",
        );

        // (c) The requester cannot approve her own replay, nor sign in someone else's name.
        let message = refused(
            approve_as(&alice, &namespace, "orders", "alice").await,
            "alice approving her own replay",
        );
        assert_mentions(&message, &["approvedBy", "requestedBy"], "self-approval");
        let message = refused(
            approve_as(&alice, &namespace, "orders", "bob").await,
            "alice approving in bob's name",
        );
        assert_mentions(
            &message,
            &["spec.approval.approvedBy must be the user setting the approval (alice)"],
            "(c)",
        );
        // (b) Only the approvers group approves: not carol, not an admin.
        for (client, user) in [(&carol, "carol"), (&admin, "admin")] {
            let message = refused(
                approve_as(client, &namespace, "orders", user).await,
                &format!("{user} approving"),
            );
            assert_mentions(
                &message,
                &[
                    "spec.approval may only be set, changed or removed by a member of the group backlog-approvers",
                    &format!("{user} is not one"),
                ],
                "(b)",
            );
        }
        let approved = approve_as(&bob, &namespace, "orders", "bob")
            .await
            .expect("bob approves alice's replay");
        assert_eq!(
            approved.spec.approval.map(|a| a.approved_by).as_deref(),
            Some("bob")
        );

        // (e) What was approved is what runs: no edits but suspend while approved.
        let message = refused(
            patch_as(&alice, &namespace, "orders", json!({"spec": {"batches": {"size": 50}}})).await,
            "alice enlarging batches after the approval",
        );
        assert_mentions(&message, &["only spec.suspend may change"], "(e)");
        refused(
            patch_as(&admin, &namespace, "orders", json!({"spec": {"template": {"spec": {"containers": [{"name": "x", "image": "evil:1"}]}}}})).await,
            "admin swapping the image after the approval",
        );
        patch_as(&alice, &namespace, "orders", json!({"spec": {"suspend": true}}))
            .await
            .expect("suspend may change while approved");
        patch_as(&admin, &namespace, "orders", json!({"metadata": {"labels": {"team": "orders"}}}))
            .await
            .expect("an admin may still label the replay");
        // Before the start an approver may withdraw; the requester edits; a new approval.
        patch_as(&bob, &namespace, "orders", json!({"spec": {"approval": null}}))
            .await
            .expect("bob withdraws his approval before the start");
        // The operator would have digested the suspension and the withdrawal by now.
        digest_as_the_operator::<ReplayJob>(&operator_client(env), &namespace, "orders", &first_spec).await;
        let before_the_edit = review_replay(&bob, &namespace, "orders").await;
        patch_as(&alice, &namespace, "orders", json!({"spec": {"batches": {"size": 3}}}))
            .await
            .expect("alice edits the unapproved replay");
        // (h) An approval names the spec it covers: until the operator has digested the edit,
        // no approval is taken, and one of the spec before the edit never is.
        let message = refused(
            patch_as(&bob, &namespace, "orders", before_the_edit.approval("bob", "CAB-2")).await,
            "bob approving before the operator digested alice's edit",
        );
        assert_mentions(&message, &["changes the operator has not digested yet", "status.specSha256"], "(h)");
        let edited_spec = sha256_hex(b"the spec alice edited");
        digest_as_the_operator::<ReplayJob>(&operator_client(env), &namespace, "orders", &edited_spec).await;
        let message = refused(
            patch_as(&bob, &namespace, "orders", before_the_edit.approval("bob", "CAB-2")).await,
            "bob approving the spec he read before alice's edit",
        );
        assert_mentions(
            &message,
            &["spec.approval.specSha256 must equal status.specSha256", &edited_spec],
            "(h)",
        );
        approve_as(&bob, &namespace, "orders", "bob")
            .await
            .expect("bob approves again");

        // A started stage, written as the operator would.
        let started = json!({"status": {"phase": "Canary", "stages": [{
            "name": "canary", "job": "orders-canary-x", "batches": 1,
            "startedAt": Timestamp::now().to_string(), "succeeded": 0, "failed": 0,
        }]}});
        Api::<ReplayJob>::namespaced(operator_client(env), &namespace)
            .patch_status("orders", &PatchParams::default(), &Patch::Merge(started))
            .await
            .expect("the operator writes the status");

        // (d) Once started, the approval stays as it is, even for the approver.
        let message = refused(
            patch_as(&bob, &namespace, "orders", json!({"spec": {"approval": null}})).await,
            "bob withdrawing after the start",
        );
        assert_mentions(
            &message,
            &["spec.approval cannot be changed or removed once the replay has started"],
            "(d)",
        );
        refused(
            patch_as(&bob, &namespace, "orders", json!({"spec": {"approval": {"reference": "CAB-2"}}})).await,
            "bob changing the reference after the start",
        );
        patch_as(&alice, &namespace, "orders", json!({"spec": {"suspend": false}}))
            .await
            .expect("suspend still toggles after the start");
    });
}

/// `spec.verificationDelay` of the replay whose flow is followed step by step (seconds).
const VERIFICATION_DELAY: i64 = 4;

fn an_approved_replay_runs_the_canary_then_the_rest(env: &TestEnv) {
    set_up(env);
    let namespace = env.fresh_restricted_namespace("replay-flow");
    let duplicates = Duplicates::start(env, &namespace, 0.0);
    let operator = start_operator(env, &namespace);
    let (alice, bob, admin) = (env.client("alice"), env.client("bob"), env.admin());
    let list = ids("ord", 7);
    let refs: Vec<&str> = list.iter().map(String::as_str).collect();
    env.block_on(async {
        create_as(&alice, &namespace, {
            // A pause after each batch keeps every stage running long enough to be seen.
            let mut body = replay_body("orders", "alice", &refs, Some(&duplicates.check()));
            body["spec"]["batches"]["pauseBetween"] = json!("3s");
            body["spec"]["verificationDelay"] = json!(format!("{VERIFICATION_DELAY}s"));
            body
        })
        .await
        .expect("alice creates");
        wait_phase(&alice, &namespace, "orders", ReplayPhase::AwaitingApproval).await;
        assert!(all_jobs(&alice, &namespace).await.is_empty());

        approve_as(&bob, &namespace, "orders", "bob")
            .await
            .expect("bob approves");
        let canary = wait_stage_job(&admin, &namespace, "orders", "canary").await;
        let replay = wait_phase(&alice, &namespace, "orders", ReplayPhase::Canary).await;
        let status = replay.status.clone().expect("status");
        let scope = status.scope.clone().expect("scope");

        // The canary Job: Indexed, one batch, the worker contract, the frozen ids read-only.
        let spec = canary.spec.clone().expect("job spec");
        assert_eq!(spec.completion_mode.as_deref(), Some("Indexed"));
        assert_eq!(spec.completions, Some(1));
        assert_eq!(spec.parallelism, Some(1));
        assert_eq!(spec.backoff_limit_per_index, Some(0));
        let owner = &canary.owner_references()[0];
        assert_eq!(owner.kind, "ReplayJob");
        assert_eq!(Some(owner.uid.clone()), replay.uid());
        let env_vars = env_of(&canary);
        for (key, want) in [
            (
                "REPLAY_OPERATION_ID",
                status.operation_id.clone().expect("operation id"),
            ),
            ("REPLAY_NAME", "orders".to_owned()),
            ("REPLAY_SOURCE", SOURCE.to_owned()),
            ("REPLAY_DESTINATION", "orders".to_owned()),
            ("REPLAY_EVENT_IDS_FILE", EVENT_IDS_FILE.to_owned()),
            ("REPLAY_STAGE", "canary".to_owned()),
            ("REPLAY_FIRST_EVENT", "0".to_owned()),
            ("REPLAY_EVENT_COUNT", "2".to_owned()),
            ("REPLAY_BATCH_SIZE", "2".to_owned()),
            ("REPLAY_RATE_PER_SECOND", "50".to_owned()),
            ("REPLAY_PAUSE_BETWEEN", "3s".to_owned()),
        ] {
            assert_eq!(env_vars.get(key), Some(&want), "{key} in {env_vars:?}");
        }
        let pod = spec.template.spec.clone().expect("pod spec");
        let mount = pod.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| EVENT_IDS_FILE.starts_with(&m.mount_path))
            .expect("the ids are mounted");
        assert_eq!(mount.read_only, Some(true));
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .expect("the ids volume");
        assert_eq!(
            volume.config_map.as_ref().map(|c| c.name.as_str()),
            Some(scope.config_map.as_str())
        );
        let security = pod.containers[0]
            .security_context
            .clone()
            .expect("restricted");
        assert_eq!(security.run_as_non_root, Some(true));
        assert_eq!(security.read_only_root_filesystem, Some(true));
        assert_eq!(security.allow_privilege_escalation, Some(false));
        assert_eq!(
            security.capabilities.and_then(|c| c.drop),
            Some(vec!["ALL".to_owned()])
        );
        assert_eq!(status.approved_by.as_deref(), Some("bob"));
        assert!(status.approved_at.is_some());
        assert_eq!(status.approval_reference.as_deref(), Some("CAB-2026-118"));
        assert!(status.stages[0].started_at.is_some());
        assert!(
            !jobs_of(&admin, &namespace, "orders")
                .await
                .contains_key("main")
        );

        // The canary's worker replays its batch and the Job controller completes the Job;
        // Prometheus says there are no duplicates: the rest runs.
        let finished = wait_job_finished(env, &namespace, &canary).await;
        assert_eq!(
            job_outcome(&finished).map(|(kind, _)| kind).as_deref(),
            Some("Complete")
        );
        let main = wait_stage_job(&admin, &namespace, "orders", "main").await;
        let replay = wait_phase(&alice, &namespace, "orders", ReplayPhase::Running).await;
        assert_eq!(
            condition(&replay, "Verified").map(|c| c.status.as_str()),
            Some("True")
        );
        let checks = replay.status.clone().expect("status").verification;
        assert_eq!(checks.len(), 1);
        assert_eq!(
            (checks[0].result.as_str(), checks[0].value),
            ("Holds", Some(1.0))
        );
        // The check held on the exporter from the start; it was asked only once the delay
        // after the canary had passed (both times in whole seconds, cut alike).
        let canary_end = replay.status.as_ref().and_then(|s| s.stages.first()).and_then(|s| s.finished_at.clone()).expect("the canary's end");
        let verified_at = condition(&replay, "Verified").expect("Verified").last_transition_time.0;
        assert!(
            verified_at.as_second() - canary_end.0.as_second() >= VERIFICATION_DELAY,
            "verified at {verified_at}, {VERIFICATION_DELAY}s after the canary's end {} at the earliest",
            canary_end.0
        );
        let main_env = env_of(&main);
        assert_eq!(main.spec.as_ref().and_then(|s| s.completions), Some(3));
        assert_eq!(main_env["REPLAY_FIRST_EVENT"], "2");
        assert_eq!(main_env["REPLAY_EVENT_COUNT"], "5");
        assert_eq!(main_env["REPLAY_FIRST_BATCH"], "1");

        wait_job_finished(env, &namespace, &main).await;
        let done = wait_phase(&alice, &namespace, "orders", ReplayPhase::Succeeded).await;
        // The workers' own account: every id once, in the frozen order, the canary's first,
        // each with the operation id and the destination.
        let lines = worker_lines(env, &namespace, &canary.name_any()).await;
        let operation = done.status.as_ref().and_then(|s| s.operation_id.clone());
        assert!(
            lines
                .iter()
                .all(|l| l["operationId"].as_str() == operation.as_deref()
                    && l["destination"] == "orders"),
            "{lines:?}"
        );
        let mut replayed = replayed_ids(env, &namespace, &canary.name_any()).await;
        assert_eq!(replayed, refs[..2], "the canary replays the first batch");
        replayed.extend(replayed_ids(env, &namespace, &main.name_any()).await);
        assert_eq!(replayed, refs, "every id exactly once, in order");
        let status = done.status.clone().expect("status");
        assert_eq!(status.batches_total, Some(4));
        // Each stage follows the Job the operator created, by uid.
        let uids: Vec<Option<String>> = status.stages.iter().map(|s| s.job_uid.clone()).collect();
        assert_eq!(uids, vec![canary.uid(), main.uid()]);
        assert_audit_trail(&admin, &operator, &namespace, "orders", &[&canary, &main]).await;
        assert_eq!(status.batches_succeeded, Some(4));
        assert_eq!(status.batches_failed, Some(0));
        assert!(
            status.stages.iter().all(|s| s.finished_at.is_some()),
            "{:?}",
            status.stages
        );

        let reasons = wait_until(STEP, "every transition is an Event", || async {
            let reasons = event_reasons(&alice, &namespace, "orders").await;
            let want = [
                "ScopeFrozen",
                "AwaitingApproval",
                "Approved",
                "StageStarted",
                "Canary",
                "Running",
                "Succeeded",
            ];
            if want.iter().all(|w| reasons.iter().any(|r| r == w)) {
                Ok(reasons)
            } else {
                Err(format!("{reasons:?}"))
            }
        })
        .await;
        assert!(!reasons.is_empty());
    });
    assert_no_reconcile_errors(&operator);
    duplicates.stop(env);
}

fn a_failed_canary_halts_without_a_main_job(env: &TestEnv) {
    set_up(env);
    let namespace = env.fresh_restricted_namespace("replay-canary-fails");
    let operator = start_operator(env, &namespace);
    let (alice, admin) = (env.client("alice"), env.admin());
    let list = ids("evt", 6);
    let refs: Vec<&str> = list.iter().map(String::as_str).collect();
    env.block_on(async {
        // The destination refuses the canary's second event: its batch (index 0) fails, and
        // with no retries per batch the Job controller fails the Job.
        let mut body = replay_body("orders", "alice", &refs, None);
        body["spec"]["template"]["spec"]["containers"][0]["env"] =
            json!([{"name": "REPLAY_WORKER_REJECT", "value": refs[1]}]);
        let canary = approved_until_canary(env, &namespace, "orders", body).await;
        let failed = wait_job_finished(env, &namespace, &canary).await;
        let (kind, reason) = job_outcome(&failed).expect("an outcome");
        assert_eq!(kind, "Failed", "{reason}");
        assert_eq!(
            failed
                .status
                .as_ref()
                .and_then(|s| s.failed_indexes.as_deref()),
            Some("0")
        );
        let halted = wait_phase(&alice, &namespace, "orders", ReplayPhase::Halted).await;
        let condition = condition(&halted, "Halted").expect("Halted condition");
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("True", "BatchFailed")
        );
        assert_mentions(&condition.message, &["batch 0", "canary", &reason], "halt");
        let lines = worker_lines(env, &namespace, &canary.name_any()).await;
        assert!(
            lines
                .iter()
                .any(|l| l["eventId"] == refs[1] && l["outcome"] == "refused"),
            "the worker says which event was refused: {lines:?}"
        );
        assert_eq!(
            halted.status.as_ref().and_then(|s| s.batches_failed),
            Some(1)
        );

        // Nudging it (suspend, resume) does not bring it back.
        patch_as(
            &alice,
            &namespace,
            "orders",
            json!({"spec": {"suspend": true}}),
        )
        .await
        .expect("suspend");
        let resumed = patch_as(
            &alice,
            &namespace,
            "orders",
            json!({"spec": {"suspend": false}}),
        )
        .await
        .expect("resume");
        let generation = resumed.metadata.generation;
        let replay = wait_until(STEP, "the operator saw the resume", || async {
            let replay = get_replay(&alice, &namespace, "orders").await;
            let seen = replay.status.as_ref().and_then(|s| s.observed_generation);
            if seen >= generation {
                Ok(replay)
            } else {
                Err(format!("observed {seen:?}"))
            }
        })
        .await;
        assert_eq!(phase(&replay), Some(ReplayPhase::Halted));
        let jobs = jobs_of(&admin, &namespace, "orders").await;
        assert_eq!(
            jobs.keys().collect::<Vec<_>>(),
            ["canary"],
            "no main Job after a failed canary"
        );
        assert_eq!(jobs["canary"].len(), 1);
    });
    assert_no_reconcile_errors(&operator);
}

fn a_failed_verification_halts_without_a_main_job(env: &TestEnv) {
    set_up(env);
    let namespace = env.fresh_restricted_namespace("replay-verify-fails");
    let duplicates = Duplicates::start(env, &namespace, 3.0);
    let operator = start_operator(env, &namespace);
    let (alice, admin) = (env.client("alice"), env.admin());
    let list = ids("evt", 6);
    let refs: Vec<&str> = list.iter().map(String::as_str).collect();
    env.block_on(async {
        let canary = approved_until_canary(
            env,
            &namespace,
            "orders",
            replay_body("orders", "alice", &refs, Some(&duplicates.check())),
        )
        .await;
        wait_job_finished(env, &namespace, &canary).await;
        let halted = wait_phase(&alice, &namespace, "orders", ReplayPhase::Halted).await;
        let halt = condition(&halted, "Halted").expect("Halted condition");
        assert_eq!(halt.reason, "VerificationFailed");
        assert_mentions(&halt.message, &["no-duplicates", "returned 0"], "halt");
        assert_eq!(
            condition(&halted, "Verified").map(|c| c.status.as_str()),
            Some("False")
        );
        let checks = halted.status.clone().expect("status").verification;
        assert_eq!(
            (checks[0].result.as_str(), checks[0].value),
            ("Fails", Some(0.0))
        );
        let jobs = jobs_of(&admin, &namespace, "orders").await;
        assert_eq!(
            jobs.keys().collect::<Vec<_>>(),
            ["canary"],
            "no main Job after a failed check"
        );
    });
    assert_no_reconcile_errors(&operator);
    duplicates.stop(env);
}

fn suspend_and_resume_toggle_the_running_job(env: &TestEnv) {
    set_up(env);
    let namespace = env.fresh_restricted_namespace("replay-suspend");
    let operator = start_operator(env, &namespace);
    let (alice, admin) = (env.client("alice"), env.admin());
    env.block_on(async {
        // The canary's worker waits a minute after its batch: it is still running when
        // alice suspends.
        let mut body = replay_body("orders", "alice", &["a", "b", "c"], None);
        body["spec"]["batches"]["pauseBetween"] = json!("60s");
        let canary = approved_until_canary(env, &namespace, "orders", body).await;
        let jobs = Api::<Job>::namespaced(admin.clone(), &namespace);
        let suspended_is = |want: bool| {
            let jobs = jobs.clone();
            let name = canary.name_any();
            async move {
                let job = jobs.get(&name).await.expect("the canary Job");
                job.spec.and_then(|s| s.suspend) == Some(want)
            }
        };
        // Created suspended, resumed once its uid is recorded.
        wait_until(
            Duration::from_secs(10),
            "the operator resumes the canary Job it created suspended",
            || suspended_is(false),
        )
        .await;
        let pods = Api::<Pod>::namespaced(admin.clone(), &namespace);
        let selector = format!("batch.kubernetes.io/job-name={}", canary.name_any());
        let running_pods = || {
            let (pods, selector) = (pods.clone(), selector.clone());
            async move {
                pods.list(&ListParams::default().labels(&selector))
                    .await
                    .map(|l| {
                        l.items
                            .into_iter()
                            .filter(|p| {
                                p.metadata.deletion_timestamp.is_none()
                                    && p.status.as_ref().and_then(|s| s.phase.as_deref())
                                        == Some("Running")
                            })
                            .map(|p| p.name_any())
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default()
            }
        };
        let first = wait_until(JOB_RUN, "the canary's worker pod runs", || async {
            running_pods().await.into_iter().next()
        })
        .await;

        patch_as(
            &alice,
            &namespace,
            "orders",
            json!({"spec": {"suspend": true}}),
        )
        .await
        .expect("alice suspends");
        wait_until(STEP, "the Job is suspended", || suspended_is(true)).await;
        // The Job controller ends the running pod of a suspended Job.
        wait_until(STEP, "the worker pod is gone", || async {
            let all = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .map(|l| {
                    l.items
                        .into_iter()
                        .map(|p| p.name_any())
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            (!all.contains(&first)).then_some(()).ok_or(all)
        })
        .await;
        let replay = wait_phase(&alice, &namespace, "orders", ReplayPhase::Suspended).await;
        assert_mentions(
            replay
                .status
                .and_then(|s| s.message)
                .as_deref()
                .unwrap_or_default(),
            &["spec.suspend"],
            "suspended",
        );

        patch_as(
            &alice,
            &namespace,
            "orders",
            json!({"spec": {"suspend": false}}),
        )
        .await
        .expect("alice resumes");
        wait_until(STEP, "the Job runs again", || suspended_is(false)).await;
        let second = wait_until(JOB_RUN, "a new worker pod runs", || async {
            running_pods().await.into_iter().next()
        })
        .await;
        assert_ne!(
            first, second,
            "resuming starts the batch again in a new pod"
        );
        wait_phase(&alice, &namespace, "orders", ReplayPhase::Canary).await;
        assert_eq!(
            jobs_of(&admin, &namespace, "orders").await["canary"].len(),
            1
        );
    });
    assert_no_reconcile_errors(&operator);
}

fn the_scope_is_frozen_from_its_source_and_cannot_be_edited(env: &TestEnv) {
    set_up(env);
    let namespace = env.fresh_restricted_namespace("replay-scope");
    let operator = start_operator(env, &namespace);
    let (alice, bob, admin) = (env.client("alice"), env.client("bob"), env.admin());
    let list = ids("dlq", 4);
    env.block_on(async {
        let mut body = replay_body("orders", "alice", &[], None);
        body["spec"]["scope"] = json!({"eventType": "order.created", "eventIdsFrom": {"name": "dead-letters", "key": "ids"}});
        create_as(&alice, &namespace, body).await.expect("alice creates");
        // The source does not exist yet: the replay says which field and what to do.
        let pending = wait_phase(&alice, &namespace, "orders", ReplayPhase::Pending).await;
        let frozen = condition(&pending, "ScopeFrozen").expect("ScopeFrozen");
        assert_eq!(frozen.status, "False");
        assert_mentions(&frozen.message, &["spec.scope.eventIdsFrom", "dead-letters", "ids"], "pending");

        let source = Api::<ConfigMap>::namespaced(alice.clone(), &namespace);
        let text: String = list.iter().map(|id| format!("{id}\n")).collect();
        let config_map: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "dead-letters"},
            "data": {"ids": text},
        }))
        .expect("a ConfigMap");
        source
            .create(&PostParams::default(), &config_map)
            .await
            .expect("alice lists the dead letters");
        let replay = wait_phase(&alice, &namespace, "orders", ReplayPhase::AwaitingApproval).await;
        let scope = replay.status.clone().and_then(|s| s.scope).expect("frozen");
        assert_eq!(scope.count, 4);

        // Later edits of the source change nothing.
        source
            .patch(
                "dead-letters",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"ids": format!("{text}dlq-9999\n")}})),
            )
            .await
            .expect("the source is edited");
        // The scope itself cannot be edited.
        let message = refused(
            patch_as(&alice, &namespace, "orders", json!({"spec": {"scope": {"eventIdsFrom": {"name": "other", "key": "ids"}}}})).await,
            "editing the scope",
        );
        assert_mentions(&message, &["spec.scope", "immutable"], "scope edit");

        approve_as(&bob, &namespace, "orders", "bob").await.expect("bob approves");
        let canary = wait_stage_job(&admin, &namespace, "orders", "canary").await;
        let frozen = Api::<ConfigMap>::namespaced(admin.clone(), &namespace)
            .get(&scope.config_map)
            .await
            .expect("the frozen scope");
        assert_eq!(frozen.data.and_then(|d| d.get(EVENT_IDS_KEY).cloned()), Some(text));
        let replay = get_replay(&alice, &namespace, "orders").await;
        assert_eq!(replay.status.and_then(|s| s.scope), Some(scope.clone()));
        let pod = canary.spec.and_then(|s| s.template.spec).expect("pod");
        assert!(
            pod.volumes
                .iter()
                .flatten()
                .any(|v| v.config_map.as_ref().map(|c| c.name.as_str()) == Some(scope.config_map.as_str())),
            "the canary mounts the frozen copy, not the source"
        );
    });
    assert_no_reconcile_errors(&operator);
}

fn a_second_replay_of_the_same_source_waits_for_the_first(env: &TestEnv) {
    set_up(env);
    let namespace = env.fresh_restricted_namespace("replay-queue");
    let operator = start_operator(env, &namespace);
    let (alice, bob, admin) = (env.client("alice"), env.client("bob"), env.admin());
    env.block_on(async {
        // Each batch of the first waits 8s after replaying: it runs while the second asks.
        let mut first = replay_body("first", "alice", &["a", "b", "c"], None);
        first["spec"]["batches"]["pauseBetween"] = json!("8s");
        let canary = approved_until_canary(env, &namespace, "first", first).await;

        let mut second = replay_body("second", "alice", &["x", "y"], None);
        second["spec"]["batches"]["pauseBetween"] = json!("3s");
        create_as(&alice, &namespace, second).await.expect("second");
        approve_as(&bob, &namespace, "second", "bob")
            .await
            .expect("approve second");
        let waiting = wait_until(
            STEP,
            "the second replay waits, naming the first",
            || async {
                let replay = get_replay(&alice, &namespace, "second").await;
                match condition(&replay, "Waiting") {
                    Some(c) if c.status == "True" => Ok(replay),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
        assert_eq!(phase(&waiting), Some(ReplayPhase::Approved));
        let message = condition(&waiting, "Waiting")
            .map(|c| c.message.clone())
            .unwrap_or_default();
        assert_mentions(
            &message,
            &[&format!("{namespace}/first"), SOURCE],
            "waiting",
        );
        assert!(jobs_of(&admin, &namespace, "second").await.is_empty());

        // The first one ends: the second starts.
        wait_job_finished(env, &namespace, &canary).await;
        let main = wait_stage_job(&admin, &namespace, "first", "main").await;
        wait_job_finished(env, &namespace, &main).await;
        wait_phase(&alice, &namespace, "first", ReplayPhase::Succeeded).await;
        wait_stage_job(&admin, &namespace, "second", "canary").await;
        let second = wait_started(&alice, &namespace, "second").await;
        assert_eq!(
            condition(&second, "Waiting").map(|c| c.status.as_str()),
            Some("False")
        );
    });
    assert_no_reconcile_errors(&operator);
}

fn a_restarted_operator_creates_one_job_per_stage(env: &TestEnv) {
    set_up(env);
    let namespace = env.fresh_restricted_namespace("replay-restart");
    let (alice, admin) = (env.client("alice"), env.admin());
    let list = ids("evt", 9);
    let refs: Vec<&str> = list.iter().map(String::as_str).collect();
    let mut operator = start_operator(env, &namespace);
    // Each batch waits 3s after replaying: the main stage runs long enough to be seen running.
    let mut body = replay_body("orders", "alice", &refs, None);
    body["spec"]["batches"]["pauseBetween"] = json!("3s");
    let canary = env.block_on(async {
        let canary = approved_until_canary(env, &namespace, "orders", body).await;
        wait_job_recorded(&alice, &namespace, "orders", "canary", &canary).await;
        wait_job_released(&admin, &namespace, &canary).await;
        canary
    });
    // Stopped like a crash, between the stages (after the canary's uid was recorded and the
    // Job resumed): the canary completes meanwhile.
    operator.stop();
    env.block_on(wait_job_finished(env, &namespace, &canary));
    let mut operator = start_operator(env, &namespace);
    let main = env.block_on(async {
        let main = wait_stage_job(&admin, &namespace, "orders", "main").await;
        wait_phase(&alice, &namespace, "orders", ReplayPhase::Running).await;
        wait_job_recorded(&alice, &namespace, "orders", "main", &main).await;
        wait_job_released(&admin, &namespace, &main).await;
        main
    });
    operator.stop();
    // A third start with nothing new: it finds both Jobs and creates neither again.
    let operator = start_operator(env, &namespace);
    env.block_on(async {
        wait_job_finished(env, &namespace, &main).await;
        wait_phase(&alice, &namespace, "orders", ReplayPhase::Succeeded).await;
        let jobs = jobs_of(&admin, &namespace, "orders").await;
        assert_eq!(jobs.len(), 2, "{:?}", jobs.keys());
        assert_eq!(jobs["canary"].len(), 1);
        assert_eq!(jobs["main"].len(), 1);
        assert_eq!(
            jobs["canary"][0].uid(),
            canary.uid(),
            "the canary Job was never replaced"
        );
        assert_eq!(
            jobs["main"][0].uid(),
            main.uid(),
            "the main Job was never replaced"
        );
        assert_eq!(all_jobs(&admin, &namespace).await.len(), 2);
    });
    assert_no_reconcile_errors(&operator);
}

fn the_jobs_indices_cover_every_id_exactly_once(env: &TestEnv) {
    set_up(env);
    let namespace = env.fresh_restricted_namespace("replay-cover");
    let operator = start_operator(env, &namespace);
    let (alice, admin) = (env.client("alice"), env.admin());
    let list = ids("evt", 23);
    let refs: Vec<&str> = list.iter().map(String::as_str).collect();
    env.block_on(async {
        let mut body = replay_body("orders", "alice", &refs, None);
        body["spec"]["batches"] = json!({"size": 4, "canary": 3, "ratePerSecond": 50});
        let canary = approved_until_canary(env, &namespace, "orders", body).await;
        wait_job_finished(env, &namespace, &canary).await;
        let main = wait_stage_job(&admin, &namespace, "orders", "main").await;

        let replay = get_replay(&alice, &namespace, "orders").await;
        let config_map = replay
            .status
            .and_then(|s| s.scope)
            .expect("scope")
            .config_map;
        let frozen = Api::<ConfigMap>::namespaced(admin.clone(), &namespace)
            .get(&config_map)
            .await
            .expect("frozen ids")
            .data
            .and_then(|d| d.get(EVENT_IDS_KEY).cloned())
            .expect("ids");
        let lines: Vec<&str> = frozen.lines().collect();
        assert_eq!(lines, refs, "the frozen file is the list, in order");

        // Replay what the worker would: for every index of every Job, its slice of the file.
        let mut replayed: Vec<&str> = Vec::new();
        let mut batches = Vec::new();
        for job in [&canary, &main] {
            let vars = env_of(job);
            let (first, count, size, first_batch) = (
                number(&vars, "REPLAY_FIRST_EVENT"),
                number(&vars, "REPLAY_EVENT_COUNT"),
                number(&vars, "REPLAY_BATCH_SIZE"),
                number(&vars, "REPLAY_FIRST_BATCH"),
            );
            let completions = job
                .spec
                .as_ref()
                .and_then(|s| s.completions)
                .expect("completions") as usize;
            for index in 0..completions {
                let start = first + index * size;
                let end = (start + size).min(first + count);
                assert!(start < end, "index {index} of {} is empty", job.name_any());
                replayed.extend(&lines[start..end]);
                batches.push(first_batch + index);
            }
        }
        assert_eq!(replayed, refs, "every id exactly once, in order");
        assert_eq!(
            batches,
            (0..batches.len()).collect::<Vec<_>>(),
            "batches numbered 0..n"
        );
        assert_eq!(
            batches.len(),
            1 + 5,
            "a canary of 3 and 20 ids in batches of 4"
        );

        // And what the workers did: every id exactly once, in order, with its batch number.
        wait_job_finished(env, &namespace, &main).await;
        let mut done = Vec::new();
        for job in [&canary, &main] {
            done.extend(worker_lines(env, &namespace, &job.name_any()).await);
        }
        let done_ids: Vec<&str> = done.iter().filter_map(|l| l["eventId"].as_str()).collect();
        assert_eq!(
            done_ids, refs,
            "the workers replayed every id once, in order"
        );
        let done_batches: Vec<u64> = done.iter().filter_map(|l| l["batch"].as_u64()).collect();
        let expected: Vec<u64> = replayed_batches(&batches, &lines, &[3, 4, 4, 4, 4, 4]);
        assert_eq!(done_batches, expected);
    });
    assert_no_reconcile_errors(&operator);
}

fn a_template_the_api_server_refuses_is_reported_before_the_start(env: &TestEnv) {
    set_up(env);
    let namespace = env.fresh_restricted_namespace("replay-bad-template");
    let operator = start_operator(env, &namespace);
    let (alice, bob, admin) = (env.client("alice"), env.client("bob"), env.admin());
    env.block_on(async {
        let mut body = replay_body("orders", "alice", &["a", "b", "c"], None);
        // The CRD checks only names and images in the pod template; the Job's validation
        // finds a pull policy that does not exist.
        body["spec"]["template"] = json!({"spec": {"containers": [{
            "name": "replay",
            "image": support::image("backlog-replay-worker"),
            "imagePullPolicy": "Sometimes"
        }]}});
        create_as(&alice, &namespace, body).await.expect("alice creates");
        approve_as(&bob, &namespace, "orders", "bob").await.expect("bob approves");
        let refused = wait_phase(&alice, &namespace, "orders", ReplayPhase::Refused).await;
        let accepted = condition(&refused, "JobAccepted").expect("JobAccepted condition");
        assert_eq!(accepted.status, "False");
        assert_mentions(&accepted.message, &["spec.template", "imagePullPolicy"], "refused template");
        let status = refused.status.clone().expect("status");
        assert!(status.stages.iter().all(|s| s.started_at.is_none()), "nothing started");
        assert!(all_jobs(&admin, &namespace).await.is_empty(), "no Job");

        // Not started, so the approval can still be withdrawn and the template fixed.
        patch_as(&bob, &namespace, "orders", json!({"spec": {"approval": null}}))
            .await
            .expect("bob withdraws");
        patch_as(&alice, &namespace, "orders", json!({"spec": {"template": {"spec": {"containers": [{"name": "replay", "image": support::image("backlog-replay-worker")}]}}}}))
            .await
            .expect("alice fixes the template");
        approve_as(&bob, &namespace, "orders", "bob").await.expect("bob approves again");
        wait_stage_job(&admin, &namespace, "orders", "canary").await;
        let running = wait_started(&alice, &namespace, "orders").await;
        wait_until(STEP, "the Job counts as accepted", || async {
            let replay = get_replay(&alice, &namespace, "orders").await;
            condition(&replay, "JobAccepted").map(|c| c.status.clone()) == Some("True".to_owned())
        })
        .await;
        assert!(running.status.is_some());
    });
    assert_no_reconcile_errors(&operator);
}

fn a_main_stage_job_the_api_server_refuses_is_refused_before_the_canary(env: &TestEnv) {
    // The longest name admitted (45 characters) and more than 100,000 batches: the canary's
    // Job is fine, but the main stage's pods, <Job>-<index>, pass the 63 characters of a DNS
    // label at index 100000. Found only at the main stage, the canary's events would have
    // been replayed by then.
    const NAME: &str = "orders-replay-for-the-schema-fix-of-release-7";
    assert_eq!(NAME.len(), 45);
    set_up(env);
    let namespace = env.fresh_restricted_namespace("replay-too-large");
    let operator = start_operator(env, &namespace);
    let (alice, bob, admin) = (env.client("alice"), env.client("bob"), env.admin());
    env.block_on(async {
        let text: String = (0..100_002).map(|i| format!("e{i:06}\n")).collect();
        let config_map: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "dead-letters"},
            "data": {"ids": text},
        }))
        .expect("a ConfigMap");
        Api::<ConfigMap>::namespaced(alice.clone(), &namespace)
            .create(&PostParams::default(), &config_map)
            .await
            .expect("alice lists the dead letters");
        let mut body = replay_body(NAME, "alice", &[], None);
        body["spec"]["scope"] = json!({"eventIdsFrom": {"name": "dead-letters", "key": "ids"}});
        body["spec"]["batches"] = json!({"size": 1, "canary": 1, "ratePerSecond": 1000});
        let created = create_as(&alice, &namespace, body)
            .await
            .expect("alice creates");
        approve_as(&bob, &namespace, NAME, "bob")
            .await
            .expect("bob approves");
        let refused = wait_phase(&alice, &namespace, NAME, ReplayPhase::Refused).await;
        let uid = created.uid().expect("uid");
        let main_job = job_name(NAME, &uid, StageName::Main);
        let status = refused.status.clone().expect("status");
        assert_mentions(
            status.message.as_deref().unwrap_or_default(),
            &[&main_job, "main stage", "Nothing has run"],
            "refused",
        );
        assert!(
            status.stages.iter().all(|s| s.started_at.is_none()),
            "nothing started"
        );
        assert!(
            all_jobs(&admin, &namespace).await.is_empty(),
            "no canary Job either"
        );
    });
    assert_no_reconcile_errors(&operator);
}

fn a_pace_no_job_can_keep_is_refused_before_the_approval(env: &TestEnv) {
    // Three events at 3e-7 per second take 115 days: the stage's Job, whose deadline is at most
    // 30 days, would be stopped part-way weeks after the start.
    set_up(env);
    let namespace = env.fresh_restricted_namespace("replay-too-slow");
    let operator = start_operator(env, &namespace);
    let (alice, admin) = (env.client("alice"), env.admin());
    env.block_on(async {
        let mut body = replay_body("orders", "alice", &["a", "b", "c"], None);
        body["spec"]["batches"]["ratePerSecond"] = json!(3e-7);
        create_as(&alice, &namespace, body)
            .await
            .expect("alice creates");
        let refused = wait_phase(&alice, &namespace, "orders", ReplayPhase::Refused).await;
        let message = refused.status.and_then(|s| s.message).unwrap_or_default();
        assert_mentions(
            &message,
            &["ratePerSecond", "30 days", "Nothing has run"],
            "refused",
        );
        assert!(all_jobs(&admin, &namespace).await.is_empty(), "no Job");
    });
    assert_no_reconcile_errors(&operator);
}

/// The batch number of each replayed line, given the batches' sizes in order.
fn replayed_batches(batches: &[usize], lines: &[&str], sizes: &[usize]) -> Vec<u64> {
    assert_eq!(sizes.iter().sum::<usize>(), lines.len());
    batches
        .iter()
        .zip(sizes)
        .flat_map(|(batch, size)| std::iter::repeat_n(*batch as u64, *size))
        .collect()
}

/// The operator is a process of its own, killed with SIGKILL at random moments while replays
/// with a canary, a verification and a main stage run on the node, and started again each time.
/// Across all kills: one Job per stage, and the workers replayed every id exactly once.
fn kill_9_at_random_points_never_duplicates_or_skips_a_batch(env: &TestEnv) {
    use rand::{RngExt, SeedableRng};
    const KILLS: usize = 20;
    const PER_WAVE: usize = 3;
    let token = set_up(env);
    let namespace = env.fresh_restricted_namespace("replay-kill9");
    env.block_on(support::identity::ensure_service_account(
        env,
        &namespace,
        WORKER_ACCOUNT,
    ));
    let duplicates = Duplicates::start(env, &namespace, 0.0);
    let (alice, bob, admin) = (env.client("alice"), env.client("bob"), env.admin());
    let seed: u64 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(7);
    let mut random = rand::rngs::StdRng::seed_from_u64(seed);
    let mut operator = OperatorProcess::start(
        env,
        Launch {
            identity: format!("{namespace}-op"),
            namespace: namespace.clone(),
            prometheus: Some(env.prometheus_url().to_owned()),
            election: None,
            // As the operator's ServiceAccount: only it may write replay status.
            kubeconfig: Some(kubeconfig_with_token(env, &token, &namespace)),
            args: Vec::new(),
        },
    );
    let mut replays: Vec<(String, Vec<String>)> = Vec::new();
    let mut kills_during_replays = 0;
    let started = std::time::Instant::now();
    env.block_on(async {
        while kills_during_replays < KILLS {
            // A wave of replays on queues of their own, so they run side by side.
            let mut running = false;
            for (name, _) in &replays {
                let replay = get_replay(&alice, &namespace, name).await;
                running |= !matches!(phase(&replay), Some(ReplayPhase::Succeeded));
            }
            if !running {
                let wave = replays.len() / PER_WAVE;
                for queue in 0..PER_WAVE {
                    let name = format!("orders-{wave}-{queue}");
                    let list = ids(&name, 7);
                    let refs: Vec<&str> = list.iter().map(String::as_str).collect();
                    let mut body = replay_body(&name, "alice", &refs, Some(&duplicates.check()));
                    body["spec"]["source"]["queue"] = json!(format!("{name}.dlq"));
                    create_as(&alice, &namespace, body).await.expect("alice creates");
                    approve_as(&bob, &namespace, &name, "bob").await.expect("bob approves");
                    replays.push((name, list));
                }
            }
            let after = Duration::from_millis(random.random_range(200..2500));
            tokio::time::sleep(after).await;
            // Only kills while a replay is under way count; otherwise the next wave starts.
            let mut under_way = false;
            for (name, _) in &replays {
                let replay = get_replay(&alice, &namespace, name).await;
                under_way |= !matches!(phase(&replay), Some(ReplayPhase::Succeeded));
            }
            if under_way {
                operator.kill();
                kills_during_replays += 1;
                operator.restart();
            }
        }
        for (name, _) in &replays {
            wait_until(JOB_RUN, &format!("ReplayJob {name} succeeds"), || async {
                let replay = get_replay(&alice, &namespace, name).await;
                match phase(&replay) {
                    Some(ReplayPhase::Succeeded) => Ok(()),
                    other => Err(format!(
                        "{other:?}: {:?}",
                        replay.status.and_then(|s| s.message)
                    )),
                }
            })
            .await;
        }
        let mut duplicate_jobs = 0;
        let mut twice = 0;
        let mut skipped = 0;
        for (name, list) in &replays {
            let jobs = jobs_of(&admin, &namespace, name).await;
            for stage in ["canary", "main"] {
                let count = jobs.get(stage).map_or(0, Vec::len);
                assert!(count >= 1, "{name} has no {stage} Job");
                duplicate_jobs += count - 1;
            }
            let mut done = Vec::new();
            for stage in ["canary", "main"] {
                for job in &jobs[stage] {
                    done.extend(replayed_ids(env, &namespace, &job.name_any()).await);
                }
            }
            for id in list {
                match done.iter().filter(|d| *d == id).count() {
                    0 => skipped += 1,
                    1 => {}
                    n => twice += n - 1,
                }
            }
            assert_eq!(&done, list, "{name}: every id exactly once, in order");
        }
        assert_eq!(
            all_jobs(&admin, &namespace).await.len(),
            2 * replays.len(),
            "one canary and one main Job per replay"
        );
        assert_eq!((duplicate_jobs, twice, skipped), (0, 0, 0));
        eprintln!(
            "fault-report: kill -9: {kills_during_replays} kills at random points (seed {seed}) during {} replays (canary, verification, main) run by the node's Job controller in {:.0}s; duplicate Jobs {duplicate_jobs}, batches run twice {twice}, batches skipped {skipped}",
            replays.len(),
            started.elapsed().as_secs_f64()
        );
    });
    duplicates.stop(env);
}
