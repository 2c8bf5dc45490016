{{/*
Helpers of the sie-workers chart. Each returns a string (YAML or JSON where noted); the
arithmetic that is easy to get wrong by hand (GPUs, devices, ports, shm, resources,
probe budgets) lives here so templates only place the results.
*/}}

{{/*
Chart name, overridable.
Usage: {{ include "sie-workers.name" . }}
*/}}
{{- define "sie-workers.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Release-wide name prefix of every resource.
Usage: {{ include "sie-workers.fullname" . }}
*/}}
{{- define "sie-workers.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Chart name and version for the helm.sh/chart label.
Usage: {{ include "sie-workers.chart" . }}
*/}}
{{- define "sie-workers.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Labels of every resource of the release.
Usage: {{ include "sie-workers.labels" . }}
*/}}
{{- define "sie-workers.labels" -}}
helm.sh/chart: {{ include "sie-workers.chart" . }}
{{ include "sie-workers.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sie-workers
{{- end -}}

{{/*
Selector labels shared by every resource of the release.
Usage: {{ include "sie-workers.selectorLabels" . }}
*/}}
{{- define "sie-workers.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sie-workers.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
Name of one pool x bundle workload (Deployment, Service, PDB, ...). Names longer than 63
characters are cut and made unique with a hash of the full name.
Usage: {{ include "sie-workers.workloadName" (dict "root" $ "pool" $poolName "bundle" $bundleName) }}
*/}}
{{- define "sie-workers.workloadName" -}}
{{- $full := printf "%s-%s-%s" (include "sie-workers.fullname" .root) .pool .bundle -}}
{{- if le (len $full) 63 -}}
{{- $full -}}
{{- else -}}
{{- printf "%s-%s" ($full | trunc 54 | trimSuffix "-") ($full | sha256sum | trunc 8) -}}
{{- end -}}
{{- end -}}

{{/*
Selector labels of one pool x bundle workload.
Usage: {{ include "sie-workers.workloadSelectorLabels" (dict "root" $ "pool" $poolName "bundle" $bundleName) }}
*/}}
{{- define "sie-workers.workloadSelectorLabels" -}}
{{ include "sie-workers.selectorLabels" .root }}
app.kubernetes.io/component: worker
sie-workers/pool: {{ .pool }}
sie-workers/bundle: {{ .bundle }}
{{- end -}}

{{/*
Full labels of one pool x bundle workload: release labels, pool, bundle and the pool's
identity (gpuType, machineProfile), which are labels, never node constraints.
Usage: {{ include "sie-workers.workloadLabels" (dict "root" $ "pool" $poolName "bundle" $bundleName) }}
*/}}
{{- define "sie-workers.workloadLabels" -}}
{{- $pool := index .root.Values.workers.pools .pool -}}
{{ include "sie-workers.labels" .root }}
app.kubernetes.io/component: worker
sie-workers/pool: {{ .pool }}
sie-workers/bundle: {{ .bundle }}
sie-workers/gpu-type: {{ $pool.gpuType | quote }}
sie-workers/machine-profile: {{ $pool.machineProfile | quote }}
{{- end -}}

{{/*
Affinity of one pool x bundle's pods (YAML): the pool's own affinity, with the GPU node
affinity of sie-workers.gpuNodeAffinity (_helpers-scheduling.tpl) merged into its
nodeAffinity, plus a preferred anti-affinity that spreads the workload's replicas over nodes
unless the pool sets its own podAntiAffinity.
Usage: {{ include "sie-workers.affinity" (dict "root" $ "pool" $poolName "bundle" $bundleName) | nindent 8 }}
*/}}
{{- define "sie-workers.affinity" -}}
{{- $pool := index .root.Values.workers.pools .pool -}}
{{- $affinity := deepCopy ($pool.affinity | default dict) -}}
{{- $nodeAffinity := include "sie-workers.gpuNodeAffinity" (dict "root" .root "pool" $pool "affinity" $affinity.nodeAffinity) | fromYaml -}}
{{- if $nodeAffinity -}}
{{- $_ := set $affinity "nodeAffinity" $nodeAffinity -}}
{{- end -}}
{{- if not (hasKey $affinity "podAntiAffinity") -}}
{{- $term := dict "labelSelector" (dict "matchLabels" (include "sie-workers.workloadSelectorLabels" . | fromYaml)) "topologyKey" "kubernetes.io/hostname" -}}
{{- $_ := set $affinity "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term))) -}}
{{- end -}}
{{- toYaml $affinity -}}
{{- end -}}

{{/*
Name of the ServiceAccount of the worker pods.
Usage: {{ include "sie-workers.serviceAccountName" . }}
*/}}
{{- define "sie-workers.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sie-workers.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
Name of the ConfigMap holding the shipped model configs.
Usage: {{ include "sie-workers.modelsConfigMapName" . }}
*/}}
{{- define "sie-workers.modelsConfigMapName" -}}
{{- printf "%s-models" (include "sie-workers.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Checksum of the shipped model configs; on the pod template it rolls pods when they change.
Usage: {{ include "sie-workers.modelsChecksum" . }}
*/}}
{{- define "sie-workers.modelsChecksum" -}}
{{- toYaml (.Values.models | default dict) | sha256sum -}}
{{- end -}}

{{/*
Pool names, sorted, of the enabled pools (JSON list).
Usage: {{ include "sie-workers.enabledPools" . | fromJsonArray }}
*/}}
{{- define "sie-workers.enabledPools" -}}
{{- $names := list -}}
{{- range $name, $pool := .Values.workers.pools -}}
{{- if and $pool $pool.enabled -}}
{{- $names = append $names $name -}}
{{- end -}}
{{- end -}}
{{- $names | sortAlpha | toJson -}}
{{- end -}}

{{/*
"true" when the pool runs on CPUs (gpuType: cpu): no GPU requests, SIE_DEVICES=cpu.
Usage: {{ include "sie-workers.isCpuPool" $pool }}
*/}}
{{- define "sie-workers.isCpuPool" -}}
{{- if eq (toString .gpuType) "cpu" -}}true{{- end -}}
{{- end -}}

{{/*
"true" when the bundle runs an engine that splits a model across GPUs (SGLang or vLLM); like
the worker, every bundle but `default` does.
Usage: {{ include "sie-workers.isTensorParallelBundle" $bundleName }}
*/}}
{{- define "sie-workers.isTensorParallelBundle" -}}
{{- if ne . "default" -}}true{{- end -}}
{{- end -}}

{{/*
"vllm" when the bundle runs vLLM, else "sglang": the engine whose parser reads the shipped
models' extra_launch_args when their profile names no adapter (the worker's rule).
Usage: {{ include "sie-workers.bundleEngine" $bundleName }}
*/}}
{{- define "sie-workers.bundleEngine" -}}
{{- if eq . "vllm" -}}vllm{{- else -}}sglang{{- end -}}
{{- end -}}

{{/*
Worker containers (serving slots) in one pod: gpu.count, or 1 with a device group.
Usage: {{ include "sie-workers.slotCount" $pool }}
*/}}
{{- define "sie-workers.slotCount" -}}
{{- if .gpu.deviceGroup -}}1{{- else -}}{{ int .gpu.count }}{{- end -}}
{{- end -}}

{{/*
GPUs of one worker container (its slot width): gpu.count with a device group, else 1.
Usage: {{ include "sie-workers.slotWidth" $pool }}
*/}}
{{- define "sie-workers.slotWidth" -}}
{{- if .gpu.deviceGroup -}}{{ int .gpu.count }}{{- else -}}1{{- end -}}
{{- end -}}

{{/*
SIE_DEVICES of one worker container: cuda:0,...,cuda:N-1 for N GPUs, `cpu` on a CPU pool.
Usage: {{ include "sie-workers.devices" $pool }}
*/}}
{{- define "sie-workers.devices" -}}
{{- if include "sie-workers.isCpuPool" . -}}
cpu
{{- else -}}
{{- $devices := list -}}
{{- range $i := until (include "sie-workers.slotWidth" . | int) -}}
{{- $devices = append $devices (printf "cuda:%d" $i) -}}
{{- end -}}
{{- join "," $devices -}}
{{- end -}}
{{- end -}}

{{/*
Port of worker container i: workers.common.port + 1 + i.
Usage: {{ include "sie-workers.workerPort" (dict "root" $ "index" $i) }}
*/}}
{{- define "sie-workers.workerPort" -}}
{{- add (int .root.Values.workers.common.port) 1 .index -}}
{{- end -}}

{{/*
SIE_WORKER_PORTS of the router: the pod's worker ports, one per slot, comma separated.
Usage: {{ include "sie-workers.workerPorts" (dict "root" $ "pool" $pool) }}
*/}}
{{- define "sie-workers.workerPorts" -}}
{{- $root := .root -}}
{{- $ports := list -}}
{{- range $i := until (include "sie-workers.slotCount" .pool | int) -}}
{{- $ports = append $ports (include "sie-workers.workerPort" (dict "root" $root "index" $i)) -}}
{{- end -}}
{{- join "," $ports -}}
{{- end -}}

{{/*
/dev/shm size limit of a pool: its shmSize, else workers.common.shmSize.
Usage: {{ include "sie-workers.shmSize" (dict "root" $ "pool" $pool) }}
*/}}
{{- define "sie-workers.shmSize" -}}
{{- include "sie-workers.quantityString" (.pool.shmSize | default .root.Values.workers.common.shmSize) -}}
{{- end -}}

{{/*
A quantity from values as a string (numbers come in as integers or floats).
Usage: {{ include "sie-workers.quantityString" $quantity }}
*/}}
{{- define "sie-workers.quantityString" -}}
{{- if kindIs "string" . -}}
{{- . -}}
{{- else if kindIs "float64" . -}}
{{- if eq (float64 (int64 .)) . -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/*
A quantity multiplied by an integer, exactly (decimal digits kept, no float rounding):
"1.5Gi" x 3 -> "4.5Gi", "500m" x 4 -> "2000m", "4" x 4 -> "16".
Usage: {{ include "sie-workers.multiplyQuantity" (dict "quantity" "16Gi" "times" 4) }}
*/}}
{{- define "sie-workers.multiplyQuantity" -}}
{{- $q := include "sie-workers.quantityString" .quantity -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" $q -}}
{{- $suffix := trimPrefix $number $q -}}
{{- $parts := splitList "." $number -}}
{{- $frac := "" -}}
{{- if gt (len $parts) 1 -}}{{- $frac = index $parts 1 -}}{{- end -}}
{{- $digits := printf "%d" (mul (atoi (printf "%s%s" (index $parts 0) $frac)) (int .times)) -}}
{{- $d := len $frac -}}
{{- if gt $d 0 -}}
{{- if le (len $digits) $d -}}
{{- $digits = printf "%s%s" (repeat (int (sub (add1 $d) (len $digits))) "0") $digits -}}
{{- end -}}
{{- $cut := int (sub (len $digits) $d) -}}
{{- $digits = printf "%s.%s" (substr 0 $cut $digits) (substr $cut (len $digits) $digits) -}}
{{- $digits = regexReplaceAll "\\.?0+$" $digits "" -}}
{{- end -}}
{{- printf "%s%s" $digits $suffix -}}
{{- end -}}

{{/*
A quantity in base units (bytes for memory, cores for CPU) as a float, for comparisons.
Usage: {{ include "sie-workers.quantityValue" "32Gi" | float64 }}
*/}}
{{- define "sie-workers.quantityValue" -}}
{{- $q := include "sie-workers.quantityString" . -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" $q -}}
{{- $suffix := trimPrefix $number $q -}}
{{- $factors := dict "" 1.0 "m" 0.001 "k" 1000.0 "M" 1000000.0 "G" 1000000000.0 "T" 1000000000000.0 "P" 1000000000000000.0 "E" 1000000000000000000.0 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- mulf (float64 $number) (get $factors $suffix) -}}
{{- end -}}

{{/*
Resources of one worker container (YAML): the pool's own resources if it sets any, else
workers.common.resources (per GPU) times the container's GPUs; ephemeral-storage from
workers.common when the pool's own resources lack it; plus nvidia.com/gpu in requests and
limits when the pod's GPUs come from limits (sie-workers.podGpus), and with "index" the
container's DRA `claims` when they come from a claim. The rest is the same either way.
Usage: {{ include "sie-workers.workerResources" (dict "root" $ "pool" $pool "index" $i) | nindent 12 }}
*/}}
{{- define "sie-workers.workerResources" -}}
{{- $gpus := include "sie-workers.podGpus" . | fromJson -}}
{{- $width := include "sie-workers.slotWidth" .pool | int -}}
{{- $gpu := eq $gpus.source "limits" -}}
{{- $out := dict -}}
{{- $poolResources := .pool.resources | default dict -}}
{{- range $kind := list "requests" "limits" -}}
{{- $section := dict -}}
{{- if $poolResources -}}
{{- range $name, $q := (get $poolResources $kind | default dict) -}}
{{- $_ := set $section $name (include "sie-workers.quantityString" $q) -}}
{{- end -}}
{{- /* The chart's emptyDirs count against ephemeral storage: keep it when the pool sets none. */ -}}
{{- $ephemeral := get (get $.root.Values.workers.common.resources $kind | default dict) "ephemeral-storage" -}}
{{- if and $ephemeral (not (hasKey $section "ephemeral-storage")) -}}
{{- $_ := set $section "ephemeral-storage" (include "sie-workers.multiplyQuantity" (dict "quantity" $ephemeral "times" $width)) -}}
{{- end -}}
{{- else -}}
{{- range $name, $q := (get $.root.Values.workers.common.resources $kind | default dict) -}}
{{- $_ := set $section $name (include "sie-workers.multiplyQuantity" (dict "quantity" $q "times" $width)) -}}
{{- end -}}
{{- end -}}
{{- if $gpu -}}
{{- $_ := set $section "nvidia.com/gpu" $width -}}
{{- end -}}
{{- if $section -}}
{{- $_ := set $out $kind $section -}}
{{- end -}}
{{- end -}}
{{- if and (eq $gpus.source "claims") (hasKey . "index") -}}
{{- $_ := set $out "claims" (include "sie-workers.workerClaims" (dict "gpus" $gpus "index" .index) | fromYamlArray) -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
Image reference of a bundle: repository:tag[suffix], or repository@digest.
Usage: {{ include "sie-workers.image" (dict "root" $ "bundle" $bundleName) }}
*/}}
{{- define "sie-workers.image" -}}
{{- $image := .root.Values.workers.common.image -}}
{{- $bundle := index .root.Values.workers.bundles .bundle | default dict -}}
{{- $repository := $bundle.repository | default $image.repository -}}
{{- if $bundle.digest -}}
{{- printf "%s@%s" $repository $bundle.digest -}}
{{- else if $bundle.tag -}}
{{- printf "%s:%s" $repository (toString $bundle.tag) -}}
{{- else -}}
{{- printf "%s:%s%s" $repository (toString ($image.tag | default .root.Chart.AppVersion)) ($bundle.tagSuffix | default "") -}}
{{- end -}}
{{- end -}}

{{/*
SIE_API_KEY from the existing Secret named by workers.common.apiKey (env list item), or
nothing when no Secret is named.
Usage: {{ include "sie-workers.apiKeyEnv" . | nindent 12 }}
*/}}
{{- define "sie-workers.apiKeyEnv" -}}
{{- with .Values.workers.common.apiKey -}}
{{- if .secretName -}}
- name: SIE_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .key }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Liveness budget of a worker container in seconds: failureThreshold x periodSeconds.
Usage: {{ include "sie-workers.livenessBudgetSeconds" . }}
*/}}
{{- define "sie-workers.livenessBudgetSeconds" -}}
{{- $probe := .Values.workers.common.probes.liveness -}}
{{- mul (int $probe.failureThreshold) (int $probe.periodSeconds) -}}
{{- end -}}

{{/*
terminationGracePeriodSeconds of worker pods: preStop sleep + stream drain + engine stop
grace + 10 s of slack for the process to exit.
Usage: {{ include "sie-workers.terminationGracePeriodSeconds" . }}
*/}}
{{- define "sie-workers.terminationGracePeriodSeconds" -}}
{{- $t := .Values.workers.common.termination -}}
{{- add (int $t.preStopSleepSec) (int $t.drainTimeoutSec) (int $t.engineStopGraceSec) 10 -}}
{{- end -}}

{{/*
KEDA cooldown (seconds before scaling to zero): autoscaling.cooldownPeriod, else
workers.common.modelReadyTimeoutSec, so a pool never scales to zero inside a model load.
Usage: {{ include "sie-workers.autoscalingCooldown" . }}
*/}}
{{- define "sie-workers.autoscalingCooldown" -}}
{{- if kindIs "invalid" .Values.autoscaling.cooldownPeriod -}}
{{- int .Values.workers.common.modelReadyTimeoutSec -}}
{{- else -}}
{{- int .Values.autoscaling.cooldownPeriod -}}
{{- end -}}
{{- end -}}

{{/*
A trigger query with $namespace, $release, $pool, $bundle and $workload filled in.
Usage: {{ include "sie-workers.promQuery" (dict "query" $q "namespace" $ns "release" $r "pool" $p "bundle" $b "workload" $w) }}
*/}}
{{- define "sie-workers.promQuery" -}}
{{- .query | replace "$namespace" .namespace | replace "$release" .release | replace "$workload" .workload | replace "$pool" .pool | replace "$bundle" .bundle -}}
{{- end -}}

{{/*
A model profile's adapter_options.loadtime as JSON, `{}` when absent or not a map.
Usage: {{ include "sie-workers.profileLoadtime" $profile | fromJson }}
*/}}
{{- define "sie-workers.profileLoadtime" -}}
{{- if and (kindIs "map" .) (kindIs "map" .adapter_options) (kindIs "map" .adapter_options.loadtime) -}}
{{- .adapter_options.loadtime | toJson -}}
{{- else -}}
{}
{{- end -}}
{{- end -}}

{{/*
Widths declared by the shipped models (JSON list of {model, profile, id, width, ncclPort}):
every profile whose adapter_options.loadtime declares tensor_parallel_size or
pipeline_parallel_size (numbers 1..8, each 1 when absent), its width from the worker's own
table (sie-workers.modelWidthTable: tensor x stages); `id` is the served id (sie_id, or
sie_id:profile), `ncclPort` the declared nccl_port or null.
Usage: {{ include "sie-workers.modelWidths" . | fromJsonArray }}
*/}}
{{- define "sie-workers.modelWidths" -}}
{{- $out := list -}}
{{- $table := include "sie-workers.modelWidthTable" . | fromJson -}}
{{- range $file, $model := (.Values.models | default dict) -}}
{{- if kindIs "map" $model -}}
{{- range $profileName, $profile := ($model.profiles | default dict) -}}
{{- $loadtime := include "sie-workers.profileLoadtime" $profile | fromJson -}}
{{- $factors := list -}}
{{- $declared := false -}}
{{- range $option := list "tensor_parallel_size" "pipeline_parallel_size" -}}
{{- $v := get $loadtime $option -}}
{{- if or (kindIs "float64" $v) (kindIs "int" $v) (kindIs "int64" $v) -}}
{{- $declared = true -}}
{{- $factors = append $factors (printf "%v" $v) -}}
{{- else -}}
{{- $factors = append $factors "1" -}}
{{- end -}}
{{- end -}}
{{- $width := get $table (join "x" $factors) -}}
{{- if and $declared (not (kindIs "invalid" $width)) (ne (toString $width) "") -}}
{{- $id := ternary (toString $model.sie_id) (printf "%s:%s" (toString $model.sie_id) $profileName) (eq $profileName "default") -}}
{{- $port := get $loadtime "nccl_port" -}}
{{- $nccl := ternary (int $port) nil (or (kindIs "float64" $port) (kindIs "int" $port) (kindIs "int64" $port)) -}}
{{- $out = append $out (dict "model" $file "profile" $profileName "id" $id "width" (int $width) "ncclPort" $nccl) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $out | toJson -}}
{{- end -}}

{{/*
The widest serving slot (GPUs of one worker) among enabled pools running an SGLang or vLLM bundle,
and those pools (JSON {"width": int, "pools": ["pool/bundle", ...]}).
Usage: {{ include "sie-workers.widestTensorParallelSlot" . | fromJson }}
*/}}
{{- define "sie-workers.widestTensorParallelSlot" -}}
{{- $width := 0 -}}
{{- $pools := list -}}
{{- range $poolName := (include "sie-workers.enabledPools" . | fromJsonArray) -}}
{{- $pool := index $.Values.workers.pools $poolName -}}
{{- range $bundleName, $_ := ($pool.bundles | default dict) -}}
{{- if include "sie-workers.isTensorParallelBundle" $bundleName -}}
{{- $pools = append $pools (printf "%s/%s" $poolName $bundleName) -}}
{{- $slot := include "sie-workers.slotWidth" $pool | int -}}
{{- if include "sie-workers.isCpuPool" $pool -}}{{- $slot = 1 -}}{{- end -}}
{{- if gt $slot $width -}}{{- $width = $slot -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- dict "width" $width "pools" $pools | toJson -}}
{{- end -}}

{{/*
The worker's refusal of one extra_launch_args token, empty when it allows the token: the
token's part before the first "=" looked up in the engine's spellings
(sie-workers.reservedFlagSpellings, sie-workers.vllmReservedFlagSpellings,
sie-workers.llamacppReservedFlagSpellings), read as the engine's `parser` does:
- "argparse" (SGLang): the spellings hold every one argparse resolves to a reserved flag (no
  spelling holds a space, so a token with a space and no "=", a value to argparse, is never
  found);
- "flexible" (vLLM): a "--" option's name up to its first "." (`--name.key value` is
  `--name`) with underscores made dashes; a "-" token's part before a "." likewise; and a "-"
  token that argparse cannot prefix-match whole may still set a short option exactly
  (`-tp=2`) or with its value attached (`-n2`);
- "exact" (llama.cpp): a "--" option's underscores made dashes, no prefixes; and any "-"
  token with "=" is refused (`equals`: the message's format of the token, flag and value).
Usage: {{ include "sie-workers.launchArgProblem" (dict "token" $arg "spellings" $spellings "parser" "argparse" "equals" $equals) }}
*/}}
{{- define "sie-workers.launchArgProblem" -}}
{{- if kindIs "string" .token -}}
{{- $option := index (splitList "=" .token) 0 -}}
{{- $found := "" -}}
{{- if eq .parser "exact" -}}
{{- if hasPrefix "--" $option -}}{{- $option = printf "--%s" (replace "_" "-" (trimPrefix "--" $option)) -}}{{- end -}}
{{- if and (not (hasKey .spellings $option)) (hasPrefix "-" .token) (contains "=" .token) -}}
{{- $parts := splitn "=" 2 .token -}}
{{- printf .equals .token $parts._0 $parts._1 -}}
{{- $option = "" -}}
{{- end -}}
{{- else if and (eq .parser "flexible") (hasPrefix "--" $option) -}}
{{- $option = printf "--%s" (replace "_" "-" (index (splitList "." (trimPrefix "--" $option)) 0)) -}}
{{- else if and (eq .parser "flexible") (hasPrefix "-" $option) (not (hasPrefix "-O" $option)) -}}
{{- $whole := .token -}}
{{- if contains "." $option -}}{{- $whole = index (splitList "." $option) 0 -}}{{- $option = $whole -}}{{- end -}}
{{- $short := trunc 2 $whole -}}
{{- $exact := list -}}
{{- range $spelling := list $option $short -}}
{{- if and (hasKey $.spellings $spelling) (hasPrefix "sets " (get $.spellings $spelling)) -}}{{- $exact = append $exact $spelling -}}{{- end -}}
{{- end -}}
{{- if and (contains " " $whole) (not (contains "=" $whole)) -}}
{{- $option = "" -}}
{{- else if and (not (contains "=" $whole)) (hasKey .spellings $whole) -}}
{{- $option = $whole -}}
{{- else if $exact -}}
{{- $option = first $exact -}}
{{- else -}}
{{- $option = "" -}}
{{- end -}}
{{- end -}}
{{- if and $option (hasKey .spellings $option) -}}
{{- printf "%q %s" .token (get .spellings $option) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The engine whose parser reads a shipped profile's extra_launch_args, as the worker decides
it when it reads a config: the engine of the adapter the profile, or one it extends, names
(sie-workers.engineParsers: vLLM's and llama.cpp's adapters), else "sglang".
Usage: {{ include "sie-workers.profileEngine" (dict "profiles" $model.profiles "name" $profileName) }}
*/}}
{{- define "sie-workers.profileEngine" -}}
{{- $engine := "sglang" -}}
{{- $adapters := (include "sie-workers.engineParsers" . | fromJson).adapters -}}
{{- $name := .name -}}
{{- $profiles := .profiles | default dict -}}
{{- $found := false -}}
{{- range $_ := until (len $profiles) -}}
{{- $profile := get $profiles $name -}}
{{- if and (not $found) (kindIs "map" $profile) -}}
{{- if kindIs "string" $profile.adapter_path -}}
{{- $found = true -}}
{{- if hasKey $adapters $profile.adapter_path -}}{{- $engine = get $adapters $profile.adapter_path -}}{{- end -}}
{{- else if kindIs "string" $profile.extends -}}
{{- $name = $profile.extends -}}
{{- else -}}
{{- $found = true -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $engine -}}
{{- end -}}

{{/*
The device-visibility variable an environment variable name sets (as the worker reads it:
surrounding white space stripped, any letter case), empty when it sets none.
Usage: {{ include "sie-workers.visibilityVariable" (dict "name" $name "visibility" $visibility "space" $space) }}
*/}}
{{- define "sie-workers.visibilityVariable" -}}
{{- $variable := upper (trimAll .space (toString .name)) -}}
{{- if has $variable .visibility -}}{{- $variable -}}{{- end -}}
{{- end -}}

{{/*
Problems (JSON list of strings) of one place that holds engine launch settings: a profile, or
its adapter_options.loadtime. Reserved flags in extra_launch_args, device-visibility
variables in extra_env; `key` is the values path of the place.
Usage: {{ include "sie-workers.launchSettingProblems" (dict "key" $key "place" $profile "spellings" $spellings "parser" "argparse" "equals" $equals "flagVariables" $flagVariables "visibility" $visibility "binding" $binding "space" $space) | fromJsonArray }}
*/}}
{{- define "sie-workers.launchSettingProblems" -}}
{{- $out := list -}}
{{- $ctx := . -}}
{{- if kindIs "slice" .place.extra_launch_args -}}
{{- range $i, $arg := .place.extra_launch_args -}}
{{- $problem := include "sie-workers.launchArgProblem" (dict "token" $arg "spellings" $ctx.spellings "parser" $ctx.parser "equals" $ctx.equals) -}}
{{- if $problem -}}
{{- $out = append $out (printf "%s.extra_launch_args[%d]: %s" $ctx.key $i $problem) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if kindIs "map" .place.extra_env -}}
{{- range $name, $_ := .place.extra_env -}}
{{- $where := ternary (printf "%s.extra_env.%s" $ctx.key $name) (printf "%s.extra_env[%q]" $ctx.key $name) (regexMatch "^[A-Za-z_][A-Za-z0-9_]*$" $name) -}}
{{- $variable := include "sie-workers.visibilityVariable" (dict "name" $name "visibility" $ctx.visibility "space" $ctx.space) -}}
{{- $binding := include "sie-workers.visibilityVariable" (dict "name" $name "visibility" $ctx.binding "space" $ctx.space) -}}
{{- if $variable -}}
{{- $out = append $out (printf "%s: device-visibility variables are refused in any letter case (%q sets %s); remove it, the worker writes the device mask itself from the model's GPU block" $where $name $variable) -}}
{{- else if $binding -}}
{{- $out = append $out (printf "%s: %q sets %s, which the launcher writes itself (one core list per rank, from the cores of the model's cpu devices); remove it" $where $name $binding) -}}
{{- else -}}
{{- $upper := upper (trimAll $ctx.space (toString $name)) -}}
{{- range $prefix, $engine := $ctx.flagVariables.prefixes -}}
{{- if hasPrefix $prefix $upper -}}
{{- $out = append $out (printf "%s: %s" $where (printf $ctx.flagVariables.message $name $upper $engine)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $out | toJson -}}
{{- end -}}

{{/*
Cross-field rules that values.schema.json cannot express. Collects every problem, then
fails once listing them all, each naming the key and the fix. Included from the workload
template (deployment.yaml).
Usage: {{ include "sie-workers.validateValues" . }}
*/}}
{{- define "sie-workers.validateValues" -}}
{{- $errors := list -}}
{{- $common := .Values.workers.common -}}
{{- $bundles := .Values.workers.bundles | default dict -}}
{{- $liveness := include "sie-workers.livenessBudgetSeconds" . | int -}}
{{- $readyTimeout := int $common.modelReadyTimeoutSec -}}
{{- $visibility := include "sie-workers.deviceVisibilityVariables" . | fromJsonArray -}}
{{- $space := include "sie-workers.pythonWhitespace" . -}}

{{- /* Object names: Services need DNS labels, which Helm's release names need not be. */ -}}
{{- $fullname := include "sie-workers.fullname" . -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $fullname) -}}
{{- $errors = append $errors (printf "release name %q gives object names like %q, which are not DNS labels (lowercase letters, digits and '-', no dots) and the API server would refuse the Services after creating the Deployments: install under a name without dots, or set fullnameOverride" .Release.Name $fullname) -}}
{{- end -}}

{{- /* Probe budget: a model may take modelReadyTimeoutSec to load, within the liveness budget. */ -}}
{{- if ge $readyTimeout $liveness -}}
{{- $errors = append $errors (printf "workers.common.modelReadyTimeoutSec (%d s) must be below the worker liveness budget, probes.liveness.failureThreshold x periodSeconds (%d s): raise the liveness failureThreshold or periodSeconds, or lower modelReadyTimeoutSec" $readyTimeout $liveness) -}}
{{- end -}}

{{- /* Extra environment: no device masks, no variables the chart sets. */ -}}
{{- $owned := list "SIE_DEVICES" "SIE_BUNDLE" "SIE_GPU_TYPE" "SIE_MACHINE_PROFILE" "SIE_MODEL_READY_TIMEOUT_S" "SIE_WORKER_LIVENESS_BUDGET_S" "SIE_API_KEY" "SIE_CONFIG_API" "SIE_PINNED_MODELS" "SIE_DRAIN_TIMEOUT_S" "SIE_ENGINE_STOP_GRACE_S" "HF_HOME" "TMPDIR" "SIE_NODES" "SIE_NODE_RANK" "SIE_LEADER_ADDRESS" -}}
{{- range $i, $env := ($common.extraEnv | default list) -}}
{{- if include "sie-workers.visibilityVariable" (dict "name" $env.name "visibility" $visibility "space" $space) -}}
{{- $errors = append $errors (printf "workers.common.extraEnv[%d].name: %s is a device-visibility variable; remove it, the worker writes the device mask itself" $i $env.name) -}}
{{- else if has (toString $env.name) $owned -}}
{{- $errors = append $errors (printf "workers.common.extraEnv[%d].name: %s is set by the chart; use the values key that sets it instead" $i $env.name) -}}
{{- end -}}
{{- end -}}

{{- /* Autoscaling never scales a pool to zero inside a model load. */ -}}
{{- if and .Values.autoscaling.enabled (not (kindIs "invalid" .Values.autoscaling.cooldownPeriod)) -}}
{{- if lt (int .Values.autoscaling.cooldownPeriod) $readyTimeout -}}
{{- $errors = append $errors (printf "autoscaling.cooldownPeriod (%d s) must be at least workers.common.modelReadyTimeoutSec (%d s) so that a pool is not scaled to zero while a model loads: raise it or leave it null" (int .Values.autoscaling.cooldownPeriod) $readyTimeout) -}}
{{- end -}}
{{- end -}}

{{- /* Shipped model ids, for pinned models. */ -}}
{{- $modelIds := list -}}
{{- range $file, $model := (.Values.models | default dict) -}}
{{- if and (kindIs "map" $model) $model.sie_id -}}
{{- $modelIds = append $modelIds (toString $model.sie_id) -}}
{{- range $profileName, $_ := ($model.profiles | default dict) -}}
{{- if ne $profileName "default" -}}
{{- $modelIds = append $modelIds (printf "%s:%s" $model.sie_id $profileName) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* Pools. */ -}}
{{- range $poolName := (include "sie-workers.enabledPools" . | fromJsonArray) -}}
{{- $pool := index $.Values.workers.pools $poolName -}}
{{- $key := printf "workers.pools.%s" $poolName -}}
{{- range $bundleName, $replicas := ($pool.bundles | default dict) -}}
{{- if not (hasKey $bundles $bundleName) -}}
{{- $errors = append $errors (printf "%s.bundles.%s: unknown bundle; use one of workers.bundles (%s) or define workers.bundles.%s" $key $bundleName (keys $bundles | sortAlpha | join ", ") $bundleName) -}}
{{- end -}}
{{- $replicas = $replicas | default dict -}}
{{- if and (hasKey $replicas "minReplicas") (hasKey $replicas "maxReplicas") -}}
{{- if gt (int $replicas.minReplicas) (int $replicas.maxReplicas) -}}
{{- $errors = append $errors (printf "%s.bundles.%s: minReplicas (%d) is greater than maxReplicas (%d); lower minReplicas or raise maxReplicas" $key $bundleName (int $replicas.minReplicas) (int $replicas.maxReplicas)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $slots := include "sie-workers.slotCount" $pool | int -}}
{{- $shm := include "sie-workers.shmSize" (dict "root" $ "pool" $pool) -}}
{{- $resources := include "sie-workers.workerResources" (dict "root" $ "pool" $pool) | fromYaml -}}
{{- $limit := dig "limits" "memory" "" $resources -}}
{{- if $limit -}}
{{- if lt (include "sie-workers.quantityValue" $limit | float64) (include "sie-workers.quantityValue" $shm | float64) -}}
{{- $source := ternary (printf "%s.resources.limits.memory" $key) (printf "workers.common.resources.limits.memory x %d GPU(s)" (include "sie-workers.slotWidth" $pool | int)) (not (empty $pool.resources)) -}}
{{- $errors = append $errors (printf "%s: worker memory limit %s (%s) is smaller than the /dev/shm sizeLimit %s it can fill; raise the memory limit or lower %s.shmSize" $key $limit $source $shm $key) -}}
{{- end -}}
{{- end -}}
{{- /* Kubelet evicts a pod whose emptyDirs outgrow the sum of its containers' limits. */ -}}
{{- $workerEphemeral := dig "limits" "ephemeral-storage" "" $resources -}}
{{- $routerEphemeral := dig "limits" "ephemeral-storage" "" ($common.router.resources | default dict) -}}
{{- if and $workerEphemeral $routerEphemeral -}}
{{- $podLimit := addf (mulf (include "sie-workers.quantityValue" $workerEphemeral | float64) $slots) (include "sie-workers.quantityValue" $routerEphemeral | float64) -}}
{{- /* A model cache on a claim or a node folder is not ephemeral storage (_helpers-weights.tpl). */ -}}
{{- $volumes := include "sie-workers.emptyDirBytes" (dict "root" $ "pool" $pool) | float64 -}}
{{- if lt $podLimit $volumes -}}
{{- $cache := include "sie-workers.modelCache" (dict "root" $ "pool" $pool) | fromJson -}}
{{- $tmp := printf "workers.common.tmp.sizeLimit %s" (include "sie-workers.quantityString" $common.tmp.sizeLimit) -}}
{{- $what := $tmp -}}
{{- if eq $cache.type "emptyDir" -}}
{{- $what = printf "%s %s + %s" (include "sie-workers.modelCacheKey" (dict "poolName" $poolName "pool" $pool "key" "sizeLimit")) (include "sie-workers.quantityString" $cache.sizeLimit) $tmp -}}
{{- end -}}
{{- $errors = append $errors (printf "%s: the pod's ephemeral-storage limits (%d x %s per worker + %s router = %.0fGi) are smaller than %s, so the kubelet would evict it when the cache fills; raise resources.limits.ephemeral-storage, lower the cache size, or keep the cache off ephemeral storage (modelCache.type persistentVolumeClaim or hostPath)" $key $slots $workerEphemeral $routerEphemeral (divf $podLimit 1073741824.0) $what) -}}
{{- end -}}
{{- end -}}
{{- range $i, $id := ($pool.pinnedModels | default list) -}}
{{- if not (has (toString $id) $modelIds) -}}
{{- $errors = append $errors (printf "%s.pinnedModels[%d]: %q is not a shipped model; use a sie_id from models (or sie_id:profile), one of: %s" $key $i $id (join ", " ($modelIds | sortAlpha))) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* Shipped models: width fits a pool, reserved flags, device masks, startup budget. */ -}}
{{- $widest := include "sie-workers.widestTensorParallelSlot" . | fromJson -}}
{{- /* A model wider than every pod is a group's (sie-workers.groupProblems checks its width). */ -}}
{{- $grouped := list -}}
{{- range $poolName := (include "sie-workers.enabledPools" . | fromJsonArray) -}}
{{- $pool := index $.Values.workers.pools $poolName -}}
{{- if include "sie-workers.isGroup" (dict "root" $ "pool" $pool) -}}
{{- range $m := (include "sie-workers.groupModels" (dict "root" $ "pool" $pool) | fromJsonArray) -}}
{{- $grouped = append $grouped $m.id -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $w := (include "sie-workers.modelWidths" . | fromJsonArray) -}}
{{- if and (eq $w.profile "default") (gt (int $w.width) (int $widest.width)) (not (has $w.id $grouped)) -}}
{{- if $widest.pools -}}
{{- $errors = append $errors (printf "models.%s.profiles.default.adapter_options.loadtime.tensor_parallel_size: width %d is larger than the widest slot (%d GPUs) of every enabled pool running an SGLang or vLLM bundle (%s); add a pool with gpu.count >= %d and gpu.deviceGroup: true, or pin it on a group of nodes (gpu.nodes x gpu.count = %d, pinnedModels), or lower the width" $w.model (int $w.width) (int $widest.width) (join ", " $widest.pools) (int $w.width) (int $w.width)) -}}
{{- else if gt (int $w.width) 1 -}}
{{- $errors = append $errors (printf "models.%s.profiles.default.adapter_options.loadtime.tensor_parallel_size: width %d needs an SGLang or vLLM bundle, but no enabled pool runs one; add a pool with gpu.count >= %d, gpu.deviceGroup: true and an SGLang or vLLM bundle" $w.model (int $w.width) (int $w.width)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $spellings := dict "sglang" (include "sie-workers.reservedFlagSpellings" . | fromJson) "vllm" (include "sie-workers.vllmReservedFlagSpellings" . | fromJson) "llamacpp" (include "sie-workers.llamacppReservedFlagSpellings" . | fromJson) -}}
{{- $parsers := (include "sie-workers.engineParsers" . | fromJson).parsers -}}
{{- $equals := include "sie-workers.llamacppEqualsMessage" . -}}
{{- $flagVariables := include "sie-workers.engineFlagVariables" . | fromJson -}}
{{- $binding := include "sie-workers.engineBindingVariables" . | fromJsonArray -}}
{{- range $file, $model := (.Values.models | default dict) -}}
{{- if kindIs "map" $model -}}
{{- range $profileName, $profile := ($model.profiles | default dict) -}}
{{- if kindIs "map" $profile -}}
{{- $pkey := printf "models.%s.profiles.%s" $file $profileName -}}
{{- $engine := include "sie-workers.profileEngine" (dict "profiles" $model.profiles "name" $profileName) -}}
{{- $settings := dict "spellings" (get $spellings $engine) "parser" (get $parsers $engine) "equals" $equals "flagVariables" $flagVariables "visibility" $visibility "binding" $binding "space" $space -}}
{{- $errors = concat $errors (include "sie-workers.launchSettingProblems" (merge (dict "key" $pkey "place" $profile) $settings) | fromJsonArray) -}}
{{- $loadtime := include "sie-workers.profileLoadtime" $profile | fromJson -}}
{{- $errors = concat $errors (include "sie-workers.launchSettingProblems" (merge (dict "key" (printf "%s.adapter_options.loadtime" $pkey) "place" $loadtime) $settings) | fromJsonArray) -}}
{{- $startup := get $loadtime "startup_timeout_s" -}}
{{- if or (kindIs "float64" $startup) (kindIs "int" $startup) (kindIs "int64" $startup) -}}
{{- if gt (float64 $startup) (float64 $readyTimeout) -}}
{{- $errors = append $errors (printf "%s.adapter_options.loadtime.startup_timeout_s: %v s exceeds workers.common.modelReadyTimeoutSec (%d s); lower it or raise modelReadyTimeoutSec (and the liveness budget with it)" $pkey $startup $readyTimeout) -}}
{{- else if ge (float64 $startup) (float64 $liveness) -}}
{{- $errors = append $errors (printf "%s.adapter_options.loadtime.startup_timeout_s: %v s is not below the worker liveness budget (%d s); lower it or raise probes.liveness" $pkey $startup $liveness) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* Gateway: its cross-field rules live beside its helpers (_helpers-gateway.tpl). */ -}}
{{- $errors = concat $errors (include "sie-workers.gatewayProblems" . | fromJsonArray) -}}
{{- /* Model cache, prefetch and Hugging Face token (_helpers-weights.tpl). */ -}}
{{- $errors = concat $errors (include "sie-workers.weightsProblems" . | fromJsonArray) -}}
{{- /* Scheduler, node GPU counts and DRA claims (_helpers-scheduling.tpl). */ -}}
{{- $errors = concat $errors (include "sie-workers.schedulingProblems" . | fromJsonArray) -}}
{{- /* Groups of nodes and InferencePools (_helpers-groups.tpl). */ -}}
{{- $errors = concat $errors (include "sie-workers.groupProblems" . | fromJsonArray) -}}

{{- if $errors -}}
{{- fail (printf "\n\nsie-workers: invalid values (%d problem%s):\n- %s\n" (len $errors) (ternary "" "s" (eq (len $errors) 1)) (join "\n- " $errors)) -}}
{{- end -}}
{{- end -}}
