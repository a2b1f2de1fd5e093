//! A real node under the control plane (`Options::node`): etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, containerd + runc, kubelet and kube-proxy, all in a
//! network namespace of their own whose only addresses are its loopback, the node address and
//! the pod bridge; nothing routes out of it. The API server is relayed to the host's loopback
//! (and Prometheus, which stays on the host, into the namespace) through unix sockets, which
//! network namespaces do not separate.
//!
//! Every name on the machine (namespace, runtime directory, cgroup root, CNI network) is
//! derived from the state directory, so nodes of several clusters run side by side.

pub(crate) mod config;
pub(crate) mod host;

use std::fs;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::image::{Entry, ImageSpec};
use crate::process::{self, Process};
use crate::{
    Error, Launch, LocalCluster, POLL, STOP_TIMEOUT, create_dir, free_port, write_file,
    write_private,
};

pub(crate) use host::Instance;

/// The node's address, on the loopback of its namespace.
pub const NODE_IP: &str = "10.250.0.1";
/// The node's name in the API.
pub const NODE_NAME: &str = "local-node";
/// Pod addresses (the bridge in the node's namespace).
pub const CLUSTER_CIDR: &str = "10.88.0.0/16";
/// Service addresses; 10.96.0.1 is the `kubernetes` Service.
pub const SERVICE_CIDR: &str = "10.96.0.0/24";
const SERVICE_IP: &str = "10.96.0.1";
/// The API server's port inside the namespace.
pub(crate) const APISERVER_PORT: u16 = 6443;
/// The sandbox image, built from the cached pause program at every start.
pub const PAUSE_IMAGE: &str = "localhost/backlog-pause:1";

pub(crate) const TOKEN_KUBELET: &str = "system:node:local-node";
pub(crate) const TOKEN_KUBE_PROXY: &str = "system:kube-proxy";
const TOKEN_CONTROLLER_MANAGER: &str = "system:kube-controller-manager";
const TOKEN_SCHEDULER: &str = "system:kube-scheduler";

/// How long the node may take to register and become Ready.
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Where a node is, in `cluster.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    /// The network namespace everything runs in (`/run/netns/NAME`).
    pub netns: String,
    pub address: String,
    /// Prometheus as pods reach it (`http://10.250.0.1:PORT`), if it runs.
    pub prometheus_url: Option<String>,
    /// The images loaded into the node's containerd.
    pub images: Vec<String>,
}

/// The processes of a node, in the order they are stopped: the node first (so that nothing
/// restarts containers while they are removed), then containerd, then the control plane.
pub(crate) const STOP_ORDER: [&str; 12] = [
    "apiserver-relay",
    "prometheus-relay-node",
    "kubelet",
    "kube-proxy",
    "containerd",
    "kube-scheduler",
    "kube-controller-manager",
    "apiserver-relay-node",
    "prometheus-relay",
    "kube-apiserver",
    "etcd",
    "prometheus",
];

pub(crate) fn stop_rank(name: &str) -> usize {
    STOP_ORDER
        .iter()
        .position(|n| *n == name)
        .unwrap_or(STOP_ORDER.len())
}

/// The component tokens added to the token file.
pub(crate) fn component_tokens() -> Result<Vec<(&'static str, String)>, Error> {
    [
        TOKEN_KUBELET,
        TOKEN_KUBE_PROXY,
        TOKEN_CONTROLLER_MANAGER,
        TOKEN_SCHEDULER,
    ]
    .into_iter()
    .map(|user| Ok((user, crate::pki::token()?)))
    .collect()
}

/// The extra names the API server's certificate needs for a node.
pub(crate) const SERVING_IPS: [&str; 2] = [NODE_IP, SERVICE_IP];
pub(crate) const SERVING_NAMES: [&str; 4] = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

