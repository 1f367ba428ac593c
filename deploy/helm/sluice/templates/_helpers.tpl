{{/* Chart name (nameOverride wins). */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's resources; the StatefulSet's pods are <fullname>-<ordinal>. */}}
{{- define "sluice.fullname" -}}
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

{{- define "sluice.labels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{ include "sluice.metaLabels" . }}
{{- end }}

{{/* Labels besides name and instance (pod templates add them to the selector labels). */}}
{{- define "sluice.metaLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector of the `sluice process` pods (immutable in a StatefulSet: never change it). */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: processor
{{- end }}

{{- define "sluice.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Secret and key holding SLUICE_SYSDB. */}}
{{- define "sluice.sysdbSecret" -}}
{{- default (printf "%s-sysdb" (include "sluice.fullname" .)) .Values.sysdb.existingSecret }}
{{- end }}
{{- define "sluice.sysdbKey" -}}
{{- if .Values.sysdb.existingSecret }}{{ .Values.sysdb.existingSecretKey }}{{ else }}SLUICE_SYSDB{{ end }}
{{- end }}

{{/* Secret and keys holding the API's tokens (SLUICE_READ_TOKEN, SLUICE_ADMIN_TOKEN). */}}
{{- define "sluice.tokensSecret" -}}
{{- default (printf "%s-http-tokens" (include "sluice.fullname" .)) .Values.auth.existingSecret }}
{{- end }}
{{- define "sluice.readTokenKey" -}}
{{- if .Values.auth.existingSecret }}{{ .Values.auth.existingSecretReadKey }}{{ else }}SLUICE_READ_TOKEN{{ end }}
{{- end }}
{{- define "sluice.adminTokenKey" -}}
{{- if .Values.auth.existingSecret }}{{ .Values.auth.existingSecretAdminKey }}{{ else }}SLUICE_ADMIN_TOKEN{{ end }}
{{- end }}

{{/* One token of the chart's Secret, base64: (list VALUE KEPT) with VALUE the value given
(used when set), KEPT the Secret's current data (base64) for that key, kept on upgrades;
else a new random one. */}}
{{- define "sluice.tokenData" -}}
{{- $value := index . 0 }}
{{- $kept := index . 1 }}
{{- if $value }}{{ $value | b64enc }}{{ else if $kept }}{{ $kept }}{{ else }}{{ randAlphaNum 40 | b64enc }}{{ end }}
{{- end }}

{{/* How many replicas should run: the alert SluiceReplicasMissing compares against it. */}}
{{- define "sluice.expectedReplicas" -}}
{{- if .Values.keda.enabled }}{{ .Values.keda.minReplicaCount }}{{ else }}{{ .Values.replicaCount }}{{ end }}
{{- end }}

{{/* Checks of values that would otherwise give a broken release. */}}
{{- define "sluice.validate" -}}
{{- if and (not .Values.sysdb.existingSecret) (not .Values.sysdb.url) }}
{{- fail "set sysdb.url or sysdb.existingSecret" }}
{{- end }}
{{- $listen := printf ":%v\"" .Values.metricsPort }}
{{- if not (contains $listen .Values.config) }}
{{- fail (printf "config: [http] listen must use metricsPort (%v), e.g. listen = \"0.0.0.0:%v\"" .Values.metricsPort .Values.metricsPort) }}
{{- end }}
{{- if and (not .Values.auth.existingSecret) .Values.auth.readToken (eq .Values.auth.readToken .Values.auth.adminToken) }}
{{- fail "auth.readToken and auth.adminToken must differ (whoever may read could also change state)" }}
{{- end }}
{{- if and .Values.keda.enabled (gt (int .Values.keda.minReplicaCount) (int .Values.keda.maxReplicaCount)) }}
{{- fail "keda.minReplicaCount must not exceed keda.maxReplicaCount" }}
{{- end }}
{{- end }}
