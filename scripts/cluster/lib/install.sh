# shellcheck shell=bash
# `install`: everything the cluster runs, built or fetched once into CACHE and reused:
# - the upstream components from k8s.io/kubernetes (scripts/cluster/kube: one multi-call
#   binary), compiled through the Go module proxy;
# - containerd, the CNI plugins, etcd and Prometheus (for the e2e loop on pods: Debian 12's
#   Prometheus is built without Kubernetes discovery) from Debian unstable, runc and iptables from
#   Debian 12 (unstable's runc needs a newer glibc than this host has), fetched with a private
#   apt configuration and unpacked with dpkg -x (nothing is installed into the system);
# - helm and CoreDNS (scripts/cluster/tools), compiled the same way;
# - the pause and CoreDNS images as OCI archives.

# Debian packages, by suite. The image base (libc6, libgcc-s1) is fetched here too but kept as
# .deb files: scripts/cluster/images/oci-image.py puts them into the images' base layer.
SID_PACKAGES=(containerd containernetworking-plugins etcd-server prometheus)
BOOKWORM_PACKAGES=(runc iptables libip4tc2 libip6tc2 libxtables12 libnetfilter-conntrack3
    libnfnetlink0 libnftnl11 libmnl0 libseccomp2 conntrack)
IMAGE_BASE_PACKAGES=(libc6 libgcc-s1)

# The Debian mirror this machine's apt already uses (its main archive, not security).
system_mirror() {
    local u
    u=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -n1)
    [ -n "$u" ] || u=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk '{print $2}' | grep -v security | head -n1)
    printf '%s' "${u:-http://deb.debian.org/debian}"
}

# apt_private: apt options for a private state under CACHE/apt (own sources, lists and an
# empty dpkg status, so the system's apt state is neither read nor written).
APT_OPTS=()
apt_private() {
    local a="$CACHE/apt" mirror
    mirror="${TIDEGATE_CLUSTER_APT_MIRROR:-$(system_mirror)}"
    mkdir -p "$a"/{lists/partial,state,cache,archives/partial,preferences.d}
    printf 'deb %s sid main\ndeb %s bookworm main\n' "$mirror" "$mirror" >"$a/sources.list"
    : >"$a/preferences"
    [ -f "$a/status" ] || : >"$a/status"
    APT_OPTS=(-o "Dir::Etc::SourceList=$a/sources.list" -o "Dir::Etc::SourceParts=-"
        -o "Dir::Etc::Preferences=$a/preferences" -o "Dir::Etc::PreferencesParts=$a/preferences.d"
        -o "Dir::State=$a/state" -o "Dir::State::Lists=$a/lists" -o "Dir::State::status=$a/status"
        -o "Dir::Cache=$a/cache" -o "Dir::Cache::Archives=$a/archives" -o "APT::Default-Release="
        -o "APT::Architecture=$(dpkg --print-architecture)")
    if [ "$(id -u)" = 0 ]; then APT_OPTS+=(-o "APT::Sandbox::User=root"); fi
}

# The package requests: name/suite for each list above.
package_requests() {
    local p
    for p in "${SID_PACKAGES[@]}"; do printf '%s/sid\n' "$p"; done
    for p in "${BOOKWORM_PACKAGES[@]}" "${IMAGE_BASE_PACKAGES[@]}"; do printf '%s/bookworm\n' "$p"; done
}

# debs_complete DIR: every file packages.lock names is there.
debs_complete() {
    local f
    [ -f "$1/packages.lock" ] || return 1
    while read -r f; do
        [ -f "$1/$f" ] || return 1
    done <"$1/packages.lock"
}

