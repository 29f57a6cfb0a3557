{{/*
Labels every object of the chart carries: the manifests' part-of, and Helm's. Never in
a selector (a selector must not change between chart versions).
*/}}
{{- define "agentq.labels" -}}
app.kubernetes.io/part-of: agentq
{{ include "agentq.helmLabels" . }}
{{- end }}

{{- define "agentq.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* The operator's namespace. */}}
{{- define "agentq.namespace" -}}
{{ .Values.namespace.name }}
{{- end }}

{{/* The agent pool's namespace: its own, or the release's. */}}
{{- define "agentq.poolNamespace" -}}
{{ .Values.agentPool.namespace | default .Release.Namespace }}
{{- end }}

{{/* repository:tag, or repository@digest when a digest is given. */}}
{{- define "agentq.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}
{{- end }}
