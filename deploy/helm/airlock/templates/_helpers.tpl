{{/*
The labels on every object: the base's app.kubernetes.io/part-of and
Helm's standard ones (the only labels the base lacks).
*/}}
{{- define "airlock.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: airlock
{{- end }}

{{/*
The ConfigMap's name: fixed, unlike kustomize's hashed one; the pod
template's checksum/config annotation rolls the Deployment instead.
*/}}
{{- define "airlock.configMapName" -}}
{{ .Release.Name }}-config
{{- end }}

{{/*
airlock's config.yaml: .Values.config with kubernetes.namespace and
kubernetes.runtime_class taken from namespaces.sandboxes and
runtimeClass.name, so that the config names what the RBAC grants.
*/}}
{{- define "airlock.config" -}}
{{- $config := deepCopy (.Values.config | default dict) -}}
{{- $kube := dict -}}
{{- if kindIs "map" $config.kubernetes }}{{ $kube = $config.kubernetes }}{{ end -}}
{{- $_ := set $kube "namespace" .Values.namespaces.sandboxes -}}
{{- $_ = set $kube "runtime_class" .Values.runtimeClass.name -}}
{{- $_ = set $config "kubernetes" $kube -}}
{{- toYaml $config -}}
{{- end }}
