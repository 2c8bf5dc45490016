{{/*
Helpers of groups of nodes (docs/scheduling.md, "Groups of nodes on LeaderWorkerSet"): a pool
with gpu.nodes >= 2 runs each replica as a LeaderWorkerSet group of that many pods, one
worker per pod owning all its GPUs (gpu.deviceGroup), serving the pool's pinned models wider
than one node as one engine across the group. Only the leader (worker index 0) serves; the
Service, the gateway and an InferencePool select leaders only.
*/}}

{{/*
An API group/version the chart may use: the cluster serves it (.Capabilities.APIVersions: the
cluster's discovery on install, Helm's built-in set or --api-versions for helm template), or
assumeApiVersions lists it (helm lint / helm template without a cluster). "true" or empty.
Usage: {{ if include "sie-workers.apiServed" (dict "root" $ "api" "leaderworkerset.x-k8s.io/v1") }}
*/}}
{{- define "sie-workers.apiServed" -}}
{{- if or (.root.Capabilities.APIVersions.Has .api) (has .api (.root.Values.assumeApiVersions | default list)) -}}true{{- end -}}
{{- end -}}

{{/*
Nodes of one replica of a pool (an integer >= 1): the pool's gpu.nodes when set (not null),
else workers.common.gpu.nodes, else 1; always 1 on a CPU pool.
Usage: {{ include "sie-workers.gpuNodes" (dict "root" $ "pool" $pool) | int }}
*/}}
{{- define "sie-workers.gpuNodes" -}}
{{- if include "sie-workers.isCpuPool" .pool -}}1{{- else -}}
{{- $own := dig "gpu" "nodes" nil .pool -}}
{{- $nodes := ternary (dig "gpu" "nodes" 1 .root.Values.workers.common) $own (kindIs "invalid" $own) -}}
{{- int ($nodes | default 1) -}}
{{- end -}}
{{- end -}}

{{/*
"true" when a pool's replicas are groups of nodes (gpu.nodes >= 2): a LeaderWorkerSet
instead of a Deployment.
Usage: {{ if include "sie-workers.isGroup" (dict "root" $ "pool" $pool) }}
*/}}
{{- define "sie-workers.isGroup" -}}
{{- if ge (include "sie-workers.gpuNodes" . | int) 2 -}}true{{- end -}}
{{- end -}}

{{/*
A group setting of one pool (gpu.groupTopologyKey, gpu.ncclSocketIfname,
gpu.glooSocketIfname): the pool's own when set (not null), else workers.common.gpu's, else "".
Usage: {{ include "sie-workers.groupSetting" (dict "root" $ "pool" $pool "key" "groupTopologyKey") }}
*/}}
{{- define "sie-workers.groupSetting" -}}
{{- $own := dig "gpu" .key nil .pool -}}
{{- $value := ternary (dig "gpu" .key "" .root.Values.workers.common) $own (kindIs "invalid" $own) -}}
{{- $value | default "" | toString -}}
{{- end -}}

{{/*
Name of the LeaderWorkerSet of one pool x bundle: the workload's name with "-group". It must
differ from the pool's Service: the LWS controller creates a headless Service named after
the LeaderWorkerSet (its pods' subdomain, which LWS_LEADER_ADDRESS names) and would take an
existing Service of that name instead. At most 45 characters, so that the StatefulSets and
pods the controller names after it (`<name>-<group>-<worker>`) stay DNS labels.
Usage: {{ include "sie-workers.groupName" (dict "root" $ "pool" $poolName "bundle" $bundleName) }}
*/}}
{{- define "sie-workers.groupName" -}}
{{- $full := printf "%s-group" (include "sie-workers.workloadName" .) -}}
{{- if le (len $full) 45 -}}
{{- $full -}}
{{- else -}}
{{- printf "%s-%s" ($full | trunc 36 | trimSuffix "-") ($full | sha256sum | trunc 8) -}}
{{- end -}}
{{- end -}}

{{/*
Labels that select the serving pods of one pool x bundle (YAML): the workload's selector
labels, plus `leaderworkerset.sigs.k8s.io/worker-index: "0"` (leaders only) for a group. The
Service (so the gateway's EndpointSlices) and the InferencePool select these.
Usage: {{ include "sie-workers.servingSelectorLabels" (dict "root" $ "pool" $poolName "bundle" $bundleName) }}
*/}}
{{- define "sie-workers.servingSelectorLabels" -}}
{{ include "sie-workers.workloadSelectorLabels" . }}
{{- if include "sie-workers.isGroup" (dict "root" .root "pool" (index .root.Values.workers.pools .pool)) }}
leaderworkerset.sigs.k8s.io/worker-index: "0"
{{- end -}}
{{- end -}}

