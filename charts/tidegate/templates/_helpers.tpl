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
# InferencePool and TierPolicy: watched; status written through the status subresource;
# spec.replicas.manual read through the scale subresource. Finalizers are patched on pools.
- apiGroups: ["tidegate.dev"]
  resources: ["inferencepools", "tierpolicies"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["tidegate.dev"]
  resources: ["inferencepools/status", "tierpolicies/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["tidegate.dev"]
  resources: ["inferencepools/scale"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["tidegate.dev"]
  resources: ["inferencepools/finalizers"]
  verbs: ["update"]
# The engine and router Deployments of each pool, applied with server-side apply; deleted on
# scale to nothing and when a pool is removed.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The Services of each pool (the front door on the routers, the engines' headless one) and
# its admin-token Secret. Secrets are also read for
# TierPolicy API keys (spec.tenancy.apiKeys.secretName).
- apiGroups: [""]
  resources: ["services", "secrets"]
  verbs: ["get", "list", "watch", "create", "patch"]
# The tenant-registry ConfigMaps of each pool (delete: shards left by a registry that shrank).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The engine and router PodDisruptionBudgets of each pool.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Engine and router pods: readiness, and their addresses for the admin API (drain before
# scale-down; policy and engine-set pushes to the routers);
# patch sets controller.kubernetes.io/pod-deletion-cost on a drained pod so the ReplicaSet
# removes it and not one still serving.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch"]
# Events on pools (scaling decisions, admission pause and resume).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}
