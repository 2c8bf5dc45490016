{{/*
Helpers for where GPU pods land (docs/scheduling.md): the scheduler, node GPU counts
(`nvidia.com/gpu.count`, GPU feature discovery's label), and GPUs from Dynamic Resource
Allocation (`resource.k8s.io/v1`) instead of `nvidia.com/gpu` limits. The default
scheduler's scoring ignores `nvidia.com/gpu`, so without a preference a 3-GPU pod may take a
4-GPU node and strand the 4-GPU pool: GPU pools prefer nodes with exactly their GPUs.
Each setting is the pool's own, else workers.common's; CPU pools take none of the GPU ones.
*/}}

{{/*
Scheduler of one pool's pods: workers.pools.<pool>.schedulerName, else
workers.common.schedulerName; empty for the cluster's default scheduler.
Usage: {{ include "sie-workers.schedulerName" (dict "root" $ "pool" $pool) }}
*/}}
{{- define "sie-workers.schedulerName" -}}
{{- .pool.schedulerName | default .root.Values.workers.common.schedulerName | default "" -}}
{{- end -}}

{{/*
The values key a pool's GPU scheduling setting comes from: workers.pools.<pool>.gpu.<key>
when the pool sets it (not null), else workers.common.gpu.<key>. `dra` names a key of
gpu.dra (e.g. "matchAttribute").
Usage: {{ include "sie-workers.gpuSettingKey" (dict "poolName" $poolName "pool" $pool "key" "nodeGpuCounts") }}
       {{ include "sie-workers.gpuSettingKey" (dict "poolName" $poolName "pool" $pool "dra" "enabled") }}
*/}}
{{- define "sie-workers.gpuSettingKey" -}}
{{- if .dra -}}
{{- $own := dig "gpu" "dra" .dra nil .pool -}}
{{- ternary (printf "workers.pools.%s.gpu.dra.%s" .poolName .dra) (printf "workers.common.gpu.dra.%s" .dra) (not (kindIs "invalid" $own)) -}}
{{- else -}}
{{- $own := dig "gpu" .key nil .pool -}}
{{- ternary (printf "workers.pools.%s.gpu.%s" .poolName .key) (printf "workers.common.gpu.%s" .key) (not (kindIs "invalid" $own)) -}}
{{- end -}}
{{- end -}}

{{/*
Node GPU counts a pool's pods may land on (JSON list of integers, as listed): the pool's
gpu.nodeGpuCounts when set (not null), else workers.common.gpu.nodeGpuCounts; `[]` for
none (then GPU pools prefer nodes whose count equals gpu.count), and always `[]` on a CPU pool.
Usage: {{ include "sie-workers.nodeGpuCounts" (dict "root" $ "pool" $pool) | fromJsonArray }}
*/}}
{{- define "sie-workers.nodeGpuCounts" -}}
{{- $counts := list -}}
{{- if not (include "sie-workers.isCpuPool" .pool) -}}
{{- $own := dig "gpu" "nodeGpuCounts" nil .pool -}}
{{- $raw := ternary (dig "gpu" "nodeGpuCounts" list .root.Values.workers.common) $own (kindIs "invalid" $own) -}}
{{- range $n := ($raw | default list) -}}
{{- $counts = append $counts (int $n) -}}
{{- end -}}
{{- end -}}
{{- $counts | toJson -}}
{{- end -}}

{{/*
Dynamic Resource Allocation settings of one pool (JSON {enabled, deviceClassName, selectors,
matchAttribute}): workers.common.gpu.dra with the pool's own gpu.dra keys over it; enabled
is always false on a CPU pool.
Usage: {{ $dra := include "sie-workers.dra" (dict "root" $ "pool" $pool) | fromJson }}
*/}}
{{- define "sie-workers.dra" -}}
{{- $dra := dict "enabled" false "deviceClassName" "gpu.nvidia.com" "selectors" list "matchAttribute" "" -}}
{{- /* Key by key, by hand: a merge would not let a pool's false or [] replace a default. */ -}}
{{- range $layer := list (dig "gpu" "dra" dict .root.Values.workers.common) (dig "gpu" "dra" dict .pool) -}}
{{- range $k, $v := $layer -}}
{{- if not (kindIs "invalid" $v) -}}{{- $_ := set $dra $k $v -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if include "sie-workers.isCpuPool" .pool -}}
{{- $_ := set $dra "enabled" false -}}
{{- end -}}
{{- $dra | toJson -}}
{{- end -}}

