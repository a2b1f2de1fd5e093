//! The pod a worker runs in, for replays and compensations alike (pure): the team's template,
//! with the operator's contract on top. The operator's environment variables and the frozen
//! ConfigMap's read-only mount replace anything of the same name in the template, and every
//! field the template leaves unset gets the restricted Pod Security profile's value.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, EnvVar, KeyToPath, PodSecurityContext, PodSpec,
    PodTemplateSpec, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// One key of a frozen ConfigMap, mounted read-only in every container.
pub struct FrozenMount<'a> {
    pub volume: &'a str,
    pub dir: &'a str,
    pub config_map: &'a str,
    pub key: &'a str,
}

/// `template` with `labels`, `env` and `mount` added, run once (`restartPolicy: Never`), as
/// `worker_account` unless it names a ServiceAccount, under the restricted profile.
pub fn prepare(
    mut template: PodTemplateSpec,
    labels: &BTreeMap<String, String>,
    env: &[EnvVar],
    mount: &FrozenMount<'_>,
    worker_account: &str,
) -> PodTemplateSpec {
    template
        .metadata
        .get_or_insert_with(ObjectMeta::default)
        .labels
        .get_or_insert_with(BTreeMap::new)
        .extend(labels.clone());
    let pod = template.spec.get_or_insert_with(PodSpec::default);
    // A retry is a new pod anyway (and Indexed Jobs with backoffLimitPerIndex require it).
    pod.restart_policy = Some("Never".to_owned());
    // A worker without a ServiceAccount of its own would get the namespace's `default` one;
    // it gets the dedicated one instead (the pod policy refuses any other).
    if pod
        .service_account_name
        .as_deref()
        .is_none_or(str::is_empty)
        && pod.service_account.as_deref().is_none_or(str::is_empty)
    {
        pod.service_account_name = Some(worker_account.to_owned());
    }
    restrict_pod(
        pod.security_context
            .get_or_insert_with(PodSecurityContext::default),
    );
    for container in pod
        .containers
        .iter_mut()
        .chain(pod.init_containers.iter_mut().flatten())
    {
        wire(container, env, mount);
    }
    let volumes = pod.volumes.get_or_insert_with(Vec::new);
    volumes.retain(|v| v.name != mount.volume);
    volumes.push(Volume {
        name: mount.volume.to_owned(),
        config_map: Some(ConfigMapVolumeSource {
            name: mount.config_map.to_owned(),
            items: Some(vec![KeyToPath {
                key: mount.key.to_owned(),
                path: mount.key.to_owned(),
                mode: None,
            }]),
            default_mode: Some(0o444),
            optional: Some(false),
        }),
        ..Volume::default()
    });
    template
}

/// The restricted Pod Security profile, field by field where the template leaves a field unset:
/// what the template sets explicitly wins.
fn restrict_pod(pod: &mut PodSecurityContext) {
    pod.run_as_non_root.get_or_insert(true);
    pod.seccomp_profile.get_or_insert_with(runtime_default);
}

fn restrict_container(container: &mut Container) {
    let context = container
        .security_context
        .get_or_insert_with(SecurityContext::default);
    context.run_as_non_root.get_or_insert(true);
    context.allow_privilege_escalation.get_or_insert(false);
    context.read_only_root_filesystem.get_or_insert(true);
    // Every capability is dropped whatever the template says; it may add back only what the
    // restricted profile allows (the pod policy refuses the rest).
    let capabilities = context
        .capabilities
        .get_or_insert_with(Capabilities::default);
    let drop = capabilities.drop.get_or_insert_with(Vec::new);
    if !drop.iter().any(|c| c == "ALL") {
        drop.push("ALL".to_owned());
    }
    context.seccomp_profile.get_or_insert_with(runtime_default);
}

fn runtime_default() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".to_owned(),
        localhost_profile: None,
    }
}

/// Set by Kubernetes in an Indexed Job's pods, but only where the container does not set it
/// itself: a template's own value would make every index run the same batch.
const COMPLETION_INDEX_VAR: &str = "JOB_COMPLETION_INDEX";

fn wire(container: &mut Container, env: &[EnvVar], mount: &FrozenMount<'_>) {
    let vars = container.env.get_or_insert_with(Vec::new);
    vars.retain(|var| {
        var.name != COMPLETION_INDEX_VAR && !env.iter().any(|ours| ours.name == var.name)
    });
    vars.extend(env.iter().cloned());
    let mounts = container.volume_mounts.get_or_insert_with(Vec::new);
    // A mount within the frozen directory (a file of another volume over the frozen list)
    // would show the worker other ids than those approved, however the path is spelled.
    mounts.retain(|m| m.name != mount.volume && !within(&m.mount_path, mount.dir));
    mounts.push(VolumeMount {
        name: mount.volume.to_owned(),
        mount_path: mount.dir.to_owned(),
        read_only: Some(true),
        ..VolumeMount::default()
    });
    restrict_container(container);
}

/// `path` is `dir` or lies under it, compared by path components (`/etc//x/./y` is
/// `/etc/x/y`); a `..` anywhere could lead anywhere, so it counts as within.
fn within(path: &str, dir: &str) -> bool {
    let components = |p: &str| -> Vec<String> {
        p.split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .map(str::to_owned)
            .collect()
    };
    let (path, dir) = (components(path), components(dir));
    path.iter().any(|c| c == "..") || path.starts_with(&dir)
}
