# Developer entry points. The local cluster is a real control plane (etcd +
# kube-apiserver of the version in tests/cluster/versions.env) plus Prometheus,
# all on 127.0.0.1; see tests/cluster/src/lib.rs.

SHELL := /bin/bash
CARGO ?= cargo
CLUSTER_DIR ?= target/local-cluster
LOCAL_CLUSTER := $(CARGO) run -q -p local-cluster --

.PHONY: tools cluster-up cluster-down cluster-status crds rust-components fmt lint test demo

# Idempotent: installs Prometheus from Debian if missing (refreshing the package
# lists only if the first attempt fails) and builds or finds the cached
# control-plane binaries and helm (tests/cluster/build-control-plane.sh calls
# build-helm.sh; each is keyed by its version in tests/cluster/versions.env).
tools:
	@if [ ! -x /usr/bin/prometheus ]; then \
	  echo "installing prometheus (Debian package)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y --no-install-recommends prometheus \
	    || { apt-get update && apt-get install -y --no-install-recommends prometheus; }; \
	fi
	@bash tests/cluster/build-control-plane.sh >/dev/null

# Starts the cluster in the background (harmless if it already runs) and prints
# the kubeconfig path: export KUBECONFIG=$(CLUSTER_DIR)/kubeconfig
cluster-up: tools
	$(LOCAL_CLUSTER) up --dir $(CLUSTER_DIR)

cluster-down:
	$(LOCAL_CLUSTER) down --dir $(CLUSTER_DIR)

cluster-status:
	$(LOCAL_CLUSTER) status --dir $(CLUSTER_DIR)

# Regenerates crds/ from the Rust types (tests/crd_drift.rs fails when they
# differ). Files of kinds that no longer exist are removed.
crds:
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	  $(CARGO) run -q -- crd --output-dir "$$tmp" && \
	  rm -f crds/*.yaml && cp "$$tmp"/*.yaml crds/ && \
	  echo "crds/: $$(cd crds && echo *.yaml)"

# rustfmt and clippy, for toolchains installed without them.
rust-components:
	@$(CARGO) fmt --version >/dev/null 2>&1 || rustup component add rustfmt
	@$(CARGO) clippy --version >/dev/null 2>&1 || rustup component add clippy

fmt: rust-components
	$(CARGO) fmt --all

lint: rust-components
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Everything CI runs. Integration tests start their own control plane (and
# Prometheus) per test binary and stop it when they end.
test:
	@echo "== test: tools (Prometheus, control-plane binaries, helm, rustfmt, clippy)"
	@$(MAKE) --no-print-directory tools rust-components
	@echo "== test: formatting (cargo fmt --check)"
	$(CARGO) fmt --all -- --check
	@echo "== test: lints (cargo clippy, warnings are errors)"
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	@echo "== test: unit, property and real-server integration tests"
	$(CARGO) test --workspace --no-fail-fast

# The main job on a throwaway cluster: the operator scaling a simulated consumer
# through a burst, with a live timeline; stopped again on any exit.
demo: tools
	@bash tests/cluster/demo.sh
