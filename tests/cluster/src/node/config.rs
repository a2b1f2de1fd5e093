//! The configuration files of a node's components, as pure functions of the instance's
//! paths. Every path is the instance's own, so several nodes on one machine never share a
//! socket, a state directory or a cgroup.

use std::path::Path;

use super::{
    APISERVER_PORT, CLUSTER_CIDR, NODE_IP, NODE_NAME, SERVICE_CIDR, TOKEN_KUBE_PROXY, TOKEN_KUBELET,
};

/// containerd 1.6: its own root, state, socket and runc root; CNI from `cni_dir`; sandboxes
/// from `pause_image`.
pub(crate) fn containerd(
    state_dir: &Path,
    run_dir: &Path,
    cni_dir: &Path,
    pause_image: &str,
) -> String {
    let (state, run, cni) = (state_dir.display(), run_dir.display(), cni_dir.display());
    format!(
        r#"version = 2
root = "{state}/containerd"
state = "{run}/containerd"

[grpc]
  address = "{run}/containerd.sock"

[ttrpc]
  address = "{run}/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  # Default /opt/containerd: nothing of a node is written outside its own directories.
  path = "{state}/containerd-opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  # Root here may lack CAP_SYS_RESOURCE, without which runc cannot set a sandbox's
  # oom_score_adj of -998; clamp every score to containerd's own instead.
  restrict_oom_score_adj = true
  # Pod network namespaces under the state directory, not /run/netns: they are this
  # node's and are removed with it.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        Root = "{run}/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#
    )
}

/// The pod network: a bridge inside the node's namespace, addresses from `CLUSTER_CIDR`, no
/// masquerading (no traffic leaves the namespace anyway). The network's name carries the
/// instance id, so CNI's cache files of this node can be told from others'.
pub(crate) fn cni(network: &str, ipam_dir: &Path) -> String {
    let gateway = CLUSTER_CIDR.replace("0.0/16", "0.1");
    format!(
        r#"{{
  "cniVersion": "0.4.0",
  "name": "{network}",
  "plugins": [
    {{"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{CLUSTER_CIDR}", "gateway": "{gateway}"}}]],
              "routes": [{{"dst": "0.0.0.0/0"}}], "dataDir": "{}"}}}}
  ]
}}
"#,
        ipam_dir.display()
    )
}

/// A kubeconfig that reaches the API server inside the node's namespace with a bearer token.
pub(crate) fn kubeconfig(ca_file: &Path, user: &str, token: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {{server: "https://127.0.0.1:{APISERVER_PORT}", certificate-authority: "{}"}}
users:
- name: {user}
  user: {{token: "{token}"}}
contexts:
- name: local
  context: {{cluster: local, user: {user}}}
current-context: local
"#,
        ca_file.display()
    )
}

/// The kubelet: cgroup v1 allowed (this kind of machine mounts v1 controllers), cgroupfs under
/// the instance's own cgroup root, pod logs in the state directory, no disk-pressure eviction
/// or image garbage collection on a shared disk, and quick ConfigMap refreshes.
pub(crate) struct KubeletPaths<'a> {
    pub ca_file: &'a Path,
    pub containerd_socket: &'a Path,
    pub resolv_conf: &'a Path,
    pub pod_logs: &'a Path,
    pub cgroup_root: &'a str,
}

pub(crate) fn kubelet(paths: &KubeletPaths<'_>) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: "{cgroup_root}"
containerRuntimeEndpoint: "unix://{socket}"
podLogsDir: "{pod_logs}"
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: "{ca}"}}
authorization: {{mode: Webhook}}
readOnlyPort: 0
address: "{NODE_IP}"
healthzBindAddress: 127.0.0.1
healthzPort: 10248
clusterDomain: cluster.local
resolvConf: "{resolv}"
failSwapOn: false
# -999 needs CAP_SYS_RESOURCE, which root may lack here.
oomScoreAdj: 0
rotateCertificates: false
serializeImagePulls: false
evictionHard: {{memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusUpdateFrequency: 10s
syncFrequency: 10s
fileCheckFrequency: 10s
"#,
        cgroup_root = paths.cgroup_root,
        socket = paths.containerd_socket.display(),
        pod_logs = paths.pod_logs.display(),
        ca = paths.ca_file.display(),
        resolv = paths.resolv_conf.display(),
    )
}

