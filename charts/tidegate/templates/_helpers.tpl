{{/* Chart name, truncated to the 63 characters a label value may hold. */}}
{{- define "tidegate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: <release>-tidegate, or the release name when it already contains the chart name. */}}
{{- define "tidegate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tidegate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "tidegate.labels" -}}
helm.sh/chart: {{ include "tidegate.chart" . }}
{{ include "tidegate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tidegate
{{- end -}}

{{/* Labels that select the operator pods. */}}
{{- define "tidegate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tidegate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "tidegate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tidegate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "tidegate.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion | toString -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* Namespaces the engine PodMonitor looks in (may be empty: any). */}}
{{- define "tidegate.engineNamespaces" -}}
{{- $ns := .Values.engineMonitor.namespaces | default .Values.watchNamespaces -}}
{{- toYaml $ns -}}
{{- end -}}

{{/*
Rules for the objects the operator reads and writes in the namespaces holding pools.
Kept in one place so that the ClusterRole (all namespaces) and the per-namespace Roles
grant exactly the same thing.
*/}}
{{- define "tidegate.poolRules" -}}
# Exactly what `tidegate-operator run` calls (operator/RBAC.md has the why of each line; the
# cluster e2e checks a kubectl auth can-i matrix against it, allowed and refused).
# InferencePool and TierPolicy: watched; the pool's status patched on its subresource.
- apiGroups: ["tidegate.dev"]
  resources: ["inferencepools", "tierpolicies"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["tidegate.dev"]
  resources: ["inferencepools/status"]
  verbs: ["patch"]
# The engine and router Deployments, both Services and both PodDisruptionBudgets of each
# pool: server-side apply (create + patch), watched as the pool's own objects.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Secrets by name only, never listed or watched: the pool's admin-token Secret (created once,
# then read) and the API-key Secret a TierPolicy names (read).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create"]
# The tenant-registry ConfigMaps of each pool (delete: shards left by a registry that shrank).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch", "delete"]
# Engine and router pods: listed by the pool's selectors for readiness and their addresses
# (drain before scale-down; policy and engine-set pushes); engine pods watched so that one
# that leaves or stops being Ready reaches the routers at once; patched with
# controller.kubernetes.io/pod-deletion-cost on a drained pod so the ReplicaSet removes it.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "patch"]
# Events on pools (scaling decisions, admission pause and resume; patch: an event series).
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}
