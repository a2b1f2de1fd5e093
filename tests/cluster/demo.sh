#!/usr/bin/env bash
# The operator's main job, end to end on this machine, as a user runs it: a throwaway cluster
# with a real node (images from `make image` loaded), `helm install` of the chart (the operator
# runs as a pod with in-cluster config), a consumer Deployment whose real pods mount their
# budget's control document, the workload simulator running the burst scenario 30x faster than
# the wall clock and counting the Deployment's Ready pods as its consumers, and a BacklogBudget
# scaling those pods. Then a replay: alice asks, bob approves, and its canary and main stages
# run as Indexed Jobs of the reference worker, whose logs are printed. Everything it started is
# stopped on exit, also on failure or Ctrl-C.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

cargo=${CARGO:-cargo}
scenario=examples/scenarios/burst.yaml
speed=30
images=${IMAGES_DIR:-target/images}
invalid_example=tests/invalid/rj-self-approval.yaml

step() { printf '\n== %s\n' "$*"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

step "building the operator CLI and the local-cluster tool"
"$cargo" build -q -p local-cluster --bin local-cluster
"$cargo" build -q --bin backlog-operator
target_dir=$("$cargo" metadata --format-version 1 --no-deps |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
local_cluster="$target_dir/debug/local-cluster"
operator="$target_dir/debug/backlog-operator"
for image in backlog-operator backlog-replay-worker backlog-demo-consumer; do
  [ -f "$images/$image.tar" ] || { echo "demo: $images/$image.tar is missing: run make image" >&2; exit 1; }
done

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

step "starting a cluster with a real node ($state_dir)"
"$local_cluster" up --dir "$state_dir" --node --images "$images"
kubectl=$(bash tests/cluster/build-control-plane.sh --node)/kubectl
helm=$(bash tests/cluster/build-helm.sh)
export KUBECONFIG="$state_dir/kubeconfig"
export HELM_CONFIG_HOME="$state_dir/helm/config" HELM_CACHE_HOME="$state_dir/helm/cache" \
  HELM_DATA_HOME="$state_dir/helm/data"
prometheus_url=$(cat "$state_dir/prometheus-url")
prometheus_from_pods=$(cat "$state_dir/prometheus-url-from-pods")

step "helm install: the operator as a pod (image localhost/backlog-operator, Prometheus at $prometheus_from_pods)"
"$helm" install backlog-operator charts/backlog-operator --namespace backlog-system \
  --create-namespace --set prometheusUrl="$prometheus_from_pods" --wait --timeout 120s
"$kubectl" -n backlog-system get pods -o wide

step "the consumer: Deployment demo/orders, real pods mounting the control document"
"$kubectl" create namespace demo
"$kubectl" label namespace demo pod-security.kubernetes.io/enforce=restricted
# The namespace's admin opts in: the operator may write ConfigMaps and create Jobs here.
"$kubectl" -n demo create rolebinding backlog-operator --clusterrole=backlog-operator-namespace \
  --serviceaccount=backlog-system:backlog-operator
"$kubectl" apply -n demo -f examples/demo/consumer.yaml
"$kubectl" -n demo rollout status deployment/orders --timeout=120s

step "the workload: $scenario at ${speed}x, its consumers are the Ready pods of demo/orders"
workload_port=$(free_port)
"$operator" simulate --scenario "$scenario" --serve "127.0.0.1:$workload_port" \
  --namespace demo --target orders --speed "$speed" --consumers ready-pods \
  2>"$state_dir/workload.log" &
pids+=($!)
"$local_cluster" scrape add --dir "$state_dir" workload "127.0.0.1:$workload_port"

step "the budget (the scenario's, in wall-clock terms: every duration /${speed}, every rate x${speed})"
"$operator" simulate --scenario "$scenario" --emit-budget --target orders --speed "$speed" |
  tee "$state_dir/budget.yaml" | sed -n '/completionDeadline/p;/perReplicaRate/p;/targetDrainTime/p'
"$kubectl" apply -n demo -f "$state_dir/budget.yaml"

duration=$(sed -n 's/^duration: *//p' "$scenario")
watch_seconds=$(python3 -c "
import re
total = sum(float(n) * {'h': 3600, 'm': 60, 's': 1}[u] for n, u in re.findall(r'([0-9.]+)(h|m|s)', '$duration'))
print(max(int(total / $speed) - 3, 10))")
step "live timeline for ${watch_seconds}s: the budget's decision and the pods on the node"
python3 tests/cluster/demo-timeline.py "$kubectl" demo orders app=orders "$watch_seconds"

step "kubectl get backlog -n demo; why it scaled (its Events); a consumer pod's view of its control document"
"$kubectl" get backlog -n demo
"$kubectl" -n demo get events --field-selector involvedObject.kind=BacklogBudget \
  --sort-by=.metadata.creationTimestamp \
  -o custom-columns=CREATED:.metadata.creationTimestamp,REASON:.reason,MESSAGE:.message
"$kubectl" -n demo logs deployment/orders | tail -3

step "an invalid object: $invalid_example"
sed -n '/^# expect:/d; s/^# //p' "$invalid_example"
if output=$("$kubectl" apply -n demo -f "$invalid_example" 2>&1); then
  echo "$output"
  echo "demo: the API server accepted $invalid_example; it must refuse it" >&2
  exit 1
fi
printf 'the API server refused it:\n%s\n' "$output"

step "a replay: alice asks, bob approves, the reference worker runs as Indexed Jobs"
"$kubectl" apply -f examples/demo/replay-users.yaml
"$kubectl" -n demo create serviceaccount replay-worker   # what the worker pods run as
"$kubectl" --context alice apply -f examples/demo/replay.yaml
"$kubectl" -n demo wait rj/orders-schema-fix --for=jsonpath='{.status.phase}'=AwaitingApproval --timeout=60s
"$kubectl" --context alice -n demo get rj orders-schema-fix
# bob approves exactly the frozen list and the spec he read, by their sha256s (one read, so
# the two belong together; the API server refuses them if alice edited since).
read -r scope_sha spec_sha < <("$kubectl" --context bob -n demo get rj orders-schema-fix \
  -o jsonpath='{.status.scope.sha256} {.status.specSha256}{"\n"}')
"$kubectl" --context bob -n demo patch rj orders-schema-fix --type merge \
  -p '{"spec":{"approval":{"approvedBy":"bob","reference":"CAB-2026-118","scopeSha256":"'"$scope_sha"'","specSha256":"'"$spec_sha"'"}}}'
"$kubectl" -n demo wait rj/orders-schema-fix --for=jsonpath='{.status.phase}'=Succeeded --timeout=180s
"$kubectl" -n demo get rj orders-schema-fix
"$kubectl" -n demo get jobs -l backlog.dev/replay=orders-schema-fix
for job in $("$kubectl" -n demo get jobs -l backlog.dev/replay=orders-schema-fix \
    --sort-by=.metadata.creationTimestamp -o name); do
  job=${job#job.batch/}
  for pod in $("$kubectl" -n demo get pods -l "batch.kubernetes.io/job-name=$job" -o name \
      --sort-by='.metadata.annotations.batch\.kubernetes\.io/job-completion-index'); do
    echo "-- $job, $pod"
    "$kubectl" -n demo logs "$pod"
  done
done
