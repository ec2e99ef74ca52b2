//! `K8sRuntime` against kube's mock service: `observe` reads only the watch caches (no API
//! call) and what it makes of them (engine and router endpoints from their own selectors,
//! router URLs on the router contract's ports, readiness, pods being deleted left out, other
//! pools and namespaces ignored); the exact API calls `apply` makes, in order.

use std::collections::VecDeque;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tidegate_operator::k8s::cache::Caches;
use tidegate_operator::k8s::owners::OwnerBook;
use tidegate_operator::ports::{Endpoint, PoolRef, WorkloadRuntime};
use tidegate_operator::workload_runtime::kubernetes::K8sRuntime;

/// One expected call: method, path, substrings of its query, and the answer (None: echo
/// the body back, as a server-side apply does).
struct Call {
    method: Method,
    path: &'static str,
    query_has: Vec<&'static str>,
    answer: Option<Value>,
}

fn apply(path: &'static str) -> Call {
    Call {
        method: Method::PATCH,
        path,
        query_has: vec!["fieldManager=tidegate-operator", "force=true"],
        answer: None,
    }
}

/// Serves `calls` in order and returns the bodies the runtime sent.
async fn serve(
    mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>,
    calls: Vec<Call>,
) -> Vec<Value> {
    let mut calls: VecDeque<Call> = calls.into();
    let mut sent = Vec::new();
    while let Some(call) = calls.pop_front() {
        let (req, send) = tokio::time::timeout(Duration::from_secs(10), handle.next_request())
            .await
            .expect("a call in time")
            .expect("a call");
        let (parts, body) = req.into_parts();
        assert_eq!(
            (&parts.method, parts.uri.path()),
            (&call.method, call.path),
            "call out of order: {} {}",
            parts.method,
            parts.uri
        );
        let query = parts.uri.query().unwrap_or_default();
        for q in &call.query_has {
            assert!(query.contains(q), "{}: {q} not in {query}", parts.uri);
        }
        let bytes = body.collect_bytes().await.expect("body");
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("JSON body")
        };
        let answer = call.answer.unwrap_or_else(|| body.clone());
        sent.push(body);
        send.send_response(
            Response::builder()
                .status(StatusCode::OK)
                .body(Body::from(serde_json::to_vec(&answer).expect("json")))
                .expect("response"),
        );
    }
    sent
}

fn pod(name: &str, ip: &str, ready: bool, deleting: bool) -> Value {
    let mut p = json!({
        "metadata": {"name": name, "namespace": "prod"},
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]
        }
    });
    if deleting {
        p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    p
}

fn labelled(mut pod: Value, app: &str, pool: &str) -> Value {
    pod["metadata"]["labels"] = json!({"app.kubernetes.io/name": app, "tidegate.dev/pool": pool});
    pod
}

fn elsewhere(mut pod: Value) -> Value {
    pod["metadata"]["namespace"] = json!("staging");
    pod
}

fn pool_ref() -> PoolRef {
    PoolRef {
        namespace: "prod".into(),
        name: "chat".into(),
    }
}

#[tokio::test]
async fn observe_reads_engines_and_routers_from_the_caches_by_their_own_selectors() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "chat", "namespace": "prod"},
        "spec": {"replicas": 1, "selector": {}, "template": {}},
        "status": {"readyReplicas": 1}
    });
    let pods = vec![
        labelled(
            pod("chat-x", "10.0.0.1", true, false),
            "tidegate-engine",
            "chat",
        ),
        labelled(
            pod("chat-router-b", "10.0.1.2", false, false),
            "tidegate-router",
            "chat",
        ),
        labelled(
            pod("chat-router-a", "fd00::7", true, false),
            "tidegate-router",
            "chat",
        ),
        labelled(
            pod("chat-router-gone", "10.0.1.3", true, true),
            "tidegate-router",
            "chat",
        ),
        // Another pool's engine, and a pool of the same name in another namespace.
        labelled(
            pod("other-x", "10.0.0.9", true, false),
            "tidegate-engine",
            "other",
        ),
        elsewhere(labelled(
            pod("chat-y", "10.0.2.1", true, false),
            "tidegate-engine",
            "chat",
        )),
    ];
    let caches = Caches::preloaded(
        vec![serde_json::from_value(deployment).expect("deployment")],
        pods.into_iter()
            .map(|p| serde_json::from_value(p).expect("pod"))
            .collect(),
        Vec::new(),
    );
    let runtime = K8sRuntime::new(Client::new(service, "default"), OwnerBook::new(), caches);
    let state = runtime.observe(&pool_ref()).await.expect("observe");
    let call = tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await;
    assert!(
        call.is_err(),
        "observe asked the API server: {:?}",
        call.ok().flatten().map(|(r, _)| r.uri().clone())
    );
    assert_eq!(state.replicas, Some(1));
    assert_eq!(
        state.endpoints.iter().map(|e| &e.name).collect::<Vec<_>>(),
        ["chat-x"]
    );
    assert_eq!(
        state.routers,
        vec![
            Endpoint {
                name: "chat-router-a".into(),
                api_url: "http://[fd00::7]:8000".into(),
                admin_url: "http://[fd00::7]:8001".into(),
                ready: true,
            },
            Endpoint {
                name: "chat-router-b".into(),
                api_url: "http://10.0.1.2:8000".into(),
                admin_url: "http://10.0.1.2:8001".into(),
                ready: false,
            },
        ],
        "sorted by name, the one being deleted left out"
    );
    assert!(
        !state.selector.contains("tidegate-router"),
        "{}",
        state.selector
    );
}

