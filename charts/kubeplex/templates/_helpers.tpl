{{/* Chart name, cut to 63 characters (the DNS label limit). */}}
{{- define "kubeplex.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name plus the chart name, unless the release name contains it. */}}
{{- define "kubeplex.fullname" -}}
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

{{- define "kubeplex.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kubeplex.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubeplex.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kubeplex.labels" -}}
helm.sh/chart: {{ include "kubeplex.chart" . }}
{{ include "kubeplex.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: kube-proxy
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "kubeplex.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kubeplex.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The node OS the mode runs on: kernelspace is the Windows dataplane. */}}
{{- define "kubeplex.os" -}}
{{- if eq .Values.mode "kernelspace" }}windows{{ else }}linux{{ end }}
{{- end }}

{{/* "IP:port", with IPv6 addresses in brackets: join a bind address and a port. */}}
{{- define "kubeplex.hostPort" -}}
{{- $host := index . 0 }}
{{- $port := index . 1 }}
{{- if contains ":" $host }}
{{- printf "[%s]:%d" $host (int $port) }}
{{- else }}
{{- printf "%s:%d" $host (int $port) }}
{{- end }}
{{- end }}

{{/* `--master`'s URL: the API server's own address, or nothing (the in-cluster Service). */}}
{{- define "kubeplex.master" -}}
{{- with .Values.apiServer.host }}
{{- printf "https://%s" (include "kubeplex.hostPort" (list . $.Values.apiServer.port)) }}
{{- end }}
{{- end }}

{{/* Whether an address is a loopback one (metrics cannot be scraped from off the node). */}}
{{- define "kubeplex.isLoopback" -}}
{{- if or (hasPrefix "127." .) (eq . "::1") (eq . "localhost") }}true{{ end }}
{{- end }}

{{/*
The KubeProxyConfiguration. Only keys the user set are written, so upstream defaults apply to the
rest; the bind addresses are always written, since the DaemonSet's ports and probes follow them.
*/}}
{{- define "kubeplex.config" -}}
{{- $c := .Values.config }}
{{- $doc := dict }}
{{- range $key, $value := $c.extra }}
{{- $_ := set $doc $key $value }}
{{- end }}
{{- $_ := set $doc "apiVersion" "kubeproxy.config.k8s.io/v1alpha1" }}
{{- $_ := set $doc "kind" "KubeProxyConfiguration" }}
{{- $_ := set $doc "mode" .Values.mode }}
{{- with $c.clusterCIDR }}{{ $_ := set $doc "clusterCIDR" . }}{{ end }}
{{- with $c.bindAddress }}{{ $_ := set $doc "bindAddress" . }}{{ end }}
{{- $_ := set $doc "healthzBindAddress" (include "kubeplex.hostPort" (list .Values.healthz.bindAddress .Values.healthz.port)) }}
{{- $_ := set $doc "metricsBindAddress" (include "kubeplex.hostPort" (list .Values.metrics.bindAddress .Values.metrics.port)) }}
{{- with $c.nodePortAddresses }}{{ $_ := set $doc "nodePortAddresses" . }}{{ end }}
{{- range $section := list "iptables" "nftables" "ipvs" "conntrack" "winkernel" }}
{{- with index $c $section }}{{ $_ := set $doc $section . }}{{ end }}
{{- end }}
{{- toYaml $doc }}
{{- end }}

{{/* Linux capabilities the mode needs. */}}
{{- define "kubeplex.capabilities" -}}
{{- $caps := list "NET_ADMIN" }}
{{- if has .Values.mode (list "iptables" "ipvs") }}
{{- $caps = append $caps "NET_RAW" }}
{{- end }}
{{- if and (eq .Values.mode "ipvs") .Values.securityContext.loadKernelModules }}
{{- $caps = append $caps "SYS_MODULE" }}
{{- end }}
{{- if eq .Values.mode "ebpf" }}
{{- /* Creating the maps and loading the programs take CAP_BPF, and cgroup sock_addr
programs, a networking type, CAP_NET_ADMIN too (kernel 5.8+); attaching and pinning take
nothing more. */}}
{{- $caps = append $caps "BPF" }}
{{- end }}
{{- range .Values.securityContext.extraCapabilities }}
{{- $caps = append $caps . }}
{{- end }}
{{- toJson (uniq $caps) }}
{{- end }}

{{/*
The sysctls the init container sets besides the conntrack ones, as a "key=value" list: each is
passed to `kubeplex sysctls` as a --set argument.
*/}}
{{- define "kubeplex.sysctls" -}}
{{- $sysctls := dict }}
{{- if eq .Values.mode "iptables" }}
{{- $localhostNodePorts := true }}
{{- if hasKey .Values.config.iptables "localhostNodePorts" }}
{{- $localhostNodePorts = .Values.config.iptables.localhostNodePorts }}
{{- end }}
{{- if $localhostNodePorts }}
{{- $_ := set $sysctls "net.ipv4.conf.all.route_localnet" "1" }}
{{- end }}
{{- end }}
{{- if eq .Values.mode "ipvs" }}
{{- /* What upstream's IPVS proxier sets at start (the vs keys exist once ip_vs is loaded). */}}
{{- $_ := set $sysctls "net.ipv4.vs.conntrack" "1" }}
{{- $_ := set $sysctls "net.ipv4.vs.expire_nodest_conn" "1" }}
{{- $_ := set $sysctls "net.ipv4.vs.expire_quiescent_template" "1" }}
{{- $_ := set $sysctls "net.ipv4.ip_forward" "1" }}
{{- if .Values.config.ipvs.strictARP }}
{{- $_ := set $sysctls "net.ipv4.conf.all.arp_ignore" "1" }}
{{- $_ := set $sysctls "net.ipv4.conf.all.arp_announce" "2" }}
{{- end }}
{{- end }}
{{- range $key, $value := .Values.sysctlInit.extraSysctls }}
{{- $_ := set $sysctls $key (int64 $value | toString) }}
{{- end }}
{{- $out := list }}
{{- range $key := keys $sysctls | sortAlpha }}
{{- $out = append $out (printf "%s=%s" $key (get $sysctls $key)) }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
The ebpf mode's folders in the container: the node's cgroup2 and bpffs mounts (hostPath) and
what the trust list's [backends.ebpf.options] names them.
*/}}
{{- define "kubeplex.ebpfCgroup" -}}/run/kubeplex/cgroup2{{- end }}
{{- define "kubeplex.ebpfBpffs" -}}/sys/fs/bpf{{- end }}

{{/*
The trust list of the ebpf mode: the packaged default (files/plugins.toml links to it), its
[backends.ebpf.options] pointing at the container's mounts.
*/}}
{{- define "kubeplex.plugins" -}}
{{ .Files.Get "files/plugins.toml" }}
# Written by the chart: the node's folders, as the container mounts them.
[backends.ebpf.options]
cgroup = {{ include "kubeplex.ebpfCgroup" . | quote }}
bpffs = {{ include "kubeplex.ebpfBpffs" . | quote }}
{{- end }}
