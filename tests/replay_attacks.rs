//! A hostile tenant against replays, on the real API server with the chart installed for real
//! (namespaced mode: two tenant namespaces, worker images pinned by digest) and the operator's
//! controllers in this process as the chart's own ServiceAccount.
//!
//! mallory has a namespace's edit rights in both tenant namespaces (replays and their status,
//! budgets, ConfigMaps, Jobs, Pods) and is no approver; alice asks for replays, bob approves
//! them. Every attack is refused by the API server, or halted by the operator, with a message
//! that names what was refused. No controller-manager runs: where a Job must finish, the test
//! sets its status as the Job controller would.

mod support;

use std::io::ErrorKind;
use std::net::TcpListener;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use backlog_operator::api::BacklogBudget;
use backlog_operator::api::replay_job::{ReplayJob, ReplayPhase};
use backlog_operator::controller::replay::{EVENT_IDS_KEY, LABEL_REPLAY};
use backlog_operator::controller::{ContextSettings, Scope, WorkerPolicy};
use backlog_operator::core::digest::sha256_hex;
use backlog_operator::core::replay_plan::{StageName, job_name, scope_config_map_name};
use backlog_operator::metrics_source::Allowlist;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use support::four_eyes::{ReplayReview, review_replay};
use support::helm::Helm;
use support::identity::{client_with_token, service_account_token};
use support::operator::Operator;
use support::refusal::{assert_mentions, refused};
use support::{TestEnv, wait_until};

fn main() -> ExitCode {
    support::run(
        support::tests![
            status_patched_to_succeeded_is_refused,
            status_pointed_at_another_list_is_refused,
            status_in_a_create_is_ignored,
            an_approval_before_the_freeze_is_refused,
            an_approval_of_another_list_is_refused,
            a_config_map_swapped_after_the_approval_halts_before_the_canary,
            a_config_map_swapped_during_the_canary_halts_before_the_main_stage,
            frozen_ids_cannot_be_edited_in_place,
            a_pre_created_job_is_never_adopted,
            a_pre_created_scope_config_map_is_never_taken,
            a_replaced_job_halts,
            an_edited_job_halts_and_stays_suspended,
            the_operators_service_account_is_refused_for_workers,
            a_host_path_volume_is_refused,
            host_network_is_refused,
            a_privileged_container_is_refused,
            every_other_pod_escape_is_refused,
            a_budget_cannot_point_the_operator_at_any_url,
            a_replay_cannot_point_the_operator_at_any_url,
            a_replay_deleted_and_created_again_inherits_nothing,
            a_replay_held_in_deletion_stops_its_jobs,
            a_replay_cannot_be_parted_from_its_jobs,
            a_pod_cannot_claim_a_replay_job,
            another_namespace_cannot_hold_up_a_queue,
            a_tenant_cannot_ask_or_approve_in_anothers_name,
            an_approved_spec_cannot_be_swapped,
            an_approval_cannot_change_what_it_approves,
            an_approval_covers_only_the_spec_it_read,
            a_tenant_cannot_touch_the_policies,
            a_template_that_is_not_a_pod_template_holds_up_no_other_replay,
        ],
        false,
    )
}

const RELEASE: &str = "guard";
const OPERATOR_ACCOUNT: &str = "guard-backlog-operator";
/// The operator's Prometheus: allowed, and nothing listens there (the discard port).
const PROMETHEUS: &str = "http://127.0.0.1:9";
/// How long the operator (or the API server) may take for one step.
const STEP: Duration = Duration::from_secs(60);

/// Worker images are pinned by digest in this cluster.
fn image() -> String {
    format!(
        "registry.example.com/orders/replay-tool@sha256:{}",
        "0123456789abcdef".repeat(4)
    )
}

// ---------------------------------------------------------------------------------------------
// The cluster, once per test binary

struct World {
    /// alice's team: alice, bob and mallory work here.
    team: String,
    /// mallory's own team.
    other_team: String,
    /// The chart's release namespace.
    system: String,
    /// The operator, kept for the whole binary; dropped (stopped) with the runtime.
    _operator: Operator,
}

static WORLD: OnceLock<Result<World, String>> = OnceLock::new();

fn world(env: &TestEnv) -> &World {
    match WORLD.get_or_init(|| build(env)) {
        Ok(world) => world,
        Err(problem) => panic!("setting up the attack cluster: {problem}"),
    }
}