impl LocalCluster {
    fn spawn_in_node(
        &mut self,
        name: &'static str,
        program: &Path,
        args: Vec<String>,
    ) -> Result<(), Error> {
        let instance = self
            .node
            .clone()
            .ok_or_else(|| Error::Node("no node was prepared".into()))?;
        let process = process::spawn(
            self.spawner.as_ref(),
            name,
            program,
            &args,
            &self.info.state_dir,
            Some(&instance.netns_path()),
        )?;
        self.processes.push(process);
        Ok(())
    }

    fn spawn_on_host(
        &mut self,
        name: &'static str,
        program: &Path,
        args: Vec<String>,
    ) -> Result<(), Error> {
        let process = process::spawn(
            self.spawner.as_ref(),
            name,
            program,
            &args,
            &self.info.state_dir,
            None,
        )?;
        self.processes.push(process);
        Ok(())
    }

    /// Waits until `probe` holds, failing early (with the log's tail) if `component` exits.
    fn await_probe(
        &mut self,
        component: &'static str,
        timeout: Duration,
        mut probe: impl FnMut(&mut Self) -> Result<(), String>,
    ) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match probe(self) {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            let process = self
                .processes
                .iter_mut()
                .find(|p| p.name == component)
                .ok_or_else(|| Error::Node(format!("{component} was not started")))?;
            if let Some(status) = process.exit_status() {
                return Err(Error::Exited {
                    component,
                    status,
                    tail: process::log_tail(&process.log, 40),
                    log: process.log.clone(),
                });
            }
            if Instant::now() >= deadline {
                return Err(Error::NotReady {
                    component,
                    timeout,
                    last,
                    tail: process::log_tail(&process.log, 40),
                    log: process.log.clone(),
                });
            }
            thread::sleep(POLL);
        }
    }

    /// Starts everything of a node cluster; see the module comment.
    pub(crate) fn launch_node(&mut self, launch: &Launch) -> Result<(), Error> {
        let instance = self
            .node
            .clone()
            .ok_or_else(|| Error::Node("no node was prepared".into()))?;
        let state = self.info.state_dir.clone();
        let run_dir = instance.run_dir();
        let pki = launch.pki_dir.clone();
        let bins = &launch.binaries;
        let node_bins = bins
            .node
            .as_ref()
            .ok_or_else(|| Error::Node("the node's binaries were not located".into()))?;

        // etcd, inside: its ports are the namespace's own.
        let etcd_url = "http://127.0.0.1:2379".to_string();
        let etcd_dir = state.join("etcd");
        let _ = fs::remove_dir_all(&etcd_dir);
        self.spawn_in_node(
            "etcd",
            &bins.etcd,
            vec![
                "--name=local-cluster".into(),
                format!("--data-dir={}", etcd_dir.display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                "--listen-peer-urls=http://127.0.0.1:2380".into(),
                "--initial-advertise-peer-urls=http://127.0.0.1:2380".into(),
                "--initial-cluster=local-cluster=http://127.0.0.1:2380".into(),
                "--unsafe-no-fsync=true".into(),
            ],
        )?;
        self.info.etcd_url = etcd_url.clone();

        // containerd starts alongside: it does not need the API server.
        let cni_dir = state.join("cni");
        create_dir(&cni_dir)?;
        // Written before containerd starts: it would read a file written under its watch
        // half-done.
        write_file(
            &cni_dir.join("10-backlog.conflist"),
            &config::cni(&instance.cni_network(), &state.join("cni-ipam")),
        )?;
        let containerd_config = state.join("containerd.toml");
        write_file(
            &containerd_config,
            &config::containerd(&state, &run_dir, &cni_dir, PAUSE_IMAGE),
        )?;
        self.spawn_in_node(
            "containerd",
            Path::new("/usr/bin/containerd"),
            vec![format!("--config={}", containerd_config.display())],
        )?;

        self.spawn_in_node(
            "kube-apiserver",
            &bins.kube_apiserver,
            config::apiserver_args(&pki, &etcd_url),
        )?;
        // The relay to the host: host 127.0.0.1:PORT → unix socket → 127.0.0.1:6443 inside.
        let api_socket = run_dir.join("apiserver.sock");
        self.spawn_in_node(
            "apiserver-relay-node",
            Path::new("/usr/bin/socat"),
            vec![
                format!("UNIX-LISTEN:{},fork,unlink-early", api_socket.display()),
                format!("TCP:127.0.0.1:{APISERVER_PORT}"),
            ],
        )?;
        let host_port = free_port()?;
        self.spawn_on_host(
            "apiserver-relay",
            Path::new("/usr/bin/socat"),
            vec![
                format!("TCP-LISTEN:{host_port},bind=127.0.0.1,reuseaddr,fork"),
                format!("UNIX-CONNECT:{}", api_socket.display()),
            ],
        )?;
        self.info.apiserver_url = format!("https://127.0.0.1:{host_port}");

        // The images, while the API server starts.
        let images = self.load_images(launch, &instance, &node_bins.pause)?;

        let url = self.info.apiserver_url.clone();
        let admin = self.info.tokens.get("admin").cloned();
        let http = &launch.http;
        self.await_probe("kube-apiserver", launch.timeout, |_| {
            crate::apiserver_probe(http, &url, admin.as_deref())
        })?;

        let ca_file = pki.join("ca.crt");
        let kubeconfig = |user: &str| -> Result<PathBuf, Error> {
            let token = launch
                .component_tokens
                .iter()
                .find(|(u, _)| *u == user)
                .map(|(_, t)| t.clone())
                .ok_or_else(|| Error::Node(format!("no token for {user}")))?;
            let file = state.join(format!("{}.kubeconfig", user.replace(':', "-")));
            write_private(&file, &config::kubeconfig(&ca_file, user, &token))?;
            Ok(file)
        };
        let kcm_config = kubeconfig(TOKEN_CONTROLLER_MANAGER)?;
        let kubeconfig_flags = |file: &Path| {
            vec![
                format!("--kubeconfig={}", file.display()),
                format!("--authentication-kubeconfig={}", file.display()),
                format!("--authorization-kubeconfig={}", file.display()),
                "--bind-address=127.0.0.1".into(),
                "--leader-elect=false".into(),
            ]
        };
        let mut kcm_args = kubeconfig_flags(&kcm_config);
        kcm_args.extend([
            "--use-service-account-credentials=true".into(),
            format!(
                "--service-account-private-key-file={}",
                pki.join("service-account.key").display()
            ),
            format!("--root-ca-file={}", ca_file.display()),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--allocate-node-cidrs=false".into(),
        ]);
        self.spawn_in_node(
            "kube-controller-manager",
            &node_bins.kube_controller_manager,
            kcm_args,
        )?;
        let scheduler_config = kubeconfig(TOKEN_SCHEDULER)?;
        self.spawn_in_node(
            "kube-scheduler",
            &node_bins.kube_scheduler,
            kubeconfig_flags(&scheduler_config),
        )?;

        let resolv_conf = state.join("resolv.conf");
        // No cluster DNS: a lookup inside a pod fails at once and never goes upstream.
        write_file(&resolv_conf, "nameserver 127.0.0.1\n")?;
        let kubelet_config = state.join("kubelet.yaml");
        let socket = instance.containerd_socket();
        write_file(
            &kubelet_config,
            &config::kubelet(&config::KubeletPaths {
                ca_file: &ca_file,
                containerd_socket: &socket,
                resolv_conf: &resolv_conf,
                pod_logs: &state.join("pod-logs"),
                cgroup_root: &instance.cgroup_root(),
            }),
        )?;
        let kubelet_kubeconfig = kubeconfig(TOKEN_KUBELET)?;
        self.spawn_in_node(
            "kubelet",
            &node_bins.kubelet,
            vec![
                format!("--config={}", kubelet_config.display()),
                format!("--kubeconfig={}", kubelet_kubeconfig.display()),
                format!("--hostname-override={NODE_NAME}"),
                format!("--node-ip={NODE_IP}"),
                format!("--root-dir={}", state.join("kubelet").display()),
                format!("--cert-dir={}", state.join("kubelet-pki").display()),
            ],
        )?;
        let proxy_kubeconfig = kubeconfig(TOKEN_KUBE_PROXY)?;
        let proxy_config = state.join("kube-proxy.yaml");
        write_file(&proxy_config, &config::kube_proxy(&proxy_kubeconfig))?;
        self.spawn_in_node(
            "kube-proxy",
            &node_bins.kube_proxy,
            vec![format!("--config={}", proxy_config.display())],
        )?;

        let node_path = format!("{url}/api/v1/nodes/{NODE_NAME}");
        self.await_probe("kubelet", NODE_READY_TIMEOUT, |_| {
            node_ready(http, &node_path, admin.as_deref())
        })?;
        // Pods need their namespace's default ServiceAccount, which the controller manager
        // creates; tests create pods right away.
        let service_account = format!("{url}/api/v1/namespaces/default/serviceaccounts/default");
        self.await_probe("kube-controller-manager", launch.timeout, |_| {
            let answer = http.get(&service_account, admin.as_deref())?;
            if answer.is_success() {
                Ok(())
            } else {
                Err(format!("HTTP {}", answer.status))
            }
        })?;

        self.info.node = Some(NodeInfo {
            name: NODE_NAME.into(),
            netns: instance.netns(),
            address: NODE_IP.into(),
            prometheus_url: None,
            images,
        });
        Ok(())
    }

    /// Lets pods reach the host's Prometheus at `http://NODE_IP:PORT` (the same port).
    pub(crate) fn relay_prometheus_into_node(&mut self) -> Result<(), Error> {
        let (Some(instance), Some(url)) = (self.node.clone(), self.info.prometheus_url.clone())
        else {
            return Ok(());
        };
        let port = url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse::<u16>().ok())
            .ok_or_else(|| Error::Node(format!("no port in {url}")))?;
        let socket = instance.run_dir().join("prometheus.sock");
        self.spawn_on_host(
            "prometheus-relay",
            Path::new("/usr/bin/socat"),
            vec![
                format!("UNIX-LISTEN:{},fork,unlink-early", socket.display()),
                format!("TCP:127.0.0.1:{port}"),
            ],
        )?;
        self.spawn_in_node(
            "prometheus-relay-node",
            Path::new("/usr/bin/socat"),
            vec![
                format!("TCP-LISTEN:{port},bind={NODE_IP},reuseaddr,fork"),
                format!("UNIX-CONNECT:{}", socket.display()),
            ],
        )?;
        let from_pods = format!("http://{NODE_IP}:{port}");
        write_file(
            &self.info.state_dir.join("prometheus-url-from-pods"),
            &format!("{from_pods}\n"),
        )?;
        if let Some(node) = self.info.node.as_mut() {
            node.prometheus_url = Some(from_pods);
        }
        Ok(())
    }

    /// Builds the pause image, waits for containerd and imports it and `launch.images`.
    fn load_images(
        &mut self,
        launch: &Launch,
        instance: &Instance,
        pause: &Path,
    ) -> Result<Vec<String>, Error> {
        let images_dir = self.info.state_dir.join("images");
        create_dir(&images_dir)?;
        let mut spec = ImageSpec {
            name: PAUSE_IMAGE.into(),
            entrypoint: vec!["/pause".into()],
            user: "65535:65535".into(),
            working_dir: "/".into(),
            ..ImageSpec::default()
        };
        spec.add(
            "/pause",
            Entry::File {
                source: pause.to_path_buf(),
                mode: 0o755,
            },
        )?;
        let pause_archive = images_dir.join("pause.tar");
        crate::image::write_archive(&spec, &pause_archive)?;

        let socket = instance.containerd_socket();
        let address = socket.display().to_string();
        self.await_probe("containerd", launch.timeout, |_| {
            host::run("ctr", &["--address", &address, "version"])
                .map(|_| ())
                .map_err(|e| e.to_string())
        })?;
        let mut names = Vec::new();
        for archive in std::iter::once(&pause_archive).chain(&launch.images) {
            let file = archive.display().to_string();
            let output = host::run(
                "ctr",
                &[
                    "--address",
                    &address,
                    "--namespace",
                    "k8s.io",
                    "images",
                    "import",
                    &file,
                ],
            )
            .map_err(|e| Error::Node(format!("importing {file}: {e}")))?;
            names.extend(imported_names(&output));
        }
        Ok(names)
    }

    /// Stops a node cluster's processes in [`STOP_ORDER`], removing its containers while
    /// containerd still runs, then everything it left on the machine.
    pub(crate) fn stop_node(&mut self, instance: &Instance) {
        let mut processes: Vec<Process> = std::mem::take(&mut self.processes);
        processes.sort_by_key(|p| stop_rank(p.name));
        for mut process in processes {
            if process.name == "containerd" {
                host::kill_containers(instance);
            }
            process.stop(STOP_TIMEOUT);
        }
        host::tear_down(instance);
        let _ = fs::remove_file(self.info.state_dir.join(crate::INFO_FILE));
    }
}

