#!/usr/bin/env bash
# SeaweedFS's `weed`: the real S3-compatible server the model-sources tests fetch from
# (Apache-2.0; MinIO's server is AGPL and is not used). Built from the Go module proxy at a
# pinned version and cached under ~/.cache/tidegate/seaweedfs/VERSION (44 minutes the first
# time on 2 cores shared with other builds; later calls find it in place).
#
#   scripts/seaweedfs.sh install   build it unless cached
#   scripts/seaweedfs.sh path      print the binary's path (building it first if needed)
#
# `go install …/weed@VERSION` refuses the module (its go.mod has replace directives), so the
# module is downloaded and built in place, read-only, as the cluster's components are.
set -euo pipefail

# SeaweedFS tags releases without a `v` (e.g. 4.01), which the module proxy does not list as
# versions: the pin is a pseudo-version of upstream commit 7506e5f91cd6 (2026-11-09), which
# reports itself as `weed version` 4.53.
SEAWEEDFS_VERSION=v0.0.0-20261109003541-7506e5f91cd6
MODULE=github.com/seaweedfs/seaweedfs
CACHE=${TIDEGATE_SEAWEEDFS_CACHE:-$HOME/.cache/tidegate/seaweedfs}/$SEAWEEDFS_VERSION
BIN=$CACHE/bin/weed

install() {
    [ -x "$BIN" ] && return 0
    command -v go >/dev/null || { echo "Go is needed to build SeaweedFS (Go 1.26 or newer)" >&2; exit 1; }
    echo "building SeaweedFS $SEAWEEDFS_VERSION from the Go module proxy (up to ~45 minutes on 2 busy cores the first time)" >&2
    local t0=$SECONDS dir
    dir=$(go mod download -json "$MODULE@$SEAWEEDFS_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -d "$dir" ] || { echo "go mod download $MODULE@$SEAWEEDFS_VERSION failed" >&2; exit 1; }
    mkdir -p "$CACHE/bin.new"
    (cd "$dir" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags="-s -w" -o "$CACHE/bin.new/weed" ./weed)
    rm -rf "$CACHE/bin" && mv "$CACHE/bin.new" "$CACHE/bin"
    echo "built SeaweedFS in $((SECONDS - t0))s: $BIN" >&2
}

case "${1:-}" in
    install) install ;;
    path) install && echo "$BIN" ;;
    *) echo "usage: $0 install|path" >&2; exit 2 ;;
esac