# fetch_debs: downloads the packages once; CACHE/debs/packages.lock lists the files in use,
# so a warm `up` never runs apt.
fetch_debs() {
    local debs="$CACHE/debs" want
    want=$(package_requests | sha256sum | cut -c1-12)
    if [ "$(cat "$debs/want" 2>/dev/null)" = "$want" ] && debs_complete "$debs"; then
        return 0
    fi
    have apt-get && have dpkg-deb || die "apt-get and dpkg-deb are needed to fetch the Debian packages"
    # New packages replace the unpacked ones, which a running cluster is using.
    if component_running containerd || component_running etcd; then
        die "the Debian packages changed since this cluster started: scripts/cluster.sh down first"
    fi
    apt_private
    log "apt-get update (private lists: sid and bookworm)"
    apt-get "${APT_OPTS[@]}" -qq update >&2 || die "apt-get update failed (is the Debian mirror reachable?)"
    mkdir -p "$debs"
    local requests
    mapfile -t requests < <(package_requests)
    log "downloading ${#requests[@]} Debian packages"
    (cd "$debs" && rm -f ./*.deb && apt-get "${APT_OPTS[@]}" -qq download "${requests[@]}" >&2) \
        || die "apt-get download ${requests[*]} failed"
    (cd "$debs" && ls ./*.deb | sed 's|^\./||' >packages.lock)
    printf '%s\n' "$want" >"$debs/want"
    rm -rf "$DEB_ROOT"
}

# unpack_debs: the runtime packages (not the image base) into DEB_ROOT.
unpack_debs() {
    local debs="$CACHE/debs" f base
    [ -f "$DEB_ROOT/.unpacked" ] && return 0
    rm -rf "$DEB_ROOT"
    mkdir -p "$DEB_ROOT"
    while read -r f; do
        base=${f%%_*}
        case " ${IMAGE_BASE_PACKAGES[*]} " in *" $base "*) continue ;; esac
        dpkg -x "$debs/$f" "$DEB_ROOT"
    done <"$debs/packages.lock"
    for f in usr/bin/containerd usr/bin/ctr usr/sbin/runc usr/bin/etcd usr/lib/cni/bridge \
        usr/lib/cni/host-local usr/lib/cni/loopback usr/lib/cni/portmap usr/sbin/xtables-legacy-multi; do
        [ -x "$DEB_ROOT/$f" ] || die "unpacked packages lack $f"
    done
    "$DEB_ROOT/usr/sbin/runc" --version >/dev/null 2>&1 || die "runc from Debian does not run on this host: $("$DEB_ROOT/usr/sbin/runc" --version 2>&1 | head -1)"
    "$DEB_ROOT/usr/bin/containerd" --version >/dev/null 2>&1 || die "containerd from Debian does not run on this host"
    : >"$DEB_ROOT/.unpacked"
    log "unpacked the Debian packages into $DEB_ROOT"
}

# image_base_debs: the .deb files of the images' base layer, one per line.
image_base_debs() {
    local f base
    while read -r f; do
        base=${f%%_*}
        case " ${IMAGE_BASE_PACKAGES[*]} " in *" $base "*) printf '%s/debs/%s\n' "$CACHE" "$f" ;; esac
    done <"$CACHE/debs/packages.lock"
}

# write_wrappers: iptables (legacy backend: `down` restores its tables exactly), conntrack,
# runc, and the containerd shim, as commands on PATH that find their own libraries.
write_wrappers() {
    mkdir -p "$WRAP_BIN"
    local lib="$DEB_ROOT/usr/lib/x86_64-linux-gnu" t
    for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
        printf '#!/bin/sh\nexport LD_LIBRARY_PATH=%s XTABLES_LIBDIR=%s/xtables\nexec %s/usr/sbin/xtables-legacy-multi %s "$@"\n' \
            "$lib" "$lib" "$DEB_ROOT" "$t" >"$WRAP_BIN/$t"
    done
    printf '#!/bin/sh\nexport LD_LIBRARY_PATH=%s\nexec %s/usr/sbin/conntrack "$@"\n' "$lib" "$DEB_ROOT" >"$WRAP_BIN/conntrack"
    chmod +x "$WRAP_BIN"/*
    ln -sf "$DEB_ROOT/usr/sbin/runc" "$WRAP_BIN/runc"
    ln -sf "$DEB_ROOT/usr/bin/containerd-shim-runc-v2" "$WRAP_BIN/containerd-shim-runc-v2"
}

# go_build DIR OUT PKG [LDFLAGS]: a reproducible, stripped build in the module at DIR.
go_build() {
    local dir=$1 out=$2 pkg=$3 ldflags="-s -w ${4:-}"
    have go || die "Go is needed to build the cluster's components (Go 1.26 or newer)"
    (cd "$dir" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags="$ldflags" -o "$out" "$pkg")
}

# kube_version_ldflags: the version every component and kubectl report (upstream's build
# sets these from git; helm reads the server's to check a chart's kubeVersion).
kube_version_ldflags() {
    local v=${K8S_VERSION#v} pkg flags=""
    local major=${v%%.*} minor=${v#*.}
    minor=${minor%%.*}
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
        flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    done
    printf '%s' "$flags"
}

build_kube() {
    local dir c
    dir=$(kube_dir)
    if [ ! -x "$dir/bin/kube" ]; then
        log "building Kubernetes $K8S_VERSION (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl) from the Go module proxy; about 15 minutes on 2 cores the first time"
        local t0=$SECONDS
        mkdir -p "$dir/bin.new"
        go_build "$CLUSTER_SRC/kube" "$dir/bin.new/kube" . "$(kube_version_ldflags)" || die "building Kubernetes failed"
        rm -rf "$dir/bin" && mv "$dir/bin.new" "$dir/bin"
        log "built Kubernetes $K8S_VERSION in $((SECONDS - t0))s"
    fi
    for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl cri-reset; do
        ln -sf kube "$dir/bin/$c"
    done
}

build_tools() {
    local dir
    dir=$(tools_dir)
    if [ ! -x "$dir/helm" ] || [ ! -x "$dir/coredns" ]; then
        log "building helm $HELM_VERSION and CoreDNS $COREDNS_VERSION from the Go module proxy"
        local t0=$SECONDS
        mkdir -p "$dir"
        go_build "$CLUSTER_SRC/tools" "$dir/helm.new" helm.sh/helm/v4/cmd/helm || die "building helm failed"
        go_build "$CLUSTER_SRC/tools" "$dir/coredns.new" ./coredns || die "building CoreDNS failed"
        mv "$dir/helm.new" "$dir/helm"
        mv "$dir/coredns.new" "$dir/coredns"
        log "built helm and CoreDNS in $((SECONDS - t0))s"
    fi
}

# link_tools: CACHE/bin holds the kubectl, helm, prometheus and promtool of this cluster
# (what `env` puts on PATH).
link_tools() {
    local bin
    bin=$(tools_bin)
    mkdir -p "$bin"
    ln -sf "$(kube_dir)/bin/kube" "$bin/kubectl"
    ln -sf "$(tools_dir)/helm" "$bin/helm"
    ln -sf "$DEB_ROOT/usr/bin/prometheus" "$bin/prometheus"
    ln -sf "$DEB_ROOT/usr/bin/promtool" "$bin/promtool"
}

# build_system_images: the pause image (scripts/cluster/images/pause.c, static) and the
# CoreDNS image, as OCI archives loaded at every `up`.
build_system_images() {
    local src="$CLUSTER_SRC/images/pause.c" tool="$CLUSTER_SRC/images/oci-image.py" out
    mkdir -p "$CACHE/images" "$CACHE/build"
    out="$CACHE/images/pause.tar"
    if [ ! -f "$out" ] || [ "$src" -nt "$out" ] || [ "$tool" -nt "$out" ]; then
        have gcc || die "gcc is needed to build the pause image"
        gcc -Os -static -Wall -Wextra -Werror -o "$CACHE/build/pause" "$src" || die "compiling pause.c failed (is libc6-dev installed?)"
        strip "$CACHE/build/pause" 2>/dev/null || true
        python3 "$tool" --out "$out.new" --name "$PAUSE_IMAGE" \
            --file "$CACHE/build/pause:/pause:755" --entrypoint /pause --user 65535:65535
        mv "$out.new" "$out"
    fi
    out="$CACHE/images/coredns.tar"
    if [ ! -f "$out" ] || [ "$(tools_dir)/coredns" -nt "$out" ] || [ "$tool" -nt "$out" ]; then
        python3 "$tool" --out "$out.new" --name "$COREDNS_IMAGE" \
            --file "$(tools_dir)/coredns:/coredns:755" --entrypoint /coredns --user 65532:65532 --expose 53
        mv "$out.new" "$out"
    fi
}

cmd_install() {
    mkdir -p "$CACHE"
    fetch_debs
    unpack_debs
    write_wrappers
    build_kube
    build_tools
    link_tools
    build_system_images
}
