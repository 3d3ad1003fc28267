{{/* The release's name for its objects, at most 63 characters. */}}
{{- define "edgeloop.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "edgeloop.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: control-plane
{{- end -}}

{{- define "edgeloop.labels" -}}
{{ include "edgeloop.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "edgeloop.sharedSecret" -}}
{{- .Values.shared.existingSecret | default (printf "%s-shared" (include "edgeloop.fullname" .)) -}}
{{- end -}}

{{- define "edgeloop.storeSecret" -}}
{{- .Values.store.existingSecret | default (printf "%s-store" (include "edgeloop.fullname" .)) -}}
{{- end -}}

{{/* Fails the render on values that cannot work, naming the value. */}}
{{- define "edgeloop.validate" -}}
{{- if eq .Values.mode "scaled" -}}
{{- if not (or .Values.store.url .Values.store.existingSecret) -}}
{{- fail "store.url (or store.existingSecret): mode scaled keeps its records in PostgreSQL" -}}
{{- end -}}
{{- if not .Values.artifacts.url -}}
{{- fail "artifacts.url: mode scaled keeps its artifacts in S3 (s3://bucket/prefix)" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The pod template both modes share. */}}
{{- define "edgeloop.podTemplate" -}}
metadata:
  labels:
    {{- include "edgeloop.selectorLabels" . | nindent 4 }}
  annotations:
    checksum/store: {{ printf "%s%s" .Values.store.url .Values.artifacts.url | sha256sum }}
spec:
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  automountServiceAccountToken: false
  enableServiceLinks: false
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    fsGroup: 65532
    seccompProfile:
      type: RuntimeDefault
  terminationGracePeriodSeconds: 75
  containers:
    - name: control-plane
      image: {{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        - serve
        - --grpc-listen
        - 0.0.0.0:7443
        - --http-listen
        - 0.0.0.0:8080
        - --http-tls
        {{- $fullname := include "edgeloop.fullname" . }}
        {{- range (concat (list (printf "%s-grpc" $fullname) (printf "%s-grpc.%s.svc" $fullname .Release.Namespace) (printf "%s-http.%s.svc" $fullname .Release.Namespace)) .Values.serverNames) }}
        - --server-name
        - {{ . | quote }}
        {{- end }}
        {{- if eq .Values.mode "scaled" }}
        - --artifact-url
        - {{ .Values.artifacts.url | quote }}
        {{- end }}
        {{- range .Values.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      env:
        - name: EDGELOOP_DATA_DIR
          value: /var/lib/edgeloop
        {{- if eq .Values.mode "scaled" }}
        - name: EDGELOOP_STORE_URL
          valueFrom:
            secretKeyRef:
              name: {{ include "edgeloop.storeSecret" . }}
              key: {{ .Values.store.existingSecretKey }}
        {{- end }}
      {{- if and (eq .Values.mode "scaled") .Values.artifacts.existingSecret }}
      envFrom:
        - secretRef:
            name: {{ .Values.artifacts.existingSecret }}
      {{- end }}
      ports:
        - name: grpc
          containerPort: 7443
          protocol: TCP
        - name: http
          containerPort: 8080
          protocol: TCP
      startupProbe:
        httpGet:
          path: /readyz
          port: http
          scheme: HTTPS
        periodSeconds: 2
        failureThreshold: 60
      readinessProbe:
        httpGet:
          path: /readyz
          port: http
          scheme: HTTPS
        periodSeconds: 5
      livenessProbe:
        httpGet:
          path: /healthz
          port: http
          scheme: HTTPS
        periodSeconds: 10
        failureThreshold: 6
      resources:
        {{- toYaml .Values.resources | nindent 8 }}
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities:
          drop: ["ALL"]
      volumeMounts:
        - name: data
          mountPath: /var/lib/edgeloop
        - name: tmp
          mountPath: /tmp
        {{- range $file, $path := dict "ca.crt" "pki/ca.crt" "ca.key" "pki/ca.key" "admin.token" "admin.token" "manifest-signing.key" "keys/manifest-signing.key" }}
        - name: shared
          mountPath: {{ printf "/var/lib/edgeloop/%s" $path }}
          subPath: {{ $file }}
          readOnly: true
        {{- end }}
  volumes:
    - name: tmp
      emptyDir: {}
    - name: shared
      secret:
        secretName: {{ include "edgeloop.sharedSecret" . }}
        # 0400 (YAML 1.2 would read 0400 as decimal)
        defaultMode: 256
    {{- if eq .Values.mode "scaled" }}
    - name: data
      emptyDir: {}
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
