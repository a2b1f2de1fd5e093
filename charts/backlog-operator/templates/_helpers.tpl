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

{{/*
What the controllers call, read from src/controller/ (kept in step with the code; the chart
test runs the controllers with exactly these permissions and fails when one is missing):
*/}}
{{- define "backlog-operator.rules" -}}
# The custom resources: Controller and reflector watches (list, watch); a budget reads the
# RetryPolicy it references (get).
- apiGroups: ["backlog.dev"]
  resources: ["backlogbudgets", "replayjobs"]
  verbs: ["list", "watch"]
- apiGroups: ["backlog.dev"]
  resources: ["retrypolicies"]
  verbs: ["get", "list", "watch"]
# Status is written with server-side apply (patch); a budget reconcile reads its previous
# decision from the status subresource, not the watch cache (get).
- apiGroups: ["backlog.dev"]
  resources: ["backlogbudgets/status"]
  verbs: ["get", "patch"]
- apiGroups: ["backlog.dev"]
  resources: ["retrypolicies/status", "replayjobs/status"]
  verbs: ["patch"]
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
# The consumer control document (one per budget) and a replay's frozen scope: read (get),
# written with server-side apply, which creates them the first time (create, patch). A
# replay's eventIdsFrom ConfigMap is read (get).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch"]
# Replay batches run as Indexed Jobs: owned and watched (list, watch), read by their
# deterministic names (get), validated with a dry run and created with server-side apply
# (create, patch), suspended and resumed with a merge patch (patch).
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Kubernetes Events about budgets, policies and replays (a repeated event is patched).
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}
