# shellcheck shell=bash
# `images`: the tidegate engine and operator images, as docker/Dockerfile.engine and
# docker/Dockerfile.operator describe them (their BINARIES=prebuilt path: this checkout's
# binaries on a glibc + libgcc base, non-root 65532, the same entrypoint, user and ports,
# read from the Dockerfiles themselves), written as OCI archives into CACHE/images and loaded
# into the cluster's containerd. No registry and no Docker daemon: the base layer is the
# Debian 12 packages distroless/cc-debian12 is made of (libc6, libgcc-s1).

# The names the chart and the example pools use: the chart's image.repository at its
# appVersion, the engine at the same version, and tidegate-engine:local (local demo pool).
chart_app_version() { awk -F'"' '/^appVersion:/ {print $2}' "$REPO/charts/tidegate/Chart.yaml"; }
chart_operator_repository() {
    awk '/^image:/ {in_image = 1; next} in_image && /^[^ ]/ {in_image = 0}
         in_image && $1 == "repository:" {print $2; exit}' "$REPO/charts/tidegate/values.yaml"
}
ENGINE_REPOSITORY=ghcr.io/tidegate/tidegate-engine
LOCAL_ENGINE_IMAGE=docker.io/library/tidegate-engine:local

# image_binaries PROFILE: builds both binaries; prints the target directory they are in.
image_binaries() {
    local profile=$1 target="${CARGO_TARGET_DIR:-$REPO/target}"
    local flags=(--locked -p tidegate-engine -p tidegate-operator)
    case $profile in
        release) flags+=(--release) ;;
        debug) ;;
        *) die "TIDEGATE_IMAGE_PROFILE must be release or debug, not $profile" ;;
    esac
    have cargo || die "cargo is needed to build the tidegate binaries"
    log "cargo build ${flags[*]}"
    (cd "$REPO" && cargo build --quiet "${flags[@]}") >&2 || die "cargo build failed"
    printf '%s/%s' "$target" "$profile"
}

# write_image DOCKERFILE BINARY OUT NAME...
write_image() {
    local dockerfile=$1 binary=$2 out=$3
    shift 3
    local args=(--dockerfile "$REPO/$dockerfile" --binary "$binary" --nonroot --out "$out.new")
    local deb name
    while IFS= read -r deb; do args+=(--base-deb "$deb"); done < <(image_base_debs)
    for name in "$@"; do args+=(--name "$name"); done
    python3 "$CLUSTER_SRC/images/oci-image.py" "${args[@]}" || die "writing $out failed"
    mv "$out.new" "$out"
    log "image $* ($(du -m "$out" | cut -f1) MiB archive)"
}

cmd_images() {
    local profile=${TIDEGATE_IMAGE_PROFILE:-release} bin version operator_repo
    version=$(chart_app_version)
    operator_repo=$(chart_operator_repository)
    [ -n "$version" ] && [ -n "$operator_repo" ] || die "cannot read the image names from charts/tidegate"
    fetch_debs
    bin=$(image_binaries "$profile")
    mkdir -p "$CACHE/images"
    write_image docker/Dockerfile.engine "$bin/tidegate-engine" "$CACHE/images/tidegate-engine.tar" \
        "$ENGINE_REPOSITORY:$version" "$LOCAL_ENGINE_IMAGE"
    write_image docker/Dockerfile.operator "$bin/tidegate-operator" "$CACHE/images/tidegate-operator.tar" \
        "$operator_repo:$version"
    if component_running containerd; then
        load_image "$CACHE/images/tidegate-engine.tar"
        load_image "$CACHE/images/tidegate-operator.tar"
        log "loaded both images into the cluster"
    else
        log "the cluster is not up: \`scripts/cluster.sh up\` loads them"
    fi
}

# load_cached_images: the pause image, then every image `images` wrote (at each `up`: the
# cluster's containerd starts empty).
load_cached_images() {
    local f
    for f in "$CACHE/images"/*.tar; do
        [ -f "$f" ] || continue
        load_image "$f" || die "loading $f into containerd failed"
    done
}
