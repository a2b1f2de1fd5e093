//! What a node changes on the machine, and how all of it is put back: its network namespace,
//! its cgroup root under every cgroup hierarchy, its runtime directory, the mounts kubelet and
//! containerd make, containers and shims, CNI cache files, and the six kernel settings kubelet
//! sets machine-wide (restored when the last node on the machine stops).
//!
//! Nodes register in `/run/backlog-operator/nodes/`; a node whose processes all died without
//! a teardown (its test binary was killed) is swept by the next node that starts.

use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::{Error, io_error, process};

/// Machine-wide bookkeeping of the nodes on this machine.
const REGISTRY: &str = "/run/backlog-operator";
/// kubelet writes these, whatever network namespace it runs in.
const KUBELET_SYSCTLS: [&str; 6] = [
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
];
const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

fn node_error(what: impl Into<String>) -> Error {
    Error::Node(what.into())
}

/// The names one node instance uses on the machine, all derived from its state directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Instance {
    pub id: String,
    pub state_dir: PathBuf,
}

impl Instance {
    /// The instance of `state_dir` (an absolute path): its id is a hash of the path, so a
    /// directory always maps to the same names and two directories never share them.
    pub(crate) fn of(state_dir: &Path) -> Instance {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(state_dir.as_os_str().as_encoded_bytes());
        let id: String = digest[..5].iter().map(|b| format!("{b:02x}")).collect();
        Instance {
            id,
            state_dir: state_dir.to_path_buf(),
        }
    }

    pub(crate) fn netns(&self) -> String {
        format!("backlog-{}", self.id)
    }

    pub(crate) fn netns_path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(self.netns())
    }

    /// Sockets and runtime state (short paths: a unix socket path has at most 107 bytes).
    pub(crate) fn run_dir(&self) -> PathBuf {
        PathBuf::from(format!("/run/backlog-node-{}", self.id))
    }

    pub(crate) fn cgroup_root(&self) -> String {
        format!("/backlog-{}", self.id)
    }

    pub(crate) fn cni_network(&self) -> String {
        format!("backlog-{}", self.id)
    }

    pub(crate) fn containerd_socket(&self) -> PathBuf {
        self.run_dir().join("containerd.sock")
    }

    fn registry_entry(&self) -> PathBuf {
        Path::new(REGISTRY).join("nodes").join(&self.id)
    }
}

/// Runs a command to completion; its stderr is the error.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<String, Error> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io_error(format!("running {program}"), e))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(node_error(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// What a node needs from the machine; the error says what is missing and how to get it.
pub(crate) fn preflight() -> Result<(), Error> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(node_error(
            "a node needs root (network namespaces, mounts, cgroups); run as root",
        ));
    }
    let missing: Vec<&str> = [
        "/usr/bin/containerd",
        "/usr/bin/ctr",
        "/usr/sbin/runc",
        "/usr/lib/cni/bridge",
        "/usr/lib/cni/host-local",
        "/usr/sbin/iptables",
        "/usr/sbin/conntrack",
        "/usr/bin/socat",
        "/usr/sbin/ip",
    ]
    .into_iter()
    .filter(|path| !Path::new(path).exists())
    .collect();
    if !missing.is_empty() {
        return Err(node_error(format!(
            "missing {}: run tests/cluster/install-node-packages.sh (or `make tools`)",
            missing.join(", ")
        )));
    }
    if !Path::new(CGROUP_MOUNT).join("memory").is_dir()
        && !Path::new(CGROUP_MOUNT).join("cgroup.controllers").is_file()
    {
        return Err(node_error(format!(
            "no cgroup hierarchy under {CGROUP_MOUNT}"
        )));
    }
    Ok(())
}

/// A machine-wide lock around the registry (released when dropped).
struct RegistryLock {
    _file: fs::File,
}