fn build(env: &TestEnv) -> Result<World, String> {
    let system = env.fresh_namespace("backlog-system");
    let team = env.fresh_namespace("tenant-a");
    let other_team = env.fresh_namespace("tenant-b");
    let home = env.cluster().state_dir().join("replay-attacks-helm");
    let helm = Helm::new(env, home, env.kubeconfig_path());
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/backlog-operator");
    let watch = format!("watchNamespaces={{{team},{other_team}}}");
    let prometheus = format!("prometheusUrl={PROMETHEUS}");
    helm.run(&[
        "install",
        RELEASE,
        &chart.to_string_lossy(),
        "--namespace",
        &system,
        "--skip-crds",
        "--set",
        &watch,
        "--set",
        &prometheus,
        "--set",
        "replay.requireImageDigest=true",
    ])?;
    env.block_on(async {
        for namespace in [&team, &other_team] {
            grant(env, namespace).await;
        }
        let token = service_account_token(env, &system, OPERATOR_ACCOUNT).await;
        let settings = ContextSettings {
            allowlist: Allowlist::new(&[], Some(PROMETHEUS)).map_err(|e| e.to_string())?,
            worker_policy: WorkerPolicy {
                service_accounts: vec!["replay-worker".to_owned()],
                require_image_digest: true,
            },
            ..ContextSettings::defaults(Some(PROMETHEUS.to_owned()), Duration::from_secs(2), 8)
        };
        let operator = Operator::with_settings(
            env,
            client_with_token(env, &token),
            vec![
                Scope::Namespace(team.clone()),
                Scope::Namespace(other_team.clone()),
            ],
            settings,
        );
        // The chart's policies are enforced once a create on someone else's behalf is refused.
        let probe = replay("probe", "bob", "probe.dlq", &["a"]);
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let replays = Api::<ReplayJob>::namespaced(env.client("alice"), &team);
        wait_until(STEP, "the chart's policies are enforced", || async {
            let probe: ReplayJob = serde_json::from_value(probe.clone()).expect("a ReplayJob");
            match replays.create(&dry_run, &probe).await {
                Err(kube::Error::Api(status))
                    if status.message.contains("spec.requestedBy must be the user") =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        Ok(World {
            team,
            other_team,
            system,
            _operator: operator,
        })
    })
}

/// mallory gets a namespace's edit rights (what the built-in edit role gives for these
/// kinds; its rules are aggregated by a controller-manager, which this cluster does not run);
/// alice and bob may work with replays (the policies decide who may do which).
async fn grant(env: &TestEnv, namespace: &str) {
    let objects = json!([
        {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "tenant-edit"},
            "rules": [
                {"apiGroups": ["backlog.dev"], "resources": ["replayjobs", "replayjobs/status", "backlogbudgets", "backlogbudgets/status", "retrypolicies", "retrypolicies/status"], "verbs": ["*"]},
                {"apiGroups": [""], "resources": ["configmaps", "pods", "serviceaccounts"], "verbs": ["*"]},
                {"apiGroups": ["batch"], "resources": ["jobs", "jobs/status"], "verbs": ["*"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "tenant-edit"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant-edit"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "mallory"}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "replay-users"},
            "rules": [
                {"apiGroups": ["backlog.dev"], "resources": ["replayjobs"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "create"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "replay-users"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "replay-users"},
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"},
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"},
            ],
        },
    ]);
    for object in objects.as_array().into_iter().flatten() {
        let kind = object["kind"].as_str().unwrap_or_default();
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let params = PatchParams::apply("replay-attacks").force();
        let result = match kind {
            "Role" => Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(env.admin(), namespace)
                .patch(name, &params, &Patch::Apply(object))
                .await
                .map(|_| ()),
            _ => Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(env.admin(), namespace)
                .patch(name, &params, &Patch::Apply(object))
                .await
                .map(|_| ()),
        };
        result.unwrap_or_else(|e| panic!("{kind} {namespace}/{name}: {e}"));
    }
}

// ---------------------------------------------------------------------------------------------
// Objects and requests

/// A replay of `ids` from `queue`, one canary event then batches of two.
fn replay(name: &str, requested_by: &str, queue: &str, ids: &[&str]) -> Value {
    json!({
        "apiVersion": "backlog.dev/v1alpha1",
        "kind": "ReplayJob",
        "metadata": {"name": name},
        "spec": {
            "source": {"queue": queue},
            "scope": {"eventIds": ids},
            "reason": "refund.requested events failed before the fix",
            "requestedBy": requested_by,
            "batches": {"size": 2, "canary": 1, "ratePerSecond": 5},
            "template": {"spec": {"containers": [{"name": "replay", "image": image()}]}},
        }
    })
}

/// alice asks for a suspended replay of one event from `queue`: approving it starts nothing.
async fn alice_asks_suspended(env: &TestEnv, namespace: &str, name: &str, queue: &str) {
    let mut body = replay(name, "alice", queue, &["e-1"]);
    body["spec"]["suspend"] = json!(true);
    create(&env.client("alice"), namespace, body)
        .await
        .expect("alice asks");
}

async fn create(client: &Client, namespace: &str, body: Value) -> Result<ReplayJob, kube::Error> {
    let replay: ReplayJob = serde_json::from_value(body).expect("a ReplayJob");
    Api::<ReplayJob>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &replay)
        .await
}

async fn patch(
    client: &Client,
    namespace: &str,
    name: &str,
    body: Value,
) -> Result<ReplayJob, kube::Error> {
    Api::<ReplayJob>::namespaced(client.clone(), namespace)
        .patch(name, &PatchParams::default(), &Patch::Merge(body))
        .await
}

async fn patch_status(
    client: &Client,
    namespace: &str,
    name: &str,
    body: Value,
) -> Result<ReplayJob, kube::Error> {
    Api::<ReplayJob>::namespaced(client.clone(), namespace)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(body))
        .await
}

fn lines(ids: &[&str]) -> String {
    ids.iter().map(|id| format!("{id}\n")).collect()
}

async fn get(client: &Client, namespace: &str, name: &str) -> ReplayJob {
    Api::<ReplayJob>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("reading ReplayJob {namespace}/{name}: {e}"))
}

fn condition<'a>(replay: &'a ReplayJob, type_: &str) -> Option<&'a Condition> {
    replay
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

async fn wait_phase(env: &TestEnv, namespace: &str, name: &str, want: ReplayPhase) -> ReplayJob {
    let admin = env.admin();
    wait_until(STEP, &format!("ReplayJob {name} is {want:?}"), || async {
        let replay = get(&admin, namespace, name).await;
        let status = replay.status.clone().unwrap_or_default();
        if status.phase == Some(want) {
            Ok(replay)
        } else {
            Err(format!("{:?}: {:?}", status.phase, status.message))
        }
    })
    .await
}

/// Waits until the replay halts; its Halted condition.
async fn wait_halt(env: &TestEnv, namespace: &str, name: &str) -> Condition {
    let replay = wait_phase(env, namespace, name, ReplayPhase::Halted).await;
    condition(&replay, "Halted")
        .cloned()
        .expect("a Halted condition")
}

/// Waits until ReplayJob `name` no longer exists.
async fn wait_gone(env: &TestEnv, namespace: &str, name: &str) {
    let admin = env.admin();
    wait_until(STEP, &format!("ReplayJob {name} is gone"), || async {
        Api::<ReplayJob>::namespaced(admin.clone(), namespace)
            .get_opt(name)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
}

/// The frozen scope's sha256 and ConfigMap, once frozen.
async fn frozen(env: &TestEnv, namespace: &str, name: &str) -> (String, String) {
    let admin = env.admin();
    wait_until(
        STEP,
        &format!("ReplayJob {name}'s scope is frozen"),
        || async {
            let scope = get(&admin, namespace, name).await.status?.scope?;
            Some((scope.sha256, scope.config_map))
        },
    )
    .await
}

/// bob approves the frozen list and the spec, as he reads them now.
async fn approve(env: &TestEnv, namespace: &str, name: &str) -> Result<ReplayJob, kube::Error> {
    let review = review_replay(&env.admin(), namespace, name).await;
    patch(
        &env.client("bob"),
        namespace,
        name,
        review.approval("bob", "CAB-7"),
    )
    .await
}

async fn job(env: &TestEnv, namespace: &str, name: &str) -> Option<Job> {
    Api::<Job>::namespaced(env.admin(), namespace)
        .get_opt(name)
        .await
        .expect("read a Job")
}

/// `Some(())` once Job `name` exists and is suspended.
async fn suspended(env: &TestEnv, namespace: &str, name: String) -> Option<()> {
    job(env, namespace, &name)
        .await?
        .spec?
        .suspend
        .filter(|s| *s)
        .map(|_| ())
}

/// alice asks for `name`, bob approves it, the canary Job is created and its uid recorded.
async fn running_canary(env: &TestEnv, namespace: &str, name: &str, queue: &str) -> Job {
    create(
        &env.client("alice"),
        namespace,
        replay(name, "alice", queue, &["e-1", "e-2", "e-3"]),
    )
    .await
    .expect("alice asks");
    approve(env, namespace, name).await.expect("bob approves");
    let admin = env.admin();
    wait_until(STEP, "the canary Job is created and recorded", || async {
        let replay = get(&admin, namespace, name).await;
        let uid = replay.uid()?;
        let recorded = replay
            .status?
            .stages
            .into_iter()
            .find(|s| s.name == "canary")?
            .job_uid?;
        let found = job(env, namespace, &job_name(name, &uid, StageName::Canary)).await?;
        (found.uid() == Some(recorded)).then_some(found)
    })
    .await
}

/// Every index of the Job succeeded, as the Job controller would record it.
async fn succeed(env: &TestEnv, namespace: &str, job: &Job) {
    let now = Timestamp::now().to_string();
    let completions = job.spec.as_ref().and_then(|s| s.completions).unwrap_or(1);
    let indexes = if completions > 1 {
        format!("0-{}", completions - 1)
    } else {
        "0".to_owned()
    };
    let condition = |type_: &str| {
        json!({"type": type_, "status": "True", "reason": "CompletionsReached",
               "lastTransitionTime": now, "lastProbeTime": now})
    };
    let status = json!({"status": {
        "startTime": now, "completionTime": now, "completedIndexes": indexes,
        "succeeded": completions,
        "conditions": [condition("SuccessCriteriaMet"), condition("Complete")],
    }});
    Api::<Job>::namespaced(env.admin(), namespace)
        .patch_status(
            &job.name_any(),
            &PatchParams::default(),
            &Patch::Merge(status),
        )
        .await
        .unwrap_or_else(|e| panic!("completing Job {}: {e}", job.name_any()));
}

/// mallory deletes the frozen ConfigMap and puts one of her own under its name, with other ids,
/// immutable, claiming the same owner.
async fn swap_frozen_config_map(env: &TestEnv, namespace: &str, replay: &ReplayJob, name: &str) {
    let config_maps = Api::<ConfigMap>::namespaced(env.client("mallory"), namespace);
    let original = config_maps
        .get(name)
        .await
        .expect("mallory reads the frozen ids");
    config_maps
        .delete(name, &DeleteParams::default())
        .await
        .expect("mallory deletes the frozen ConfigMap (she may: edit rights)");
    let forged: ConfigMap = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": original.labels(),
            "annotations": original.annotations(),
            "ownerReferences": [{
                "apiVersion": "backlog.dev/v1alpha1", "kind": "ReplayJob",
                "name": replay.name_any(), "uid": replay.uid(), "controller": true,
            }],
        },
        "data": {EVENT_IDS_KEY: lines(&["e-1", "victim-1", "victim-2"])},
        "immutable": true,
    }))
    .expect("a ConfigMap");
    config_maps
        .create(&PostParams::default(), &forged)
        .await
        .expect("mallory creates her list under the same name");
}

