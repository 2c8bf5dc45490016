{{/*
Helpers of the gateway (`sie-worker gateway`), the front door of every pool x bundle.
*/}}

{{/*
Name of the gateway's objects (Deployment, Service, ConfigMap, Role, ...).
Usage: {{ include "sie-workers.gatewayName" . }}
*/}}
{{- define "sie-workers.gatewayName" -}}
{{- printf "%s-gateway" (include "sie-workers.fullname" . | trunc 55 | trimSuffix "-") -}}
{{- end -}}

{{/*
"true" when the gateway is rendered: gateway.enabled and at least one pool enabled (a
gateway without pools has nothing to route to).
Usage: {{ if include "sie-workers.gatewayRendered" . }}
*/}}
{{- define "sie-workers.gatewayRendered" -}}
{{- if and .Values.gateway.enabled (include "sie-workers.enabledPools" . | fromJsonArray) -}}true{{- end -}}
{{- end -}}

{{/*
Selector labels of the gateway pods.
Usage: {{ include "sie-workers.gatewaySelectorLabels" . }}
*/}}
{{- define "sie-workers.gatewaySelectorLabels" -}}
{{ include "sie-workers.selectorLabels" . }}
app.kubernetes.io/component: gateway
{{- end -}}

{{/*
Full labels of the gateway's objects.
Usage: {{ include "sie-workers.gatewayLabels" . }}
*/}}
{{- define "sie-workers.gatewayLabels" -}}
{{ include "sie-workers.labels" . }}
app.kubernetes.io/component: gateway
{{- end -}}

{{/*
Name of the gateway's ServiceAccount.
Usage: {{ include "sie-workers.gatewayServiceAccountName" . }}
*/}}
{{- define "sie-workers.gatewayServiceAccountName" -}}
{{- if .Values.gateway.serviceAccount.create -}}
{{- default (include "sie-workers.gatewayName" .) .Values.gateway.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.gateway.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
Image of the gateway: repository@digest or repository:tag from gateway.image; with only a
repository, workers.common.image.tag (else appVersion); else exactly the `default` bundle's
worker image (the gateway needs no engine).
Usage: {{ include "sie-workers.gatewayImage" . }}
*/}}
{{- define "sie-workers.gatewayImage" -}}
{{- $image := .Values.gateway.image -}}
{{- $repository := $image.repository | default .Values.workers.common.image.repository -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $repository $image.digest -}}
{{- else if $image.tag -}}
{{- printf "%s:%s" $repository (toString $image.tag) -}}
{{- else if $image.repository -}}
{{- printf "%s:%s" $repository (toString (.Values.workers.common.image.tag | default .Chart.AppVersion)) -}}
{{- else -}}
{{- include "sie-workers.image" (dict "root" . "bundle" "default") -}}
{{- end -}}
{{- end -}}

{{/*
The gateway's pools file (YAML list), rendered from workers.pools: one entry per enabled
pool x bundle with its Service, port, slots, slot width and whether its streams resume
(the pool's `resume`). The gateway reads it
(SIE_GATEWAY_POOLS); workers.pools stays the one source.
Usage: {{ include "sie-workers.gatewayPools" . }}
*/}}
{{- define "sie-workers.gatewayPools" -}}
{{- $entries := list -}}
{{- range $poolName := (include "sie-workers.enabledPools" . | fromJsonArray) -}}
{{- $pool := index $.Values.workers.pools $poolName -}}
{{- $width := include "sie-workers.slotWidth" $pool | int -}}
{{- if include "sie-workers.isCpuPool" $pool -}}{{- $width = 1 -}}{{- end -}}
{{- /* A group's leader serves models as wide as the whole group. */ -}}
{{- $width = mul $width (include "sie-workers.gpuNodes" (dict "root" $ "pool" $pool) | int) -}}
{{- range $bundleName := (keys ($pool.bundles | default dict) | sortAlpha) -}}
{{- $entries = append $entries (dict
    "pool" $poolName
    "bundle" $bundleName
    "machine_profile" (toString $pool.machineProfile)
    "gpu_type" (toString $pool.gpuType)
    "slots" (include "sie-workers.slotCount" $pool | int)
    "slot_width" $width
    "service" (include "sie-workers.workloadName" (dict "root" $ "pool" $poolName "bundle" $bundleName))
    "port" (int $.Values.workers.common.port)
    "resume" (ne (toString $pool.resume) "false")) -}}
{{- end -}}
{{- end -}}
{{- toYaml $entries -}}
{{- end -}}

