{{/* Capability lists render as a flow sequence, e.g. [NET_ADMIN, SYS_ADMIN]. */}}
{{- define "cilium.caps" -}}
[{{ join ", " . }}]
{{- end -}}

{{/* Env that points a component at the apiserver when kube-proxy is replaced (Talos: KubePrism). */}}
{{- define "cilium.apiserverEnv" -}}
{{- if .Values.k8sServiceHost }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ .Values.k8sServiceHost | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ .Values.k8sServicePort | toString | quote }}
{{- end }}
{{- end -}}

{{- define "cilium.kpr" -}}
{{- toString .Values.kubeProxyReplacement -}}
{{- end -}}

{{/* matchLabels as `k=v,k2=v2`, as the upstream chart renders node label selectors. */}}
{{- define "cilium.mapToString" -}}
{{- $list := list -}}
{{- range $k, $v := . -}}
{{- $list = append $list (printf "%s=%s" $k $v) -}}
{{- end -}}
{{ join "," $list }}
{{- end -}}
