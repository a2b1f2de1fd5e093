#!/usr/bin/env bash
# Builds kube-apiserver, kubectl and etcd from the published Go modules at the
# pinned versions and caches them outside the clone, keyed by version, so only
# the first run on a machine pays for the build. Prints the binary directory.
# Also builds helm (build-helm.sh, cached the same way under its own version)
# for the chart tests.
#
# With --node it also builds what a node needs (`local-cluster up --node`):
# kube-controller-manager, kube-scheduler, kubelet and kube-proxy from the same
# wrapper module, and the pod sandbox's pause program (go/pause).
set -euo pipefail
node=false
for arg in "$@"; do
  case $arg in
    --node) node=true ;;
    *) echo "usage: $0 [--node]" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

cache_root=${BACKLOG_OPERATOR_CACHE:-$HOME/.cache/backlog-operator}
bin_dir="$cache_root/control-plane/k8s-v$KUBERNETES_VERSION-etcd-v$ETCD_VERSION"
mkdir -p "$bin_dir"

log() { printf '[build-control-plane] %s\n' "$*" >&2; }

# Several checkouts on one machine share the cache: one build at a time, the
# others wait and then find the binaries built.
exec 9>"$bin_dir/.lock"
if ! flock -n 9; then
  log "waiting for another build into $bin_dir to finish"
  flock 9
fi

# A binary is reused only when it exists and reports the pinned version, so a
# half-written file from an interrupted build is rebuilt, not trusted.
# The output is captured before matching: `cmd | grep -q` under pipefail fails
# whenever grep exits first and cmd dies of SIGPIPE, which rebuilt good binaries.
have() {
  local bin=$1 want=$2 out
  [ -x "$bin_dir/$bin" ] || return 1
  case $bin in
    kube-apiserver | kube-controller-manager | kube-scheduler | kubelet | kube-proxy)
      out=$("$bin_dir/$bin" --version 2>/dev/null) && [[ $out == *"v$want"* ]] ;;
    # pause has no version of its own: it is keyed by the directory (the Kubernetes version).
    pause) true ;;
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

# The Kubernetes commands come from one module: one `go build` of all missing
# ones compiles their shared packages once.
kube_commands=(kube-apiserver kubectl)
if $node; then
  kube_commands+=(kube-controller-manager kube-scheduler kubelet kube-proxy)
fi
missing=()
for bin in "${kube_commands[@]}"; do
  have "$bin" "$KUBERNETES_VERSION" || missing+=("$bin")
done

have etcd "$ETCD_VERSION" || build etcd etcd go.etcd.io/etcd/server/v3 "-s -w"
if [ ${#missing[@]} -gt 0 ]; then
  log "building ${missing[*]} (first run on this machine; several minutes)"
  tmp_dir=$(mktemp -d "$bin_dir/.build.XXXXXX")
  trap 'rm -rf "$tmp_dir"' EXIT
  (cd "$here/go/kube" && go build -trimpath -ldflags "$kube_ldflags" -o "$tmp_dir/" \
    "${missing[@]/#/k8s.io/kubernetes/cmd/}")
  for bin in "${missing[@]}"; do mv -f "$tmp_dir/$bin" "$bin_dir/$bin"; done
fi
if $node; then
  have pause "" || build pause pause . "-s -w"
fi
bash "$here/build-helm.sh" >/dev/null

echo "$bin_dir"