/// A listener standing for whatever an address could reach, counting connections.
struct Target {
    address: String,
    connections: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Target {
    fn start() -> Target {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("non-blocking");
        let address = format!("http://{}", listener.local_addr().expect("address"));
        let connections = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, done) = (connections.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok(_) => {
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(_) => break,
                }
            }
        });
        Target {
            address,
            connections,
            stop,
            thread: Some(thread),
        }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Status belongs to the operator

fn status_patched_to_succeeded_is_refused(env: &TestEnv) {
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        create(&env.client("alice"), ns, replay("done", "alice", "a01.dlq", &["e-1", "e-2"]))
            .await
            .expect("alice asks");
        wait_phase(env, ns, "done", ReplayPhase::AwaitingApproval).await;
        let forged = json!({"status": {
            "phase": "Succeeded",
            "batchesSucceeded": 2,
            "conditions": [{"type": "Verified", "status": "True", "reason": "ChecksHeld",
                            "message": "forged", "lastTransitionTime": Timestamp::now().to_string()}],
        }});
        let message = refused(
            patch_status(&env.client("mallory"), ns, "done", forged).await,
            "mallory marking a replay Succeeded",
        );
        assert_mentions(
            &message,
            &["status of ReplayJob done is written only by the operator", "not by mallory"],
            "status",
        );
        let replay = get(&env.admin(), ns, "done").await;
        assert_eq!(
            replay.status.and_then(|s| s.phase),
            Some(ReplayPhase::AwaitingApproval)
        );
    });
}

fn status_pointed_at_another_list_is_refused(env: &TestEnv) {
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        create(
            &env.client("alice"),
            ns,
            replay("scoped", "alice", "a02.dlq", &["e-1", "e-2"]),
        )
        .await
        .expect("alice asks");
        let (sha, config_map) = frozen(env, ns, "scoped").await;
        // A list of her own, then the status pointed at it: the approver would sign her sha.
        let hers = lines(&["e-1", "victim-1"]);
        let list: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": "mallory-ids"}, "data": {EVENT_IDS_KEY: hers}}),
        )
        .expect("a ConfigMap");
        Api::<ConfigMap>::namespaced(env.client("mallory"), ns)
            .create(&PostParams::default(), &list)
            .await
            .expect("mallory writes a list");
        let forged = json!({"status": {"scope": {
            "configMap": "mallory-ids", "count": 2, "sha256": sha256_hex(hers.as_bytes()),
            "frozenAt": Timestamp::now().to_string(),
        }}});
        let message = refused(
            patch_status(&env.client("mallory"), ns, "scoped", forged).await,
            "mallory pointing status.scope at her list",
        );
        assert_mentions(
            &message,
            &["written only by the operator", "not by mallory"],
            "scope",
        );
        // Nor can she un-halt or unlock anything by removing conditions.
        let message = refused(
            patch_status(
                &env.client("mallory"),
                ns,
                "scoped",
                json!({"status": {"conditions": null}}),
            )
            .await,
            "mallory clearing the conditions",
        );
        assert_mentions(&message, &["written only by the operator"], "conditions");
        let scope = get(&env.admin(), ns, "scoped")
            .await
            .status
            .and_then(|s| s.scope)
            .expect("scope");
        assert_eq!((scope.sha256, scope.config_map), (sha, config_map));
    });
}

fn status_in_a_create_is_ignored(env: &TestEnv) {
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        let mut body = replay("preset", "mallory", "a03.dlq", &["e-1"]);
        body["status"] = json!({"phase": "Succeeded", "scope": {
            "configMap": "mallory-ids", "count": 1, "sha256": "0".repeat(64),
            "frozenAt": Timestamp::now().to_string(),
        }});
        let created = create(&env.client("mallory"), ns, body)
            .await
            .expect("mallory creates her own replay");
        assert!(
            created.status.is_none(),
            "the API server drops status on create: {:?}",
            created.status
        );
        let (_, config_map) = frozen(env, ns, "preset").await;
        assert_eq!(
            config_map,
            scope_config_map_name("preset", &created.uid().expect("uid")),
            "the operator froze its own list"
        );
        wait_phase(env, ns, "preset", ReplayPhase::AwaitingApproval).await;
    });
}

// ---------------------------------------------------------------------------------------------
// The approval signs the frozen scope

fn an_approval_before_the_freeze_is_refused(env: &TestEnv) {
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        let mut body = replay("early", "alice", "a04.dlq", &[]);
        body["spec"]["scope"] = json!({"eventIdsFrom": {"name": "a04-ids", "key": "ids"}});
        create(&env.client("alice"), ns, body).await.expect("alice asks");
        wait_phase(env, ns, "early", ReplayPhase::Pending).await;
        // Approved now, the list created after the approval could hold anything.
        let message = refused(
            patch(
                &env.client("bob"),
                ns,
                "early",
                json!({"spec": {"approval": {"approvedBy": "bob", "scopeSha256": sha256_hex(b"e-1\n"), "specSha256": sha256_hex(b"{}")}}}),
            )
            .await,
            "bob approving before the freeze",
        );
        assert_mentions(&message, &["spec.approval is refused before the scope is frozen"], "early");
    });
}

fn an_approval_of_another_list_is_refused(env: &TestEnv) {
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        create(
            &env.client("alice"),
            ns,
            replay("other-list", "alice", "a05.dlq", &["e-1", "e-2"]),
        )
        .await
        .expect("alice asks");
        let review = review_replay(&env.admin(), ns, "other-list").await;
        let (sha, config_map) = (review.scope_sha256.clone(), review.config_map.clone());
        let other = ReplayReview {
            scope_sha256: sha256_hex(b"e-1\nvictim-1\n"),
            ..review
        };
        let message = refused(
            patch(
                &env.client("bob"),
                ns,
                "other-list",
                other.approval("bob", "CAB-7"),
            )
            .await,
            "bob approving another list",
        );
        assert_mentions(
            &message,
            &[
                "spec.approval.scopeSha256 must equal status.scope.sha256",
                &sha,
                &config_map,
            ],
            "sha",
        );
    });
}

