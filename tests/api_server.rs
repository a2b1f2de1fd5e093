//! The three CRDs as a real API server enforces them: every example is
//! accepted under strict field validation, every object of the invalid corpus
//! (`tests/invalid/*.yaml`) is refused with the message it expects, a
//! replay's scope and requester cannot change after creation, the budget
//! `plan` prints for each `examples/plans/*.yaml` is accepted, and the printer
//! columns and the `backlog` category work in `kubectl get`.
//!
//! The CRDs installed in the server are the files in `crds/`;
//! `tests/crd_drift.rs` keeps those equal to the Rust types.

mod support;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use backlog_operator::api::{self, BacklogBudget, Compensation, ReplayJob, RetryPolicy};
use backlog_operator::core::compensation_plan::{REPORT_LIMIT, REPORT_WORDS_ROOM, report_floor};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, Request, Status};
use kube::{Client, ResourceExt};
use serde::Deserialize;
use serde_json::{Value, json};
use support::{Test, TestEnv, wait_until};

const FIELD_MANAGER: &str = "api-server-test";

/// Asks the API server for its server-side table rendering (what `kubectl get` prints).
const TABLE_ACCEPT: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

/// How long kubectl may take to see the CRDs in discovery.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// At least this many invalid objects per kind in the corpus.
const MIN_CORPUS_PER_KIND: usize = 8;

fn main() -> ExitCode {
    let mut tests = support::tests![
        examples_cover_every_kind,
        corpus_covers_every_kind,
        strict_field_validation_refuses_unknown_fields,
        replay_scope_and_requester_are_immutable,
        printer_columns_show_in_the_server_table,
        kubectl_get_backlog_lists_every_kind,
        server_side_apply_refuses_a_repeated_key_and_stores_nothing,
        the_report_rule_counts_as_the_worker_writes,
    ];
    for path in yaml_files(&repo_path("examples/plans")) {
        let name = format!("plan_budget_is_accepted::{}", file_name(&path));
        tests.push(Test::new(name, move |env| {
            plan_budget_is_accepted(env, &path)
        }));
    }
    for path in example_files() {
        let name = format!("example_is_accepted::{}", file_name(&path));
        tests.push(Test::new(name, move |env| example_is_accepted(env, &path)));
    }
    for path in corpus_files() {
        let name = format!("invalid_object_is_refused::{}", file_name(&path));
        tests.push(Test::new(name, move |env| {
            invalid_object_is_refused(env, &path)
        }));
    }
    support::run(tests, false)
}

// ---------------------------------------------------------------------------
// Files

fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string()
}

/// The `*.yaml` files directly in `dir` (not in subdirectories), sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.is_file() && path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// `examples/*.yaml`: Kubernetes objects. `examples/scenarios/` holds
/// simulator input and is not listed.
fn example_files() -> Vec<PathBuf> {
    yaml_files(&repo_path("examples"))
}

fn corpus_files() -> Vec<PathBuf> {
    yaml_files(&repo_path("tests/invalid"))
}

/// The single YAML document of `path` as JSON.
fn read_object(path: &Path) -> Value {
    let text =
        fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut documents = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value = Value::deserialize(document)
            .unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()));
        if !value.is_null() {
            documents.push(value);
        }
    }
    assert_eq!(
        documents.len(),
        1,
        "{}: expected exactly one object",
        path.display()
    );
    documents.pop().expect("one document")
}

/// An object of the invalid corpus and the fragments the server's refusal
/// must contain (its `# expect: ...` lines).
struct InvalidCase {
    object: Value,
    expect: Vec<String>,
}

impl InvalidCase {
    fn load(path: &Path) -> InvalidCase {
        let text =
            fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let expect = text
            .lines()
            .filter_map(|line| line.trim().strip_prefix("# expect:"))
            .map(|fragment| fragment.trim().to_string())
            .filter(|fragment| !fragment.is_empty())
            .collect();
        InvalidCase {
            object: read_object(path),
            expect,
        }
    }
}

