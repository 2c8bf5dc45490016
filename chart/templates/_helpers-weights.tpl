{{/*
Helpers for model weights: where the model cache (HF_HOME) lives, the prefetch init
container, the Hugging Face token, and the rules on those values. The worker downloads a
model's weights into the cache before it starts the engine; a cache that outlives pods
(persistentVolumeClaim, hostPath) or a prefetch turns that download into a cache read.
*/}}

{{/*
The model cache settings of one pool (JSON): workers.common.modelCache with the pool's own
workers.pools.<pool>.modelCache keys over it; "ephemeralClaim" is true for a per-pod claim
(persistentVolumeClaim without existingClaim).
Usage: {{ $cache := include "sie-workers.modelCache" (dict "root" $ "pool" $pool) | fromJson }}
*/}}
{{- define "sie-workers.modelCache" -}}
{{- $cache := mergeOverwrite (deepCopy .root.Values.workers.common.modelCache) (deepCopy (.pool.modelCache | default dict)) -}}
{{- $_ := set $cache "ephemeralClaim" (and (eq $cache.type "persistentVolumeClaim") (not $cache.existingClaim)) -}}
{{- $cache | toJson -}}
{{- end -}}

{{/*
The values key a pool's model cache setting comes from: the pool's own override when it
sets the key, else workers.common.modelCache.
Usage: {{ include "sie-workers.modelCacheKey" (dict "poolName" $poolName "pool" $pool "key" "path") }}
*/}}
{{- define "sie-workers.modelCacheKey" -}}
{{- if hasKey (.pool.modelCache | default dict) .key -}}
{{- printf "workers.pools.%s.modelCache.%s" .poolName .key -}}
{{- else -}}
{{- printf "workers.common.modelCache.%s" .key -}}
{{- end -}}
{{- end -}}

{{/*
The model-cache volume of one pool x bundle's pods (a volumes list item, YAML): an emptyDir,
an existing claim, a per-pod ephemeral claim, or a node folder.
Usage: {{ include "sie-workers.modelCacheVolume" (dict "root" $ "pool" $pool "poolName" $poolName "bundle" $bundleName) | nindent 8 }}
*/}}
{{- define "sie-workers.modelCacheVolume" -}}
{{- $cache := include "sie-workers.modelCache" . | fromJson -}}
- name: model-cache
{{- if eq $cache.type "persistentVolumeClaim" }}
{{- if $cache.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ $cache.existingClaim }}
{{- else }}
  ephemeral:
    volumeClaimTemplate:
      metadata:
        labels:
          {{- include "sie-workers.workloadSelectorLabels" (dict "root" .root "pool" .poolName "bundle" .bundle) | nindent 10 }}
      spec:
        accessModes:
          {{- toYaml ($cache.accessModes | default (list "ReadWriteOnce")) | nindent 10 }}
        {{- with $cache.storageClassName }}
        storageClassName: {{ . }}
        {{- end }}
        resources:
          requests:
            storage: {{ include "sie-workers.quantityString" $cache.size }}
{{- end }}
{{- else if eq $cache.type "hostPath" }}
  hostPath:
    path: {{ $cache.path }}
    type: {{ $cache.hostPathType | default "Directory" }}
{{- else }}
  emptyDir:
    sizeLimit: {{ include "sie-workers.quantityString" $cache.sizeLimit }}
{{- end }}
{{- end -}}

{{/*
Bytes the pod's emptyDirs may hold on the node's ephemeral storage: /tmp, plus the model
cache when it is an emptyDir (a claim or a node folder does not count).
Usage: {{ include "sie-workers.emptyDirBytes" (dict "root" $ "pool" $pool) | float64 }}
*/}}
{{- define "sie-workers.emptyDirBytes" -}}
{{- $cache := include "sie-workers.modelCache" . | fromJson -}}
{{- $bytes := include "sie-workers.quantityValue" .root.Values.workers.common.tmp.sizeLimit | float64 -}}
{{- if eq $cache.type "emptyDir" -}}
{{- $bytes = addf $bytes (include "sie-workers.quantityValue" $cache.sizeLimit | float64) -}}
{{- end -}}
{{- $bytes -}}
{{- end -}}

{{/*
HF_TOKEN from the existing Secret named by workers.common.hfToken (env list item), or
nothing when no Secret is named.
Usage: {{ include "sie-workers.hfTokenEnv" . | nindent 12 }}
*/}}
{{- define "sie-workers.hfTokenEnv" -}}
{{- with .Values.workers.common.hfToken -}}
{{- if .secretName -}}
- name: HF_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .key }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The cache variables of every container that reads or writes model weights (env list items).
Usage: {{ include "sie-workers.cacheEnv" . | nindent 12 }}
*/}}
{{- define "sie-workers.cacheEnv" -}}
- name: HF_HOME
  value: /var/cache/sie/huggingface
