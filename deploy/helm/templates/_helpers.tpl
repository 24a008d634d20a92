{{/* Chart name, overridable, trimmed to the 63-character DNS label limit. */}}
{{- define "bigfleet-libvirt.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: fullnameOverride, else the release name when it already contains the chart name
(release "bigfleet-libvirt-dc1" gives deploy/bigfleet-libvirt-dc1), else <release>-<name>.
*/}}
{{- define "bigfleet-libvirt.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "bigfleet-libvirt.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "bigfleet-libvirt.selectorLabels" -}}
app.kubernetes.io/name: {{ include "bigfleet-libvirt.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "bigfleet-libvirt.labels" -}}
helm.sh/chart: {{ include "bigfleet-libvirt.chart" . }}
{{ include "bigfleet-libvirt.selectorLabels" . }}
app.kubernetes.io/version: {{ include "bigfleet-libvirt.version" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: capacity-provider
{{- end }}

{{- define "bigfleet-libvirt.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "bigfleet-libvirt.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image's tag: image.tag, else the chart's appVersion. */}}
{{- define "bigfleet-libvirt.tag" -}}
{{- .Values.image.tag | default .Chart.AppVersion | toString }}
{{- end }}

{{/*
The app.kubernetes.io/version label: the tag (never the digest, whose "sha256:" a label
value cannot hold), cut to the 63-character label limit and to an alphanumeric first and
last character, as label syntax requires.
*/}}
{{- define "bigfleet-libvirt.version" -}}
{{- include "bigfleet-libvirt.tag" . | trunc 63 | trimAll "-_." }}
{{- end }}

{{/*
The image reference: repository@sha256:... when image.digest is set (the tag is then only
the version label: a digest names exactly one image, whatever a tag points to later), else
repository:tag.
*/}}
{{- define "bigfleet-libvirt.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (include "bigfleet-libvirt.tag" .) }}
{{- end }}
{{- end }}

{{/* "true" when the fake backend is forced: libvirtBackend=fake or --use-fake-backend in extraArgs. */}}
{{- define "bigfleet-libvirt.fakeForced" -}}
{{- $forced := eq (lower (toString .Values.libvirtBackend)) "fake" }}
{{- range .Values.extraArgs }}
{{- $arg := toString . }}
{{- if or (eq $arg "--use-fake-backend") (eq $arg "--use-fake-backend=true") }}
{{- $forced = true }}
{{- end }}
{{- end }}
{{- if $forced }}true{{ end }}
{{- end }}

{{/* Fail early on combinations the binary would refuse at start-up (or silently ignore). */}}
{{- define "bigfleet-libvirt.validate" -}}
{{- $tag := toString .Values.image.tag }}
{{- if or (contains "@" $tag) (hasPrefix "sha256:" $tag) }}
{{- fail (printf "image.tag %q is a digest: set image.digest=sha256:<64 hex> instead (image.tag is the version label, which cannot hold a digest)" $tag) }}
{{- end }}
{{- if and $tag (not (regexMatch "^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$" $tag)) }}
{{- fail (printf "image.tag %q is not an image tag (letters, digits, '_', '.', '-'; at most 128 characters, not starting with '.' or '-')" $tag) }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) }}
{{- fail "tls.enabled needs tls.secretName: a kubernetes.io/tls Secret with tls.crt and tls.key (and ca.crt for tls.mtls)" }}
{{- end }}
{{- if and .Values.tls.mtls (not .Values.tls.enabled) }}
{{- fail "tls.mtls needs tls.enabled=true (the provider rejects --tls-ca without --tls-cert/--tls-key)" }}
{{- end }}
{{- if and (eq (toString .Values.tls.clientIdentity) "off") (not .Values.tls.mtls) }}
{{- fail "tls.clientIdentity=off needs tls.mtls=true (client identities come from verified client certificates; the provider rejects --client-identity without --tls-ca)" }}
{{- end }}
{{- if and .Values.state.persistence.enabled (not .Values.state.enabled) }}
{{- fail "state.persistence.enabled needs state.enabled=true (the volume holds the --state file)" }}
{{- end }}
{{- if and .Values.state.enabled (not .Values.state.path) }}
{{- fail "state.enabled needs state.path (e.g. /var/lib/bigfleet-libvirt/state.redb)" }}
{{- end }}
{{- $fake := include "bigfleet-libvirt.fakeForced" . }}
{{- if and .Values.connect (not .Values.libvirt.image) (not $fake) }}
{{- fail "connect names libvirt hosts, so libvirt.image (the golden base-image volume) is required" }}
{{- end }}
{{- if and .Values.libvirt.nics (ne (toString .Values.libvirt.network) "default") }}
{{- fail (printf "libvirt.nics replaces libvirt.network's NIC: leave libvirt.network at default and list network=%s among libvirt.nics (the provider rejects --network with --nic)" (toString .Values.libvirt.network)) }}
{{- end }}
{{- $host := .Values.libvirt.hostBudget }}
{{- $agent := .Values.libvirt.agentBudget }}
{{- if and (not (kindIs "invalid" $host)) (not (kindIs "invalid" $agent)) (gt (int64 $agent) (int64 $host)) }}
{{- fail (printf "libvirt.agentBudget (%v) must be at most libvirt.hostBudget (%v): the guest-agent calls are a share of the host's budget" $agent $host) }}
{{- end }}
{{- $conns := .Values.libvirt.hostConnections }}
{{- if and (not (kindIs "invalid" $conns)) (gt (int64 $conns) (int64 (default 7 $host))) }}
{{- fail (printf "libvirt.hostConnections (%v) must be at most libvirt.hostBudget (%v): a connection no call can use stays idle" $conns (default 7 $host)) }}
{{- end }}
{{- end }}
