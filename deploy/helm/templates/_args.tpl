{{/*
The provider's flags from the values, one list item each. The Deployment serves with them
and the doctor hook Job checks exactly them.
*/}}
{{- define "bigfleet-libvirt.args" -}}
- --addr=:{{ .Values.ports.grpc }}
- --metrics-addr=:{{ .Values.ports.metrics }}
{{- with .Values.provider }}
- {{ printf "--provider=%s" . | quote }}
{{- end }}
- {{ printf "--libvirt-backend=%s" (toString .Values.libvirtBackend) | quote }}
- {{ printf "--reflection=%t" (.Values.reflection | default false) | quote }}
- {{ printf "--reconcile-interval=%s" (toString .Values.reconcileInterval) | quote }}
{{- with .Values.connect }}
- {{ printf "--connect=%s" . | quote }}
{{- end }}
- {{ printf "--default-zone=%s" .Values.defaultZone | quote }}
- {{ printf "--capacity-type=%s" .Values.capacityType | quote }}
{{- with .Values.libvirt.image }}
- {{ printf "--image=%s" . | quote }}
{{- end }}
- {{ printf "--storage-pool=%s" .Values.libvirt.storagePool | quote }}
{{- if .Values.libvirt.seedPool }}
- {{ printf "--seed-pool=%s" .Values.libvirt.seedPool | quote }}
{{- end }}
- {{ printf "--network=%s" .Values.libvirt.network | quote }}
{{- range .Values.libvirt.nics }}
- {{ printf "--nic=%s" . | quote }}
{{- end }}
{{- with .Values.libvirt.cpu }}
- {{ printf "--cpu=%s" . | quote }}
{{- end }}
{{- if not (kindIs "invalid" .Values.libvirt.hostBudget) }}
- {{ printf "--host-budget=%s" (toString .Values.libvirt.hostBudget) | quote }}
{{- end }}
{{- if not (kindIs "invalid" .Values.libvirt.agentBudget) }}
- {{ printf "--agent-budget=%s" (toString .Values.libvirt.agentBudget) | quote }}
{{- end }}
{{- if not (kindIs "invalid" .Values.libvirt.hostConnections) }}
- {{ printf "--host-connections=%s" (toString .Values.libvirt.hostConnections) | quote }}
{{- end }}
{{- if not (kindIs "invalid" .Values.libvirt.hostMaxClientRequests) }}
- {{ printf "--host-max-client-requests=%s" (toString .Values.libvirt.hostMaxClientRequests) | quote }}
{{- end }}
{{- if not (kindIs "invalid" .Values.libvirt.diskAllocationRatio) }}
- {{ printf "--disk-allocation-ratio=%s" (toString .Values.libvirt.diskAllocationRatio) | quote }}
{{- end }}
- {{ printf "--seed-count=%s" (toString .Values.seedCount) | quote }}
- {{ printf "--price-per-vcpu-hour=%s" (toString .Values.pricing.perVCPUHour) | quote }}
- {{ printf "--price-per-gib-hour=%s" (toString .Values.pricing.perGiBHour) | quote }}
{{- with .Values.pricing.prices }}
- {{ printf "--prices=%s" . | quote }}
{{- end }}
{{- if .Values.instanceTypes.content }}
- --instance-types=/etc/bigfleet/instance-types/instance-types.json
{{- end }}
{{- if .Values.deviceClasses.content }}
- --device-classes=/etc/bigfleet/device-classes/device-classes.json
{{- end }}
{{- if .Values.addressPools.content }}
- --address-pools=/etc/bigfleet/address-pools/address-pools.json
{{- end }}
{{- if .Values.ignition.template }}
- --ignition-template=/etc/bigfleet/ignition/template.ign
{{- end }}
{{- if .Values.ignition.delivery }}
- --ignition-delivery={{ .Values.ignition.delivery }}
{{- end }}
{{- if .Values.offerings.content }}
- --offerings=/etc/bigfleet/offerings/offerings.json
{{- end }}
{{- if .Values.baseUserData.content }}
- --base-user-data=/etc/bigfleet/base-user-data/base-user-data
{{- end }}
{{- if .Values.state.enabled }}
- {{ printf "--state=%s" .Values.state.path | quote }}
{{- end }}
{{- if .Values.tls.enabled }}
- --tls-cert=/etc/bigfleet/tls/tls.crt
- --tls-key=/etc/bigfleet/tls/tls.key
{{- if .Values.tls.mtls }}
- --tls-ca=/etc/bigfleet/tls/ca.crt
- {{ printf "--client-identity=%s" .Values.tls.clientIdentity | quote }}
{{- end }}
{{- end }}
- {{ printf "--log-format=%s" .Values.logFormat | quote }}
- {{ printf "--log-level=%s" .Values.logLevel | quote }}
{{- range .Values.extraArgs }}
- {{ toString . | quote }}
{{- end }}
{{- end }}
