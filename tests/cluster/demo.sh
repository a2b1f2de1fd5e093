#!/usr/bin/env bash
# The demo: a throwaway local control plane with the CRDs and examples/*.yaml
# applied, `kubectl get backlog -A`, and one invalid object refused by the API
# server. The cluster lives in its own temporary state directory (a cluster
# started with `make cluster-up` is left alone) and is stopped on every exit,
# failed steps and Ctrl-C included.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

cargo=${CARGO:-cargo}
invalid_example=tests/invalid/rj-self-approval.yaml

step() { printf '\n== %s\n' "$*"; }
show() {
  printf '$ kubectl %s\n' "$*"
  "$kubectl" "$@"
}

step "building the local-cluster tool"
"$cargo" build -q -p local-cluster
target_dir=$("$cargo" metadata --format-version 1 --no-deps |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
local_cluster="$target_dir/debug/local-cluster"

state_dir=$(mktemp -d "${TMPDIR:-/tmp}/backlog-demo.XXXXXX")
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  step "stopping the demo cluster"
  "$local_cluster" down --dir "$state_dir" || true
  rm -rf "$state_dir"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "starting a local control plane in $state_dir"
"$local_cluster" up --dir "$state_dir" --no-prometheus
# The kubectl of the server's version, built next to the control plane.
kubectl=$(bash tests/cluster/build-control-plane.sh)/kubectl
export KUBECONFIG="$state_dir/kubeconfig"

step "applying the CRDs"
show apply --server-side -f crds/
crd_names=()
for file in crds/*.yaml; do
  crd_names+=("crd/$(basename "$file" .yaml)")
done
show wait --for condition=Established --timeout 60s "${crd_names[@]}"

step "applying every example"
show create namespace demo
for file in examples/*.yaml; do
  show apply -n demo -f "$file"
done

step "what kubectl get shows (no operator runs yet, so status columns are empty)"
show get backlog -A

step "an invalid object: $invalid_example"
sed -n '/^# expect:/d; s/^# //p' "$invalid_example"
if output=$("$kubectl" apply -n demo -f "$invalid_example" 2>&1); then
  echo "$output"
  echo "demo: the API server accepted $invalid_example; it must refuse it" >&2
  exit 1
fi
printf 'the API server refused it:\n%s\n' "$output"