fn a_config_map_swapped_after_the_approval_halts_before_the_canary(env: &TestEnv) {
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        let mut body = replay("swap-early", "alice", "a06.dlq", &["e-1", "e-2", "e-3"]);
        body["spec"]["suspend"] = json!(true);
        let created = create(&env.client("alice"), ns, body)
            .await
            .expect("alice asks");
        approve(env, ns, "swap-early").await.expect("bob approves");
        wait_phase(env, ns, "swap-early", ReplayPhase::Suspended).await;
        let (_, config_map) = frozen(env, ns, "swap-early").await;
        swap_frozen_config_map(env, ns, &created, &config_map).await;
        patch(
            &env.client("alice"),
            ns,
            "swap-early",
            json!({"spec": {"suspend": false}}),
        )
        .await
        .expect("alice starts it");
        let halt = wait_halt(env, ns, "swap-early").await;
        assert_eq!(halt.reason, "ScopeTampered");
        assert_mentions(&halt.message, &[&config_map, "was replaced"], "swap");
        let uid = created.uid().expect("uid");
        for stage in StageName::ALL {
            assert!(
                job(env, ns, &job_name("swap-early", &uid, stage))
                    .await
                    .is_none(),
                "no {stage} Job"
            );
        }
    });
}

fn a_config_map_swapped_during_the_canary_halts_before_the_main_stage(env: &TestEnv) {
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        let canary = running_canary(env, ns, "swap-late", "a07.dlq").await;
        let replay = get(&env.admin(), ns, "swap-late").await;
        let (_, config_map) = frozen(env, ns, "swap-late").await;
        swap_frozen_config_map(env, ns, &replay, &config_map).await;
        succeed(env, ns, &canary).await;
        let halt = wait_halt(env, ns, "swap-late").await;
        assert_eq!(halt.reason, "ScopeTampered");
        assert_mentions(&halt.message, &[&config_map], "swap");
        let main = job_name("swap-late", &replay.uid().expect("uid"), StageName::Main);
        assert!(job(env, ns, &main).await.is_none(), "no main Job");
    });
}

fn frozen_ids_cannot_be_edited_in_place(env: &TestEnv) {
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        create(
            &env.client("alice"),
            ns,
            replay("in-place", "alice", "a08.dlq", &["e-1"]),
        )
        .await
        .expect("alice asks");
        let (_, config_map) = frozen(env, ns, "in-place").await;
        let message = refused(
            Api::<ConfigMap>::namespaced(env.client("mallory"), ns)
                .patch(
                    &config_map,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"data": {EVENT_IDS_KEY: "victim-1\n"}})),
                )
                .await,
            "mallory editing the frozen ids",
        );
        assert_mentions(&message, &["immutable"], "in place");
    });
}

// ---------------------------------------------------------------------------------------------
// Children are the operator's by the uid it recorded

fn a_pre_created_job_is_never_adopted(env: &TestEnv) {
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        let created = create(
            &env.client("alice"),
            ns,
            replay("squatted", "alice", "a09.dlq", &["e-1", "e-2"]),
        )
        .await
        .expect("alice asks");
        let uid = created.uid().expect("uid");
        frozen(env, ns, "squatted").await;
        let name = job_name("squatted", &uid, StageName::Canary);
        // Her Job, with the predictable name, the replay's labels and the replay as owner.
        let hers: Job = serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "labels": {LABEL_REPLAY: "squatted"},
                "ownerReferences": [{"apiVersion": "backlog.dev/v1alpha1", "kind": "ReplayJob",
                                     "name": "squatted", "uid": uid, "controller": true}],
            },
            "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "x", "image": "registry.example.com/mallory/tool:1"}]}}},
        }))
        .expect("a Job");
        let hers = Api::<Job>::namespaced(env.client("mallory"), ns)
            .create(&PostParams::default(), &hers)
            .await
            .expect("mallory creates a Job under the canary's name");
        approve(env, ns, "squatted").await.expect("bob approves");
        let halt = wait_halt(env, ns, "squatted").await;
        assert_eq!(halt.reason, "ForeignJob");
        assert_mentions(
            &halt.message,
            &[&name, "was not created by the operator"],
            "squat",
        );
        let after = job(env, ns, &name).await.expect("her Job");
        assert_eq!(after.uid(), hers.uid());
        assert_eq!(
            after.spec.and_then(|s| s.suspend),
            Some(true),
            "left as she made it"
        );
        let replay = get(&env.admin(), ns, "squatted").await;
        assert!(
            replay
                .status
                .expect("status")
                .stages
                .iter()
                .all(|s| s.job_uid.is_none()),
            "her Job is recorded nowhere"
        );
    });
}

fn a_pre_created_scope_config_map_is_never_taken(env: &TestEnv) {
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        let mut body = replay("pre-scoped", "alice", "a10.dlq", &[]);
        body["spec"]["scope"] = json!({"eventIdsFrom": {"name": "a10-ids", "key": "ids"}});
        let created = create(&env.client("alice"), ns, body)
            .await
            .expect("alice asks");
        wait_phase(env, ns, "pre-scoped", ReplayPhase::Pending).await;
        let uid = created.uid().expect("uid");
        let name = scope_config_map_name("pre-scoped", &uid);
        let forged: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": name, "ownerReferences": [{"apiVersion": "backlog.dev/v1alpha1",
                "kind": "ReplayJob", "name": "pre-scoped", "uid": uid, "controller": true}]},
            "data": {EVENT_IDS_KEY: lines(&["victim-1"])},
            "immutable": true,
        }))
        .expect("a ConfigMap");
        Api::<ConfigMap>::namespaced(env.client("mallory"), ns)
            .create(&PostParams::default(), &forged)
            .await
            .expect("mallory creates the frozen scope's name first");
        let source: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": "a10-ids"}, "data": {"ids": lines(&["e-1", "e-2"])}}),
        )
        .expect("a ConfigMap");
        Api::<ConfigMap>::namespaced(env.client("alice"), ns)
            .create(&PostParams::default(), &source)
            .await
            .expect("alice lists the ids");
        let halt = wait_halt(env, ns, "pre-scoped").await;
        assert_eq!(halt.reason, "ForeignConfigMap");
        assert_mentions(
            &halt.message,
            &[&name, "was not created by the operator"],
            "pre-scoped",
        );
        let status = get(&env.admin(), ns, "pre-scoped")
            .await
            .status
            .expect("status");
        assert!(
            status.scope.is_none(),
            "her list was never frozen: {:?}",
            status.scope
        );
    });
}

