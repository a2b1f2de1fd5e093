//! The crates are the architecture: the pure decisions and the consumer library build without
//! a Kubernetes client, an async runtime or an HTTP stack, so a consumer that links them does
//! not inherit the operator's dependencies (or its pinned Kubernetes version).

use std::process::Command;

/// Crates that belong to the operator's shell, never to the core or the consumer library.
const SHELL_ONLY: [&str; 6] = ["k8s-openapi", "tokio", "hyper", "axum", "reqwest", "kube"];

/// The normal (non-dev, non-build) dependencies of `package`, transitively, by crate name.
fn normal_dependencies(package: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}", "-p", package])
        .output()
        .expect("cargo tree runs");
    assert!(
        output.status.success(),
        "cargo tree -p {package} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Names from `dependencies` that are shell-only: kube and every kube-* crate, and the rest
/// of [`SHELL_ONLY`] by exact name.
fn shell_only(dependencies: &[String]) -> Vec<&str> {
    dependencies
        .iter()
        .map(String::as_str)
        .filter(|name| {
            SHELL_ONLY.contains(name) || name.starts_with("kube-") || name.starts_with("k8s-")
        })
        .collect()
}

#[test]
fn the_consumer_library_builds_without_the_operators_dependencies() {
    let dependencies = normal_dependencies("backlog-consumer");
    assert!(
        dependencies.iter().any(|name| name == "backlog-core"),
        "the tree was read: {dependencies:?}"
    );
    assert_eq!(shell_only(&dependencies), Vec::<&str>::new());
}

#[test]
fn the_core_builds_without_the_operators_dependencies() {
    let dependencies = normal_dependencies("backlog-core");
    assert!(
        dependencies.iter().any(|name| name == "serde"),
        "the tree was read: {dependencies:?}"
    );
    assert_eq!(shell_only(&dependencies), Vec::<&str>::new());
}

#[test]
fn the_check_sees_the_operators_dependencies() {
    let dependencies = normal_dependencies("backlog-operator");
    let found = shell_only(&dependencies);
    for name in [
        "kube",
        "kube-core",
        "k8s-openapi",
        "tokio",
        "hyper",
        "axum",
        "reqwest",
    ] {
        assert!(found.contains(&name), "{name} missing from {found:?}");
    }
}
