# Shared helpers for the e2e scripts: pass/fail counting, the test API server, kubectl.
# Source it from a script run at the repository root.

E2E_PASSED=${E2E_PASSED:-0}
E2E_FAILED=${E2E_FAILED:-0}
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
K8S_TESTENV=${K8S_TESTENV:-$REPO_ROOT/../shared/testenv/k8s-testenv}

log() { printf '[e2e] %s\n' "$*" >&2; }

pass() {
    E2E_PASSED=$((E2E_PASSED + 1))
    printf '  ok   %s\n' "$1"
}

fail() {
    E2E_FAILED=$((E2E_FAILED + 1))
    printf '  FAIL %s\n' "$1"
    [ $# -gt 1 ] && printf '%s\n' "$2" | sed 's/^/       /'
    return 0
}

# check NAME CMD...: runs CMD, passes when it exits 0.
check() {
    local name=$1
    shift
    local out
    if out=$("$@" 2>&1); then pass "$name"; else fail "$name" "$out"; fi
}

# summary: prints the closing line and returns non-zero when anything failed.
summary() {
    printf '%s passed, %s failed\n' "$E2E_PASSED" "$E2E_FAILED"
    [ "$E2E_FAILED" -eq 0 ]
}

# wait_context: what a timed-out wait_for prints under its FAIL line. A script redefines it
# (the objects' status, the operator's log tail); the default prints nothing.
wait_context() { :; }

# wait_for NAME SECONDS CMD...: polls CMD once a second until it succeeds (pass, with the
# seconds it took) or SECONDS have gone (fail, with wait_context's output; returns 1).
wait_for() {
    local name=$1 secs=$2
    shift 2
    local t0=$SECONDS
    while [ $((SECONDS - t0)) -lt "$secs" ]; do
        if "$@" >/dev/null 2>&1; then
            pass "$name ($((SECONDS - t0))s)"
            return 0
        fi
        sleep 1
    done
    fail "$name (timed out after ${secs}s)" "$(wait_context)"
    return 1
}

# build_binaries PROFILE: builds tidegate-operator and tidegate-engine, debug or release.
# wait_file FILE SECONDS: until FILE exists (a background client's "in flight" mark).
wait_file() {
    local i
    for i in $(seq 1 $(($2 * 10))); do
        [ -e "$1" ] && return 0
        sleep 0.1
    done
    return 1
}

build_binaries() {
    local flags=()
    [ "$1" = release ] && flags=(--release)
    cargo build --quiet "${flags[@]}" -p tidegate-operator -p tidegate-engine
}

# listen_ports N: N distinct loopback ports below the ephemeral range that can be bound right
# now (not listening, and not the local side of any connection, TIME-WAIT included).
listen_ports() {
    python3 - "$1" <<'PY'
import random, socket, sys
want = int(sys.argv[1])
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    low = 32768
high = low if low > 21000 else 32768
found = []
for _ in range(500):
    port = random.randrange(20000, high)
    if port in found:
        continue
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    found.append(port)
    if len(found) == want:
        break
print(" ".join(map(str, found)))
PY
}

# start_api_server STATE_DIR: starts etcd + the real apiextensions API server, exports
# KUBECONFIG and PATH (with the bundled kubectl), and stops it when the script exits.
start_api_server() {
    export K8S_TESTENV_STATE=$1
    [ -x "$K8S_TESTENV" ] || { log "k8s-testenv not found at $K8S_TESTENV"; return 1; }
    local install_log
    install_log=$(mktemp)
    if ! "$K8S_TESTENV" install >"$install_log" 2>&1; then
        cat "$install_log" >&2
        log "k8s-testenv install failed"
        return 1
    fi
    rm -f "$install_log"
    # The test API server picks random loopback ports, which may collide with the client
    # side of connections still in TIME-WAIT after an earlier load ("address already in
    # use"); the API server and etcd client ports are picked here outside the ephemeral
    # range, and a failed start is retried with fresh ports.
    local exports="" attempt ports errors
    errors=$(mktemp)
    for attempt in 1 2 3; do
        read -r -a ports <<<"$(listen_ports 2)"
        exports=$(K8S_TESTENV_APISERVER_PORT=${ports[0]:-} K8S_TESTENV_ETCD_PORT=${ports[1]:-} \
            "$K8S_TESTENV" start 2>"$errors") && break
        exports=""
        log "API server failed to start (attempt $attempt of 3)"
        "$K8S_TESTENV" stop --purge >/dev/null 2>&1 || true
        sleep 2
    done
    if [ -z "$exports" ]; then
        tail -20 "$errors" >&2
        rm -f "$errors"
        log "API server failed to start"
        return 1
    fi
    rm -f "$errors"
    eval "$exports"
    eval "$("$K8S_TESTENV" env)"
    trap 'stop_api_server' EXIT
    log "API server up: $(kubectl version 2>/dev/null | grep Server)"
}

stop_api_server() {
    "$K8S_TESTENV" stop --purge >/dev/null 2>&1 || true
}

# apply_crds: applies crds/ and waits until they are served.
apply_crds() {
    kubectl apply -f "$REPO_ROOT/crds/" >/dev/null &&
        kubectl wait --for condition=Established crd/inferencepools.tidegate.dev crd/tierpolicies.tidegate.dev --timeout=60s >/dev/null
}