{{/*
The group models of one pool (JSON list of {id, index, width, port, model, profile}): its
pinnedModels whose shipped width is wider than one pod's gpu.count, each with its rendezvous
port (the declared nccl_port, else sie-workers.groupPortBase + its index in pinnedModels, as
every rank computes it from SIE_PINNED_MODELS).
Usage: {{ include "sie-workers.groupModels" (dict "root" $ "pool" $pool) | fromJsonArray }}
*/}}
{{- define "sie-workers.groupModels" -}}
{{- $out := list -}}
{{- $widths := include "sie-workers.modelWidths" .root | fromJsonArray -}}
{{- $base := include "sie-workers.groupPortBase" .root | int -}}
{{- $count := int .pool.gpu.count -}}
{{- range $i, $id := (.pool.pinnedModels | default list) -}}
{{- range $w := $widths -}}
{{- if and (eq $w.id (toString $id)) (gt (int $w.width) $count) -}}
{{- $port := ternary (add $base $i) $w.ncclPort (kindIs "invalid" $w.ncclPort) -}}
{{- $out = append $out (dict "id" $w.id "index" $i "width" $w.width "port" (int $port) "model" $w.model "profile" $w.profile) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $out | toJson -}}
{{- end -}}

{{/*
Environment of a group's worker container (YAML list; nothing for a single-node pool): the
LWS variables the LeaderWorkerSet pod webhook injects first in every container, mapped to the
worker's SIE_NODES / SIE_NODE_RANK / SIE_LEADER_ADDRESS, and the network interface NCCL and
Gloo bind (without it Gloo may bind 127.0.0.1 and the ranks never meet).
Usage: {{ include "sie-workers.groupEnv" (dict "root" $ "pool" $pool) | nindent 12 }}
*/}}
{{- define "sie-workers.groupEnv" -}}
{{- if include "sie-workers.isGroup" . -}}
- name: SIE_NODES
  value: $(LWS_GROUP_SIZE)
- name: SIE_NODE_RANK
  value: $(LWS_WORKER_INDEX)
- name: SIE_LEADER_ADDRESS
  value: $(LWS_LEADER_ADDRESS)
{{- with include "sie-workers.groupSetting" (dict "root" .root "pool" .pool "key" "ncclSocketIfname") }}
- name: NCCL_SOCKET_IFNAME
  value: {{ . | quote }}
{{- end }}
{{- with include "sie-workers.groupSetting" (dict "root" .root "pool" .pool "key" "glooSocketIfname") }}
- name: GLOO_SOCKET_IFNAME
  value: {{ . | quote }}
{{- end }}
{{- end -}}
{{- end -}}

