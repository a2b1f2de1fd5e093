{{/* The chart's name, overridable with nameOverride. */}}
{{- define "backlog-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The full name of the release's objects: the release name if it already contains the
chart's name, else release-chart; fullnameOverride replaces it. */}}
{{- define "backlog-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "backlog-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "backlog-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "backlog-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "backlog-operator.labels" -}}
helm.sh/chart: {{ include "backlog-operator.chart" . }}
{{ include "backlog-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "backlog-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "backlog-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "backlog-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The namespaces the operator watches, as a JSON list (empty: all namespaces). */}}
{{- define "backlog-operator.watchNamespaces" -}}
{{- $namespaces := list }}
{{- range .Values.watchNamespaces }}
{{- $namespaces = append $namespaces . }}
{{- end }}
{{- with .Values.watchNamespace }}
{{- $namespaces = append $namespaces . }}
{{- end }}
{{- $namespaces | uniq | toJson }}
{{- end }}

{{/* The operator's user name, as the API server sees its ServiceAccount. */}}
{{- define "backlog-operator.userName" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "backlog-operator.serviceAccountName" .) }}
{{- end }}

{{/*
What the controllers call, read from src/controller/ (kept in step with the code; the chart
test runs the controllers with exactly these permissions and fails when one is missing).

Two parts. "clusterRules" hold in every watched namespace and write nothing but the status of
the operator's own kinds, the /scale of workloads, and Events. "namespaceRules" create Jobs and
write ConfigMaps: in the cluster-wide mode they come only from an aggregated ClusterRole that a
namespace admin binds in a namespace (so the operator cannot create a Job in kube-system, nor
anything in its own namespace); in the namespaced mode they are part of the Role in each
watched namespace. Nothing here touches the admission policies (cluster-scoped; their
parameters are literals in them).
*/}}
{{- define "backlog-operator.clusterRules" -}}
# The custom resources: Controller and reflector watches (list, watch); a budget reads the
# RetryPolicy it references (get).
- apiGroups: ["backlog.dev"]
  resources: ["backlogbudgets", "replayjobs", "compensations"]
  verbs: ["list", "watch"]
- apiGroups: ["backlog.dev"]
  resources: ["retrypolicies"]
  verbs: ["get", "list", "watch"]
# Status is written with server-side apply (patch); a budget keeps its decision's memory in
# the operator and never reads its status back. The admission policy status-owner admits
# these writes from this ServiceAccount only.
- apiGroups: ["backlog.dev"]
  resources: ["backlogbudgets/status", "retrypolicies/status", "replayjobs/status"]
  verbs: ["patch"]
# A compensation's start and Job uid are the record that keeps its worker from running twice:
# read fresh from the status subresource (get), never from a cache.
- apiGroups: ["backlog.dev"]
  resources: ["compensations/status"]
  verbs: ["get", "patch"]
# Scale targets: watched to react to replica changes (list, watch), read for spec.replicas and
# status.readyReplicas (get), scaled through /scale with server-side apply (patch).
- apiGroups: ["apps"]
  resources: ["deployments", "statefulsets"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["apps"]
  resources: ["deployments/scale", "statefulsets/scale"]
  verbs: ["patch"]
{{- range .Values.rbac.extraScaleTargets }}
- apiGroups: [{{ .apiGroup | quote }}]
  resources: {{ toJson .resources }}
  verbs: ["get"]
- apiGroups: [{{ .apiGroup | quote }}]
  resources: [{{ range $i, $r := .resources }}{{ if $i }}, {{ end }}{{ printf "%s/scale" $r | quote }}{{ end }}]
  verbs: ["patch"]
{{- end }}
# Another autoscaler owning a budget's target is a conflict: HPAs are watched, never written.
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["list", "watch"]
# Replay batches run as Indexed Jobs: watched (list, watch) and read by their deterministic
# names (get). Creating and suspending them is a namespace's grant (namespaceRules).
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch"]
# Kubernetes Events about budgets, policies and replays (a repeated event is patched).
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{- define "backlog-operator.replayNamespaceRules" -}}
# Replays: the frozen scope and the audit trail are created (create) and read back with the
# eventIdsFrom source (get); batches run as Jobs created once (create) and only ever
# suspended or resumed (patch).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["create", "patch"]
# Compensations: the claim on a compensationId and the frozen request, and the result, are
# immutable ConfigMaps (create, get, as above); the worker's report is its pod's termination
# message (list the Job's pods).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
{{- end }}

{{- define "backlog-operator.budgetNamespaceRules" -}}
# Budgets: the consumer control document, read from a watch (list, watch; get before the
# watch has listed) and written with server-side apply, which creates it the first time
# (create, patch). get already reads any ConfigMap here by name: list and watch add no access.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch"]
{{- end }}