/// kube-proxy in iptables mode; its rules live in the node's namespace only.
pub(crate) fn kube_proxy(kubeconfig: &Path) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {{kubeconfig: "{}"}}
hostnameOverride: {NODE_NAME}
clusterCIDR: {CLUSTER_CIDR}
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {{maxPerCore: 0, min: 0}}
oomScoreAdj: 0
"#,
        kubeconfig.display()
    )
}

/// The token-file lines of the node's components (`token,user,uid,"groups"`).
pub(crate) fn component_users(tokens: &[(&str, String)]) -> String {
    tokens
        .iter()
        .map(|(user, token)| match *user {
            TOKEN_KUBELET => format!("{token},{user},{user},\"system:nodes\"\n"),
            TOKEN_KUBE_PROXY => format!("{token},{user},{user},\"system:node-proxier\"\n"),
            _ => format!("{token},{user},{user}\n"),
        })
        .collect()
}

/// kube-apiserver's arguments for a node: every address inside the namespace, the default
/// admission plugins (ServiceAccount, PodSecurity, ...) plus NodeRestriction, and the Node
/// authorizer in front of RBAC.
pub(crate) fn apiserver_args(pki: &Path, etcd_url: &str) -> Vec<String> {
    let file = |name: &str| pki.join(name).display().to_string();
    vec![
        format!("--etcd-servers={etcd_url}"),
        "--bind-address=0.0.0.0".into(),
        format!("--advertise-address={NODE_IP}"),
        format!("--secure-port={APISERVER_PORT}"),
        format!("--cert-dir={}", pki.display()),
        format!("--tls-cert-file={}", file("apiserver.crt")),
        format!("--tls-private-key-file={}", file("apiserver.key")),
        format!("--token-auth-file={}", file("tokens.csv")),
        format!("--client-ca-file={}", file("ca.crt")),
        format!(
            "--kubelet-client-certificate={}",
            file("apiserver-kubelet-client.crt")
        ),
        format!(
            "--kubelet-client-key={}",
            file("apiserver-kubelet-client.key")
        ),
        "--kubelet-preferred-address-types=InternalIP".into(),
        "--authorization-mode=Node,RBAC".into(),
        "--enable-admission-plugins=NodeRestriction".into(),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        format!("--service-account-key-file={}", file("service-account.pub")),
        format!(
            "--service-account-signing-key-file={}",
            file("service-account.key")
        ),
        format!("--service-cluster-ip-range={SERVICE_CIDR}"),
        "--allow-privileged=true".into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn every_path_of_containerd_is_the_instances_own() {
        let text = containerd(
            Path::new("/state/x"),
            Path::new("/run/backlog-node-ab12"),
            Path::new("/state/x/cni"),
            "localhost/backlog-pause:1",
        );
        for line in text.lines().filter(|l| l.contains('/')) {
            assert!(
                line.contains("/state/x")
                    || line.contains("/run/backlog-node-ab12")
                    || line.contains("/usr/")
                    || line.contains("localhost/")
                    || line.trim_start().starts_with('#'),
                "a path outside the instance: {line}"
            );
        }
        assert!(text.contains("netns_mounts_under_state_dir = true"));
    }

    #[test]
    fn the_kubelet_allows_cgroup_v1_under_its_own_root() {
        let (ca, socket, resolv, logs) = (
            PathBuf::from("/s/ca.crt"),
            PathBuf::from("/run/b/containerd.sock"),
            PathBuf::from("/s/resolv.conf"),
            PathBuf::from("/s/pod-logs"),
        );
        let text = kubelet(&KubeletPaths {
            ca_file: &ca,
            containerd_socket: &socket,
            resolv_conf: &resolv,
            pod_logs: &logs,
            cgroup_root: "/backlog-ab12",
        });
        for want in [
            "failCgroupV1: false",
            "cgroupRoot: \"/backlog-ab12\"",
            "unix:///run/b/containerd.sock",
            "podLogsDir: \"/s/pod-logs\"",
        ] {
            assert!(text.contains(want), "{want} in\n{text}");
        }
    }

    #[test]
    fn component_users_have_their_groups() {
        let lines = component_users(&[
            (TOKEN_KUBELET, "t1".into()),
            ("system:kube-scheduler", "t2".into()),
        ]);
        assert_eq!(
            lines,
            format!(
                "t1,{TOKEN_KUBELET},{TOKEN_KUBELET},\"system:nodes\"\nt2,system:kube-scheduler,system:kube-scheduler\n"
            )
        );
    }
}