{{/*
Rules on groups of nodes and InferencePools (JSON list of messages, each naming the key and
the fix): gpu.nodes >= 2 without gpu.deviceGroup, a pinned group model whose width is not
gpu.nodes x gpu.count, a group pool that pins no group model, a shipped model wider than
every pod that no group pins, and APIs the cluster does not serve.
Usage: {{ $errors = concat $errors (include "sie-workers.groupProblems" . | fromJsonArray) }}
*/}}
{{- define "sie-workers.groupProblems" -}}
{{- $errors := list -}}
{{- $apiHint := "helm template or helm lint without a cluster: --api-versions %s, or list it in assumeApiVersions" -}}
{{- range $poolName := (include "sie-workers.enabledPools" . | fromJsonArray) -}}
{{- $pool := index $.Values.workers.pools $poolName -}}
{{- $nodes := include "sie-workers.gpuNodes" (dict "root" $ "pool" $pool) | int -}}
{{- if ge $nodes 2 -}}
{{- $key := include "sie-workers.gpuSettingKey" (dict "poolName" $poolName "pool" $pool "key" "nodes") -}}
{{- $count := int $pool.gpu.count -}}
{{- if not $pool.gpu.deviceGroup -}}
{{- $errors = append $errors (printf "%s: %d nodes per replica need workers.pools.%s.gpu.deviceGroup: true (one worker owning the pod's %d GPUs runs each rank of the group's engine); set it, or set gpu.nodes to 1" $key $nodes $poolName $count) -}}
{{- end -}}
{{- if not (include "sie-workers.apiServed" (dict "root" $ "api" "leaderworkerset.x-k8s.io/v1")) -}}
{{- $errors = append $errors (printf "%s: %d nodes per replica render a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1), which this cluster does not serve; install LeaderWorkerSet (sigs.k8s.io/lws) first, or set gpu.nodes to 1 (%s)" $key $nodes (printf $apiHint "leaderworkerset.x-k8s.io/v1")) -}}
{{- end -}}
{{- $groupModels := include "sie-workers.groupModels" (dict "root" $ "pool" $pool) | fromJsonArray -}}
{{- range $m := $groupModels -}}
{{- if ne (int $m.width) (mul $nodes $count) -}}
{{- $errors = append $errors (printf "workers.pools.%s.pinnedModels[%d]: %q has width %d (models.%s.profiles.%s.adapter_options.loadtime tensor_parallel_size x pipeline_parallel_size), but a group of %s = %d nodes x gpu.count %d spans %d GPUs; a group model takes the whole group: change the width to %d, or gpu.nodes / gpu.count so that their product is %d" $poolName (int $m.index) $m.id (int $m.width) $m.model $m.profile $key $nodes $count (mul $nodes $count) (mul $nodes $count) (int $m.width)) -}}
{{- end -}}
{{- end -}}
{{- /* The interfaces the chart sets for the group's worker: not again in extraEnv. */ -}}
{{- range $setting := list (list "ncclSocketIfname" "NCCL_SOCKET_IFNAME") (list "glooSocketIfname" "GLOO_SOCKET_IFNAME") -}}
{{- if include "sie-workers.groupSetting" (dict "root" $ "pool" $pool "key" (index $setting 0)) -}}
{{- range $i, $env := ($.Values.workers.common.extraEnv | default list) -}}
{{- if eq (toString $env.name) (index $setting 1) -}}
{{- $errors = append $errors (printf "workers.common.extraEnv[%d].name: %s is set by the chart for the group pool %s from %s; set it there (empty leaves it unset) instead of in extraEnv" $i (index $setting 1) $poolName (include "sie-workers.gpuSettingKey" (dict "poolName" $poolName "pool" $pool "key" (index $setting 0)))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not $groupModels -}}
{{- $errors = append $errors (printf "%s: a group of %d nodes serves the pool's pinned models wider than one pod (gpu.count %d), and workers.pools.%s.pinnedModels pins none; pin a shipped model of width %d (tensor_parallel_size x pipeline_parallel_size), or set gpu.nodes to 1" $key $nodes $count $poolName (mul $nodes $count)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* InferencePool: its API, and an endpoint picker to name. */ -}}
{{- if .Values.inferencePool.enabled -}}
{{- if not (include "sie-workers.apiServed" (dict "root" $ "api" "inference.networking.k8s.io/v1")) -}}
{{- $errors = append $errors (printf "inferencePool.enabled: InferencePool (inference.networking.k8s.io/v1, the Gateway API Inference Extension) is not served by this cluster; install the extension's CRDs first, or set it to false (%s)" (printf $apiHint "inference.networking.k8s.io/v1")) -}}
{{- end -}}
{{- if not .Values.inferencePool.endpointPickerRef.name -}}
{{- $errors = append $errors "inferencePool.endpointPickerRef.name: empty; name the endpoint picker's Service (e.g. llm-d's router, the inference scheduler) that the InferencePool sends its gateway to" -}}
{{- end -}}
{{- end -}}
{{- $errors | uniq | toJson -}}
{{- end -}}

{{/*
kube-score annotations (YAML map, empty for a single-node pool) of an object that selects a
group's pods: kube-score reads Deployments and StatefulSets, not LeaderWorkerSets, so it finds
no pod for the selector. `check` is the kube-score check id.
Usage: {{ include "sie-workers.groupScoreIgnore" (dict "root" $ "pool" $pool "check" "service-targets-pod") }}
*/}}
{{- define "sie-workers.groupScoreIgnore" -}}
{{- if include "sie-workers.isGroup" . -}}
kube-score/ignore: {{ .check }}
sie-workers/kube-score-ignore-reason: {{ printf "%s: the pods come from a LeaderWorkerSet, which kube-score does not read" .check | quote }}
{{- end -}}
{{- end -}}
