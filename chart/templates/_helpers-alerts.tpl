{{/*
The selector of every series of this release, as the chart's ServiceMonitors label them.
Usage: {{ include "sie-workers.releaseSelector" . }}
*/}}
{{- define "sie-workers.releaseSelector" -}}
namespace="{{ .Release.Namespace }}",release="{{ .Release.Name }}"
{{- end -}}

{{/*
The alerts of the PrometheusRule (a YAML list of rules): every enabled alert of
metrics.prometheusRule.alerts, its expression selecting this release's series, with its
severity, `for`, the extra labels and annotations, and a runbook_url to its section of the
chart README (runbookBaseUrl + "#" + the alert name in lower case).
Usage: {{ include "sie-workers.alertRules" . | nindent 8 }}
*/}}
{{- define "sie-workers.alertRules" -}}
{{- $rule := .Values.metrics.prometheusRule -}}
{{- $a := $rule.alerts -}}
{{- $s := include "sie-workers.releaseSelector" . -}}
{{- $pod := "namespace, release, pool, bundle, pod" -}}
{{- $container := "namespace, release, pool, bundle, pod, container" -}}
{{- $defs := list -}}
{{- $defs = append $defs (dict "key" "workerNotReady" "alert" "SieWorkerNotReady"
  "expr" (printf "max by (%s, slot) (sie_router_slot_ready{%s}) == 0" $pod $s)
  "summary" "A worker slot of pool {{ $labels.pool }} is not ready"
  "description" "Slot {{ $labels.slot }} of pod {{ $labels.namespace }}/{{ $labels.pod }} (pool {{ $labels.pool }}, bundle {{ $labels.bundle }}) has not reported ready: its pinned models are not loaded, or its worker does not answer.") -}}
{{- $defs = append $defs (dict "key" "modelLoadFailures" "alert" "SieModelLoadFailed"
  "expr" (printf "sum by (%s, outcome) (increase(sie_model_loads_total{%s,outcome!~\"ready|cancelled|placement_failed\"}[%s])) > 0" $container $s $a.modelLoadFailures.window)
  "summary" "Model loads fail in pool {{ $labels.pool }}"
  "description" (printf "{{ $value | humanize }} model load(s) ended with {{ $labels.outcome }} in the last %s on {{ $labels.namespace }}/{{ $labels.pod }} container {{ $labels.container }} (pool {{ $labels.pool }}, bundle {{ $labels.bundle }})." $a.modelLoadFailures.window)) -}}
{{- $defs = append $defs (dict "key" "placementFailures" "alert" "SiePlacementFailed"
  "expr" (printf "sum by (%s) (increase(sie_placement_failures_total{%s}[%s])) > 0" $container $s $a.placementFailures.window)
  "summary" "Loads are refused for lack of free devices in pool {{ $labels.pool }}"
  "description" (printf "{{ $value | humanize }} load(s) in the last %s on {{ $labels.namespace }}/{{ $labels.pod }} container {{ $labels.container }} answered placement_failed: no block of devices could be freed, because pinned (or loading) models hold them." $a.placementFailures.window)) -}}
{{- $defs = append $defs (dict "key" "engineRestarts" "alert" "SieEngineRestarts"
  "expr" (printf "sum by (%s) (increase(sie_model_evictions_total{%s,reason=\"engine_exit\"}[%s])) > %v" $container $s $a.engineRestarts.window $a.engineRestarts.threshold)
  "summary" "Engines crash in pool {{ $labels.pool }}"
  "description" (printf "{{ $value | humanize }} engine(s) exited on their own in the last %s on {{ $labels.namespace }}/{{ $labels.pod }} container {{ $labels.container }}; their models turned failed and load again on the next request." $a.engineRestarts.window)) -}}
{{- $defs = append $defs (dict "key" "requestsQueueing" "alert" "SieRequestsQueueing"
  "expr" (printf "sum by (%s) (sie_router_queued_requests{%s}) > %v" $pod $s $a.requestsQueueing.threshold)
  "summary" "Requests queue at a pod of pool {{ $labels.pool }}"
  "description" "{{ $value }} request(s) wait at the router of {{ $labels.namespace }}/{{ $labels.pod }} (pool {{ $labels.pool }}, bundle {{ $labels.bundle }}) for a slot or for their model to load.") -}}
{{- if include "sie-workers.gatewayRendered" . -}}
{{- $half := divf (float64 .Values.gateway.holdSec) 2 -}}
{{- $defs = append $defs (dict "key" "gatewayHoldTooLong" "alert" "SieGatewayHoldTooLong"
  "expr" (printf "max by (namespace, release, pool, bundle) (sie_gateway_oldest_held_seconds{%s}) > %v" $s $half)
  "summary" "The gateway holds requests for pool {{ $labels.pool }} with no ready pod"
  "description" (printf "A request for pool {{ $labels.pool }}, bundle {{ $labels.bundle }} has waited {{ $value | humanizeDuration }} for a ready pod, more than half of the hold time (gateway.holdSec %v s); at the hold time it gets 503 provisioning." .Values.gateway.holdSec)) -}}
{{- end -}}
{{- $defs = append $defs (dict "key" "deviceMemoryNearBudget" "alert" "SieDeviceMemoryNearBudget"
  "expr" (printf "max by (%s, device) (sie_device_memory_reserved_bytes{%s} / sie_device_memory_total_bytes{%s}) > %v" $container $s $s $a.deviceMemoryNearBudget.threshold)
  "summary" "Device {{ $labels.device }} is near its memory budget"
  "description" "The models placed on {{ $labels.device }} of {{ $labels.namespace }}/{{ $labels.pod }} container {{ $labels.container }} reserve {{ $value | humanizePercentage }} of its memory; the next load there evicts a model.") -}}
{{- $defs = append $defs (dict "key" "engineRequestsWaiting" "alert" "SieEngineRequestsWaiting"
  "expr" (printf "max by (%s, model) (sglang:num_queue_reqs{%s} or vllm:num_requests_waiting{%s}) > %v" $container $s $s $a.engineRequestsWaiting.threshold)
  "summary" "Engine of {{ $labels.model }} is saturated"
  "description" "{{ $value }} request(s) wait in the queue of the engine serving {{ $labels.model }} on {{ $labels.namespace }}/{{ $labels.pod }} container {{ $labels.container }}.") -}}
{{- $defs = append $defs (dict "key" "engineKvCacheFull" "alert" "SieEngineKvCacheFull"
  "expr" (printf "max by (%s, model) (sglang:token_usage{%s} or vllm:kv_cache_usage_perc{%s}) > %v" $container $s $s $a.engineKvCacheFull.threshold)
  "summary" "KV cache of {{ $labels.model }} is nearly full"
  "description" "The engine serving {{ $labels.model }} on {{ $labels.namespace }}/{{ $labels.pod }} container {{ $labels.container }} uses {{ $value | humanizePercentage }} of its KV cache.") -}}
{{- $rules := list -}}
{{- range $defs -}}
{{- $cfg := index $a .key -}}
{{- if $cfg.enabled -}}
{{- $labels := merge (dict "severity" $cfg.severity) ($rule.additionalRuleLabels | default dict) -}}
{{- $annotations := merge (dict "summary" .summary "description" .description "runbook_url" (printf "%s#%s" $rule.runbookBaseUrl (lower .alert))) ($rule.additionalRuleAnnotations | default dict) -}}
{{- $rules = append $rules (dict "alert" .alert "expr" .expr "for" $cfg.for "labels" $labels "annotations" $annotations) -}}
{{- end -}}
{{- end -}}
{{- toYaml $rules -}}
{{- end -}}