impl RegistryLock {
    fn take() -> Result<RegistryLock, Error> {
        let dir = Path::new(REGISTRY).join("nodes");
        fs::create_dir_all(&dir).map_err(|e| io_error(format!("creating {}", dir.display()), e))?;
        let path = Path::new(REGISTRY).join("lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io_error(format!("opening {}", path.display()), e))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io_error(
                "locking the node registry",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(RegistryLock { _file: file })
    }
}

fn registered() -> Vec<Instance> {
    let Ok(entries) = fs::read_dir(Path::new(REGISTRY).join("nodes")) else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let state_dir = fs::read_to_string(entry.path()).ok()?;
            Some(Instance {
                id: entry.file_name().to_string_lossy().into_owned(),
                state_dir: PathBuf::from(state_dir.trim()),
            })
        })
        .collect()
}

/// Whether any process recorded in the instance's state directory still runs.
fn alive(instance: &Instance) -> bool {
    let Ok(entries) = fs::read_dir(&instance.state_dir) else {
        return false;
    };
    entries.filter_map(Result::ok).any(|entry| {
        let path = entry.path();
        path.extension().is_some_and(|e| e == "pid")
            && process::read_pid(&path).is_some_and(|pid| {
                process::is_alive(pid)
                    && process::belongs_to_any(pid, &[&instance.state_dir, &instance.run_dir()])
            })
    })
}

/// Registers `instance`, sweeping nodes that died without a teardown, and records the kernel
/// settings kubelet will change if no other node runs. Then creates the network namespace
/// (loopback up, the node address on it, a route for the Service range), the runtime
/// directory and the cgroup roots.
pub(crate) fn set_up(instance: &Instance, node_ip: &str, service_cidr: &str) -> Result<(), Error> {
    {
        let _lock = RegistryLock::take()?;
        for stale in registered() {
            if stale.id != instance.id && !alive(&stale) {
                eprintln!(
                    "local-cluster: removing the leftovers of node {} ({}), whose processes are gone",
                    stale.id,
                    stale.state_dir.display()
                );
                tear_down_locked(&stale);
            }
        }
        if instance.netns_path().exists() {
            if alive(instance) {
                return Err(node_error(format!(
                    "network namespace {} exists and its node runs; stop it first (local-cluster down)",
                    instance.netns()
                )));
            }
            tear_down_locked(instance);
        }
        let before = Path::new(REGISTRY).join("sysctl-before");
        if registered().is_empty() && !before.exists() {
            let mut saved = String::new();
            for key in KUBELET_SYSCTLS {
                let value = run("sysctl", &["-n", key])?;
                saved.push_str(&format!("{key}={}\n", value.trim()));
            }
            fs::write(&before, saved)
                .map_err(|e| io_error(format!("writing {}", before.display()), e))?;
        }
        let entry = instance.registry_entry();
        fs::write(&entry, instance.state_dir.as_os_str().as_encoded_bytes())
            .map_err(|e| io_error(format!("writing {}", entry.display()), e))?;
    }

    let run_dir = instance.run_dir();
    fs::create_dir_all(&run_dir)
        .map_err(|e| io_error(format!("creating {}", run_dir.display()), e))?;
    let netns = instance.netns();
    run("ip", &["netns", "add", &netns])?;
    run("ip", &["-n", &netns, "link", "set", "lo", "up"])?;
    // kubelet refuses a loopback node IP; this namespace has no other device, so the node's
    // address sits on lo. Pods reach it through their bridge's gateway.
    run(
        "ip",
        &[
            "-n",
            &netns,
            "addr",
            "add",
            &format!("{node_ip}/32"),
            "dev",
            "lo",
        ],
    )?;
    // No default route and no device that leads out: only a route for the Service range, so
    // that hostNetwork pods' packets to 10.96.0.1 reach kube-proxy's DNAT instead of failing
    // with "network is unreachable".
    run(
        "ip",
        &["-n", &netns, "route", "add", service_cidr, "dev", "lo"],
    )?;
    create_cgroup_root(&instance.cgroup_root())?;
    Ok(())
}

/// The cgroup hierarchies of this machine (v1 controllers and/or the v2 unified one).
fn cgroup_hierarchies() -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(CGROUP_MOUNT) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").is_file() && !p.is_symlink())
        .collect();
    if Path::new(CGROUP_MOUNT).join("cgroup.procs").is_file() {
        found.push(PathBuf::from(CGROUP_MOUNT));
    }
    found.sort();
    found
}

