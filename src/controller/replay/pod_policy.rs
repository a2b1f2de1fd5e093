//! What a replay worker's pod may be (pure): the restricted Pod Security profile, a
//! ServiceAccount from an allowlist, and optionally images pinned by digest.
//!
//! The API server refuses such templates already (the chart's admission policy, with the same
//! rules and messages); the operator checks again before it creates a Job, so a cluster without
//! the policy, or a ReplayJob admitted before it was installed, still cannot run a worker that
//! could take over its node or act as another ServiceAccount. The operator creates the Job with
//! its own credentials, so the worker must never get more than its requester could.

use k8s_openapi::api::core::v1::{
    Container, PodSecurityContext, PodSpec, PodTemplateSpec, SELinuxOptions, SecurityContext,
    Volume,
};

use crate::api::worker_template::WorkerTemplate;

/// The ServiceAccount a worker runs as when its template names none.
pub const DEFAULT_WORKER_SERVICE_ACCOUNT: &str = "replay-worker";

/// Volume types of the restricted profile; every other one (hostPath first of all) is refused.
const ALLOWED_VOLUME_TYPES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// The sysctls the baseline profile calls safe.
const SAFE_SYSCTLS: [&str; 10] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// SELinux types the baseline profile allows.
const ALLOWED_SELINUX_TYPES: [&str; 4] = [
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// The only capability a restricted pod may add.
const ADDABLE_CAPABILITY: &str = "NET_BIND_SERVICE";

/// The operator's rules for worker pods (`--replay-worker-service-account`,
/// `--replay-require-image-digest`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerPolicy {
    /// ServiceAccounts a worker may run as (in the replay's namespace).
    pub service_accounts: Vec<String>,
    /// Every image must be pinned as `name@sha256:<64 hex>`.
    pub require_image_digest: bool,
}

impl WorkerPolicy {
    /// The ServiceAccount of a worker whose template names none: the first allowed one.
    pub fn default_account(&self) -> &str {
        self.service_accounts
            .first()
            .map(String::as_str)
            .unwrap_or(DEFAULT_WORKER_SERVICE_ACCOUNT)
    }
}

impl Default for WorkerPolicy {
    fn default() -> Self {
        WorkerPolicy {
            service_accounts: vec![DEFAULT_WORKER_SERVICE_ACCOUNT.to_owned()],
            require_image_digest: false,
        }
    }
}

const PROFILE: &str = "replay workers run under the restricted Pod Security profile";

/// Every rule `template` breaks, each naming the field and the fix; empty when it may run.
/// A template that is not a `PodTemplateSpec` at all is refused for its first wrong field.
pub fn problems(template: &WorkerTemplate, policy: &WorkerPolicy) -> Vec<String> {
    match template.decode() {
        Ok(template) => decoded_problems(&template, policy),
        Err(undecodable) => vec![undecodable.to_string()],
    }
}

fn decoded_problems(template: &PodTemplateSpec, policy: &WorkerPolicy) -> Vec<String> {
    let mut found = Vec::new();
    let Some(pod) = &template.spec else {
        return vec!["spec.template.spec is missing: give the worker's containers".to_owned()];
    };
    pod_problems(pod, policy, &mut found);
    if let Some(annotations) = template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
    {
        for (key, value) in annotations {
            if key.starts_with("container.apparmor.security.beta.kubernetes.io/")
                && value == "unconfined"
            {
                found.push(format!(
                    "spec.template.metadata.annotations[{key}] is unconfined: {PROFILE}; remove it"
                ));
            }
        }
    }
    for (path, container) in containers(pod) {
        container_problems(&path, container, policy, &mut found);
    }
    found
}

fn containers(pod: &PodSpec) -> Vec<(String, &Container)> {
    let main = pod
        .containers
        .iter()
        .enumerate()
        .map(|(i, c)| (format!("spec.template.spec.containers[{i}]"), c));
    let init = pod
        .init_containers
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| (format!("spec.template.spec.initContainers[{i}]"), c));
    main.chain(init).collect()
}