fn a_replaced_job_halts(env: &TestEnv) {
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        let canary = running_canary(env, ns, "replaced", "a11.dlq").await;
        let jobs_as_mallory = Api::<Job>::namespaced(env.client("mallory"), ns);
        // (In the background: the orphan default waits for a garbage collector, which this
        // cluster does not run.)
        jobs_as_mallory
            .delete(&canary.name_any(), &DeleteParams::background())
            .await
            .expect("mallory deletes the canary Job");
        // Her Job under the same name, with the same labels and owner.
        let hers: Job = serde_json::from_value(json!({
            "metadata": {
                "name": canary.name_any(),
                "labels": canary.labels(),
                "ownerReferences": canary.owner_references(),
            },
            "spec": {"completionMode": "Indexed", "completions": 1, "parallelism": 1,
                "template": {"spec": {"restartPolicy": "Never",
                    "containers": [{"name": "x", "image": "registry.example.com/mallory/tool:1"}]}}},
        }))
        .expect("a Job");
        // The same name, her Job (created as soon as the old one is gone).
        let hers = wait_until(STEP, "mallory's Job is created under the name", || async {
            jobs_as_mallory.create(&PostParams::default(), &hers).await.map_err(|e| e.to_string())
        })
        .await;
        let halt = wait_halt(env, ns, "replaced").await;
        assert!(
            ["JobReplaced", "JobDeleted"].contains(&halt.reason.as_str()),
            "{}: {}",
            halt.reason,
            halt.message
        );
        assert_mentions(&halt.message, &[&canary.name_any()], "replaced");
        let after = job(env, ns, &canary.name_any()).await.expect("her Job");
        assert_eq!(after.uid(), hers.uid());
        assert_ne!(after.spec.and_then(|s| s.suspend), Some(true), "not the operator's to touch");
    });
}

fn an_edited_job_halts_and_stays_suspended(env: &TestEnv) {
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        let canary = running_canary(env, ns, "edited", "a12.dlq").await;
        let jobs_as_mallory = Api::<Job>::namespaced(env.client("mallory"), ns);
        jobs_as_mallory
            .patch(
                &canary.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"parallelism": 5}})),
            )
            .await
            .expect("mallory raises the parallelism");
        let halt = wait_halt(env, ns, "edited").await;
        assert_eq!(halt.reason, "JobTampered");
        assert_mentions(
            &halt.message,
            &[&canary.name_any(), "spec.parallelism is 5, not 1"],
            "edited",
        );
        let its_job_suspended = || suspended(env, ns, canary.name_any());
        wait_until(STEP, "the operator suspends its Job", its_job_suspended).await;
        // She resumes it: the halted replay suspends it again.
        jobs_as_mallory
            .patch(
                &canary.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"suspend": false}})),
            )
            .await
            .expect("mallory resumes the Job");
        wait_until(STEP, "the operator suspends it again", its_job_suspended).await;
        assert_eq!(
            get(&env.admin(), ns, "edited")
                .await
                .status
                .and_then(|s| s.phase),
            Some(ReplayPhase::Halted)
        );
    });
}

// ---------------------------------------------------------------------------------------------
// The worker pod is restricted by the API server

/// mallory asks for a replay of her own whose pod spec is `pod`; the refusal's message.
async fn refused_template(env: &TestEnv, name: &str, pod: Value) -> String {
    let world = world(env);
    let mut body = replay(name, "mallory", &format!("{name}.dlq"), &["e-1"]);
    body["spec"]["template"] = json!({"spec": pod});
    refused(
        create(&env.client("mallory"), &world.team, body).await,
        &format!("template {name}"),
    )
}

fn worker(extra: Value) -> Value {
    let mut pod = json!({"containers": [{"name": "replay", "image": image()}]});
    if let (Some(pod), Some(extra)) = (pod.as_object_mut(), extra.as_object()) {
        pod.extend(extra.clone());
    }
    pod
}

fn the_operators_service_account_is_refused_for_workers(env: &TestEnv) {
    world(env);
    env.block_on(async {
        for account in [OPERATOR_ACCOUNT, "backlog-operator", "default"] {
            let message = refused_template(
                env,
                "as-operator",
                worker(json!({"serviceAccountName": account})),
            )
            .await;
            assert_mentions(
                &message,
                &[
                    &format!("spec.template.spec.serviceAccountName {account} is not allowed"),
                    "replay-worker",
                ],
                account,
            );
        }
    });
}

fn a_host_path_volume_is_refused(env: &TestEnv) {
    world(env);
    env.block_on(async {
        let pod = worker(json!({"volumes": [{"name": "node-root", "hostPath": {"path": "/"}}]}));
        let message = refused_template(env, "host-path", pod).await;
        assert_mentions(
            &message,
            &[
                "spec.template.spec.volumes[node-root] uses hostPath",
                "restricted Pod Security profile",
            ],
            "hostPath",
        );
    });
}

fn host_network_is_refused(env: &TestEnv) {
    world(env);
    env.block_on(async {
        let message =
            refused_template(env, "host-network", worker(json!({"hostNetwork": true}))).await;
        assert_mentions(
            &message,
            &["spec.template.spec.hostNetwork is true"],
            "hostNetwork",
        );
    });
}

fn a_privileged_container_is_refused(env: &TestEnv) {
    world(env);
    env.block_on(async {
        let mut pod = worker(json!({}));
        pod["containers"][0]["securityContext"] = json!({"privileged": true});
        let message = refused_template(env, "privileged", pod).await;
        assert_mentions(&message, &["spec.template.spec.containers[replay].securityContext.privileged is true"], "privileged");
        // An init container is a container too.
        let pod = worker(json!({"initContainers": [{"name": "setup", "image": image(), "securityContext": {"privileged": true}}]}));
        let message = refused_template(env, "privileged-init", pod).await;
        assert_mentions(&message, &["spec.template.spec.initContainers[setup].securityContext.privileged is true"], "init");
    });
}

