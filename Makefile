# Developer entry points. The local cluster is a real control plane (etcd +
# kube-apiserver of the version in tests/cluster/versions.env) plus Prometheus,
# all on 127.0.0.1; see tests/cluster/src/lib.rs.

SHELL := /bin/bash
CARGO ?= cargo
CLUSTER_DIR ?= target/local-cluster
LOCAL_CLUSTER := $(CARGO) run -q -p local-cluster --

.PHONY: tools cluster-up cluster-down cluster-status

# Idempotent: installs Prometheus from Debian if missing (refreshing the package
# lists only if the first attempt fails) and builds or finds the cached
# control-plane binaries.
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