/// kubelet insists that its `cgroupRoot` exists in every hierarchy.
fn create_cgroup_root(root: &str) -> Result<(), Error> {
    for hierarchy in cgroup_hierarchies() {
        let dir = hierarchy.join(root.trim_start_matches('/'));
        fs::create_dir_all(&dir).map_err(|e| io_error(format!("creating {}", dir.display()), e))?;
        // A new cpuset starts with no CPUs and no memory nodes: inherit the parent's.
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(value) = fs::read_to_string(hierarchy.join(file)) {
                let _ = fs::write(dir.join(file), value.trim());
            }
        }
    }
    Ok(())
}

/// Kills every container of the node's containerd (while it still runs) and notes the pod
/// network namespaces it created.
pub(crate) fn kill_containers(instance: &Instance) {
    let socket = instance.containerd_socket();
    if !socket.exists() {
        return;
    }
    let address = socket.display().to_string();
    let ctr = |args: &[&str]| -> String {
        let mut all = vec!["--address", address.as_str(), "--namespace", "k8s.io"];
        all.extend_from_slice(args);
        run("ctr", &all).unwrap_or_default()
    };
    let tasks = ctr(&["tasks", "ls", "--quiet"]);
    for task in tasks.split_whitespace() {
        ctr(&["tasks", "kill", "--all", "--signal", "SIGKILL", task]);
    }
    for task in tasks.split_whitespace() {
        ctr(&["tasks", "delete", "--force", task]);
    }
    for container in ctr(&["containers", "ls", "--quiet"]).split_whitespace() {
        ctr(&["containers", "delete", container]);
    }
}

/// Removes everything of `instance` from the machine (its processes must be stopped) and
/// restores the kernel settings if it was the last node. Idempotent.
pub(crate) fn tear_down(instance: &Instance) {
    match RegistryLock::take() {
        Ok(_lock) => tear_down_locked(instance),
        Err(e) => {
            eprintln!("local-cluster: {e}; tearing the node down without the registry lock");
            tear_down_locked(instance);
        }
    }
}

fn tear_down_locked(instance: &Instance) {
    let run_dir = instance.run_dir();
    let socket = instance.containerd_socket();
    let socket_text = socket.display().to_string();
    // Shims (and their containers) whose containerd was this node's: their command lines name
    // its socket. Processes of a swept node are killed the same way.
    kill_processes_naming(&[&socket_text, &run_dir.display().to_string()]);

    // Mounts under the node's directories (kubelet's token tmpfs, containerd's rootfs overlays,
    // sandbox shm, pod network namespaces), deepest first.
    let prefixes = [instance.state_dir.clone(), run_dir.clone()];
    let mut mounts: Vec<String> = fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split(' ').nth(4).map(unescape_mount_path))
        .filter(|target| {
            prefixes
                .iter()
                .any(|p| Path::new(target).starts_with(p) && Path::new(target) != p.as_path())
        })
        .collect();
    mounts.sort();
    mounts.dedup();
    for target in mounts.iter().rev() {
        let path = std::ffi::CString::new(target.as_str()).unwrap_or_default();
        // SAFETY: umount2 on a path string; MNT_DETACH as a fallback for busy mounts.
        unsafe {
            if libc::umount2(path.as_ptr(), 0) != 0 {
                libc::umount2(path.as_ptr(), libc::MNT_DETACH);
            }
        }
    }

    // The node's namespace: its bridge, veths and kube-proxy's rules go with it.
    if instance.netns_path().exists() {
        let _ = run("ip", &["netns", "delete", &instance.netns()]);
    }
    // Pod cgroups, deepest first, then the root itself. Their processes are killed first: a
    // node swept after its test binary was killed still has running containers, and no
    // containerd to stop them.
    let root = instance.cgroup_root();
    for hierarchy in cgroup_hierarchies() {
        kill_cgroup_processes(&hierarchy.join(root.trim_start_matches('/')));
    }
    for hierarchy in cgroup_hierarchies() {
        let dir = hierarchy.join(root.trim_start_matches('/'));
        remove_cgroup_tree(&dir);
    }
    // CNI's cache of results (machine-wide), one file per network and sandbox: the pod
    // network's name carries the instance id, and the loopback network's files name sandboxes
    // that containerd's CRI plugin keeps a directory for in the node's state.
    let prefix = format!("{}-", instance.cni_network());
    let sandboxes: Vec<String> = fs::read_dir(
        instance
            .state_dir
            .join("containerd/io.containerd.grpc.v1.cri/sandboxes"),
    )
    .map(|entries| {
        entries
            .filter_map(Result::ok)
            .map(|e| format!("-{}-", e.file_name().to_string_lossy()))
            .collect()
    })
    .unwrap_or_default();
    if let Ok(entries) = fs::read_dir("/var/lib/cni/results") {
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) || sandboxes.iter().any(|id| name.contains(id)) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
    let _ = fs::remove_dir_all(&run_dir);
    // containerd 1.6 keeps shim sockets and fifos under /run/containerd whatever its config
    // says; rmdir removes them only when empty, so never another containerd's.
    for dir in [
        "/run/containerd/s",
        "/run/containerd/fifo",
        "/run/containerd",
    ] {
        let _ = fs::remove_dir(dir);
    }

    let _ = fs::remove_file(instance.registry_entry());
    if registered().is_empty() {
        restore_sysctls();
    }
}