fn every_other_pod_escape_is_refused(env: &TestEnv) {
    world(env);
    env.block_on(async {
        let container = |context: Value| {
            let mut pod = worker(json!({}));
            pod["containers"][0]["securityContext"] = context;
            pod
        };
        let mut unpinned = worker(json!({}));
        unpinned["containers"][0]["image"] = json!("registry.example.com/orders/replay-tool:1.4.2");
        let mut host_port = worker(json!({}));
        host_port["containers"][0]["ports"] = json!([{"containerPort": 8080, "hostPort": 8080}]);
        for (name, pod, fragment) in [
            ("host-pid", worker(json!({"hostPID": true})), "spec.template.spec.hostPID is true"),
            ("host-ipc", worker(json!({"hostIPC": true})), "spec.template.spec.hostIPC is true"),
            ("node-name", worker(json!({"nodeName": "node-1"})), "spec.template.spec.nodeName is set"),
            ("sys-admin", container(json!({"capabilities": {"add": ["SYS_ADMIN"]}})), "securityContext.capabilities.add lists SYS_ADMIN"),
            ("root", container(json!({"runAsUser": 0})), "securityContext.runAsUser is 0"),
            ("escalation", container(json!({"allowPrivilegeEscalation": true})), "securityContext.allowPrivilegeEscalation is true"),
            ("unconfined", container(json!({"seccompProfile": {"type": "Unconfined"}})), "securityContext.seccompProfile.type is Unconfined"),
            ("host-port", host_port, "spec.template.spec.containers[replay].ports sets a hostPort"),
            ("unpinned", unpinned, "spec.template.spec.containers[replay].image registry.example.com/orders/replay-tool:1.4.2: not pinned by digest"),
        ] {
            let message = refused_template(env, name, pod).await;
            assert_mentions(&message, &[fragment], name);
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Prometheus addresses

fn a_budget_cannot_point_the_operator_at_any_url(env: &TestEnv) {
    let world = world(env);
    let ns = &world.team;
    let target = Target::start();
    env.block_on(async {
        support::workload::deployment(env, ns, "ssrf", 1).await;
        let budget: BacklogBudget = serde_json::from_value(json!({
            "apiVersion": "backlog.dev/v1alpha1",
            "kind": "BacklogBudget",
            "metadata": {"name": "ssrf"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "ssrf"},
                "minReplicas": 1, "maxReplicas": 4, "completionDeadline": "10m", "partitionCount": 4,
                "pollInterval": "1s",
                "prometheus": {"address": target.address},
                "metrics": {"backlog": "sum(up)"},
                "capacity": {"perReplicaRate": 10},
            }
        }))
        .expect("a BacklogBudget");
        Api::<BacklogBudget>::namespaced(env.client("mallory"), ns)
            .create(&PostParams::default(), &budget)
            .await
            .expect("mallory creates a budget");
        let budgets = Api::<BacklogBudget>::namespaced(env.admin(), ns);
        let message = wait_until(STEP, "the budget says its address is refused", || async {
            let status = budgets.get("ssrf").await.ok()?.status?;
            let metrics = status.conditions.iter().find(|c| c.type_ == "MetricsAvailable")?;
            (metrics.status == "False").then(|| metrics.message.clone())
        })
        .await;
        assert_mentions(
            &message,
            &[&format!("spec.prometheus.address {} is not a Prometheus this operator may query", target.address), "--allowed-prometheus-url"],
            "budget",
        );
        // Several polls later, still not one connection.
        let status = budgets.get("ssrf").await.expect("budget").status.expect("status");
        assert_eq!(
            status.phase.map(|p| format!("{p:?}")).as_deref(),
            Some("MetricsUnavailable")
        );
    });
    assert_eq!(
        target.connections(),
        0,
        "the operator connected to {}",
        target.address
    );
}

fn a_replay_cannot_point_the_operator_at_any_url(env: &TestEnv) {
    let world = world(env);
    let ns = &world.team;
    let target = Target::start();
    env.block_on(async {
        let mut body = replay("ssrf", "alice", "a20.dlq", &["e-1", "e-2"]);
        body["spec"]["prometheus"] = json!({"address": target.address});
        body["spec"]["verification"] = json!([{"name": "probe", "query": "sum(up) == bool 1"}]);
        create(&env.client("alice"), ns, body)
            .await
            .expect("alice asks");
        // Refused before anyone approves what could never run.
        let refused = wait_phase(env, ns, "ssrf", ReplayPhase::Refused).await;
        let admitted = condition(&refused, "Admitted").expect("Admitted");
        assert_eq!(admitted.status, "False");
        assert_mentions(
            &admitted.message,
            &[
                &format!("spec.prometheus.address {}", target.address),
                "--allowed-prometheus-url",
            ],
            "replay",
        );
    });
    assert_eq!(
        target.connections(),
        0,
        "the operator connected to {}",
        target.address
    );
}

/// The CRD checks only the outline of a worker's pod template, so a value of the wrong type
/// elsewhere in it is stored. Decoded with the operator's list of every replay in scope, one
/// such template stopped all of them: it is refused on its own object instead, naming the
/// field, and a replay asked for after it is reconciled as usual.
fn a_template_that_is_not_a_pod_template_holds_up_no_other_replay(env: &TestEnv) {
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        let mut body = replay("mistyped", "mallory", "a30.dlq", &["e-1"]);
        body["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!("thirty");
        create(&env.client("mallory"), ns, body)
            .await
            .expect("the API server stores a template it does not check");
        create(
            &env.client("alice"),
            ns,
            replay("after-mistyped", "alice", "a31.dlq", &["e-1", "e-2"]),
        )
        .await
        .expect("alice asks");
        wait_phase(env, ns, "after-mistyped", ReplayPhase::AwaitingApproval).await;
        let refused = wait_phase(env, ns, "mistyped", ReplayPhase::Refused).await;
        let admitted = condition(&refused, "Admitted").expect("Admitted");
        assert_eq!(admitted.status, "False");
        assert_mentions(
            &admitted.message,
            &[
                "spec.template.spec.terminationGracePeriodSeconds is not what a Pod takes",
                "invalid type",
            ],
            "mistyped template",
        );
        // A misspelled field would be dropped by decoding: the worker would run without the
        // limits the approver read.
        let mut body = replay("misspelled", "alice", "a33.dlq", &["e-1"]);
        body["spec"]["template"]["spec"]["containers"][0]["resourcez"] =
            json!({"limits": {"memory": "64Mi"}});
        create(&env.client("alice"), ns, body)
            .await
            .expect("the API server stores a template it does not check");
        let refused = wait_phase(env, ns, "misspelled", ReplayPhase::Refused).await;
        let admitted = condition(&refused, "Admitted").expect("Admitted");
        assert_mentions(
            &admitted.message,
            &[
                "spec.template.spec.containers[0].resourcez is not what a Pod takes",
                "no such field",
            ],
            "misspelled template",
        );
    });
}

// ---------------------------------------------------------------------------------------------
// Identity and tenancy

fn a_replay_held_in_deletion_stops_its_jobs(env: &TestEnv) {
    // Deleting a replay deletes its Jobs only once it is gone, and a finalizer anyone with
    // edit rights may add keeps it: meanwhile its Job must not replay on unwatched.
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        let canary = running_canary(env, ns, "held", "a22.dlq").await;
        let replays_as_mallory = Api::<ReplayJob>::namespaced(env.client("mallory"), ns);
        let hold =
            |finalizers: Value| Patch::Merge(json!({"metadata": {"finalizers": finalizers}}));
        replays_as_mallory
            .patch(
                "held",
                &PatchParams::default(),
                &hold(json!(["example.com/hold"])),
            )
            .await
            .expect("mallory adds a finalizer of her own");
        replays_as_mallory
            .delete("held", &DeleteParams::default())
            .await
            .expect("mallory deletes the replay");
        wait_until(STEP, "the operator suspends the held replay's Job", || {
            suspended(env, ns, canary.name_any())
        })
        .await;
        // Let it go, so the namespace holds nothing of this test.
        Api::<ReplayJob>::namespaced(env.admin(), ns)
            .patch("held", &PatchParams::default(), &hold(json!(null)))
            .await
            .expect("the finalizer is removed");
        wait_gone(env, ns, "held").await;
    });
}