#[tokio::test]
async fn a_failing_model_fetch_is_read_from_the_engine_pods_init_container() {
    // The pod as the kubelet reports it: fetch-model exited 1 with its cause as the
    // termination message, and waits to be restarted (CrashLoopBackOff).
    let message = "model fetch failed: s3://models/tiny: credentials refused: 403 Forbidden: SignatureDoesNotMatch: The request signature we calculated does not match the signature you provided.";
    let mut engine = labelled(
        pod("chat-x", "10.0.0.1", false, false),
        "tidegate-engine",
        "chat",
    );
    engine["status"]["initContainerStatuses"] = json!([{
        "name": "fetch-model", "image": "e", "imageID": "", "ready": false, "restartCount": 2,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s restarting failed container"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": message}}
    }]);
    let (service, _handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let caches = Caches::preloaded(
        Vec::new(),
        vec![serde_json::from_value(engine).expect("pod")],
        Vec::new(),
    );
    let runtime = K8sRuntime::new(Client::new(service, "default"), OwnerBook::new(), caches);
    let state = runtime.observe(&pool_ref()).await.expect("observe");
    assert_eq!(state.model_problem, Some(format!("pod chat-x: {message}")));
    assert!(state.endpoints.iter().all(|e| !e.ready));
}

#[tokio::test]
async fn apply_writes_engine_and_router_objects_front_door_last() {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let runtime = K8sRuntime::new(
        Client::new(service, "default"),
        OwnerBook::new(),
        Caches::default(),
    );
    let spec: tidegate_api::InferencePoolSpec = serde_json::from_value(json!({
        "model": {"name": "m", "uri": "file:///models/m"},
        "engine": {"image": "engine:1"},
        "replicas": {"min": 0, "max": 3},
        "router": {"replicas": 3}
    }))
    .expect("spec");
    let calls = vec![
        apply("/apis/apps/v1/namespaces/prod/deployments/chat"),
        apply("/api/v1/namespaces/prod/services/chat-engines"),
        apply("/apis/policy/v1/namespaces/prod/poddisruptionbudgets/chat"),
        apply("/apis/apps/v1/namespaces/prod/deployments/chat-router"),
        apply("/apis/policy/v1/namespaces/prod/poddisruptionbudgets/chat-router"),
        apply("/api/v1/namespaces/prod/services/chat"),
    ];
    let server = tokio::spawn(serve(handle, calls));
    runtime
        .apply(&pool_ref(), &spec, 0, &[])
        .await
        .expect("apply");
    let sent = server.await.expect("server");
    // Engines scaled to zero; the routers stay, to hold requests while the pool scales up.
    assert_eq!(sent[0]["spec"]["replicas"], 0);
    assert_eq!(sent[3]["spec"]["replicas"], 3);
    let args = sent[3]["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect::<Vec<_>>()
        .join(" ");
    assert!(args.starts_with("route "), "{args}");
    assert!(args.contains("--limit-share 3"), "{args}");
    assert_eq!(
        sent[5]["spec"]["selector"]["app.kubernetes.io/name"],
        "tidegate-router"
    );
}