fn kind_of(object: &Value) -> &str {
    object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn name_of(object: &Value) -> &str {
    object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------
// API helpers

fn crd_of_kind(kind: &str) -> CustomResourceDefinition {
    api::all_crds()
        .into_iter()
        .find(|crd| crd.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD of kind {kind:?}"))
}

fn resource_of(crd: &CustomResourceDefinition) -> ApiResource {
    let version = &crd.spec.versions[0].name;
    ApiResource {
        group: crd.spec.group.clone(),
        version: version.clone(),
        api_version: format!("{}/{version}", crd.spec.group),
        kind: crd.spec.names.kind.clone(),
        plural: crd.spec.names.plural.clone(),
    }
}

fn collection_path(resource: &ApiResource, namespace: &str) -> String {
    format!(
        "/apis/{}/namespaces/{namespace}/{}",
        resource.api_version, resource.plural
    )
}

/// POSTs `object` into `namespace` with `fieldValidation=Strict`, as kubectl
/// does: a field the schema does not know fails the request instead of being
/// dropped.
async fn create_strict(
    client: &Client,
    namespace: &str,
    object: &Value,
) -> Result<DynamicObject, kube::Error> {
    let resource = resource_of(&crd_of_kind(kind_of(object)));
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    let body = serde_json::to_vec(object).expect("serialize the object");
    let mut request = Request::new(collection_path(&resource, namespace))
        .create(&params, body)
        .expect("build the create request");
    let uri = format!("{}&fieldValidation=Strict", request.uri());
    *request.uri_mut() = uri.parse().expect("a valid URI");
    client.request::<DynamicObject>(request).await
}

/// The API server's rule on a compensation's report size counts exactly as the operator does:
/// at the limit accepted, one byte over refused, for several shapes of id and sub-actions.
fn the_report_rule_counts_as_the_worker_writes(env: &TestEnv) {
    let namespace = env.fresh_namespace("report-rule");
    let base = read_object(&repo_path("examples/compensation.yaml"));
    let budget = REPORT_LIMIT - REPORT_WORDS_ROOM;
    env.block_on(async {
        for (count, id_length) in [(16, 1), (16, 20), (12, 100), (7, 253)] {
            // The longest names that fit with `count` sub-actions under an id of `id_length`.
            let id = "c".repeat(id_length);
            let fixed = report_floor(&id, &vec![""; count]);
            let Some(room) = budget.checked_sub(fixed) else {
                panic!("{count} sub-actions under a {id_length}-character id never fit")
            };
            let per_name = (room / 2 / count).min(63);
            let mut names: Vec<String> = (0..count)
                .map(|i| format!("{i:x}{}", "n".repeat(per_name - 1)))
                .collect();
            // Lengthen the names one character at a time while the count allows.
            let mut index = 0;
            while report_floor(&id, &refs(&names)) + 2 <= budget && index < count {
                names[index].push('x');
                index += 1;
            }
            let at_limit = report_floor(&id, &refs(&names));
            let mut object = base.clone();
            object["metadata"]["name"] = json!(format!("fits-{count}-{id_length}"));
            object["spec"]["compensationId"] = json!(id);
            object["spec"]["proposedAction"]["subActions"] = json!(names);
            create_strict(&env.admin(), &namespace, &object)
                .await
                .unwrap_or_else(|e| panic!("{count} sub-actions counted {at_limit} <= {budget} were refused: {e}"));
            // One more byte: the id one character longer (or, at 253, a longer name).
            let mut over = object.clone();
            over["metadata"]["name"] = json!(format!("over-{count}-{id_length}"));
            let mut longer = names.clone();
            let grown = if id_length < 253 {
                over["spec"]["compensationId"] = json!("c".repeat(id_length + 1));
                report_floor(&"c".repeat(id_length + 1), &refs(&names))
            } else {
                let short = longer.iter().position(|n| n.len() < 63).expect("a name to grow");
                longer[short].push('y');
                over["spec"]["proposedAction"]["subActions"] = json!(longer);
                report_floor(&id, &refs(&longer))
            };
            assert!(
                at_limit + 1 >= budget && grown > budget,
                "{count} sub-actions: {at_limit} is not at the limit {budget}, or {grown} not over it"
            );
            let status = refusal(
                create_strict(&env.admin(), &namespace, &over).await,
                &format!("{count} sub-actions counted {grown} > {budget}"),
            );
            assert!(
                status.message.contains("compensationId and proposedAction.subActions are too long together"),
                "server said: {}",
                status.message
            );
        }
    });
}

fn refs(names: &[String]) -> Vec<&str> {
    names.iter().map(String::as_str).collect()
}

/// The server's `Status` of a refused request; panics if it was not refused.
fn refusal<T: std::fmt::Debug>(result: Result<T, kube::Error>, what: &str) -> Box<Status> {
    match result {
        Err(kube::Error::Api(status)) => status,
        Err(other) => panic!("{what}: expected a refusal from the API server, got {other}"),
        Ok(accepted) => panic!("{what}: the API server accepted it: {accepted:?}"),
    }
}

fn dynamic_api(client: Client, namespace: &str, kind: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client, namespace, &resource_of(&crd_of_kind(kind)))
}

/// Asserts every value in `sent` is in `stored` unchanged (the server may add
/// defaults, but must not drop or alter what was sent).
fn assert_kept(sent: &Value, stored: &Value, at: &str) {
    match (sent, stored) {
        (Value::Object(sent), Value::Object(stored)) => {
            for (key, value) in sent {
                let got = stored
                    .get(key)
                    .unwrap_or_else(|| panic!("{at}.{key} was dropped by the server"));
                assert_kept(value, got, &format!("{at}.{key}"));
            }
        }
        (Value::Array(sent), Value::Array(stored)) => {
            assert_eq!(sent.len(), stored.len(), "{at}: list length changed");
            for (i, (value, got)) in sent.iter().zip(stored).enumerate() {
                assert_kept(value, got, &format!("{at}[{i}]"));
            }
        }
        (Value::Number(sent), Value::Number(stored)) => {
            assert_eq!(sent.as_f64(), stored.as_f64(), "{at}");
        }
        _ => assert_eq!(sent, stored, "{at}"),
    }
}

// ---------------------------------------------------------------------------
// Examples

fn example_kinds() -> BTreeSet<String> {
    example_files()
        .iter()
        .map(|path| kind_of(&read_object(path)).to_string())
        .collect()
}

fn all_kinds() -> BTreeSet<String> {
    api::all_crds()
        .into_iter()
        .map(|crd| crd.spec.names.kind)
        .collect()
}

fn examples_cover_every_kind(_env: &TestEnv) {
    assert_eq!(
        example_kinds(),
        all_kinds(),
        "examples/*.yaml should show every kind"
    );
}

fn example_is_accepted(env: &TestEnv, path: &Path) {
    let object = read_object(path);
    let kind = kind_of(&object).to_string();
    let namespace = env.fresh_namespace("example");
    let created = env
        .block_on(create_strict(&env.admin(), &namespace, &object))
        .unwrap_or_else(|e| panic!("{} was refused: {e}", path.display()));
    let stored = serde_json::to_value(&created).expect("serialize");
    assert_kept(&object["spec"], &stored["spec"], "spec");

    // What the server stored (defaults included) reads back as the Rust type.
    let typed = match kind.as_str() {
        "BacklogBudget" => serde_json::from_value::<BacklogBudget>(stored).map(|_| ()),
        "ReplayJob" => serde_json::from_value::<ReplayJob>(stored).map(|_| ()),
        "Compensation" => serde_json::from_value::<Compensation>(stored).map(|_| ()),
        "RetryPolicy" => serde_json::from_value::<RetryPolicy>(stored).map(|_| ()),
        other => panic!("{}: unexpected kind {other:?}", path.display()),
    };
    typed.unwrap_or_else(|e| panic!("{}: stored {kind} does not parse: {e}", path.display()));
}

/// The BacklogBudget `backlog-operator plan` prints applies as it is, under strict field
/// validation and every CEL rule.
fn plan_budget_is_accepted(env: &TestEnv, path: &Path) {
    let report = backlog_operator::plan::plan_file(path)
        .unwrap_or_else(|e| panic!("{} does not plan: {e}", path.display()));
    assert!(
        report.budget.spec.max_replicas
            <= i32::try_from(report.plan.partitions).unwrap_or(i32::MAX)
    );
    let mut object = serde_json::to_value(&report.budget).expect("serialize");
    object["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("namespace");
    let namespace = env.fresh_namespace("plan");
    let created = env
        .block_on(create_strict(&env.admin(), &namespace, &object))
        .unwrap_or_else(|e| {
            panic!(
                "the budget planned from {} was refused: {e}",
                path.display()
            )
        });
    let stored = serde_json::to_value(&created).expect("serialize");
    assert_kept(&object["spec"], &stored["spec"], "spec");
}

/// Proves the examples test can fail: with strict field validation an
/// unknown field is an error; without it the server silently drops the field.
fn strict_field_validation_refuses_unknown_fields(env: &TestEnv) {
    let mut object = read_object(&repo_path("examples/retry-policy.yaml"));
    object["spec"]["backoff"]["multiplier"] = json!(2);
    let namespace = env.fresh_namespace("strict");
    let client = env.admin();
    env.block_on(async {
        let status = refusal(
            create_strict(&client, &namespace, &object).await,
            "a RetryPolicy with spec.backoff.multiplier",
        );
        assert!(
            status
                .message
                .contains("unknown field \"spec.backoff.multiplier\""),
            "server said: {}",
            status.message
        );

        let api = dynamic_api(client.clone(), &namespace, "RetryPolicy");
        let lenient: DynamicObject =
            serde_json::from_value(object.clone()).expect("a DynamicObject");
        let stored = api
            .create(&PostParams::default(), &lenient)
            .await
            .expect("without strict validation the object is accepted");
        assert!(
            stored.data["spec"]["backoff"].get("multiplier").is_none(),
            "the unknown field should have been pruned: {:?}",
            stored.data["spec"]["backoff"]
        );
    });
}

// ---------------------------------------------------------------------------
// The invalid corpus

fn corpus_covers_every_kind(_env: &TestEnv) {
    let files = corpus_files();
    assert!(
        files.len() >= 30,
        "tests/invalid holds {} objects; keep at least 30",
        files.len()
    );
    let entries = fs::read_dir(repo_path("tests/invalid")).expect("tests/invalid");
    for entry in entries {
        let path = entry.expect("entry").path();
        assert!(
            files.contains(&path),
            "{}: tests/invalid holds only *.yaml objects",
            path.display()
        );
    }
    for kind in all_kinds() {
        let count = files
            .iter()
            .filter(|path| kind_of(&read_object(path)) == kind)
            .count();
        assert!(
            count >= MIN_CORPUS_PER_KIND,
            "only {count} invalid {kind} objects in tests/invalid"
        );
    }
}

fn invalid_object_is_refused(env: &TestEnv, path: &Path) {
    let file = file_name(path);
    let case = InvalidCase::load(path);
    assert!(
        !case.expect.is_empty(),
        "{file}: no `# expect: <fragment of the server's message>` line"
    );
    assert!(
        all_kinds().contains(kind_of(&case.object)),
        "{file}: kind {:?} is not one of ours",
        kind_of(&case.object)
    );
    let namespace = env.fresh_namespace("invalid");
    let status = refusal(
        env.block_on(create_strict(&env.admin(), &namespace, &case.object)),
        &file,
    );
    let missing: Vec<&String> = case
        .expect
        .iter()
        .filter(|fragment| !status.message.contains(fragment.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "{file}: the server's message lacks {missing:?}\nthe server said (HTTP {} {}): {}",
        status.code,
        status.reason,
        status.message
    );
    assert_eq!(
        (status.code, status.reason.as_str()),
        (422, "Invalid"),
        "{file}: expected a validation error; the server said: {}",
        status.message
    );
}

/// GitOps tools apply with server-side apply, which refuses an entry given twice in a keyed
/// list before any schema rule runs, and as HTTP 500 (a create gets 422 `Duplicate value`):
/// the README says so, and this keeps it true on the pinned Kubernetes version.
fn server_side_apply_refuses_a_repeated_key_and_stores_nothing(env: &TestEnv) {
    let case = InvalidCase::load(&repo_path("tests/invalid/rj-duplicate-event-ids.yaml"));
    let namespace = env.fresh_namespace("ssa-duplicate");
    let replays = dynamic_api(env.admin(), &namespace, kind_of(&case.object));
    let name = name_of(&case.object).to_string();
    env.block_on(async {
        let status = refusal(
            replays
                .patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER),
                    &Patch::Apply(&case.object),
                )
                .await,
            "server-side apply of a repeated event id",
        );
        assert!(
            status.message.contains("duplicate entries") && status.message.contains("evt-0001"),
            "the refusal names the repeated entry: HTTP {} {}",
            status.code,
            status.message
        );
        assert!(
            matches!(status.code, 422 | 500),
            "HTTP {}: {}",
            status.code,
            status.message
        );
        assert!(
            replays.get_opt(&name).await.expect("read").is_none(),
            "nothing was stored"
        );
    });
}

// ---------------------------------------------------------------------------
// Updates

fn replay_scope_and_requester_are_immutable(env: &TestEnv) {
    let namespace = env.fresh_namespace("replay-immutable");
    let client = env.admin();
    let object = read_object(&repo_path("examples/replay-job.yaml"));
    let name = name_of(&object).to_string();
    env.block_on(async {
        create_strict(&client, &namespace, &object)
            .await
            .expect("create the example replay");
        let replays = Api::<ReplayJob>::namespaced(client.clone(), &namespace);
        let merge = |patch: Value| {
            let replays = replays.clone();
            let name = name.clone();
            async move {
                replays
                    .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
            }
        };

        for change in [
            json!({"spec": {"scope": {"eventIds": ["evt-0001"]}}}),
            json!({"spec": {"scope": {"tenant": "globex"}}}),
            json!({"spec": {"scope": {"eventIds": null, "timeRange": {
                "from": "2026-11-28T10:00:00Z", "to": "2026-11-28T12:00:00Z"}}}}),
        ] {
            let status = refusal(merge(change.clone()).await, &format!("patch {change}"));
            assert_eq!(status.code, 422, "{}", status.message);
            for fragment in ["spec.scope", "immutable"] {
                assert!(
                    status.message.contains(fragment),
                    "patch {change}: {fragment:?} not in the server's message: {}",
                    status.message
                );
            }
        }

        let status = refusal(
            merge(json!({"spec": {"requestedBy": "carol"}})).await,
            "changing spec.requestedBy",
        );
        assert_eq!(status.code, 422, "{}", status.message);
        assert!(
            status.message.contains("spec.requestedBy")
                && status.message.contains("requestedBy is immutable"),
            "server said: {}",
            status.message
        );

        let resized = merge(json!({"spec": {"batches": {"size": 3}}}))
            .await
            .expect("spec.batches.size may change");
        assert_eq!(resized.spec.batches.size, 3);
        let approved = merge(
            json!({"spec": {"approval": {"approvedBy": "bob", "scopeSha256": "0".repeat(64), "specSha256": "0".repeat(64)}}}),
        )
        .await
        .expect("an approval may be added after creation");
        assert_eq!(
            approved.spec.approval.map(|a| a.approved_by).as_deref(),
            Some("bob")
        );

        let stored = replays.get(&name).await.expect("get the replay");
        assert_eq!(
            stored.spec.scope.event_ids,
            ["evt-0001", "evt-0002", "evt-0003"]
        );
        assert_eq!(stored.spec.scope.tenant.as_deref(), Some("acme"));
        assert!(stored.spec.scope.time_range.is_none());
        assert_eq!(stored.spec.requested_by, "alice");
        assert_eq!(stored.metadata.generation, Some(3));
    });
}

// ---------------------------------------------------------------------------
// Printer columns and the category

/// For each kind: a status to patch in, and the cell every printer column
/// must then show for the kind's example object. A column without an entry
/// here fails the test, so a new column comes with a check of its jsonPath.
fn showcase(kind: &str) -> (Value, Vec<(&'static str, Value)>) {
    match kind {
        "BacklogBudget" => (
            json!({
                "phase": "AtRisk",
                "observed": {
                    "backlog": 1234.5,
                    "replicas": 3,
                    "partitions": 12,
                    "oldestUnfinishedAge": 242.0,
                    "oldestUnfinishedAgeText": "4m2s",
                },
                "desiredReplicas": 7,
                "drainTimeSeconds": 200.0,
                "drainTime": "3m20s",
                "explanation": "backlog 1234.5 drains in 3m20s at 7 replicas",
                "capacityHeadroom": 1.75,
            }),
            vec![
                ("Phase", json!("AtRisk")),
                ("Replicas", json!(3)),
                ("Desired", json!(7)),
                ("Partitions", json!(12)),
                ("Backlog", json!(1234.5)),
                ("Oldest", json!("4m2s")),
                ("Deadline", json!("10m")),
                ("Drain", json!("3m20s")),
                ("Headroom", json!(1.75)),
                (
                    "Reason",
                    json!("backlog 1234.5 drains in 3m20s at 7 replicas"),
                ),
            ],
        ),
        "ReplayJob" => (
            json!({
                "phase": "Canary",
                "message": "canary batch 1 of 2 running",
                "scope": {
                    "configMap": "orders-schema-fix-replay-scope",
                    "count": 3,
                    "sha256": "9f2c",
                    "frozenAt": "2026-11-28T10:00:00Z",
                },
                "batchesTotal": 2,
                "batchesSucceeded": 1,
                "batchesFailed": 0,
            }),
            vec![
                ("Phase", json!("Canary")),
                ("Source", json!("orders.quarantine")),
                ("Events", json!(3)),
                ("Batches", json!(2)),
                ("Done", json!(1)),
                ("Failed", json!(0)),
                ("Requested By", json!("alice")),
                ("Approved By", json!("bob")),
                ("Reason", json!("canary batch 1 of 2 running")),
            ],
        ),
        "Compensation" => (
            json!({
                "phase": "Executing",
                "message": "the worker runs in Job compensation-3f1c",
            }),
            vec![
                ("Phase", json!("Executing")),
                ("Compensation Id", json!("refund-o-123")),
                ("Reason Code", json!("DuplicateEffect")),
                ("Requested By", json!("alice")),
                // Not approved yet in the example.
                ("Approved By", json!(null)),
                ("Reason", json!("the worker runs in Job compensation-3f1c")),
            ],
        ),
        "RetryPolicy" => (
            json!({
                "worstCaseRetryDelay": "10.7s",
                "amplification": 5,
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "Valid", "message": "",
                     "lastTransitionTime": "2026-11-28T10:00:00Z"},
                    {"type": "DeadlineConflict", "status": "False", "reason": "NoConflict",
                     "message": "", "lastTransitionTime": "2026-11-28T10:00:00Z"},
                ],
            }),
            vec![
                ("Attempts", json!(5)),
                ("Worst Case", json!("10.7s")),
                ("Amplification", json!(5)),
                ("Ready", json!("True")),
                ("Deadline Conflict", json!("False")),
            ],
        ),
        other => panic!("no printer-column showcase for kind {other:?}"),
    }
}

/// Creates every example in `namespace`; returns `(kind, name)` of each.
async fn create_examples(client: &Client, namespace: &str) -> Vec<(String, String)> {
    let mut created = Vec::new();
    for path in example_files() {
        let object = read_object(&path);
        let made = create_strict(client, namespace, &object)
            .await
            .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        created.push((kind_of(&object).to_string(), made.name_any()));
    }
    created
}

fn cells_equal(expected: &Value, got: &Value) -> bool {
    match (expected.as_f64(), got.as_f64()) {
        (Some(e), Some(g)) => e == g,
        _ => expected == got,
    }
}

fn printer_columns_show_in_the_server_table(env: &TestEnv) {
    let namespace = env.fresh_namespace("printer-columns");
    let client = env.admin();
    env.block_on(async {
        let examples = create_examples(&client, &namespace).await;
        dynamic_api(client.clone(), &namespace, "ReplayJob")
            .patch(
                "orders-schema-fix-replay",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"approval": {"approvedBy": "bob", "scopeSha256": "0".repeat(64), "specSha256": "0".repeat(64)}}})),
            )
            .await
            .expect("approve the example replay");

        for crd in api::all_crds() {
            let kind = crd.spec.names.kind.clone();
            let (kind_name, name) = examples
                .iter()
                .find(|(k, _)| *k == kind)
                .unwrap_or_else(|| panic!("no example {kind}"));
            assert_eq!(kind_name, &kind);
            let (status, expected) = showcase(&kind);
            dynamic_api(client.clone(), &namespace, &kind)
                .patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await
                .unwrap_or_else(|e| panic!("patching the status of {kind} {name}: {e}"));

            let mut request = Request::new(collection_path(&resource_of(&crd), &namespace))
                .list(&ListParams::default())
                .expect("build the list request");
            request
                .headers_mut()
                .insert("accept", TABLE_ACCEPT.parse().expect("a header value"));
            let text = client
                .request_text(request)
                .await
                .unwrap_or_else(|e| panic!("listing {kind} as a Table: {e}"));
            let table: Value = serde_json::from_str(&text).expect("a JSON Table");
            assert_eq!(table["kind"], "Table", "{text}");

            let columns: Vec<&str> = table["columnDefinitions"]
                .as_array()
                .unwrap_or_else(|| panic!("no columnDefinitions: {text}"))
                .iter()
                .map(|c| c["name"].as_str().unwrap_or_default())
                .collect();
            let declared = crd.spec.versions[0]
                .additional_printer_columns
                .clone()
                .unwrap_or_default();
            let declared_names: Vec<&str> = declared.iter().map(|c| c.name.as_str()).collect();
            assert!(!declared.is_empty(), "{kind} declares no printer columns");
            assert_eq!(
                columns,
                [&["Name"][..], &declared_names].concat(),
                "{kind}: the server's table columns"
            );

            let rows = table["rows"].as_array().expect("rows");
            assert_eq!(rows.len(), 1, "{kind}: {text}");
            let cells = rows[0]["cells"].as_array().expect("cells");
            assert_eq!(cells[0], json!(name));
            for (i, column) in declared.iter().enumerate() {
                let got = &cells[i + 1];
                if column.type_ == "date" {
                    assert!(
                        got.as_str().is_some_and(|s| !s.is_empty()),
                        "{kind} column {}: {got}",
                        column.name
                    );
                    continue;
                }
                let want = expected
                    .iter()
                    .find(|(n, _)| *n == column.name)
                    .map(|(_, v)| v)
                    .unwrap_or_else(|| {
                        panic!(
                            "{kind} column {:?} ({}) has no expected cell in showcase()",
                            column.name, column.json_path
                        )
                    });
                assert!(
                    cells_equal(want, got),
                    "{kind} column {:?} ({}): expected {want}, the server shows {got}",
                    column.name,
                    column.json_path
                );
            }
            for (column, _) in &expected {
                assert!(
                    declared_names.contains(column),
                    "{kind}: showcase() expects a column {column:?} the CRD does not declare"
                );
            }
        }
    });
}

