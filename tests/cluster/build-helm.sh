#!/usr/bin/env bash
# Builds the helm CLI from its published Go module (helm.sh/helm/v3, through the
# wrapper module in go/helm) at the version pinned in versions.env and caches it
# outside the clone, keyed by that version, so only the first run on a machine
# pays for the build. Prints the path of the binary.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
module_dir="$here/go/helm"

cache_root=${BACKLOG_OPERATOR_CACHE:-$HOME/.cache/backlog-operator}
bin_dir="$cache_root/helm/v$HELM_VERSION"
bin="$bin_dir/helm"

log() { printf '[build-helm] %s\n' "$*" >&2; }

# A binary is reused only when it runs and reports the pinned version, so a
# half-written file from an interrupted build is rebuilt, not trusted. The
# output is captured before matching (no `| grep -q` under pipefail).
have() {
  local out
  [ -x "$bin" ] || return 1
  out=$("$bin" version --template '{{.Version}}' 2>/dev/null) && [ "$out" = "v$HELM_VERSION" ]
}

if have; then
  echo "$bin"
  exit 0
fi

export CGO_ENABLED=0
# The committed go.mod and go.sum are complete; a build never rewrites them.
export GOFLAGS=-mod=readonly

# versions.env and the wrapper module must name the same helm.
required=$(cd "$module_dir" && go list -m -f '{{.Version}}' helm.sh/helm/v3)
if [ "$required" != "v$HELM_VERSION" ]; then
  log "go/helm/go.mod requires helm.sh/helm/v3 $required but versions.env pins v$HELM_VERSION; update one of them"
  exit 1
fi

# As helm's own Makefile does: the version, and the Kubernetes version helm
# assumes without a cluster (`helm template`, `helm lint`), taken from the
# client-go it is built with (v0.X.Y is Kubernetes 1.X).
client_go=$(cd "$module_dir" && go list -m -f '{{.Version}}' k8s.io/client-go)
k8s_minor=$(echo "$client_go" | cut -d. -f2)
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION \
 -X helm.sh/helm/v3/internal/version.gitTreeState=clean \
 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 \
 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$k8s_minor \
 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 \
 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$k8s_minor"

mkdir -p "$bin_dir"
log "building helm v$HELM_VERSION (first run on this machine; a few minutes)"
tmp="$bin_dir/.helm.tmp.$$"
trap 'rm -f "$tmp"' EXIT
(cd "$module_dir" && go build -trimpath -ldflags "$ldflags" -o "$tmp" helm.sh/helm/v3/cmd/helm)
mv -f "$tmp" "$bin"
have || { log "$bin does not report v$HELM_VERSION after the build"; exit 1; }
echo "$bin"
