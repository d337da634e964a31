{{- /* The release's name for its objects: the release name where it holds the chart's ("beamserve",
"beamserve-prod"), else release-chart; fullnameOverride takes its place. */ -}}
{{- define "beamserve.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- /* Labels on every object: the app's, this release's, and Helm's own. */ -}}
{{- define "beamserve.labels" -}}
app.kubernetes.io/part-of: beamserve
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- /* A component's selector: the app, this release, and the component (head, worker, limits, ...). */ -}}
{{- define "beamserve.selector" -}}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/name: beamserve
{{- end -}}

{{- /* The Ray pods of this release, as a label expression (head and workers). */ -}}
{{- define "beamserve.rayPods" -}}
matchExpressions:
  - {key: app.kubernetes.io/name, operator: In, values: [beamserve]}
  - {key: app.kubernetes.io/instance, operator: In, values: [{{ .Release.Name | quote }}]}
  - {key: app.kubernetes.io/component, operator: In, values: [head, worker]}
{{- end -}}

{{- /* A number as Python's str() writes it (30.0 -> "30.0", 7.5 -> "7.5"): the front's variables are
read by Settings and compared with what service/api/front.py writes. */ -}}
{{- define "beamserve.float" -}}
{{- $x := float64 . -}}
{{- if eq $x (floor $x) }}{{ printf "%.1f" $x }}{{ else }}{{ $x }}{{ end -}}
{{- end -}}

{{- /* Every Ray container's environment: the HTTP front (service/api/front.py cluster_environment): Serve's
high-throughput mode behind HAProxy, its limits from front.*, beamserve's part of HAProxy's configuration
through Ray's worker setup hook; then the values' env. */ -}}
{{- define "beamserve.env" -}}
{{- $f := .Values.front -}}
- {name: BEAMSERVE_PROXY, value: haproxy}
- {name: BEAMSERVE_MAX_IN_FLIGHT, value: {{ int $f.maxInFlight | quote }}}
- {name: BEAMSERVE_MAX_QUEUED, value: {{ int $f.maxQueued | quote }}}
- {name: BEAMSERVE_MAX_BODY_BYTES, value: {{ int $f.maxBodyBytes | quote }}}
- {name: BEAMSERVE_MAX_DOCUMENT_BYTES, value: {{ int $f.maxDocumentBytes | quote }}}
- {name: BEAMSERVE_BODY_TIMEOUT_S, value: {{ include "beamserve.float" $f.bodyTimeoutS | quote }}}
- {name: BEAMSERVE_REQUEST_TIMEOUT_S, value: {{ include "beamserve.float" $f.requestTimeoutS | quote }}}
- {name: RAY_SERVE_LOG_TO_STDERR, value: "0"}
- {name: RAY_SERVE_METRICS_EXPORT_INTERVAL_MS, value: "1000"}
- {name: RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S, value: "30"}
- {name: RAY_SERVE_ENABLE_HA_PROXY, value: "1"}
- {name: RAY_SERVE_THROUGHPUT_OPTIMIZED, value: "1"}
- {name: RAY_SERVE_HAPROXY_TUNE_BUFSIZE, value: "81920"}
- {name: RAY_SERVE_HAPROXY_RETRY_ON, value: conn-failure empty-response}
- {name: RAY_SERVE_HAPROXY_RETRIES, value: "20"}
- {name: RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S, value: {{ add (int (ceil (float64 $f.requestTimeoutS))) 10 | quote }}}
- {name: RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S, value: "2"}
- {name: __RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR, value: service.api.front_log.install}
{{- with .Values.env }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- /* The image: the values' repository and tag, else beamserve:cpu or beamserve:gpu. */ -}}
{{- define "beamserve.image" -}}
{{- $tag := .Values.image.tag | default (ternary "gpu" "cpu" .Values.gpu.enabled) -}}
{{- printf "%s:%s" (.Values.image.repository | default "beamserve") $tag -}}
{{- end -}}

{{- /* The Serve config (serveConfigV2): serve.config, its application's args with the front's limits (front.*,
the same values the pods' environment carries), serve.args over them, and a registry's models each a
deployment of its own with the options the shipped models have and models.deployment over them. */ -}}
{{- define "beamserve.serveConfig" -}}
{{- $v := .Values -}}
{{- if or (hasKey ($v.serve.args | default dict) "models") (hasKey ($v.serve.args | default dict) "model_registry") -}}
{{- fail "serve.args: name the models in models.registry, which also gives each its deployment" -}}
{{- end -}}
{{- $config := deepCopy $v.serve.config -}}
{{- $app := index $config.applications 0 -}}
{{- $f := $v.front -}}
{{- $front := dict "max_in_flight" (int $f.maxInFlight) "max_queued" (int $f.maxQueued) "max_body_bytes" (int $f.maxBodyBytes) "max_document_bytes" (int $f.maxDocumentBytes) "body_timeout_s" (float64 $f.bodyTimeoutS) "request_timeout_s" (float64 $f.requestTimeoutS) -}}
{{- $args := mergeOverwrite (deepCopy $app.args) $front (deepCopy ($v.serve.args | default dict)) -}}
{{- if $v.models.registry -}}
{{- $_ := unset $args "models" -}}
{{- $_ := set $args "model_registry" $v.models.registry -}}
{{- $model := dict -}}
{{- $others := list -}}
{{- range $app.deployments -}}
{{- if hasPrefix "model-" .name }}{{ if not $model }}{{ $model = . }}{{ end }}{{ else }}{{ $others = append $others . }}{{ end -}}
{{- end -}}
{{- $deployments := list -}}
{{- range $entry := $v.models.registry -}}
{{- if not $entry.pool -}}
{{- $d := mergeOverwrite (deepCopy $model) (deepCopy ($v.models.deployment | default dict)) (dict "name" (printf "model-%s" $entry.name)) -}}
{{- $deployments = append $deployments $d -}}
{{- end -}}
{{- end -}}
{{- $_ := set $app "deployments" (concat $deployments $others) -}}
{{- end -}}
{{- $_ := set $app "args" $args -}}
{{- toYaml $config -}}
{{- end -}}

{{- /* The init container that copies the models out of models.copyFrom.image into the pod's /models. */ -}}
{{- define "beamserve.copyModels" -}}
- name: models
  image: {{ .Values.models.copyFrom.image }}
  command: [sh, -c, {{ printf "cp -R %s/. /copy/" (trimSuffix "/" .Values.models.copyFrom.path) | quote }}]
  securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
  resources: {requests: {cpu: 100m, memory: 128Mi}, limits: {cpu: "1", memory: 512Mi}}
  volumeMounts:
    - {name: models, mountPath: /copy}
{{- end -}}

{{- /* The Fluent Bit sidecar (logShipping): Serve's JSON log files from the shared /tmp/ray to its stdout. */ -}}
{{- define "beamserve.fluentBit" -}}
- name: fluent-bit
  image: fluent/fluent-bit:4.0.3
  args: [--config=/fluent-bit/etc/fluent-bit.yaml]
  securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
  resources: {requests: {cpu: 50m, memory: 64Mi}, limits: {cpu: 200m, memory: 128Mi}}
  volumeMounts:
    - {name: ray-logs, mountPath: /tmp/ray}
    - {name: fluent-bit-config, mountPath: /fluent-bit/etc/}
{{- end -}}