/// Runs the cluster's kubectl as admin; `Err` carries its stderr.
async fn kubectl(env: &TestEnv, args: &[&str]) -> Result<String, String> {
    let kubectl = env
        .cluster()
        .kubectl_path()
        .expect("the control plane comes with a kubectl")
        .to_path_buf();
    let mut command = Command::new(kubectl);
    command
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .arg("--cache-dir")
        .arg(env.cluster().state_dir().join("kubectl-cache"))
        .args(args);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("kubectl task")
        .map_err(|e| format!("running kubectl: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

fn kubectl_get_backlog_lists_every_kind(env: &TestEnv) {
    let namespace = env.fresh_namespace("category");
    let client = env.admin();
    env.block_on(async {
        let examples = create_examples(&client, &namespace).await;
        let want: BTreeSet<String> = examples
            .iter()
            .map(|(kind, name)| format!("{}.{}/{name}", kind.to_lowercase(), api::GROUP))
            .collect();
        assert_eq!(want.len(), all_kinds().len(), "{want:?}");

        let listed = wait_until(
            DISCOVERY_TIMEOUT,
            "kubectl get backlog lists every example",
            || async {
                let out = kubectl(env, &["get", "backlog", "-n", &namespace, "-o", "name"]).await?;
                let got: BTreeSet<String> = out.lines().map(str::to_string).collect();
                if got == want {
                    Ok(got)
                } else {
                    Err(format!("listed {got:?}"))
                }
            },
        )
        .await;
        assert_eq!(listed.len(), all_kinds().len());

        // The human-readable form carries each kind's printer columns.
        let table = kubectl(env, &["get", "backlog", "-n", &namespace])
            .await
            .expect("kubectl get backlog");
        for header in [
            "PHASE",
            "DESIRED",
            "PARTITIONS",
            "REQUESTED BY",
            "ATTEMPTS",
            "COMPENSATION ID",
        ] {
            assert!(table.contains(header), "no {header} column in:\n{table}");
        }

        // Short names.
        for (short, kind) in [
            ("bb", "backlogbudget"),
            ("rj", "replayjob"),
            ("rp", "retrypolicy"),
            ("comp", "compensation"),
        ] {
            let out = kubectl(env, &["get", short, "-n", &namespace, "-o", "name"])
                .await
                .unwrap_or_else(|e| panic!("kubectl get {short}: {e}"));
            assert!(
                out.lines().count() == 1 && out.starts_with(&format!("{kind}.{}/", api::GROUP)),
                "kubectl get {short}: {out}"
            );
        }
    });
}