fn pod_problems(pod: &PodSpec, policy: &WorkerPolicy, found: &mut Vec<String>) {
    for (field, set) in [
        ("hostNetwork", pod.host_network),
        ("hostPID", pod.host_pid),
        ("hostIPC", pod.host_ipc),
    ] {
        if set == Some(true) {
            found.push(format!(
                "spec.template.spec.{field} is true: {PROFILE}, which shares none of the node's namespaces; remove it"
            ));
        }
    }
    if pod.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        found.push(
            "spec.template.spec.nodeName is set: a worker is placed by the scheduler like any pod; remove it (use nodeSelector or affinity)".to_owned(),
        );
    }
    if pod
        .ephemeral_containers
        .as_ref()
        .is_some_and(|c| !c.is_empty())
    {
        found.push(
            "spec.template.spec.ephemeralContainers is set: a worker has no debug containers; remove it".to_owned(),
        );
    }
    for volume in pod.volumes.iter().flatten() {
        if let Some(kind) = forbidden_volume_type(volume) {
            found.push(format!(
                "spec.template.spec.volumes[{}] uses {kind}: {PROFILE}, which allows only {} volumes; remove it",
                volume.name,
                ALLOWED_VOLUME_TYPES.join(", ")
            ));
        }
    }
    let account = pod
        .service_account_name
        .as_deref()
        .or(pod.service_account.as_deref())
        .filter(|a| !a.is_empty());
    if let Some(account) = account
        && !policy.service_accounts.iter().any(|a| a == account)
    {
        found.push(format!(
            "spec.template.spec.serviceAccountName {account:?} is not allowed: replay workers run as one of {} (default {DEFAULT_WORKER_SERVICE_ACCOUNT}), never as the operator or another workload; remove it or use an allowed one",
            policy.service_accounts.join(", ")
        ));
    }
    if let Some(context) = &pod.security_context {
        let path = "spec.template.spec.securityContext";
        shared_problems(path, &Shared::of_pod(context), found);
        for sysctl in context.sysctls.iter().flatten() {
            if !SAFE_SYSCTLS.contains(&sysctl.name.as_str()) {
                found.push(format!(
                    "{path}.sysctls names {}: {PROFILE}, which allows only the safe sysctls; remove it",
                    sysctl.name
                ));
            }
        }
    }
}

/// The fields a pod's and a container's security contexts share.
struct Shared<'a> {
    run_as_non_root: Option<bool>,
    run_as_user: Option<i64>,
    seccomp: Option<&'a str>,
    app_armor: Option<&'a str>,
    se_linux: Option<&'a SELinuxOptions>,
    host_process: Option<bool>,
}

