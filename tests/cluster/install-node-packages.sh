#!/usr/bin/env bash
# Installs the Debian packages a local node needs (`local-cluster up --node`), if any is
# missing: containerd and runc (the runtime), the CNI plugins (bridge, host-local), iptables
# and conntrack (kube-proxy), socat (the API server relay between the node's network namespace
# and the host's loopback), and lua5.4 (the Argo CD health-check tests). Idempotent; refreshes
# the package lists only when an install fails without them.
set -euo pipefail
packages=(containerd runc containernetworking-plugins iptables conntrack socat lua5.4 ca-certificates)

# `dpkg -s` succeeds for a removed package whose configuration files remain; ask for the state.
missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "[install-node-packages] apt-get install ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
  || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