/// `unpacking localhost/x:1 (sha256:…)...done` → `localhost/x:1`
fn imported_names(ctr_output: &str) -> Vec<String> {
    ctr_output
        .lines()
        .filter_map(|line| line.strip_prefix("unpacking "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

fn node_ready(http: &crate::http::Http, url: &str, admin: Option<&str>) -> Result<(), String> {
    let answer = http.get(url, admin)?;
    if !answer.is_success() {
        return Err(format!("node not registered yet (HTTP {})", answer.status));
    }
    let node: Value = serde_json::from_str(&answer.body).map_err(|e| e.to_string())?;
    let ready = node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|conditions| {
            conditions
                .iter()
                .find(|c| c["type"] == "Ready")
                .map(|c| (c["status"] == "True", c["message"].to_string()))
        });
    match ready {
        Some((true, _)) => Ok(()),
        Some((false, message)) => Err(format!("node not Ready: {message}")),
        None => Err("node has no Ready condition yet".into()),
    }
}

/// Stops the node recorded in `state_dir` (detached mode) and tears it down.
pub(crate) fn stop_recorded(state_dir: &Path, recorded: Vec<(String, u32)>) {
    let instance = Instance::of(state_dir);
    let mut recorded = recorded;
    recorded.sort_by_key(|(name, _)| stop_rank(name));
    for (name, pid) in recorded {
        if name == "containerd" {
            host::kill_containers(&instance);
        }
        if process::belongs_to_any(pid, &[state_dir, &instance.run_dir()]) {
            process::terminate_pid(pid, STOP_TIMEOUT);
        }
    }
    host::tear_down(&instance);
}

/// The extra processes a node cluster records.
pub(crate) fn expected_processes(prometheus: bool) -> Vec<&'static str> {
    STOP_ORDER
        .iter()
        .copied()
        .filter(|name| prometheus || !name.starts_with("prometheus"))
        .collect()
}

/// Checks the files a node start needs before anything is changed on the machine.
pub(crate) fn images_exist(images: &[PathBuf]) -> Result<(), Error> {
    for image in images {
        if !image.is_file() {
            return Err(Error::Node(format!(
                "image archive {} is missing: run `make image`",
                image.display()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctr_import_output_names_the_images() {
        let output = "unpacking localhost/backlog-pause:1 (sha256:abc)...done\n\
                      unpacking localhost/backlog-operator:0.1.0 (sha256:def)...done\n";
        assert_eq!(
            imported_names(output),
            [
                "localhost/backlog-pause:1",
                "localhost/backlog-operator:0.1.0"
            ]
        );
    }

    #[test]
    fn the_node_stops_before_its_runtime_and_the_runtime_before_the_api() {
        assert!(stop_rank("kubelet") < stop_rank("containerd"));
        assert!(stop_rank("containerd") < stop_rank("kube-apiserver"));
        assert!(stop_rank("kube-apiserver") < stop_rank("etcd"));
    }
}