fn a_replay_cannot_be_parted_from_its_jobs(env: &TestEnv) {
    // A Job that outlives its replay replays on unwatched, beside the next replay of the
    // queue. Every way to delete the replay and keep the Job is refused or halts it.
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        let canary = running_canary(env, ns, "parted", "a29.dlq").await;
        let mallory = env.client("mallory");
        let replays_as_mallory = Api::<ReplayJob>::namespaced(mallory.clone(), ns);
        let orphan = |dry_run| DeleteParams {
            propagation_policy: Some(PropagationPolicy::Orphan),
            dry_run,
            ..DeleteParams::default()
        };
        // --cascade=orphan: a dry run until the policy is loaded, then for real.
        wait_until(STEP, "an orphaning delete is refused", || async {
            match replays_as_mallory.delete("parted", &orphan(true)).await {
                Err(kube::Error::Api(status)) => Ok(status.message),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        let message = refused(
            replays_as_mallory.delete("parted", &orphan(false)).await,
            "--cascade=orphan",
        );
        assert_mentions(
            &message,
            &["ReplayJob parted", "--cascade=orphan", "spec.suspend: true"],
            "--cascade=orphan",
        );
        // The older flag, as older clients send it.
        let path = format!("/apis/backlog.dev/v1alpha1/namespaces/{ns}/replayjobs/parted");
        let body = json!({"kind": "DeleteOptions", "apiVersion": "v1", "orphanDependents": true});
        let request = http::Request::delete(path)
            .header("Content-Type", "application/json")
            .body(serde_json::to_vec(&body).expect("a body"))
            .expect("a request");
        let message = refused(mallory.request_text(request).await, "orphanDependents");
        assert_mentions(&message, &["ReplayJob parted", "orphanDependents"], "flag");
        // The finalizer a later plain delete would orphan by.
        let message = refused(
            patch(
                &mallory,
                ns,
                "parted",
                json!({"metadata": {"finalizers": ["orphan"]}}),
            )
            .await,
            "the orphan finalizer",
        );
        assert_mentions(
            &message,
            &["metadata.finalizers", "\"orphan\""],
            "finalizer",
        );
        let replay = get(&env.admin(), ns, "parted").await;
        assert!(replay.metadata.deletion_timestamp.is_none(), "not deleted");
        assert_eq!(
            replay.status.and_then(|s| s.phase),
            Some(ReplayPhase::Canary)
        );

        // Or the Job's owner reference edited away, so that a plain delete leaves it.
        Api::<Job>::namespaced(mallory, ns)
            .patch(
                &canary.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"ownerReferences": null}})),
            )
            .await
            .expect("mallory removes the canary Job's owner reference");
        let halt = wait_halt(env, ns, "parted").await;
        assert_eq!(halt.reason, "JobDisowned", "{}", halt.message);
        assert_mentions(
            &halt.message,
            &[&canary.name_any(), "metadata.ownerReferences"],
            "disowned",
        );
        wait_until(STEP, "the operator suspends the disowned Job", || {
            suspended(env, ns, canary.name_any())
        })
        .await;
    });
}

fn a_pod_cannot_claim_a_replay_job(env: &TestEnv) {
    // The Job controller adopts a pod without an owner that carries a Job's controller-uid
    // label and counts its end as the Job's: a pod of hers that exits 0 at once, labelled with
    // the canary's uid and index 0, would complete the canary without replaying anything.
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        let canary = running_canary(env, ns, "claimed", "a32.dlq").await;
        let uid = canary.uid().expect("the canary's uid");
        let pods_as_mallory = Api::<Pod>::namespaced(env.client("mallory"), ns);
        let pod = |name: &str, labels: Value| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": labels, "annotations": {
                    "batch.kubernetes.io/job-completion-index": "0"}},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "replay", "image": "registry.example.com/mallory/true:1"}]},
            }))
            .expect("a Pod")
        };
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        for label in ["batch.kubernetes.io/controller-uid", "controller-uid"] {
            let claiming = pod("claims-the-canary", json!({label: uid}));
            // The policy loads on its own schedule: a dry run until it refuses.
            let message = wait_until(STEP, "a pod claiming the canary is refused", || async {
                match pods_as_mallory.create(&dry_run, &claiming).await {
                    Err(kube::Error::Api(status)) => Ok(status.message),
                    other => Err(format!("{other:?}")),
                }
            })
            .await;
            assert_mentions(
                &message,
                &[
                    "claims-the-canary",
                    label,
                    "mallory",
                    "only the Job controller",
                ],
                label,
            );
        }
        // Nor can she add the label to a pod of hers afterwards.
        pods_as_mallory
            .create(&PostParams::default(), &pod("hers", json!({"app": "tool"})))
            .await
            .expect("a pod without the label is hers to create");
        let message = refused(
            pods_as_mallory
                .patch(
                    "hers",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {
                        "batch.kubernetes.io/controller-uid": uid}}})),
                )
                .await,
            "the label added later",
        );
        assert_mentions(&message, &["pod hers", "only the Job controller"], "update");
        pods_as_mallory
            .delete("hers", &DeleteParams::background())
            .await
            .expect("her pod is deleted");
    });
}

fn a_replay_deleted_and_created_again_inherits_nothing(env: &TestEnv) {
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        let canary = running_canary(env, ns, "reborn", "a21.dlq").await;
        let old = get(&env.admin(), ns, "reborn").await;
        let approval = old.spec.approval.clone().expect("approved");
        Api::<ReplayJob>::namespaced(env.client("mallory"), ns)
            .delete("reborn", &DeleteParams::default())
            .await
            .expect("mallory deletes alice's replay (edit rights)");
        wait_gone(env, ns, "reborn").await;
        // Under the same name, with bob's approval copied: refused.
        let mut body = replay("reborn", "mallory", "a21.dlq", &["e-1", "victim-1"]);
        body["spec"]["approval"] = serde_json::to_value(&approval).expect("approval");
        let message = refused(
            create(&env.client("mallory"), ns, body).await,
            "recreating with the approval",
        );
        assert_mentions(
            &message,
            &["spec.approval may only be set, changed or removed by a member of the group"],
            "approval",
        );
        // Without it: a new replay that starts from nothing.
        let reborn = create(
            &env.client("mallory"),
            ns,
            replay("reborn", "mallory", "a21.dlq", &["e-1", "victim-1"]),
        )
        .await
        .expect("mallory recreates it");
        let new_uid = reborn.uid().expect("uid");
        assert_ne!(Some(new_uid.clone()), old.uid());
        let replay = wait_phase(env, ns, "reborn", ReplayPhase::AwaitingApproval).await;
        let status = replay.status.expect("status");
        assert_eq!(
            status.scope.map(|s| s.config_map),
            Some(scope_config_map_name("reborn", &new_uid))
        );
        assert!(status.stages.is_empty(), "the old stages are not inherited");
        assert!(
            job(env, ns, &job_name("reborn", &new_uid, StageName::Canary))
                .await
                .is_none()
        );
        // The old canary Job (no garbage collector here) is nobody's now, and untouched.
        assert_eq!(
            job(env, ns, &canary.name_any()).await.and_then(|j| j.uid()),
            canary.uid()
        );
    });
}

fn another_namespace_cannot_hold_up_a_queue(env: &TestEnv) {
    let world = world(env);
    env.block_on(async {
        // mallory's own replay in her namespace, on the queue alice's team replays from.
        running_canary_as(env, &world.other_team, "hold", "mallory", "shared.dlq").await;
        // alice's replay of that queue in her namespace starts anyway.
        create(
            &env.client("alice"),
            &world.team,
            replay("unblocked", "alice", "shared.dlq", &["e-1", "e-2"]),
        )
        .await
        .expect("alice asks");
        approve(env, &world.team, "unblocked")
            .await
            .expect("bob approves");
        let running = wait_phase(env, &world.team, "unblocked", ReplayPhase::Canary).await;
        assert_eq!(
            condition(&running, "Waiting").map(|c| c.status.as_str()),
            Some("False")
        );
    });
}

