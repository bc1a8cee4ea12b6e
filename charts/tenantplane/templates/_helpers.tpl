{{/* The name of the operator's objects: the release name when it holds the chart name. */}}
{{- define "tenantplane.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* What Helm adds to every object: the release's bookkeeping. */}}
{{- define "tenantplane.releaseLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "tenantplane.selectorLabels" -}}
app.kubernetes.io/name: tenantplane
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tenantplane.labels" -}}
app.kubernetes.io/name: tenantplane
{{ include "tenantplane.releaseLabels" . }}
{{- end -}}