{{/*
The one place that decides a pod's GPUs (JSON): where they come from ("none" on a CPU pool,
"claims" with gpu.dra.enabled, else "limits": `nvidia.com/gpu` in each worker container's
requests and limits), worker containers ("workers", the router's SIE_GPU_COUNT), GPUs of each
("perWorker", SIE_DEVICES cuda:0..) and of the pod ("total"), and with claims the claim's
requests: one `gpus` of every GPU for a device group, `gpu-0` .. `gpu-N-1` (one per worker
container, in order) otherwise. Counts, SIE_DEVICES, shm and resources are the same either way.
Usage: {{ $gpus := include "sie-workers.podGpus" (dict "root" $ "pool" $pool) | fromJson }}
*/}}
{{- define "sie-workers.podGpus" -}}
{{- $workers := include "sie-workers.slotCount" .pool | int -}}
{{- $perWorker := include "sie-workers.slotWidth" .pool | int -}}
{{- $source := "limits" -}}
{{- $requests := list -}}
{{- if include "sie-workers.isCpuPool" .pool -}}
{{- $source = "none" -}}
{{- $perWorker = 0 -}}
{{- else if (include "sie-workers.dra" . | fromJson).enabled -}}
{{- $source = "claims" -}}
{{- if .pool.gpu.deviceGroup -}}
{{- $requests = list "gpus" -}}
{{- else -}}
{{- range $i := until $workers -}}
{{- $requests = append $requests (printf "gpu-%d" $i) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- dict "source" $source "workers" $workers "perWorker" $perWorker "total" (mul $workers $perWorker) "claim" "gpus" "requests" $requests | toJson -}}
{{- end -}}

{{/*
The `claims` of worker container i (YAML list) when the pod's GPUs come from a claim, else
nothing: the pod's claim `gpus`, narrowed to the container's own request.
Usage: {{ include "sie-workers.workerClaims" (dict "gpus" $gpus "index" $i) }}
*/}}
{{- define "sie-workers.workerClaims" -}}
{{- if eq .gpus.source "claims" -}}
{{- $request := index .gpus.requests 0 -}}
{{- if gt (len .gpus.requests) 1 -}}{{- $request = index .gpus.requests (int .index) -}}{{- end -}}
{{- list (dict "name" .gpus.claim "request" $request) | toYaml -}}
{{- end -}}
{{- end -}}

{{/*
Spec of the ResourceClaimTemplate of one pool x bundle (YAML): one request per entry of
podGpus' requests, each of the pool's DeviceClass, selectors and count, and a matchAttribute
constraint over all of them when set. The generated claims carry the workload's selector
labels (stable across chart versions: a template's spec is immutable).
Usage: {{ include "sie-workers.resourceClaimTemplateSpec" (dict "root" $ "pool" $poolName "bundle" $bundleName) }}
*/}}
{{- define "sie-workers.resourceClaimTemplateSpec" -}}
{{- $pool := index .root.Values.workers.pools .pool -}}
{{- $gpus := include "sie-workers.podGpus" (dict "root" .root "pool" $pool) | fromJson -}}
{{- $dra := include "sie-workers.dra" (dict "root" .root "pool" $pool) | fromJson -}}
{{- $perRequest := ternary (int $gpus.total) 1 (eq (len $gpus.requests) 1) -}}
{{- $requests := list -}}
{{- range $name := $gpus.requests -}}
{{- $exactly := dict "deviceClassName" $dra.deviceClassName "allocationMode" "ExactCount" "count" $perRequest -}}
{{- with $dra.selectors -}}
{{- $selectors := list -}}
{{- range $expression := . -}}
{{- $selectors = append $selectors (dict "cel" (dict "expression" $expression)) -}}
{{- end -}}
{{- $_ := set $exactly "selectors" $selectors -}}
{{- end -}}
{{- $requests = append $requests (dict "name" $name "exactly" $exactly) -}}
{{- end -}}
{{- $devices := dict "requests" $requests -}}
{{- with $dra.matchAttribute -}}
{{- $_ := set $devices "constraints" (list (dict "matchAttribute" .)) -}}
{{- end -}}
{{- $labels := include "sie-workers.workloadSelectorLabels" . | fromYaml -}}
{{- dict "metadata" (dict "labels" $labels) "spec" (dict "devices" $devices) | toYaml -}}
{{- end -}}

