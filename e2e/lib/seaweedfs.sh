# shellcheck shell=bash
# A SeaweedFS S3 server for the model-source e2e (local mode and the cluster): one `weed
# server` (master, volume, filer, S3 gateway) on free ports of one address, with one access
# key. Source it after e2e/lib.sh (listen_ports).
#
# start_weed BIN IP DIR PIDS_VAR: starts it, its data and config under DIR, and appends its
# pid to the array named PIDS_VAR. Sets S3 (the endpoint URL). The key pair is
# $S3_ACCESS/$S3_SECRET in $S3_REGION.
#
# weed_up: true once the gateway takes a signed request (it makes the bucket `models`); made
# for wait_for. A server that has exited (a port taken between the pick and its bind) is
# started again on other ports, up to three times, its log kept as weed.log.N.
S3_ACCESS=tidegate-e2e
S3_SECRET=tidegate-e2e-secret-key
S3_REGION=us-east-1

WEED_RESTARTS=0
start_weed() {
    local bin=$1 ip=$2 dir=$3 pids_var=$4 P
    WEED_ARGS=("$@")
    read -r -a P <<<"$(listen_ports 8)"
    mkdir -p "$dir/data"
    cat >"$dir/s3.json" <<JSON
{"identities": [{"name": "e2e", "credentials": [{"accessKey": "$S3_ACCESS", "secretKey": "$S3_SECRET"}],
  "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}
JSON
    "$bin" server -ip="$ip" -ip.bind="$ip" -dir="$dir/data" \
        -master.port="${P[1]}" -master.port.grpc="${P[2]}" \
        -volume.port="${P[3]}" -volume.port.grpc="${P[4]}" \
        -filer -filer.port="${P[5]}" -filer.port.grpc="${P[6]}" \
        -s3 -s3.port="${P[0]}" -s3.port.grpc="${P[7]}" -s3.config="$dir/s3.json" \
        -s3.port.iceberg=0 -s3.port.lance=0 \
        -master.volumeSizeLimitMB=64 -volume.max=8 >"$dir/weed.log" 2>&1 &
    WEED_PID=$!
    eval "$pids_var+=($WEED_PID)"
    S3="http://$ip:${P[0]}"
}

weed_up() {
    if ! kill -0 "$WEED_PID" 2>/dev/null && [ "$WEED_RESTARTS" -lt 3 ]; then
        local dir=${WEED_ARGS[2]}
        WEED_RESTARTS=$((WEED_RESTARTS + 1))
        mv "$dir/weed.log" "$dir/weed.log.$WEED_RESTARTS" 2>/dev/null || true
        echo "SeaweedFS exited; starting it again on other ports (log: weed.log.$WEED_RESTARTS)" >&2
        rm -rf "$dir/data"
        start_weed "${WEED_ARGS[@]}"
    fi
    s3 -X PUT "$S3/models"
}

# s3 ARGS...: curl with the access key's SigV4 signature (PUT a bucket, -T an object).
s3() { curl -sf --aws-sigv4 "aws:amz:$S3_REGION:s3" --user "$S3_ACCESS:$S3_SECRET" "$@"; }

# upload_dir DIR URL: every file of DIR as an object under URL; prints how many went up.
upload_dir() {
    local f n=0
    for f in "$1"/*; do
        s3 -T "$f" "$2/$(basename "$f")" >/dev/null && n=$((n + 1))
    done
    echo "$n"
}
