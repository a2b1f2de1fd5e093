#!/usr/bin/env bash
# The operator's main job, end to end on this machine: a throwaway local control plane and
# Prometheus, the workload simulator running the burst scenario 30x faster than the wall clock
# (its consumers are a Deployment's spec.replicas), the operator, and a BacklogBudget. Prints
# the budget's live timeline and a summary, shows kubectl's view and one refused invalid
# object, then stops everything it started, also on failure or Ctrl-C.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

cargo=${CARGO:-cargo}
scenario=examples/scenarios/burst.yaml
speed=30
invalid_example=tests/invalid/rj-self-approval.yaml

step() { printf '\n== %s\n' "$*"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

step "building the operator and the local-cluster tool"
"$cargo" build -q -p local-cluster --bin local-cluster
"$cargo" build -q --bin backlog-operator
target_dir=$("$cargo" metadata --format-version 1 --no-deps |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
local_cluster="$target_dir/debug/local-cluster"
operator="$target_dir/debug/backlog-operator"

state_dir=$(mktemp -d "${TMPDIR:-/tmp}/backlog-demo.XXXXXX")
pids=()
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  step "stopping everything the demo started"
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  "$local_cluster" down --dir "$state_dir" || true
  rm -rf "$state_dir"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "starting etcd, kube-apiserver and Prometheus on loopback ($state_dir)"
"$local_cluster" up --dir "$state_dir"
kubectl=$(bash tests/cluster/build-control-plane.sh)/kubectl
export KUBECONFIG="$state_dir/kubeconfig"
prometheus_url=$(cat "$state_dir/prometheus-url")

step "the consumer: Deployment demo/orders (no kubelet runs; its spec.replicas are the consumers)"
"$kubectl" create namespace demo
"$kubectl" -n demo create deployment orders --image=registry.example.com/orders-consumer:1 --replicas=3

step "the workload: $scenario at ${speed}x, serving kafka_exporter-style metrics"
workload_port=$(free_port)
"$operator" simulate --scenario "$scenario" --serve "127.0.0.1:$workload_port" \
  --namespace demo --target orders --speed "$speed" 2>"$state_dir/workload.log" &
pids+=($!)
"$local_cluster" scrape add --dir "$state_dir" workload "127.0.0.1:$workload_port"

step "the operator: backlog-operator run --namespace demo --prometheus-url $prometheus_url"
"$operator" run --namespace demo --prometheus-url "$prometheus_url" \
  --listen "127.0.0.1:$(free_port)" 2>"$state_dir/operator.log" &
pids+=($!)

step "the budget (the scenario's, in wall-clock terms: every duration /${speed}, every rate x${speed})"
"$operator" simulate --scenario "$scenario" --emit-budget --target orders --speed "$speed" |
  tee "$state_dir/budget.yaml" | sed -n '/completionDeadline/p;/perReplicaRate/p;/targetDrainTime/p'
"$kubectl" apply -n demo -f "$state_dir/budget.yaml"

duration=$(sed -n 's/^duration: *//p' "$scenario")
watch_for=$(python3 -c "
import re,sys
d='$duration'; total=0
for n,u in re.findall(r'([0-9.]+)(h|m|s)', d): total += float(n)*{'h':3600,'m':60,'s':1}[u]
print(f'{max(int(total/$speed)-3, 10)}s')")
step "live timeline for $watch_for (λ: arrivals, μ: completions, per wall-clock second)"
"$operator" watch orders -n demo --for "$watch_for"

step "kubectl get backlog -n demo"
"$kubectl" get backlog -n demo

step "an invalid object: $invalid_example"
sed -n '/^# expect:/d; s/^# //p' "$invalid_example"
if output=$("$kubectl" apply -n demo -f "$invalid_example" 2>&1); then
  echo "$output"
  echo "demo: the API server accepted $invalid_example; it must refuse it" >&2
  exit 1
fi
printf 'the API server refused it:\n%s\n' "$output"
