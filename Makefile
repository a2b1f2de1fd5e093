# Developer entry points. The local cluster is a real control plane (etcd +
# kube-apiserver of the version in tests/cluster/versions.env) plus Prometheus,
# all on 127.0.0.1, and with NODE=1 a real node in a network namespace of its
# own; see tests/cluster/src/lib.rs.

SHELL := /bin/bash
CARGO ?= cargo
CLUSTER_DIR ?= target/local-cluster
LOCAL_CLUSTER := $(CARGO) run -q -p local-cluster --
NODE ?= 1
IMAGES_DIR ?= target/images
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

.PHONY: tools image cluster-up cluster-down cluster-status crds rust-components fmt lint test demo bench-scale

# Idempotent: installs Prometheus and the node's Debian packages if missing
# (refreshing the package lists only if the first attempt fails) and builds or
# finds the cached control-plane and node binaries and helm
# (tests/cluster/build-control-plane.sh calls build-helm.sh; each is keyed by
# its version in tests/cluster/versions.env).
tools:
	@if [ ! -x /usr/bin/prometheus ]; then \
	  echo "installing prometheus (Debian package)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y --no-install-recommends prometheus \
	    || { apt-get update && apt-get install -y --no-install-recommends prometheus; }; \
	fi
	@bash tests/cluster/install-node-packages.sh
	@bash tests/cluster/build-control-plane.sh --node >/dev/null
	@bash tests/cluster/build-kstatus.sh >/dev/null

# OCI image archives in $(IMAGES_DIR), built without a container engine from
# release binaries (shared libraries and CA certificates from this machine's
# Debian packages, user 65532): the operator, the reference replay and
# compensation workers and the demo consumer. Reproducible: the same commit gives the same digests
# (created = the commit's time).
image:
	$(CARGO) build --release -q --bins -p backlog-operator -p backlog-replay-worker \
	  -p backlog-compensation-worker -p backlog-demo-consumer
	$(CARGO) build -q -p local-cluster --bin local-cluster
	@set -e; \
	revision=$$(git rev-parse HEAD 2>/dev/null || echo unknown); \
	created=$${SOURCE_DATE_EPOCH:-$$(git log -1 --format=%ct 2>/dev/null || echo 0)}; \
	target=$$($(CARGO) metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p'); \
	pack() { \
	  "$$target/debug/local-cluster" image --binary "$$target/release/$$1" --command "$$1" \
	    --name "localhost/$$2:$(VERSION)" --out "$(IMAGES_DIR)/$$2.tar" --created "$$created" \
	    --label org.opencontainers.image.title="$$2" \
	    --label org.opencontainers.image.description="$$3" \
	    --label org.opencontainers.image.version="$(VERSION)" \
	    --label org.opencontainers.image.revision="$$revision" \
	    --label org.opencontainers.image.licenses=Apache-2.0 \
	    --label org.opencontainers.image.vendor=backlog.dev \
	    $${4:+--port $$4}; \
	}; \
	pack backlog-operator backlog-operator "Declarative retry policies, backlog budgets and approved replays for asynchronous consumers" 8080; \
	pack replay-worker backlog-replay-worker "Reference ReplayJob worker"; \
	pack compensation-worker backlog-compensation-worker "Reference Compensation worker"; \
	pack demo-consumer backlog-demo-consumer "Demo consumer that follows its BacklogBudget's control document"

# Starts the cluster in the background (harmless if it already runs) and prints
# the kubeconfig path: export KUBECONFIG=$(CLUSTER_DIR)/kubeconfig. With NODE=1
# (the default) it has a real node running the images of `make image`; NODE=0
# starts the control plane alone.
cluster-up: tools
ifeq ($(NODE),1)
	@[ -n "$$(ls $(IMAGES_DIR)/*.tar 2>/dev/null)" ] || $(MAKE) --no-print-directory image
	$(LOCAL_CLUSTER) up --dir $(CLUSTER_DIR) --node --images $(IMAGES_DIR)
else
	$(LOCAL_CLUSTER) up --dir $(CLUSTER_DIR)
endif

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
	@echo "== test: tools (Prometheus, node packages, control-plane and node binaries, helm, rustfmt, clippy)"
	@$(MAKE) --no-print-directory tools rust-components
	@echo "== test: images (the real-node tests run them)"
	@$(MAKE) --no-print-directory image
	@echo "== test: formatting (cargo fmt --check)"
	$(CARGO) fmt --all -- --check
	@echo "== test: lints (cargo clippy, warnings are errors)"
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	@echo "== test: unit, property and real-server integration tests"
	$(CARGO) test --workspace --no-fail-fast

# The main job on a throwaway cluster with a real node, as a user does it: helm
# install of the chart with the image of `make image`, real consumer pods scaled
# through a burst (live timeline), and a replay whose Jobs run the reference
# worker; everything is stopped again on any exit.
demo: tools image
	@bash tests/cluster/demo.sh

# N budgets (default 100) on one release operator process, on a throwaway control plane and
# Prometheus with metrics that do not move: RSS, CPU, API requests by verb and resource,
# Prometheus queries, time to every status, reaction to one rising backlog (benches/scale.rs;
# SETTLE, WINDOW and POLL in seconds may be set too).
N ?= 100
bench-scale: tools
	N=$(N) $(CARGO) bench --bench scale
