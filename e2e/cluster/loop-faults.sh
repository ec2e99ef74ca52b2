# shellcheck shell=bash
# Sourced by e2e/cluster/loop-steps.sh with the pool at 3 engine pods under load: the faults,
# each with the figure of what it cost.
#   1. an engine's process killed on the node (its container's task gone) with a stream on it
#      through the router: that stream ends with the router's error event, a stream on another
#      engine completes, every router takes the engine out within a second, the kubelet
#      restarts the container in the same pod and the pool recovers;
#   2. an engine pod force-deleted (no grace asked) with a stream on it: the stream finishes
#      within the kubelet's minimum grace or ends with the error event, never hangs; every
#      router takes the engine out (the operator's push, on its engine-pod watch) before that
#      grace ends; the ReplicaSet's new pod joins;
#   3. a router pod deleted: requests through the Service, each retried, all succeed; the
#      PodDisruptionBudget refuses to evict the other router while one is missing.
# FAULTS collects "unix-time what" for the load's loss accounting in loop-steps.sh.

echo "   -- faults"
FAULTS=()
ROUTER_SEL="app.kubernetes.io/name=tidegate-router,tidegate.dev/pool=$POOL"
routers_count() { kubectl -n "$NS" get pods -l "$ROUTER_SEL" -o name | grep -c .; }
# engine_pids: "pod pid restarts" for each engine pod: the host pid of its engine process (its
# cgroup names the pod's uid) and its container's restart count. Found before a kill, so that
# the kill is instant and the kubelet's restart is counted from before it.
engine_pids() {
    local name uid restarts pid
    while read -r name _; do
        read -r uid restarts <<<"$(kubectl -n "$NS" get pod "$name" -o jsonpath='{.metadata.uid} {.status.containerStatuses[0].restartCount}')"
        for pid in $(pgrep -x tidegate-engine); do
            grep -qs -e "pod${uid}" -e "pod${uid//-/_}" "/proc/$pid/cgroup" && echo "$name $pid $restarts"
        done
    done < <(engine_pods)
}
# router_reaction POD SINCE [deleted]: seconds until the slowest router took POD out ("-": not yet).
router_reaction() {
    kubectl -n "$NS" logs -l "$ROUTER_SEL" --timestamps --prefix --tail=-1 2>/dev/null \
        | python3 e2e/cluster/router_reaction.py "$1" "$2" "$(routers_count)" "${3:-}"
}
# await_router_reaction LIMIT WHY POD SINCE [deleted]: the check that every router took POD
# out within LIMIT seconds (WHY says why that bound), with the time it took.
await_router_reaction() {
    local limit=$1 why=$2 r=- i
    shift 2
    for i in $(seq 1 20); do
        r=$(router_reaction "$@")
        [ "$r" != - ] && break
        sleep 0.5
    done
    if [ "$r" != - ] && python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)" "$r" "$limit"; then
        pass "every router took $1 out within ${limit}s, $why (${r}s after the fault)"
    else
        fail "every router took $1 out within ${limit}s, $why" "after ${r}s"
    fi
}
# stream_on_some_engine NAME [ARG...]: a 1000-token stream through the pool's Service, with
# load.py's further ARGs; returns once its first token arrived (the engine answering is in
# $WORK/NAME-started). Sets STREAM_PID.
stream_on_some_engine() {
    local name=$1
    shift
    rm -f "$WORK/$name-started"
    python3 e2e/load.py stream --targets "$TARGETS" --routers "$ROUTERS" --tenant "$name" --tokens 1000 \
        --started-file "$WORK/$name-started" "$@" >"$WORK/$name.txt" 2>&1 &
    STREAM_PID=$!
    wait_file "$WORK/$name-started" 20
}
# stream_elsewhere POD NAME: a stream straight at an engine pod other than POD. Sets OTHER_PID.
stream_elsewhere() {
    local ip
    ip=$(engine_pods | awk -v p="$1" '$1 != p && $3 == "true" {print $2; exit}')
    printf '[{"targets": ["%s:8000"]}]\n' "$ip" >"$WORK/$2-target.json"
    python3 e2e/load.py stream --targets "$WORK/$2-target.json" --tokens 300 >"$WORK/$2.txt" 2>&1 &
    OTHER_PID=$!
}
# expect_error_event NAME PID: the stream ended with the router's error event.
expect_error_event() {
    if wait "$2"; then
        fail "the stream on the killed engine ended with the router's error event" "it completed: killed too late"
    elif grep -q '^error event engine_stream_broken' "$WORK/$1.txt"; then
        pass "the stream on the killed engine ended with the router's error event ($(cut -c1-90 "$WORK/$1.txt"))"
    else
        fail "the stream on the killed engine ended with the router's error event" "$(cat "$WORK/$1.txt")"
    fi
}

# ---- 1. The engine's process killed on the node, by the stream's client the moment the first
# token arrives: the tiny model streams 1000 tokens in well under a second, and a kill from
# here, after polling for that token, could come after the stream ended.
engine_pids >"$WORK/engine-pids.txt"
if stream_on_some_engine victim-kill --kill-on-start "$WORK/engine-pids.txt"; then
    read -r victim pid KILLED_AT <"$WORK/victim-kill-started"
    if [ "${pid:--}" != - ]; then
        FAULTS+=("$KILLED_AT engine-process-killed")
        pass "engine pod $victim: its engine process killed on the node mid-stream, at its first token (pid $pid)"
    else
        fail "found the engine process of pod $victim on the node" "pids: $(tr '\n' ',' <"$WORK/engine-pids.txt")"
    fi
    restarts_before=$(awk -v p="$victim" '$1 == p {print $3}' "$WORK/engine-pids.txt")
    stream_elsewhere "$victim" other-kill
    expect_error_event victim-kill "$STREAM_PID"
    await_router_reaction 1 "by their own probes" "$victim" "$KILLED_AT"
    wait "$OTHER_PID" && pass "a stream on another engine completed" || fail "a stream on another engine completed" "$(cat "$WORK/other-kill.txt")"
    restarted() { [ "$(kubectl -n "$NS" get pod "$victim" -o jsonpath='{.status.containerStatuses[0].restartCount}')" -gt "$restarts_before" ]; }
    wait_for "the kubelet restarted the engine's container in the same pod" 60 restarted
