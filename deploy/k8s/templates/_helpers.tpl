{{- /* Labels on every object: the kustomize base's part-of, and Helm's own. */ -}}
{{- define "beamserve.labels" -}}
app.kubernetes.io/part-of: beamserve
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
