# shellcheck shell=bash
# What the cluster changes on the host outside CACHE and STATE, recorded by `up` before it
# starts anything and put back by `down`:
# - sysctls the kubelet and the bridge plugin set (ip_forward; the kubelet's kernel tunables);
# - the iptables rules (kube-proxy's and portmap's chains; legacy backend, restored as saved);
# - host paths some component insists on creating, and the models folder the example
#   PersistentVolumes serve (each removed when it was not there before);
# - the pod bridge, and the kubelet's cgroups (kubepods) in every v1 hierarchy.

HOST_STATE="$STATE/host"
HOST_SYSCTLS=(net.ipv4.ip_forward net.ipv6.conf.all.forwarding net.ipv4.conf.all.route_localnet
    vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
    kernel.keys.root_maxkeys kernel.keys.root_maxbytes)
# Paths that upstream components create when they are missing, whatever their configuration.
HOST_PATHS=(/var/log/containers /var/lib/kubelet /run/containerd /var/run/netns /var/lib/cni
    /etc/cni /opt/cni /opt/containerd /var/run/nri /etc/kubernetes /var/run/kubernetes
    /var/lib/containerd /run/runc /var/lib/tidegate)

snapshot_host() {
    [ -f "$HOST_STATE/.complete" ] && return 0
    mkdir -p "$HOST_STATE"
    local s p
    for s in "${HOST_SYSCTLS[@]}"; do
        if v=$(sysctl -n "$s" 2>/dev/null); then printf '%s=%s\n' "$s" "$v"; fi
    done >"$HOST_STATE/sysctl"
    for p in "${HOST_PATHS[@]}"; do
        [ -e "$p" ] || printf '%s\n' "$p"
    done >"$HOST_STATE/absent-paths"
    "$WRAP_BIN/iptables-save" >"$HOST_STATE/iptables" 2>/dev/null || : >"$HOST_STATE/iptables"
    "$WRAP_BIN/ip6tables-save" >"$HOST_STATE/ip6tables" 2>/dev/null || : >"$HOST_STATE/ip6tables"
    : >"$HOST_STATE/.complete"
}

# empty_ruleset: what iptables-restore needs to leave the filter, nat and mangle tables with
# no rules and ACCEPT policies (a host that had no rules before `up`).
empty_ruleset() {
    local t
    for t in filter nat mangle raw; do
        printf '*%s\n' "$t"
        case $t in
            filter) printf ':INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n' ;;
            nat) printf ':PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n' ;;
            mangle) printf ':PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n' ;;
            raw) printf ':PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n' ;;
        esac
        printf 'COMMIT\n'
    done
}

restore_iptables() {
    local v tool
    for v in iptables ip6tables; do
        tool="$WRAP_BIN/$v-restore"
        [ -x "$tool" ] || continue
        # Empty every table first: a table the saved rules do not mention (nat, on a host
        # with filter rules only) would otherwise keep kube-proxy's chains.
        empty_ruleset | "$tool" 2>/dev/null || log "warning: could not empty the $v tables"
        if [ -s "$HOST_STATE/$v" ]; then
            "$tool" <"$HOST_STATE/$v" 2>/dev/null || log "warning: $v-restore of the saved rules failed"
        fi
    done
}

restore_sysctls() {
    [ -f "$HOST_STATE/sysctl" ] || return 0
    local line
    while IFS= read -r line; do
        [ "$(sysctl -n "${line%%=*}" 2>/dev/null)" = "${line#*=}" ] && continue
        sysctl -q -w "$line" >/dev/null 2>&1 || log "warning: could not restore $line"
    done <"$HOST_STATE/sysctl"
}

restore_paths() {
    [ -f "$HOST_STATE/absent-paths" ] || return 0
    local p
    while IFS= read -r p; do
        [ -e "$p" ] || continue
        umount_under "$p"
        rm -rf "$p" || log "warning: could not remove $p"
    done <"$HOST_STATE/absent-paths"
}

# umount_under DIR: every mount point at or below DIR, deepest first.
umount_under() {
    local dir=$1 m
    [ -e "$dir" ] || return 0
    while IFS= read -r m; do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "warning: could not unmount $m"
    done < <(awk -v d="$dir" '$2 == d || index($2, d "/") == 1 {print $2}' /proc/self/mounts | sort -r)
}