impl<'a> Shared<'a> {
    fn of_pod(context: &'a PodSecurityContext) -> Shared<'a> {
        Shared {
            run_as_non_root: context.run_as_non_root,
            run_as_user: context.run_as_user,
            seccomp: context.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
            app_armor: context.app_armor_profile.as_ref().map(|p| p.type_.as_str()),
            se_linux: context.se_linux_options.as_ref(),
            host_process: context
                .windows_options
                .as_ref()
                .and_then(|w| w.host_process),
        }
    }

    fn of_container(context: &'a SecurityContext) -> Shared<'a> {
        Shared {
            run_as_non_root: context.run_as_non_root,
            run_as_user: context.run_as_user,
            seccomp: context.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
            app_armor: context.app_armor_profile.as_ref().map(|p| p.type_.as_str()),
            se_linux: context.se_linux_options.as_ref(),
            host_process: context
                .windows_options
                .as_ref()
                .and_then(|w| w.host_process),
        }
    }
}

fn shared_problems(path: &str, context: &Shared<'_>, found: &mut Vec<String>) {
    if context.run_as_non_root == Some(false) {
        found.push(format!(
            "{path}.runAsNonRoot is false: {PROFILE}; remove it"
        ));
    }
    if context.run_as_user == Some(0) {
        found.push(format!(
            "{path}.runAsUser is 0 (root): {PROFILE}; remove it"
        ));
    }
    if context.seccomp == Some("Unconfined") {
        found.push(format!(
            "{path}.seccompProfile.type is Unconfined: {PROFILE}; use RuntimeDefault or Localhost"
        ));
    }
    if context.app_armor == Some("Unconfined") {
        found.push(format!(
            "{path}.appArmorProfile.type is Unconfined: {PROFILE}; remove it"
        ));
    }
    if let Some(options) = context.se_linux {
        selinux_problems(path, options, found);
    }
    if context.host_process == Some(true) {
        found.push(format!(
            "{path}.windowsOptions.hostProcess is true: {PROFILE}; remove it"
        ));
    }
}

fn forbidden_volume_type(volume: &Volume) -> Option<&'static str> {
    // Serialized, a volume is its name and exactly one source: the source's key is its type.
    let value = serde_json::to_value(volume).ok()?;
    let object = value.as_object()?;
    let kind = object
        .keys()
        .find(|k| *k != "name" && !ALLOWED_VOLUME_TYPES.contains(&k.as_str()))?;
    Some(match kind.as_str() {
        "hostPath" => "hostPath",
        _ => "a volume type outside the restricted profile",
    })
}

fn selinux_problems(path: &str, options: &SELinuxOptions, found: &mut Vec<String>) {
    if options.user.as_deref().is_some_and(|u| !u.is_empty())
        || options.role.as_deref().is_some_and(|r| !r.is_empty())
    {
        found.push(format!(
            "{path}.seLinuxOptions sets user or role: {PROFILE}; remove them"
        ));
    }
    if let Some(type_) = options.type_.as_deref().filter(|t| !t.is_empty())
        && !ALLOWED_SELINUX_TYPES.contains(&type_)
    {
        found.push(format!(
            "{path}.seLinuxOptions.type is {type_}: {PROFILE}, which allows only {}; remove it",
            ALLOWED_SELINUX_TYPES.join(", ")
        ));
    }
}

fn container_problems(
    path: &str,
    container: &Container,
    policy: &WorkerPolicy,
    found: &mut Vec<String>,
) {
    let image = container.image.as_deref().unwrap_or_default();
    if policy.require_image_digest && !pinned_by_digest(image) {
        found.push(format!(
            "{path}.image {image:?} is not pinned by digest: this cluster runs replay workers only from images named as name@sha256:<64 hex digits>; pin it"
        ));
    }
    for port in container.ports.iter().flatten() {
        if port.host_port.is_some_and(|p| p != 0) {
            found.push(format!(
                "{path}.ports sets hostPort {}: {PROFILE}; remove it",
                port.host_port.unwrap_or_default()
            ));
        }
    }
    if let Some(context) = &container.security_context {
        security_context_problems(&format!("{path}.securityContext"), context, found);
    }
}

fn security_context_problems(path: &str, context: &SecurityContext, found: &mut Vec<String>) {
    for (field, set) in [
        ("privileged", context.privileged),
        (
            "allowPrivilegeEscalation",
            context.allow_privilege_escalation,
        ),
    ] {
        if set == Some(true) {
            found.push(format!("{path}.{field} is true: {PROFILE}; remove it"));
        }
    }
    shared_problems(path, &Shared::of_container(context), found);
    if let Some(added) = context.capabilities.as_ref().and_then(|c| c.add.as_ref()) {
        let forbidden: Vec<&str> = added
            .iter()
            .map(String::as_str)
            .filter(|c| *c != ADDABLE_CAPABILITY)
            .collect();
        if !forbidden.is_empty() {
            found.push(format!(
                "{path}.capabilities.add lists {}: {PROFILE}, which adds at most {ADDABLE_CAPABILITY}; remove them",
                forbidden.join(", ")
            ));
        }
    }
    if context.proc_mount.as_deref() == Some("Unmasked") {
        found.push(format!(
            "{path}.procMount is Unmasked: {PROFILE}; remove it"
        ));
    }
}

/// `name@sha256:<64 lowercase hex digits>`.
pub fn pinned_by_digest(image: &str) -> bool {
    image.rsplit_once("@sha256:").is_some_and(|(name, digest)| {
        !name.is_empty()
            && digest.len() == 64
            && digest
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn template(spec: serde_json::Value) -> WorkerTemplate {
        WorkerTemplate::from(serde_json::json!({ "spec": spec }))
    }

    fn worker() -> serde_json::Value {
        serde_json::json!({"containers": [{"name": "replay", "image": "tool:1"}]})
    }

    fn refused(spec: serde_json::Value, policy: &WorkerPolicy, fragment: &str) {
        let found = problems(&template(spec.clone()), policy);
        assert!(
            found.iter().any(|p| p.contains(fragment)),
            "{fragment:?} not in {found:?} for {spec}"
        );
    }

    #[test]
    fn a_plain_worker_may_run() {
        assert!(problems(&template(worker()), &WorkerPolicy::default()).is_empty());
        let mut spec = worker();
        spec["serviceAccountName"] = "replay-worker".into();
        spec["volumes"] = serde_json::json!([{"name": "scratch", "emptyDir": {}}]);
        spec["containers"][0]["securityContext"] = serde_json::json!({
            "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
            "runAsUser": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        });
        assert_eq!(
            problems(&template(spec), &WorkerPolicy::default()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn host_access_is_refused_naming_the_field() {
        let policy = WorkerPolicy::default();
        for (field, fragment) in [
            ("hostNetwork", "spec.template.spec.hostNetwork is true"),
            ("hostPID", "spec.template.spec.hostPID is true"),
            ("hostIPC", "spec.template.spec.hostIPC is true"),
        ] {
            let mut spec = worker();
            spec[field] = true.into();
            refused(spec, &policy, fragment);
        }
        let mut spec = worker();
        spec["nodeName"] = "node-1".into();
        refused(spec, &policy, "spec.template.spec.nodeName is set");
        let mut spec = worker();
        spec["volumes"] = serde_json::json!([{"name": "root", "hostPath": {"path": "/"}}]);
        refused(
            spec,
            &policy,
            "spec.template.spec.volumes[root] uses hostPath",
        );
        let mut spec = worker();
        spec["volumes"] = serde_json::json!([{"name": "n", "nfs": {"server": "x", "path": "/"}}]);
        refused(spec, &policy, "volumes[n] uses a volume type outside");
    }

    #[test]
    fn privileges_are_refused_in_every_container() {
        let policy = WorkerPolicy::default();
        for (context, fragment) in [
            (
                serde_json::json!({"privileged": true}),
                "containers[0].securityContext.privileged is true",
            ),
            (
                serde_json::json!({"allowPrivilegeEscalation": true}),
                "allowPrivilegeEscalation is true",
            ),
            (
                serde_json::json!({"capabilities": {"add": ["SYS_ADMIN", "NET_BIND_SERVICE"]}}),
                "capabilities.add lists SYS_ADMIN",
            ),
            (serde_json::json!({"runAsUser": 0}), "runAsUser is 0"),
            (
                serde_json::json!({"runAsNonRoot": false}),
                "runAsNonRoot is false",
            ),
            (
                serde_json::json!({"seccompProfile": {"type": "Unconfined"}}),
                "seccompProfile.type is Unconfined",
            ),
            (
                serde_json::json!({"procMount": "Unmasked"}),
                "procMount is Unmasked",
            ),
        ] {
            let mut spec = worker();
            spec["containers"][0]["securityContext"] = context.clone();
            refused(spec, &policy, fragment);
            let mut spec = worker();
            spec["initContainers"] = serde_json::json!([{"name": "init", "image": "tool:1", "securityContext": context}]);
            refused(spec, &policy, "initContainers[0]");
        }
        let mut spec = worker();
        spec["containers"][0]["ports"] = serde_json::json!([{"containerPort": 80, "hostPort": 80}]);
        refused(spec, &policy, "hostPort 80");
        let mut spec = worker();
        spec["securityContext"] =
            serde_json::json!({"sysctls": [{"name": "kernel.msgmax", "value": "1"}]});
        refused(spec, &policy, "sysctls names kernel.msgmax");
    }

    #[test]
    fn only_allowed_service_accounts_run_workers() {
        let policy = WorkerPolicy::default();
        for account in ["backlog-operator", "default"] {
            let mut spec = worker();
            spec["serviceAccountName"] = account.into();
            refused(
                spec,
                &policy,
                &format!("spec.template.spec.serviceAccountName {account:?} is not allowed"),
            );
        }
        let mut spec = worker();
        spec["serviceAccount"] = "backlog-operator".into();
        refused(spec, &policy, "is not allowed");
        let custom = WorkerPolicy {
            service_accounts: vec!["orders-replay".into()],
            ..WorkerPolicy::default()
        };
        let mut spec = worker();
        spec["serviceAccountName"] = "orders-replay".into();
        assert!(problems(&template(spec), &custom).is_empty());
    }

    #[test]
    fn digests_are_required_when_the_policy_says_so() {
        let pinned = WorkerPolicy {
            require_image_digest: true,
            ..WorkerPolicy::default()
        };
        refused(
            worker(),
            &pinned,
            "containers[0].image \"tool:1\" is not pinned by digest",
        );
        let mut spec = worker();
        spec["containers"][0]["image"] = format!("tool@sha256:{}", "a".repeat(64)).into();
        assert!(problems(&template(spec), &pinned).is_empty());
        assert!(!pinned_by_digest("tool:1@sha256:abc"));
        assert!(!pinned_by_digest(&format!("@sha256:{}", "a".repeat(64))));
        assert!(!pinned_by_digest(&format!(
            "tool@sha256:{}",
            "A".repeat(64)
        )));
    }

    proptest! {
        /// Whatever else a template says, a privileged container or a hostPath volume is never
        /// accepted.
        #[test]
        fn privileged_or_host_path_is_always_refused(
            account in prop_oneof![Just(None), Just(Some("replay-worker")), Just(Some("other"))],
            host_network in any::<bool>(),
            privileged_index in 0usize..3,
            containers in 1usize..4,
            host_path in any::<bool>(),
        ) {
            let mut spec = serde_json::json!({"containers": (0..containers)
                .map(|i| serde_json::json!({"name": format!("c{i}"), "image": "tool:1"}))
                .collect::<Vec<_>>()});
            if let Some(account) = account {
                spec["serviceAccountName"] = account.into();
            }
            if host_network {
                spec["hostNetwork"] = true.into();
            }
            if host_path {
                spec["volumes"] = serde_json::json!([{"name": "h", "hostPath": {"path": "/var"}}]);
            } else if privileged_index < containers {
                spec["containers"][privileged_index]["securityContext"] =
                    serde_json::json!({"privileged": true});
            } else {
                return Ok(());
            }
            prop_assert!(!problems(&template(spec), &WorkerPolicy::default()).is_empty());
        }
    }
}