/// `requested_by` asks for `name` in `namespace`, bob approves it, its canary runs.
async fn running_canary_as(
    env: &TestEnv,
    namespace: &str,
    name: &str,
    requested_by: &str,
    queue: &str,
) {
    create(
        &env.client(requested_by),
        namespace,
        replay(name, requested_by, queue, &["m-1", "m-2"]),
    )
    .await
    .expect("asks");
    approve(env, namespace, name).await.expect("bob approves");
    wait_phase(env, namespace, name, ReplayPhase::Canary).await;
}

fn a_tenant_cannot_ask_or_approve_in_anothers_name(env: &TestEnv) {
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        let message = refused(
            create(&env.client("mallory"), ns, replay("for-alice", "alice", "a23.dlq", &["e-1"])).await,
            "mallory asking in alice's name",
        );
        assert_mentions(&message, &["spec.requestedBy must be the user creating the ReplayJob (mallory)"], "ask");
        create(&env.client("alice"), ns, replay("alices", "alice", "a23.dlq", &["e-1"]))
            .await
            .expect("alice asks");
        let review = review_replay(&env.admin(), ns, "alices").await;
        for approver in ["mallory", "bob"] {
            let message = refused(
                patch(&env.client("mallory"), ns, "alices", review.approval(approver, "CAB-7")).await,
                &format!("mallory approving as {approver}"),
            );
            assert_mentions(&message, &["may only be set, changed or removed by a member of the group backlog-approvers", "mallory is not one"], "approve");
        }
    });
}

fn an_approved_spec_cannot_be_swapped(env: &TestEnv) {
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        alice_asks_suspended(env, ns, "approved", "a24.dlq").await;
        approve(env, ns, "approved").await.expect("bob approves");
        let evil = format!("registry.example.com/mallory/tool@sha256:{}", "f".repeat(64));
        for (what, change) in [
            ("the image", json!({"spec": {"template": {"spec": {"containers": [{"name": "replay", "image": evil}]}}}})),
            ("the batches", json!({"spec": {"batches": {"size": 1000, "canary": 1, "ratePerSecond": 1000}}})),
            ("the destination", json!({"spec": {"destination": {"queue": "payments"}}})),
        ] {
            let message = refused(patch(&env.client("mallory"), ns, "approved", change).await, what);
            assert_mentions(&message, &["only spec.suspend may change"], what);
        }
    });
}

fn an_approval_cannot_change_what_it_approves(env: &TestEnv) {
    // bob may approve, but not approve a spec of his own making in the same request: four
    // eyes would be his alone.
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        alice_asks_suspended(env, ns, "rewritten", "a25.dlq").await;
        let review = review_replay(&env.admin(), ns, "rewritten").await;
        let approval = review.approval("bob", "CAB-8")["spec"]["approval"].clone();
        for (what, change) in [
            (
                "the destination",
                json!({"destination": {"queue": "payments"}}),
            ),
            (
                "the batches",
                json!({"batches": {"size": 1000, "canary": 1, "ratePerSecond": 1000}}),
            ),
            ("the reason", json!({"reason": "bob's own reason"})),
        ] {
            let mut spec = change;
            spec["approval"] = approval.clone();
            let message = refused(
                patch(&env.client("bob"), ns, "rewritten", json!({"spec": spec})).await,
                what,
            );
            assert_mentions(&message, &["may change nothing else in spec"], what);
        }
        // The approval alone, with the suspension lifted, passes.
        let mut spec = json!({"suspend": false});
        spec["approval"] = approval;
        patch(&env.client("bob"), ns, "rewritten", json!({"spec": spec}))
            .await
            .expect("bob approves what alice asked for");
    });
}

fn an_approval_covers_only_the_spec_it_read(env: &TestEnv) {
    // alice edits between bob's review and his approval: the approval must not cover an edit
    // bob never saw, whatever the edit is.
    let world = world(env);
    let ns = &world.team;
    env.block_on(async {
        alice_asks_suspended(env, ns, "reread", "a26.dlq").await;
        let mut read = review_replay(&env.admin(), ns, "reread").await;
        for (what, change) in [
            ("the destination", json!({"destination": {"queue": "payments"}})),
            ("the pace", json!({"batches": {"ratePerSecond": 1000}})),
            ("the image", json!({"template": {"spec": {"containers": [{"name": "replay", "image": format!("registry.example.com/mallory/tool@sha256:{}", "e".repeat(64))}]}}})),
        ] {
            patch(&env.client("alice"), ns, "reread", json!({"spec": change}))
                .await
                .unwrap_or_else(|e| panic!("alice changes {what} before the approval: {e}"));
            let now = review_replay(&env.admin(), ns, "reread").await;
            assert_ne!(now.spec_sha256, read.spec_sha256, "{what} changes the digest");
            assert_eq!(now.scope_sha256, read.scope_sha256, "{what} leaves the list");
            let message = refused(
                patch(&env.client("bob"), ns, "reread", read.approval("bob", "CAB-9")).await,
                &format!("bob approving what he read before alice changed {what}"),
            );
            assert_mentions(
                &message,
                &["spec.approval.specSha256 must equal status.specSha256", &now.spec_sha256],
                what,
            );
            read = now;
        }
        // Approving what the spec says now counts, for the API server and for the operator.
        patch(&env.client("bob"), ns, "reread", read.approval("bob", "CAB-9"))
            .await
            .expect("bob approves the spec he read last");
        wait_until(STEP, "the operator takes bob's approval", || async {
            let status = get(&env.admin(), ns, "reread").await.status?;
            (status.approved_by.as_deref() == Some("bob")
                && status.spec_sha256.as_deref() == Some(read.spec_sha256.as_str()))
            .then_some(())
        })
        .await;
    });
}

fn a_tenant_cannot_touch_the_policies(env: &TestEnv) {
    let world = world(env);
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    env.block_on(async {
        let mallory = env.client("mallory");
        let forbidden = |result: Result<(), kube::Error>, what: &str| match result {
            Err(kube::Error::Api(status)) if status.code == 403 => status.message,
            other => panic!("{what}: expected 403, got {other:?}"),
        };
        let message = forbidden(
            Api::<ValidatingAdmissionPolicy>::all(mallory.clone())
                .patch(
                    &format!("{RELEASE}-backlog-operator.replayjob.backlog.dev"),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"variables": [{"name": "approversGroup", "expression": "\"system:authenticated\""}]}})),
                )
                .await
                .map(|_| ()),
            "mallory switching four eyes off",
        );
        assert_mentions(&message, &["mallory", "validatingadmissionpolicies"], "policy");
        let message = forbidden(
            Api::<ValidatingAdmissionPolicyBinding>::all(mallory.clone())
                .delete(&format!("{RELEASE}-backlog-operator.status-owner.backlog.dev"), &DeleteParams::default())
                .await
                .map(|_| ()),
            "mallory unbinding the status policy",
        );
        assert_mentions(&message, &["mallory", "validatingadmissionpolicybindings"], "binding");
        // Nor can she touch anything of the operator's own namespace.
        let message = forbidden(
            Api::<ConfigMap>::namespaced(mallory.clone(), &world.system)
                .list(&ListParams::default())
                .await
                .map(|_| ()),
            "mallory reading the operator's namespace",
        );
        assert_mentions(&message, &["mallory"], "system");
    });
}