fn restore_sysctls() {
    let before = Path::new(REGISTRY).join("sysctl-before");
    let Ok(saved) = fs::read_to_string(&before) else {
        return;
    };
    for line in saved.lines() {
        if let Some((key, value)) = line.split_once('=') {
            let path = Path::new("/proc/sys").join(key.replace('.', "/"));
            if let Err(e) = fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|mut f| f.write_all(value.as_bytes()))
            {
                eprintln!("local-cluster: could not restore {key}={value}: {e}");
            }
        }
    }
    let _ = fs::remove_file(before);
}

fn kill_cgroup_processes(dir: &Path) {
    let mut pids = Vec::new();
    collect_cgroup_pids(dir, &mut pids);
    for pid in &pids {
        // SAFETY: plain syscall.
        unsafe {
            libc::kill(*pid as libc::pid_t, libc::SIGKILL);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|pid| process::is_alive(*pid)) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
}

fn collect_cgroup_pids(dir: &Path, pids: &mut Vec<u32>) {
    if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.filter_map(Result::ok) {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_cgroup_pids(&entry.path(), pids);
            }
        }
    }
}

fn remove_cgroup_tree(dir: &Path) {
    if !dir.is_dir() {
        return;
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.filter_map(Result::ok) {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&entry.path());
            }
        }
    }
    // A cgroup can be removed once its last process has been reaped; give the kernel a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    while fs::remove_dir(dir).is_err() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILLs every process whose command line contains one of `needles`.
fn kill_processes_naming(needles: &[&str]) {
    let Ok(entries) = fs::read_dir("/proc") else {
        return;
    };
    let me = std::process::id();
    let mut killed = Vec::new();
    for entry in entries.filter_map(Result::ok) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let matches = needles.iter().any(|needle| {
            let needle = needle.as_bytes();
            !needle.is_empty() && cmdline.windows(needle.len()).any(|w| w == needle)
        });
        if matches {
            // SAFETY: plain syscall.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
            killed.push(pid);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while killed.iter().any(|pid| process::is_alive(*pid)) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mount_path(field: &str) -> String {
    field
        .replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_of_different_directories_share_no_name() {
        let a = Instance::of(Path::new("/tmp/local-cluster-a"));
        let b = Instance::of(Path::new("/tmp/local-cluster-b"));
        assert_eq!(a, Instance::of(Path::new("/tmp/local-cluster-a")));
        assert_ne!(a.netns(), b.netns());
        assert_ne!(a.run_dir(), b.run_dir());
        assert_ne!(a.cgroup_root(), b.cgroup_root());
        assert_ne!(a.cni_network(), b.cni_network());
        // A unix socket path has room for at most 107 bytes.
        assert!(a.containerd_socket().as_os_str().len() + ".ttrpc".len() < 100);
    }

    #[test]
    fn mount_paths_are_unescaped() {
        assert_eq!(unescape_mount_path("/a\\040b"), "/a b");
    }
}
