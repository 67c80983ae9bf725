{{/* The release's name for every object; "gitsched" when the release is called that. */}}
{{- define "gitsched.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gitsched.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gitsched.labels" -}}
{{ include "gitsched.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gitsched.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gitsched.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: the name of an existing ServiceAccount (serviceAccount.create is false)" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The webhook's Secret name, or "" when the webhook is off. */}}
{{- define "gitsched.webhookSecret" -}}
{{- if .Values.webhook.existingSecret -}}
{{- .Values.webhook.existingSecret -}}
{{- else if .Values.webhook.secret -}}
{{- printf "%s-webhook" (include "gitsched.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The console token's Secret name, or "" when visitors are not asked for one. */}}
{{- define "gitsched.consoleTokenSecret" -}}
{{- if .Values.console.token.existingSecret -}}
{{- .Values.console.token.existingSecret -}}
{{- else if .Values.console.token.value -}}
{{- printf "%s-console-token" (include "gitsched.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "gitsched.logURL" -}}
{{- if eq .Values.log.backend "sqlite" -}}
sqlite:////data/log.db
{{- else if eq .Values.log.backend "kafka" -}}
{{- required "log.kafka.url: kafka://host:port/topic (log.backend is kafka)" .Values.log.kafka.url -}}
{{- else -}}
{{- fail (printf "log.backend: %q is neither sqlite nor kafka" .Values.log.backend) -}}
{{- end -}}
{{- end -}}

{{/* Values that cannot work together fail the install with a message, not a broken pod. */}}
{{- define "gitsched.check" -}}
{{- $replicas := int .Values.replicas -}}
{{- if lt $replicas 1 -}}
{{- fail "replicas: at least 1" -}}
{{- end -}}
{{- if and (gt $replicas 1) (ne .Values.log.backend "kafka") -}}
{{- fail "replicas > 1 needs log.backend kafka: the SQLite log is one file on one volume" -}}
{{- end -}}
{{- if and (gt $replicas 1) (not .Values.leaderElection.enabled) -}}
{{- fail "replicas > 1 needs leaderElection.enabled: without the Lease every replica would act" -}}
{{- end -}}
{{- if and .Values.ingress.enabled .Values.console.enabled (not (include "gitsched.consoleTokenSecret" .)) (not .Values.console.trustForwardedUser) -}}
{{- fail "ingress.enabled exposes the console: set console.token (existingSecret or value) or console.trustForwardedUser behind an auth proxy" -}}
{{- end -}}
{{- if not (hasPrefix "kafka://" (include "gitsched.logURL" .)) -}}
{{- if ne .Values.log.backend "sqlite" -}}
{{- fail "log.kafka.url must start with kafka://" -}}
{{- end -}}
{{- end -}}
{{- end -}}
