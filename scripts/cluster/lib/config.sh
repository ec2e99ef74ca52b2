# shellcheck shell=bash
# The configuration files of containerd, the pod network, the kubelet and kube-proxy, written
# into STATE at every `up`. Each keeps the component's files under STATE, not in /var/lib,
# /run or /etc, so that `down` can account for everything.

# restrict_oom_score_adj: true when this root cannot lower an OOM score (no CAP_SYS_RESOURCE).
restrict_oom_score_adj() {
    local eff
    eff=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
    if (((0x$eff >> 24) & 1)); then echo false; else echo true; fi
}

write_containerd_config() {
    mkdir -p "$STATE/containerd" "$STATE/cni/net.d"
    # Plugins that would create or watch host paths (/opt/containerd, /var/run/nri, /etc/cdi)
    # or that this machine has no use for are off; the CRI is required (containerd fails at
    # start, naming it, instead of running without the kubelet's API).
    cat >"$STATE/containerd/config.toml" <<EOF
version = 3
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
required_plugins = ["io.containerd.grpc.v1.cri"]
disabled_plugins = [
  "io.containerd.nri.v1.nri",
  "io.containerd.internal.v1.opt",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = "$CONTAINERD_SOCK"

[ttrpc]
  address = "$CONTAINERD_SOCK.ttrpc"

[plugins]
  # The CRI needs it; no verifier is installed, so it reads an empty folder.
  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = "$STATE/containerd/image-verifier"

  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "$PAUSE_IMAGE"

  [plugins.'io.containerd.cri.v1.runtime']
    # Root here may lack CAP_SYS_RESOURCE (sandboxed machines), and then cannot give a
    # container an OOM score below its own: runc fails to start the pod's sandbox. Clamp the
    # kubelet's negative scores to containerd's own instead (what rootless setups do).
    restrict_oom_score_adj = $(restrict_oom_score_adj)
    netns_mounts_under_state_dir = true
    enable_cdi = false
    cdi_spec_dirs = []
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = "$WRAP_BIN/runc"
          Root = "$STATE/runc"
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["$CNI_BIN"]
      conf_dir = "$STATE/cni/net.d"
      max_conf_num = 1
EOF
}

# The pod network: one Linux bridge with host-local addresses, portmap for hostPorts. Pods
# reach the host (and the API server) through the bridge's address; no masquerading, as
# nothing beyond this machine is reachable anyway.
write_cni_config() {
    mkdir -p "$STATE/cni/net.d" "$STATE/cni/ipam"
    cat >"$STATE/cni/net.d/10-tidegate.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "tidegate",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$NODE_POD_SUBNET"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$STATE/cni/ipam"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

write_kubelet_config() {
    mkdir -p "$STATE/kubelet" "$STATE/pod-logs"
    cat >"$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
address: 0.0.0.0
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
cgroupDriver: cgroupfs
# This machine mounts cgroup v1 (the kernel has v2, but v1 holds the controllers); upstream
# still runs there when asked to.
failCgroupV1: false
failSwapOn: false
clusterDomain: $CLUSTER_DOMAIN
clusterDNS: [$DNS_SERVICE_IP]
podLogsDir: $STATE/pod-logs
serializeImagePulls: false
# Images are loaded locally, never pulled: the kubelet must not collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# A small CI disk must not evict pods: evict only when memory or disk is nearly gone.
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
maxPods: 110
EOF
}

write_kube_proxy_config() {
    cat >"$STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $STATE/kube-proxy.kubeconfig
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $POD_CIDR
bindAddress: 0.0.0.0
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
# Leave the host's conntrack sysctls as they are, and do not turn on route_localnet:
# NodePorts answer on the node's address, not on 127.0.0.1.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
nodePortAddresses: [primary]
iptables:
  localhostNodePorts: false
EOF
}
