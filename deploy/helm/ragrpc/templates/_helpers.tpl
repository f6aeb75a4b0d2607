{{/* Names and labels. */}}
{{- define "ragrpc.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ragrpc.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ragrpc.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "ragrpc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "ingest"). */}}
{{- define "ragrpc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ragrpc.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "ragrpc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ragrpc.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The env ConfigMap of one component: shared config, then the component's own settings. */}}
{{- define "ragrpc.configData" -}}
{{- $values := index .root.Values .component -}}
{{- range $key, $value := .root.Values.config }}
{{ $key }}: {{ $value | toString | quote }}
{{- end }}
RAGRPC_MILVUS_URI: {{ .root.Values.milvus.uri | quote }}
RAGRPC_HOST: "0.0.0.0"
RAGRPC_{{ upper .component }}_PORT: {{ $values.port | toString | quote }}
RAGRPC_{{ upper .component }}_METRICS_PORT: {{ $values.metricsPort | toString | quote }}
{{- if eq .component "query" }}
RAGRPC_LLM_ENDPOINTS: {{ $values.llmEndpoints | toString | quote }}
{{- end }}
{{- range $key, $value := $values.env }}
{{ $key }}: {{ $value | toString | quote }}
{{- end }}
{{- end -}}