{{/*
Name of the ResourceClaimTemplate of one pool x bundle: the workload's name and a hash of
the template's spec. The API server refuses changes to a template's spec, so a change makes
a new template (the pods roll onto it) and Helm deletes the old one.
Usage: {{ include "sie-workers.resourceClaimTemplateName" (dict "root" $ "pool" $poolName "bundle" $bundleName) }}
*/}}
{{- define "sie-workers.resourceClaimTemplateName" -}}
{{- printf "%s-%s" (include "sie-workers.workloadName" .) (include "sie-workers.resourceClaimTemplateSpec" . | sha256sum | trunc 8) -}}
{{- end -}}

{{/*
The node affinity of one pool's pods (YAML): the pool's own nodeAffinity (`affinity` passed
in) plus, on GPU pools, `nvidia.com/gpu.count In` the node GPU counts as a requirement
(added to every nodeSelectorTerm, which are ORed) or, without them, a preferred term of
weight 100 for nodes whose count equals gpu.count.
Usage: {{ include "sie-workers.gpuNodeAffinity" (dict "root" $ "pool" $pool "affinity" $nodeAffinity) | fromYaml }}
*/}}
{{- define "sie-workers.gpuNodeAffinity" -}}
{{- $affinity := deepCopy (.affinity | default dict) -}}
{{- if not (include "sie-workers.isCpuPool" .pool) -}}
{{- $counts := include "sie-workers.nodeGpuCounts" . | fromJsonArray -}}
{{- if $counts -}}
{{- $values := list -}}
{{- range $n := $counts -}}{{- $values = append $values (printf "%d" (int $n)) -}}{{- end -}}
{{- $expression := dict "key" "nvidia.com/gpu.count" "operator" "In" "values" $values -}}
{{- $required := get $affinity "requiredDuringSchedulingIgnoredDuringExecution" | default dict -}}
{{- $terms := list -}}
{{- range $term := ($required.nodeSelectorTerms | default list) -}}
{{- $terms = append $terms (set $term "matchExpressions" (append ($term.matchExpressions | default list) $expression)) -}}
{{- end -}}
{{- if not $terms -}}{{- $terms = list (dict "matchExpressions" (list $expression)) -}}{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $terms -}}
{{- $_ := set $affinity "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- else -}}
{{- $exact := dict "weight" 100 "preference" (dict "matchExpressions" (list (dict "key" "nvidia.com/gpu.count" "operator" "In" "values" (list (printf "%d" (int .pool.gpu.count)))))) -}}
{{- $preferred := get $affinity "preferredDuringSchedulingIgnoredDuringExecution" | default list -}}
{{- $_ := set $affinity "preferredDuringSchedulingIgnoredDuringExecution" (append $preferred $exact) -}}
{{- end -}}
{{- end -}}
{{- if $affinity -}}{{- toYaml $affinity -}}{{- end -}}
{{- end -}}

{{/*
A device attribute's problem (empty when it is a fully qualified name, `<domain>/<name>`:
a DNS subdomain of at most 63 characters and a C identifier of at most 32, as the API
server requires of matchAttribute).
Usage: {{ include "sie-workers.attributeProblem" (dict "key" $key "value" $attribute) }}
*/}}
{{- define "sie-workers.attributeProblem" -}}
{{- $value := toString .value -}}
{{- $parts := splitList "/" $value -}}
{{- $standard := list "pcieRoot" "pciBusID" -}}
{{- if eq (len $parts) 1 -}}
{{- $suggest := ternary (printf "resource.kubernetes.io/%s" $value) (printf "gpu.nvidia.com/%s (NVIDIA's DRA driver) or <driver domain>/%s" $value $value) (has $value $standard) -}}
{{- printf "%s: %q has no domain; device attributes are named <domain>/<name>: write %s" .key $value $suggest -}}
{{- else if or (ne (len $parts) 2) (gt (len (index $parts 0)) 63) (gt (len (index $parts 1)) 32) (not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" (index $parts 0))) (not (regexMatch "^[A-Za-z_][A-Za-z0-9_]*$" (index $parts 1))) -}}
{{- printf "%s: %q is not a device attribute name <domain>/<name> (a DNS subdomain of at most 63 characters, then a C identifier of at most 32), e.g. resource.kubernetes.io/pcieRoot" .key $value -}}
{{- end -}}
{{- end -}}

{{/*
Rules on the scheduling values (JSON list of messages, each naming the key and the fix):
node GPU counts below a pool's gpu.count, DRA on a cluster without `resource.k8s.io/v1`
(.Capabilities.APIVersions: the cluster's discovery on install, Helm's built-in set or
--api-versions for helm template), and matchAttribute names without a domain.
Usage: {{ $errors = concat $errors (include "sie-workers.schedulingProblems" . | fromJsonArray) }}
*/}}
{{- define "sie-workers.schedulingProblems" -}}
{{- $errors := list -}}
{{- range $poolName := (include "sie-workers.enabledPools" . | fromJsonArray) -}}
{{- $pool := index $.Values.workers.pools $poolName -}}
{{- if not (include "sie-workers.isCpuPool" $pool) -}}
{{- $count := int $pool.gpu.count -}}
{{- $key := include "sie-workers.gpuSettingKey" (dict "poolName" $poolName "pool" $pool "key" "nodeGpuCounts") -}}
{{- range $i, $n := (include "sie-workers.nodeGpuCounts" (dict "root" $ "pool" $pool) | fromJsonArray) -}}
{{- if lt (int $n) $count -}}
{{- $fix := ternary (printf "; list node GPU counts of at least %d, or give the pool its own gpu.nodeGpuCounts" $count) (printf "; list node GPU counts of at least %d, or lower gpu.count" $count) (hasPrefix "workers.common." $key) -}}
{{- $errors = append $errors (printf "%s[%d]: %d is below workers.pools.%s.gpu.count (%d): a node with %d GPUs can never hold the pool's pods%s" $key $i (int $n) $poolName $count (int $n) $fix) -}}
{{- end -}}
{{- end -}}
{{- $dra := include "sie-workers.dra" (dict "root" $ "pool" $pool) | fromJson -}}
{{- if $dra.enabled -}}
{{- if not ($.Capabilities.APIVersions.Has "resource.k8s.io/v1") -}}
{{- $errors = append $errors (printf "%s: GPUs from Dynamic Resource Allocation need the resource.k8s.io/v1 API (Kubernetes 1.34 or later), which this cluster does not serve; upgrade the cluster, or set it to false to request nvidia.com/gpu limits (helm template without a cluster: --api-versions resource.k8s.io/v1)" (include "sie-workers.gpuSettingKey" (dict "poolName" $poolName "pool" $pool "dra" "enabled"))) -}}
{{- end -}}
{{- with $dra.matchAttribute -}}
{{- with include "sie-workers.attributeProblem" (dict "key" (include "sie-workers.gpuSettingKey" (dict "poolName" $poolName "pool" $pool "dra" "matchAttribute")) "value" .) -}}
{{- $errors = append $errors . -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $errors | uniq | toJson -}}
{{- end -}}