- name: XDG_CACHE_HOME
  value: /var/cache/sie/xdg
{{- end -}}

{{/*
The prefetch init container of one pool x bundle (a containers list item, YAML):
`sie-worker fetch` of the shipped models (or workers.common.prefetch.models) into the cache.
Usage: {{ include "sie-workers.prefetchContainer" (dict "root" $ "bundle" $bundleName "image" $image) | nindent 8 }}
*/}}
{{- define "sie-workers.prefetchContainer" -}}
{{- $common := .root.Values.workers.common -}}
{{- $args := list "fetch" "/etc/sie/models" -}}
{{- with $common.prefetch.models -}}
{{- $args = concat $args (list "--models" (join "," .)) -}}
{{- end -}}
- name: prefetch
  image: {{ .image }}
  imagePullPolicy: {{ $common.image.pullPolicy }}
  args: {{ $args | toJson }}
  env:
    - name: SIE_BUNDLE
      value: {{ .bundle | quote }}
    {{- include "sie-workers.cacheEnv" .root | nindent 4 }}
    - name: TMPDIR
      value: /tmp
    {{- with include "sie-workers.hfTokenEnv" .root }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- with $common.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  resources:
    {{- toYaml $common.prefetch.resources | nindent 4 }}
  securityContext:
    {{- toYaml .root.Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: tmp
      mountPath: /tmp
    - name: model-cache
      mountPath: /var/cache/sie
    - name: models
      mountPath: /etc/sie/models
      readOnly: true
{{- end -}}

{{/*
Problems with the model cache, prefetch and token values (JSON list of messages, each
naming the key and the fix), for sie-workers.validateValues. The schema checks
workers.common.modelCache on its own; a pool's overrides are checked here, merged.
Usage: {{ $errors = concat $errors (include "sie-workers.weightsProblems" . | fromJsonArray) }}
*/}}
{{- define "sie-workers.weightsProblems" -}}
{{- $errors := list -}}
{{- $common := .Values.workers.common -}}
{{- range $poolName := (include "sie-workers.enabledPools" . | fromJsonArray) -}}
{{- $pool := index $.Values.workers.pools $poolName -}}
{{- if $pool.modelCache -}}
{{- $cache := include "sie-workers.modelCache" (dict "root" $ "pool" $pool) | fromJson -}}
{{- if and (eq $cache.type "persistentVolumeClaim") (not $cache.existingClaim) (not $cache.size) -}}
{{- $errors = append $errors (printf "workers.pools.%s.modelCache: type persistentVolumeClaim needs existingClaim (a claim to mount) or size (a per-pod claim of that size); set one of them" $poolName) -}}
{{- end -}}
{{- if and (eq $cache.type "hostPath") (not (hasPrefix "/" (toString $cache.path))) -}}
{{- $errors = append $errors (printf "workers.pools.%s.modelCache.path: type hostPath needs an absolute folder on the node (e.g. /mnt/nvme/sie-cache), got %q; set it" $poolName (toString $cache.path)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* A token set both ways would be set twice in the container. */ -}}
{{- if $common.hfToken.secretName -}}
{{- range $i, $env := ($common.extraEnv | default list) -}}
{{- if eq (toString $env.name) "HF_TOKEN" -}}
{{- $errors = append $errors (printf "workers.common.extraEnv[%d].name: HF_TOKEN is set by the chart from workers.common.hfToken; remove one of them" $i) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* Prefetch only what is shipped. */ -}}
{{- if $common.prefetch.enabled -}}
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
{{- range $i, $id := ($common.prefetch.models | default list) -}}
{{- if not (has (toString $id) $modelIds) -}}
{{- $errors = append $errors (printf "workers.common.prefetch.models[%d]: %q is not a shipped model; use a sie_id from models (or sie_id:profile), one of: %s" $i $id (join ", " ($modelIds | sortAlpha))) -}}
{{- end -}}
{{- end -}}
{{- if not $modelIds -}}
{{- $errors = append $errors "workers.common.prefetch.enabled: no model is shipped (models is empty), so there is nothing to prefetch; add models or turn prefetch off" -}}
{{- end -}}
{{- end -}}
{{- $errors | toJson -}}
{{- end -}}
