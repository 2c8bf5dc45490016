{{/*
The pod template of one pool x bundle (YAML: metadata and spec), the same for its Deployment
and, for a group of nodes, for every pod of its LeaderWorkerSet (leader and workers alike:
each runs the router and one worker owning the pod's GPUs; the worker's rank comes from the
LWS variables, sie-workers.groupEnv).
Usage: {{ include "sie-workers.podTemplate" (dict "root" $ "pool" $poolName "bundle" $bundleName) | nindent 4 }}
*/}}
{{- define "sie-workers.podTemplate" -}}
{{- $ := .root -}}
{{- $poolName := .pool -}}
{{- $bundleName := .bundle -}}
{{- $ctx := . -}}
{{- $common := $.Values.workers.common -}}
{{- $port := int $common.port -}}
{{- $termination := $common.termination -}}
{{- $pool := index $.Values.workers.pools $poolName -}}
{{- $slots := include "sie-workers.slotCount" $pool | int -}}
{{- $gpus := include "sie-workers.podGpus" (dict "root" $ "pool" $pool) | fromJson -}}
{{- $image := include "sie-workers.image" (dict "root" $ "bundle" $bundleName) -}}
metadata:
  labels:
    {{- include "sie-workers.workloadLabels" $ctx | nindent 4 }}
    {{- with $common.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/models: {{ include "sie-workers.modelsChecksum" $ }}
    {{- with $common.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "sie-workers.serviceAccountName" $ }}
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: {{ include "sie-workers.terminationGracePeriodSeconds" $ }}
  {{- with $common.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with include "sie-workers.schedulerName" (dict "root" $ "pool" $pool) }}
  schedulerName: {{ . }}
  {{- end }}
  securityContext:
    {{- toYaml $.Values.podSecurityContext | nindent 4 }}
  {{- with $common.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $pool.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $pool.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  affinity:
    {{- include "sie-workers.affinity" $ctx | nindent 4 }}
  {{- if eq $gpus.source "claims" }}
  resourceClaims:
    - name: {{ $gpus.claim }}
      resourceClaimTemplateName: {{ include "sie-workers.resourceClaimTemplateName" $ctx }}
  {{- end }}
  {{- if $common.prefetch.enabled }}
  initContainers:
    {{- include "sie-workers.prefetchContainer" (dict "root" $ "bundle" $bundleName "image" $image) | nindent 4 }}
  {{- end }}
  containers:
    - name: router
      image: {{ $image }}
      imagePullPolicy: {{ $common.image.pullPolicy }}
      args: ["route", "--host", "0.0.0.0", "--port", "{{ $port }}"]
      ports:
        - name: http
          containerPort: {{ $port }}
          protocol: TCP
      env:
        - name: SIE_GPU_COUNT
          value: {{ $slots | quote }}
        - name: SIE_WORKER_PORTS
          value: {{ include "sie-workers.workerPorts" (dict "root" $ "pool" $pool) | quote }}
        - name: SIE_BUNDLE
          value: {{ $bundleName | quote }}
        - name: SIE_GPU_TYPE
          value: {{ $pool.gpuType | quote }}
        - name: SIE_MACHINE_PROFILE
          value: {{ $pool.machineProfile | quote }}
        - name: SIE_DRAIN_TIMEOUT_S
          value: {{ $termination.drainTimeoutSec | int | quote }}
        {{- if eq (toString $pool.resume) "false" }}
        - name: SIE_ROUTER_RESUME_MAX
          value: "0"
        {{- end }}
        {{- with include "sie-workers.apiKeyEnv" $ }}
        {{- . | nindent 8 }}
        {{- end }}
        - name: TMPDIR
          value: /tmp
      resources:
        {{- toYaml $common.router.resources | nindent 8 }}
      securityContext:
        {{- toYaml $.Values.securityContext | nindent 8 }}
      startupProbe:
        httpGet:
          path: /healthz
          port: http
        {{- toYaml $common.router.probes.startup | nindent 8 }}
      livenessProbe:
        httpGet:
          path: /healthz
          port: http
        {{- toYaml $common.router.probes.liveness | nindent 8 }}
      readinessProbe:
        httpGet:
          path: /readyz
          port: http
        {{- toYaml $common.router.probes.readiness | nindent 8 }}
      lifecycle:
        preStop:
          sleep:
            seconds: {{ int $termination.preStopSleepSec }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
    {{- range $i := until $slots }}
    {{- $workerPort := include "sie-workers.workerPort" (dict "root" $ "index" $i) }}
    - name: worker-{{ $i }}
      image: {{ $image }}
      imagePullPolicy: {{ $common.image.pullPolicy }}
      args: ["serve", "--config-dir", "/etc/sie/models", "--host", "0.0.0.0", "--port", "{{ $workerPort }}"]
      ports:
        - name: worker-{{ $i }}
          containerPort: {{ $workerPort }}
          protocol: TCP
      env:
        - name: SIE_DEVICES
          value: {{ include "sie-workers.devices" $pool | quote }}
        - name: SIE_BUNDLE
          value: {{ $bundleName | quote }}
        - name: SIE_GPU_TYPE
          value: {{ $pool.gpuType | quote }}
        - name: SIE_MACHINE_PROFILE
          value: {{ $pool.machineProfile | quote }}
        - name: SIE_MODEL_READY_TIMEOUT_S
          value: {{ $common.modelReadyTimeoutSec | int | quote }}
        - name: SIE_WORKER_LIVENESS_BUDGET_S
          value: {{ include "sie-workers.livenessBudgetSeconds" $ | quote }}
        - name: SIE_CONFIG_API
          value: {{ $common.configApi | quote }}
        - name: SIE_DRAIN_TIMEOUT_S
          value: {{ $termination.drainTimeoutSec | int | quote }}
        - name: SIE_ENGINE_STOP_GRACE_S
          value: {{ $termination.engineStopGraceSec | int | quote }}
        {{- if not (kindIs "invalid" $common.generateReadTimeoutSec) }}
        - name: SIE_SGLANG_GENERATE_READ_TIMEOUT_S
          value: {{ $common.generateReadTimeoutSec | toString | quote }}
        {{- end }}
        {{- with $pool.pinnedModels }}
        - name: SIE_PINNED_MODELS
          value: {{ join "," . | quote }}
        {{- end }}
        {{- with include "sie-workers.groupEnv" (dict "root" $ "pool" $pool) }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with include "sie-workers.apiKeyEnv" $ }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with include "sie-workers.hfTokenEnv" $ }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- include "sie-workers.cacheEnv" $ | nindent 8 }}
        - name: TRITON_CACHE_DIR
          value: /var/cache/sie/triton
        - name: TMPDIR
          value: /tmp
        {{- with $common.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      resources:
        {{- include "sie-workers.workerResources" (dict "root" $ "pool" $pool "index" $i) | nindent 8 }}
      securityContext:
        {{- toYaml $.Values.securityContext | nindent 8 }}
      startupProbe:
        httpGet:
          path: /healthz
          port: worker-{{ $i }}
        {{- toYaml $common.probes.startup | nindent 8 }}
      livenessProbe:
        httpGet:
          path: /healthz
          port: worker-{{ $i }}
        {{- toYaml $common.probes.liveness | nindent 8 }}
      readinessProbe:
        httpGet:
          path: /readyz
          port: worker-{{ $i }}
        {{- toYaml $common.probes.readiness | nindent 8 }}
      lifecycle:
        preStop:
          sleep:
            seconds: {{ int $termination.preStopSleepSec }}
      volumeMounts:
        - name: dshm
          mountPath: /dev/shm
        - name: tmp
          mountPath: /tmp
        - name: model-cache
          mountPath: /var/cache/sie
        - name: models
          mountPath: /etc/sie/models
          readOnly: true
    {{- end }}
  volumes:
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ include "sie-workers.shmSize" (dict "root" $ "pool" $pool) }}
    - name: tmp
      emptyDir:
        sizeLimit: {{ include "sie-workers.quantityString" $common.tmp.sizeLimit }}
    {{- include "sie-workers.modelCacheVolume" (dict "root" $ "pool" $pool "poolName" $poolName "bundle" $bundleName) | nindent 4 }}
    - name: models
      configMap:
        name: {{ include "sie-workers.modelsConfigMapName" $ }}
{{- end -}}
