#!/usr/bin/env bash
# Builds the kstatus checker (go/kstatus: what Flux's health checks make of an object, from
# sigs.k8s.io/cli-utils) at the version its go.mod requires and caches it outside the clone,
# keyed by that version and the checker's own source. Prints the path of the binary.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
module_dir="$here/go/kstatus"
version=$(sed -n 's/^[[:space:]]*sigs.k8s.io\/cli-utils \(v[^ ]*\).*/\1/p' "$module_dir/go.mod")
cache_root=${BACKLOG_OPERATOR_CACHE:-$HOME/.cache/backlog-operator}
source_hash=$(cat "$module_dir/main.go" "$module_dir/go.mod" "$module_dir/go.sum" | sha256sum | cut -c1-12)
bin_dir="$cache_root/kstatus/cli-utils-$version-$source_hash"
bin="$bin_dir/kstatus"
if [ -x "$bin" ] && echo '[]' | "$bin" >/dev/null 2>&1; then
  echo "$bin"
  exit 0
fi
mkdir -p "$bin_dir"
echo "[build-kstatus] building the kstatus checker (cli-utils $version; first run on this machine)" >&2
tmp="$bin_dir/.kstatus.tmp.$$"
trap 'rm -f "$tmp"' EXIT
(cd "$module_dir" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w" -o "$tmp" .)
mv -f "$tmp" "$bin"
echo "$bin"
