#!/usr/bin/env bash
# Builds kube-apiserver, kubectl and etcd from the published Go modules at the
# pinned versions and caches them outside the clone, keyed by version, so only
# the first run on a machine pays for the build. Prints the binary directory.
# Also builds helm (build-helm.sh, cached the same way under its own version)
# for the chart tests.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

cache_root=${BACKLOG_OPERATOR_CACHE:-$HOME/.cache/backlog-operator}
bin_dir="$cache_root/control-plane/k8s-v$KUBERNETES_VERSION-etcd-v$ETCD_VERSION"
mkdir -p "$bin_dir"

log() { printf '[build-control-plane] %s\n' "$*" >&2; }

# A binary is reused only when it exists and reports the pinned version, so a
# half-written file from an interrupted build is rebuilt, not trusted.
# The output is captured before matching: `cmd | grep -q` under pipefail fails
# whenever grep exits first and cmd dies of SIGPIPE, which rebuilt good binaries.
have() {
  local bin=$1 want=$2 out
  [ -x "$bin_dir/$bin" ] || return 1
  case $bin in
    kube-apiserver) out=$("$bin_dir/$bin" --version 2>/dev/null) && [[ $out == *"v$want"* ]] ;;
    kubectl) out=$("$bin_dir/$bin" version --client 2>/dev/null) && [[ $out == *"v$want"* ]] ;;
    etcd) out=$("$bin_dir/$bin" --version 2>/dev/null) && [[ $out == *"etcd Version: $want"* ]] ;;
  esac
}

export CGO_ENABLED=0
# Go keeps its module and build caches in its default places (outside the clone).
# -mod=readonly: the committed go.mod and go.sum are complete; a build must
# never rewrite files in the clone.
export GOFLAGS=-mod=readonly

minor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2)
kube_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$KUBERNETES_VERSION \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/client-go/pkg/version.gitVersion=v$KUBERNETES_VERSION \
 -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"

build() {
  local module_dir=$1 bin=$2 pkg=$3 ldflags=$4
  log "building $bin (first run on this machine; several minutes)"
  local tmp="$bin_dir/.$bin.tmp.$$"
  (cd "$here/go/$module_dir" && go build -trimpath -ldflags "$ldflags" -o "$tmp" "$pkg")
  mv -f "$tmp" "$bin_dir/$bin"
}

have etcd "$ETCD_VERSION" || build etcd etcd go.etcd.io/etcd/server/v3 "-s -w"
have kube-apiserver "$KUBERNETES_VERSION" || build kube kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$kube_ldflags"
have kubectl "$KUBERNETES_VERSION" || build kube kubectl k8s.io/kubernetes/cmd/kubectl "$kube_ldflags"
bash "$here/build-helm.sh" >/dev/null

echo "$bin_dir"