{{/*
Affinity of the gateway pods: gateway.affinity, else a preferred spread over nodes.
Usage: {{ include "sie-workers.gatewayAffinity" . | nindent 8 }}
*/}}
{{- define "sie-workers.gatewayAffinity" -}}
{{- with .Values.gateway.affinity -}}
{{- toYaml . -}}
{{- else -}}
{{- $term := dict "labelSelector" (dict "matchLabels" (include "sie-workers.gatewaySelectorLabels" . | fromYaml)) "topologyKey" "kubernetes.io/hostname" -}}
{{- toYaml (dict "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term)))) -}}
{{- end -}}
{{- end -}}

{{/*
terminationGracePeriodSeconds of the gateway pods: preStop sleep + drain + 10 s of slack.
Usage: {{ include "sie-workers.gatewayTerminationGracePeriodSeconds" . }}
*/}}
{{- define "sie-workers.gatewayTerminationGracePeriodSeconds" -}}
{{- $t := .Values.gateway.termination -}}
{{- add (int $t.preStopSleepSec) (int $t.drainTimeoutSec) 10 -}}
{{- end -}}

{{/*
The gateway's cross-field problems (JSON list of messages), collected by
sie-workers.validateValues.
Usage: {{ include "sie-workers.gatewayProblems" . | fromJsonArray }}
*/}}
{{- define "sie-workers.gatewayProblems" -}}
{{- $errors := list -}}
{{- $gateway := .Values.gateway -}}
{{- /* A pool at zero wakes only through the gateway's held-request trigger. */ -}}
{{- if and .Values.autoscaling.enabled (not $gateway.enabled) -}}
{{- range $poolName := (include "sie-workers.enabledPools" . | fromJsonArray) -}}
{{- $pool := index $.Values.workers.pools $poolName -}}
{{- range $bundleName, $replicas := ($pool.bundles | default dict) -}}
{{- if and (kindIs "map" $replicas) (hasKey $replicas "minReplicas") (eq (int $replicas.minReplicas) 0) -}}
{{- $errors = append $errors (printf "workers.pools.%s.bundles.%s.minReplicas: 0 needs gateway.enabled: with no pod there is no router, and only the gateway holds the first request and exports sie_gateway_pending_requests, which wakes the pool; enable the gateway or raise minReplicas to 1" $poolName $bundleName) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $gateway.enabled -}}
{{- if and $gateway.httpRoute.enabled (not $gateway.httpRoute.parentRefs) -}}
{{- $errors = append $errors "gateway.httpRoute.parentRefs: an HTTPRoute attaches to nothing without parentRefs; add the Gateway, e.g. [{name: public, namespace: gateways}]" -}}
{{- end -}}
{{- if and $gateway.ingress.enabled (not $gateway.ingress.hosts) -}}
{{- $errors = append $errors "gateway.ingress.hosts: an Ingress needs at least one host; add [{host: sie.example.com}]" -}}
{{- end -}}
{{- if and (not (kindIs "invalid" $gateway.service.nodePort)) (eq $gateway.service.type "ClusterIP") -}}
{{- $errors = append $errors (printf "gateway.service.nodePort: %v is set but gateway.service.type is ClusterIP; use NodePort or LoadBalancer, or leave nodePort null" $gateway.service.nodePort) -}}
{{- end -}}
{{- $owned := list "SIE_GATEWAY_POOLS" "SIE_GATEWAY_MAX_HELD" "SIE_GATEWAY_HOLD_S" "SIE_GATEWAY_RETRY_AFTER_S" "SIE_GATEWAY_SLOT_TARGET" "SIE_GATEWAY_NAMESPACE" "SIE_CONFIG_DIR" "SIE_API_KEY" "SIE_DRAIN_TIMEOUT_S" -}}
{{- range $i, $env := ($gateway.extraEnv | default list) -}}
{{- if has (toString $env.name) $owned -}}
{{- $errors = append $errors (printf "gateway.extraEnv[%d].name: %s is set by the chart; use the gateway values key that sets it instead" $i $env.name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $errors | toJson -}}
{{- end -}}