# kill_leftover_pods: when removing the pods through the CRI failed (containerd hung, or was
# gone), the pods' processes (everything in the kubelet's kubepods cgroups) and the shims
# containerd started for them (by their executable, from this cache) are ended here.
kill_leftover_pods() {
    local pids="" f pid exe
    for f in $(find /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods -name cgroup.procs 2>/dev/null); do
        pids+=" $(cat "$f" 2>/dev/null)"
    done
    for pid in /proc/[0-9]*; do
        exe=$(readlink "$pid/exe" 2>/dev/null) || continue
        [ "$exe" = "$DEB_ROOT/usr/bin/containerd-shim-runc-v2" ] && pids+=" ${pid#/proc/}"
    done
    pids=$(echo $pids | tr ' ' '\n' | sort -un | tr '\n' ' ')
    [ -n "${pids// /}" ] || return 0
    log "ending what the pods left running: pids $pids"
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 1
}

# remove_cgroups: the kubelet's kubepods cgroups (empty once every pod is gone).
remove_cgroups() {
    local d
    for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
        [ -d "$d" ] || continue
        find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
        [ -d "$d" ] && log "warning: $d is still there (a process still in it?)"
    done
    return 0
}

remove_bridge() {
    if ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link delete "$BRIDGE" || log "warning: could not delete the bridge $BRIDGE"
    fi
}

restore_host() {
    remove_bridge
    restore_iptables
    restore_sysctls
    restore_paths
    remove_cgroups
}

# host_leftovers: what `down` should have removed and did not; prints one line each.
host_leftovers() {
    local p
    ip link show "$BRIDGE" >/dev/null 2>&1 && echo "network device $BRIDGE"
    if [ -f "$HOST_STATE/absent-paths" ]; then
        while IFS= read -r p; do [ -e "$p" ] && echo "path $p"; done <"$HOST_STATE/absent-paths"
    fi
    awk -v d="$STATE" 'index($2, d) == 1 {print "mount " $2}' /proc/self/mounts
    for p in /proc/[0-9]*; do
        [[ $(readlink "$p/exe" 2>/dev/null) == "$CACHE"/* ]] && echo "process ${p#/proc/} $(readlink "$p/exe")"
    done
    for p in /sys/fs/cgroup/*/kubepods; do [ -d "$p" ] && echo "cgroup $p"; done
    return 0
}

# host_report: what the host looks like in every respect the cluster touches, normalized so
# that two reports are equal when nothing of the cluster is left: processes running anything
# from CACHE or in a pod's cgroup, mounts, network devices, iptables rules (legacy backend,
# without counters; an empty table reads as an absent one), the sysctls above, the paths
# above, the kubelet's cgroups. `host-snapshot` prints it; the cluster e2e diffs the one
# taken before `up` with the one after `down`.
host_report() {
    local pid exe p s t
    echo "# processes"
    for pid in /proc/[0-9]*; do
        exe=$(readlink "$pid/exe" 2>/dev/null) || continue
        if [[ $exe == "$CACHE"/* ]] || grep -qs kubepods "$pid/cgroup"; then
            echo "process $exe"
        fi
    done | sort
    echo "# mounts"
    awk '{print $2, $3}' /proc/self/mounts | sort
    echo "# network devices"
    ip -o link show | awk -F': ' '{sub(/@.*/, "", $2); print $2}' | sort
    echo "# iptables"
    for t in iptables ip6tables; do
        [ -x "$WRAP_BIN/$t-save" ] || continue
        "$WRAP_BIN/$t-save" 2>/dev/null | awk -v t="$t" '
            /^\*/ {table = $0}
            /^-/ {print t, table, $0}
            /^:/ && !/^:(INPUT|OUTPUT|FORWARD|PREROUTING|POSTROUTING) ACCEPT/ {print t, table, $1, $2}'
    done
    echo "# sysctls"
    for s in "${HOST_SYSCTLS[@]}"; do echo "$s=$(sysctl -n "$s" 2>/dev/null)"; done
    echo "# paths"
    for p in "${HOST_PATHS[@]}"; do
        if [ -e "$p" ]; then echo "present $p"; else echo "absent $p"; fi
    done
    echo "# cgroups"
    for p in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do [ -d "$p" ] && echo "cgroup $p"; done
    return 0
}