else
    fail "a stream through the Service started" "$(cat "$WORK/victim-kill.txt")"
fi
wait_for "the pool recovers: 3 ready replicas again" 120 ge '{.status.readyReplicas}' 3

# ---- 2. An engine pod force-deleted.
if stream_on_some_engine victim-delete; then
    victim=$(cat "$WORK/victim-delete-started")
    stream_elsewhere "$victim" other-delete
    DELETED_AT=$(date +%s.%N)
    kubectl -n "$NS" delete pod "$victim" --grace-period=0 --force >/dev/null 2>&1
    FAULTS+=("$DELETED_AT engine-pod-force-deleted")
    pass "engine pod $victim force-deleted mid-stream"
    wait "$STREAM_PID"
    outcome=$(cat "$WORK/victim-delete.txt")
    case $outcome in
        ok) pass "its stream finished within the kubelet's minimum grace (drained)" ;;
        "error event engine_stream_broken"*) pass "its stream ended with the router's error event" ;;
        *) fail "its stream finished or ended with the router's error event" "$outcome" ;;
    esac
    # The pod still serves for the kubelet's minimum grace (2 s: its preStop sleep, cut
    # short); the operator's push, on the engine-pod watch, must come inside it.
    await_router_reaction 2 "the operator's push inside the kubelet's 2 s minimum grace" "$victim" "$DELETED_AT" deleted
    wait "$OTHER_PID" && pass "a stream on another engine completed" || fail "a stream on another engine completed" "$(cat "$WORK/other-delete.txt")"
    wait_for "the ReplicaSet's new engine pod joins: 3 ready replicas" 120 ge '{.status.readyReplicas}' 3
else
    fail "a stream through the Service started" "$(cat "$WORK/victim-delete.txt")"
fi

# ---- 3. A router pod deleted while clients keep calling the Service.
ROUTER_VICTIM=$(kubectl -n "$NS" get pods -l "$ROUTER_SEL" -o jsonpath='{.items[0].metadata.name}')
ROUTER_OTHER=$(kubectl -n "$NS" get pods -l "$ROUTER_SEL" -o jsonpath='{.items[1].metadata.name}')
(
    for i in $(seq 1 30); do
        tries=0
        while :; do
            tries=$((tries + 1))
            read -r code _ < <(python3 e2e/load.py probe --targets "$TARGETS" --routers "$ROUTERS" --tenant tenant-001 --tier standard --timeout 10)
            [ "$code" = 200 ] && break
            [ "$tries" -ge 5 ] && break
            sleep 0.3
        done
        echo "$code $tries"
        sleep 0.2
    done
) >"$WORK/router-clients.txt" 2>&1 &
CLIENTS=$!
sleep 1
# The node cordoned first: the router's replacement stays Pending, so that the PDB is seen
# holding the other router while one is missing (a replacement Ready in a second would make
# the next eviction rightly allowed).
NODE=$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')
kubectl cordon "$NODE" >/dev/null
ROUTER_DELETED_AT=$(date +%s.%N)
kubectl -n "$NS" delete pod "$ROUTER_VICTIM" --wait=false >/dev/null
FAULTS+=("$ROUTER_DELETED_AT router-pod-deleted")
pass "router pod $ROUTER_VICTIM deleted while clients call the Service (node cordoned)"
pdb_holds() { [ "$(kubectl -n "$NS" get pdb "$POOL-router" -o jsonpath='{.status.disruptionsAllowed}')" = 0 ]; }
if wait_for "the router PodDisruptionBudget allows no more disruptions" 20 pdb_holds; then
    evict=$(printf '{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"%s","namespace":"%s"}}' "$ROUTER_OTHER" "$NS" \
        | kubectl create --raw "/api/v1/namespaces/$NS/pods/$ROUTER_OTHER/eviction" -f - 2>&1)
    grep -qi 'disruption budget' <<<"$evict" && pass "evicting the other router ($ROUTER_OTHER) is refused: $(cut -c1-110 <<<"$evict")" ||
        fail "evicting the other router is refused by the PDB" "$evict"
fi
kubectl uncordon "$NODE" >/dev/null
wait "$CLIENTS"
served=$(awk '$1 == 200' "$WORK/router-clients.txt" | grep -c .)
retried=$(awk '$1 == 200 && $2 > 1' "$WORK/router-clients.txt" | grep -c .)
[ "$served" = 30 ] && pass "every call through the Service succeeded while a router left (30, $retried needed a retry)" ||
    fail "every call through the Service succeeded while a router left" "$(tr '\n' ',' <"$WORK/router-clients.txt")"
routers_ready() { [ "$(kubectl -n "$NS" get deploy "$POOL-router" -o jsonpath='{.status.readyReplicas}')" = 2 ]; }
wait_for "the router Deployment is back to 2 ready pods" 120 routers_ready
