//! Controller tests against kube's mock service (the ApiServerVerifier pattern): each
//! `Scenario` says what the watch caches hold (Deployment, pods, TierPolicy: never read from
//! the API server by a tick) and lists the exact API calls one reconcile must make, in order,
//! with checks on their bodies, and the canned answers. Events (events.k8s.io) may come at any point and
//! are refused with 403 to prove that a cluster refusing Events does not break reconcile.
//! Metrics and engine control are fakes; the workload runtime and registry are the real
//! Kubernetes adapters.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::ObjectMeta;
use kube::client::Body;
use serde_json::{Value, json};
use tidegate_api::InferencePool;
use tidegate_api::engine_admin::{
    AdmittedTenant, AdmittedTenants, DrainState, DrainStatus, EnginePolicy,
};
use tidegate_api::status::InferencePoolStatus;
use tidegate_operator::driver::Driver;
use tidegate_operator::k8s::cache::Caches;
use tidegate_operator::k8s::controller::{Context, reconcile};
use tidegate_operator::k8s::lenient::Lenient;
use tidegate_operator::k8s::metrics::OperatorMetrics;
use tidegate_operator::k8s::owners::OwnerBook;
use tidegate_operator::plan::{MetricsProblem, PoolMetrics};
use tidegate_operator::ports::{ControlError, Endpoint, EngineControl, MetricsSource, PoolRef};
use tidegate_operator::registry_store::config_map::ConfigMapRegistry;
use tidegate_operator::status_sink::kubernetes::EventSink;
use tidegate_operator::workload_runtime::kubernetes::K8sRuntime;

const NOW: u64 = 1_800_000_000_000;

// ---------- fakes ----------

struct FakeMetrics(Result<PoolMetrics, MetricsProblem>);

impl MetricsSource for FakeMetrics {
    async fn read(
        &self,
        _: &PoolRef,
        _: &tidegate_api::InferencePoolSpec,
        _: &[Endpoint],
        _: u64,
    ) -> Result<PoolMetrics, MetricsProblem> {
        self.0.clone()
    }
}

/// (router admin URL, engine names pushed to it).
type EndpointPush = (String, Vec<String>);

#[derive(Clone, Default)]
struct FakeControl {
    pushes: Arc<Mutex<Vec<(String, String, EnginePolicy)>>>,
    drains: Arc<Mutex<Vec<String>>>,
    endpoint_pushes: Arc<Mutex<Vec<EndpointPush>>>,
}

impl EngineControl for FakeControl {
    async fn push_endpoints(
        &self,
        router: &Endpoint,
        _: &str,
        set: &tidegate_api::router::RouterEndpoints,
    ) -> Result<tidegate_api::router::EndpointsView, ControlError> {
        if let Ok(mut p) = self.endpoint_pushes.lock() {
            let names = set.endpoints.iter().map(|e| e.name.clone()).collect();
            p.push((router.admin_url.clone(), names));
        }
        Ok(Default::default())
    }
    async fn push_policy(
        &self,
        ep: &Endpoint,
        token: &str,
        policy: &EnginePolicy,
    ) -> Result<(), ControlError> {
        if let Ok(mut p) = self.pushes.lock() {
            p.push((ep.name.clone(), token.to_string(), policy.clone()));
        }
        Ok(())
    }
    async fn tenants_since(
        &self,
        _: &Endpoint,
        _: &str,
        _: u64,
    ) -> Result<AdmittedTenants, ControlError> {
        Ok(AdmittedTenants {
            now_ms: NOW,
            tenants: vec![AdmittedTenant {
                tenant: "acme".into(),
                tier: "gold".into(),
                first_admitted_ms: NOW - 1000,
            }],
        })
    }
    async fn drain(&self, ep: &Endpoint, _: &str, _: u64) -> Result<DrainStatus, ControlError> {
        if let Ok(mut d) = self.drains.lock() {
            d.push(ep.name.clone());
        }
        Ok(DrainStatus {
            state: DrainState::Drained,
            in_flight: 0,
        })
    }
    async fn drain_status(&self, _: &Endpoint, _: &str) -> Result<DrainStatus, ControlError> {
        Ok(DrainStatus {
            state: DrainState::Drained,
            in_flight: 0,
        })
    }
}

// ---------- fixtures ----------

fn pool(extra_spec: Value) -> InferencePool {
    let mut spec = json!({
        "model": {"name": "llama", "uri": "file:///models/llama"},
        "engine": {"image": "engine:1", "resources": {"gpus": 1}},
        "replicas": {"min": 1, "max": 3},
        "scaling": {
            "capacityHintTokensPerSecond": 100.0,
            "scaleUpStabilization": "0s",
            "scaleDownStabilization": "0s"
        },
        "tierPolicyRef": {"name": "tiers"}
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra_spec.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    let mut p = InferencePool::new("chat", serde_json::from_value(spec).expect("spec"));
    p.metadata = ObjectMeta {
        name: Some("chat".into()),
        namespace: Some("prod".into()),
        uid: Some("pool-uid".into()),
        generation: Some(7),
        resource_version: Some("1".into()),
        ..ObjectMeta::default()
    };
    p
}

fn tier_policy() -> Value {
    json!({
        "apiVersion": "tidegate.dev/v1alpha1", "kind": "TierPolicy",
        "metadata": {"name": "tiers", "namespace": "prod"},
        "spec": {
            "tiers": [{"name": "gold", "priority": 10}, {"name": "free"}],
            "defaultTier": "free",
            "tenancy": {"apiKeys": {"secretName": "keys"}}
        }
    })
}

fn keys_secret() -> Value {
    use std::io::Write;
    let yaml = "- tenant: acme\n  tier: gold\n  apiKey: abc\n";
    let mut b64 = Vec::new();
    let _ = write!(b64, "{}", base64(yaml.as_bytes()));
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "keys", "namespace": "prod"},
        "data": {"tenants.yaml": String::from_utf8(b64).expect("utf8")}
    })
}

fn base64(bytes: &[u8]) -> String {
    const T: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn admin_secret() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "chat-admin", "namespace": "prod"},
        "data": {"token": base64(b"s3cret")}
    })
}

fn deployment(replicas: i32, ready: i32) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "chat", "namespace": "prod"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": "tidegate-engine", "tidegate.dev/pool": "chat"}},
            "template": {"spec": {"containers": []}}
        },
        "status": {"replicas": replicas, "readyReplicas": ready}
    })
}

fn pods(names: &[&str]) -> Value {
    pods_in(names, 0, "tidegate-engine")
}

/// Router pods: addresses after the engines'.
fn router_pods(names: &[&str]) -> Value {
    pods_in(names, 100, "tidegate-router")
}

fn pods_in(names: &[&str], first_ip: usize, app: &str) -> Value {
    let items: Vec<Value> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            json!({
                "metadata": {"name": n, "namespace": "prod",
                    "labels": {"app.kubernetes.io/name": app, "tidegate.dev/pool": "chat"}},
                "status": {
                    "podIP": format!("10.0.0.{}", first_ip + i + 1),
                    "conditions": [{"type": "Ready", "status": "True"}]
                }
            })
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})
}

fn metrics(running: f64, waiting: f64, tps: f64, pods: i32) -> PoolMetrics {
    PoolMetrics {
        decode_tokens_per_second: tps,
        running,
        waiting,
        queue_wait_p99_seconds: Some(if waiting > 0.0 { 3.0 } else { 0.01 }),
        kv_utilization: 0.5,
        evictions_per_second: 0.0,
        overload_refusals_per_second: 0.0,
        pods_reporting: pods,
        sampled_at: NOW,
        ..PoolMetrics::default()
    }
}

/// The requeue delay of an Action, in seconds (from its Debug form, e.g.
/// `Action { requeue_after: Some(14.799472015s) }`; Action has no getter).
fn requeue_secs(action: &impl std::fmt::Debug) -> Option<f64> {
    let text = format!("{action:?}");
    let inner = text.split("Some(").nth(1)?.split(')').next()?;
    let digits = inner.trim_end_matches(|c: char| c.is_ascii_alphabetic() || c == 'µ');
    let unit = &inner[digits.len()..];
    let value: f64 = digits.parse().ok()?;
    Some(match unit {
        "s" => value,
        "ms" => value / 1e3,
        "µs" => value / 1e6,
        "ns" => value / 1e9,
        _ => return None,
    })
}

// ---------- the verifier ----------

type Check = Box<dyn Fn(&Value) + Send>;

/// One expected API call and its answer.
struct Call {
    method: Method,
    path: String,
    query_has: Vec<&'static str>,
    content_type: Option<&'static str>,
    check: Option<Check>,
    status: StatusCode,
    /// None: echo the request body back.
    answer: Option<Value>,
}

impl Call {
    fn new(method: Method, path: &str, status: StatusCode, answer: Option<Value>) -> Self {
        Call {
            method,
            path: path.to_string(),
            query_has: vec![],
            content_type: None,
            check: None,
            status,
            answer,
        }
    }
    fn get(path: &str, answer: Value) -> Self {
        Call::new(Method::GET, path, StatusCode::OK, Some(answer))
    }
    fn missing(path: &str) -> Self {
        let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": "not found", "reason": "NotFound", "code": 404});
        Call::new(Method::GET, path, StatusCode::NOT_FOUND, Some(status))
    }
    /// A server-side apply by the operator's field manager, forced.
    fn apply(path: &str, check: impl Fn(&Value) + Send + 'static) -> Self {
        let mut c = Call::new(Method::PATCH, path, StatusCode::OK, None);
        c.query_has = vec!["fieldManager=tidegate-operator", "force=true"];
        c.content_type = Some("application/apply-patch+yaml");
        c.check = Some(Box::new(check));
        c
    }
    fn merge(path: &str, answer: Option<Value>, check: impl Fn(&Value) + Send + 'static) -> Self {
        let mut c = Call::new(Method::PATCH, path, StatusCode::OK, answer);
        c.content_type = Some("application/merge-patch+json");
        c.check = Some(Box::new(check));
        c
    }
    fn create(path: &str, check: impl Fn(&Value) + Send + 'static) -> Self {
        let mut c = Call::new(Method::POST, path, StatusCode::CREATED, None);
        c.check = Some(Box::new(check));
        c
    }
}

fn owned_by_pool(v: &Value) {
    let o = &v["metadata"]["ownerReferences"][0];
    assert_eq!(o["kind"], "InferencePool", "{v}");
    assert_eq!(o["uid"], "pool-uid");
    assert_eq!(o["controller"], true);
}

const DEP: &str = "/apis/apps/v1/namespaces/prod/deployments/chat";
const SVC: &str = "/api/v1/namespaces/prod/services/chat";
const PDB: &str = "/apis/policy/v1/namespaces/prod/poddisruptionbudgets/chat";
const ROUTER_DEP: &str = "/apis/apps/v1/namespaces/prod/deployments/chat-router";
const ROUTER_PDB: &str = "/apis/policy/v1/namespaces/prod/poddisruptionbudgets/chat-router";
const ENGINES_SVC: &str = "/api/v1/namespaces/prod/services/chat-engines";
const PODS: &str = "/api/v1/namespaces/prod/pods";
const ADMIN: &str = "/api/v1/namespaces/prod/secrets/chat-admin";
const TENANTS: &str = "/api/v1/namespaces/prod/configmaps/chat-tenants";
const STATUS: &str = "/apis/tidegate.dev/v1alpha1/namespaces/prod/inferencepools/chat/status";

fn apply_workload(replicas: i64) -> Vec<Call> {
    vec![
        Call::apply(DEP, move |v| {
            owned_by_pool(v);
            assert_eq!(v["spec"]["replicas"], replicas, "{v}");
            let c = &v["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], "1");
            assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        }),
        Call::apply(ENGINES_SVC, |v| {
            owned_by_pool(v);
            assert_eq!(v["spec"]["clusterIP"], "None");
            assert_eq!(
                v["spec"]["selector"]["app.kubernetes.io/name"],
                "tidegate-engine"
            );
            assert_eq!(v["spec"]["ports"][0]["port"], 8000);
            assert_eq!(v["spec"]["ports"][1]["port"], 8001);
        }),
        Call::apply(PDB, |v| {
            owned_by_pool(v);
            assert_eq!(v["spec"]["maxUnavailable"], 1);
        }),
        Call::apply(ROUTER_DEP, |v| {
            owned_by_pool(v);
            assert_eq!(v["spec"]["replicas"], 2, "{v}");
            let c = &v["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(c["args"][0], "route");
            assert!(
                c["resources"]["limits"].get("nvidia.com/gpu").is_none(),
                "{c}"
            );
            assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        }),
        Call::apply(ROUTER_PDB, |v| {
            owned_by_pool(v);
            assert_eq!(v["spec"]["maxUnavailable"], 1);
            assert_eq!(
                v["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
                "tidegate-router"
            );
        }),
        // Last: clients move to the routers once those exist.
        Call::apply(SVC, |v| {
            owned_by_pool(v);
            assert_eq!(
                v["spec"]["selector"]["app.kubernetes.io/name"],
                "tidegate-router"
            );
            assert_eq!(v["spec"]["ports"][0]["port"], 8000);
            assert_eq!(v["spec"]["ports"].as_array().map(Vec::len), Some(1));
        }),
    ]
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
}

/// The scenarios: what the cluster holds and what one reconcile must do about it.
enum Scenario {
    /// 2 ready replicas under heavy load: scale to 3 (the max), create the admin token,
    /// persist the tenants the engines report, status with conditions.
    ScaleUp,
    /// The referenced TierPolicy is missing and nothing runs yet: Ready=False
    /// TierPolicyNotFound, the workload is still created with min replicas, the existing
    /// admin Secret is used (never rewritten), no registry write (nothing changed).
    TierPolicyMissing,
    /// 3 replicas with no load: drain the victim, mark it with a low deletion cost, scale to 2.
    ScaleDown,
}

impl Scenario {
    fn pool(&self) -> InferencePool {
        match self {
            Scenario::ScaleUp | Scenario::TierPolicyMissing => pool(json!({})),
            Scenario::ScaleDown => pool(json!({"tierPolicyRef": null})),
        }
    }

    fn metrics(&self) -> Result<PoolMetrics, MetricsProblem> {
        match self {
            Scenario::ScaleUp => Ok(metrics(40.0, 20.0, 200.0, 2)),
            Scenario::TierPolicyMissing => Err(MetricsProblem::NoData("no pods".into())),
            Scenario::ScaleDown => Ok(metrics(1.0, 0.0, 20.0, 3)),
        }
    }

    /// What the watch caches hold: the Deployment, the engine and router pods, the policy.
    fn cache(&self) -> Caches {
        let (deployment, engines, routers, policy) = match self {
            Scenario::ScaleUp => (
                Some(deployment(2, 2)),
                pods(&["chat-a", "chat-b"]),
                router_pods(&["chat-router-a", "chat-router-b"]),
                Some(tier_policy()),
            ),
            Scenario::TierPolicyMissing => (None, pods(&[]), router_pods(&[]), None),
            Scenario::ScaleDown => (
                Some(deployment(3, 3)),
                pods(&["chat-a", "chat-b", "chat-c"]),
                router_pods(&[]),
                None,
            ),
        };
        let items = |list: Value| -> Vec<Pod> {
            serde_json::from_value(list["items"].clone()).expect("pods")
        };
        let mut all = items(engines);
        all.extend(items(routers));
        Caches::preloaded(
            deployment
                .map(|d| serde_json::from_value(d).expect("deployment"))
                .into_iter()
                .collect(),
            all,
            policy
                .map(|p| serde_json::from_value(p).expect("policy"))
                .into_iter()
                .collect(),
        )
    }

    fn calls(&self) -> Vec<Call> {
        let pool_json = serde_json::to_value(self.pool()).expect("pool json");
        let mut calls = Vec::new();
        match self {
            Scenario::ScaleUp => {
                calls.push(Call::get(
                    "/api/v1/namespaces/prod/secrets/keys",
                    keys_secret(),
                ));
                calls.push(Call::missing(ADMIN));
                calls.push(Call::create("/api/v1/namespaces/prod/secrets", |v| {
                    owned_by_pool(v);
                    assert_eq!(v["metadata"]["name"], "chat-admin");
                    let token = v["stringData"]["token"].as_str().expect("token");
                    assert_eq!(token.len(), 64);
                }));
                calls.extend(apply_workload(3));
                calls.push(Call::missing(TENANTS));
                calls.push(Call::apply(TENANTS, |v| {
                    owned_by_pool(v);
                    assert!(v["binaryData"]["registry.bin"].as_str().is_some(), "{v}");
                    assert_eq!(
                        v["metadata"]["annotations"]["tidegate.dev/registry-parts"],
                        "1"
                    );
                }));
                calls.push(Call::merge(STATUS, Some(pool_json), |v| {
                    let s = &v["status"];
                    assert_eq!(s["desiredReplicas"], 3, "{v}");
                    assert_eq!(s["replicas"], 2);
                    assert_eq!(s["readyReplicas"], 2);
                    assert_eq!(s["observedGeneration"], 7);
                    assert_eq!(condition(s, "MetricsAvailable")["status"], "True");
                    assert_eq!(condition(s, "Scaling")["status"], "True");
                    assert!(
                        s["selector"]
                            .as_str()
                            .expect("selector")
                            .contains("tidegate.dev/pool=chat")
                    );
                    let d = &s["recentDecisions"][0];
                    assert_eq!((d["from"].as_i64(), d["to"].as_i64()), (Some(2), Some(3)));
                    assert_eq!(d["basis"], "Ceiling", "{d}");
                }));
            }
            Scenario::TierPolicyMissing => {
                calls.push(Call::get(ADMIN, admin_secret()));
                calls.extend(apply_workload(1));
                calls.push(Call::missing(TENANTS));
                calls.push(Call::merge(STATUS, Some(pool_json), |v| {
                    let s = &v["status"];
                    let ready = condition(s, "Ready");
                    assert_eq!(ready["status"], "False", "{v}");
                    assert_eq!(ready["reason"], "TierPolicyNotFound");
                    assert_eq!(condition(s, "MetricsAvailable")["status"], "False");
                    assert_eq!(s["desiredReplicas"], 1);
                }));
            }
            Scenario::ScaleDown => {
                calls.push(Call::get(ADMIN, admin_secret()));
                calls.push(Call::merge(&format!("{PODS}/chat-c"), Some(pods(&["chat-c"])["items"][0].clone()), |v| {
                    assert_eq!(
                        v["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"],
                        "-1000"
                    );
                }));
                calls.extend(apply_workload(2));
                calls.push(Call::missing(TENANTS));
                calls.push(Call::apply(TENANTS, owned_by_pool));
                calls.push(Call::merge(STATUS, Some(pool_json), |v| {
                    assert_eq!(v["status"]["desiredReplicas"], 2, "{v}");
                }));
            }
        }
        calls
    }
}

/// Serves the expected calls in order; answers events with 403. Returns how many events
/// were refused.
async fn verify(
    mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>,
    calls: Vec<Call>,
) -> usize {
    let mut calls: VecDeque<Call> = calls.into();
    let mut events = 0;
    while let Some((req, send)) = handle.next_request().await {
        let (parts, body) = req.into_parts();
        let bytes = body.collect_bytes().await.expect("body");
        let path = parts.uri.path().to_string();
        if path.contains("/events") {
            events += 1;
            let refusal = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "message": "events are forbidden", "reason": "Forbidden", "code": 403});
            send.send_response(
                Response::builder()
                    .status(StatusCode::FORBIDDEN)
                    .body(Body::from(serde_json::to_vec(&refusal).expect("json")))
                    .expect("response"),
            );
            continue;
        }
        let call = calls
            .pop_front()
            .unwrap_or_else(|| panic!("unexpected call {} {}", parts.method, parts.uri));
        assert_eq!(
            (&parts.method, path.as_str()),
            (&call.method, call.path.as_str()),
            "call out of order: got {} {}",
            parts.method,
            parts.uri
        );
        let query = parts.uri.query().unwrap_or_default();
        for q in &call.query_has {
            assert!(
                query.contains(q),
                "{} {}: missing {q}",
                parts.method,
                parts.uri
            );
        }
        if let Some(ct) = call.content_type {
            let got = parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            assert_eq!(got, ct, "{} {}", parts.method, parts.uri);
        }
        let sent: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("request body is JSON")
        };
        if let Some(check) = &call.check {
            check(&sent);
        }
        let answer = call.answer.clone().unwrap_or(sent);
        send.send_response(
            Response::builder()
                .status(call.status)
                .body(Body::from(serde_json::to_vec(&answer).expect("json")))
                .expect("response"),
        );
        if calls.is_empty() {
            // Give trailing event posts a moment, then stop.
            while let Ok(Some((req, send))) =
                tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await
            {
                assert!(
                    req.uri().path().contains("/events"),
                    "unexpected call {}",
                    req.uri()
                );
                events += 1;
                send.send_response(
                    Response::builder()
                        .status(StatusCode::FORBIDDEN)
                        .body(Body::from(Vec::new()))
                        .expect("response"),
                );
            }
            break;
        }
    }
    assert!(
        calls.is_empty(),
        "calls never made: {:?}",
        calls
            .iter()
            .map(|c| format!("{} {}", c.method, c.path))
            .collect::<Vec<_>>()
    );
    events
}

struct Run {
    events_refused: usize,
    control: FakeControl,
    metrics: Arc<OperatorMetrics>,
}

async fn run(scenario: Scenario) -> Run {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let owners = OwnerBook::new();
    let control = FakeControl::default();
    let caches = scenario.cache();
    let driver = Driver::new(
        K8sRuntime::new(client.clone(), owners.clone(), caches.clone()),
        FakeMetrics(scenario.metrics()),
        control.clone(),
        ConfigMapRegistry::new(client.clone(), owners.clone()),
    );
    let metrics = Arc::new(OperatorMetrics::new());
    let mut ctx = Context::new(
        client.clone(),
        driver,
        owners,
        EventSink::new(client),
        metrics.clone(),
    );
    ctx.clock = Arc::new(|| NOW);
    ctx.caches = caches;
    let ctx = Arc::new(ctx);
    let pool = Arc::new(Lenient::from(scenario.pool()));
    let verifier = tokio::spawn(verify(handle, scenario.calls()));
    let action = tokio::time::timeout(
        Duration::from_secs(10),
        reconcile(pool.clone(), ctx.clone()),
    )
    .await
    .expect("reconcile finished")
    .expect("reconcile succeeded");
    assert_eq!(
        requeue_secs(&action),
        Some(15.0),
        "requeue after the interval: {action:?}"
    );
    let events_refused = tokio::time::timeout(Duration::from_secs(10), verifier)
        .await
        .expect("verifier finished")
        .expect("verifier passed");
    // A trigger within the interval (e.g. our own status patch) is debounced: no API call
    // (the mock service is closed now, so any call would fail the reconcile).
    let again = reconcile(pool, ctx).await.expect("debounced reconcile");
    assert!(
        requeue_secs(&again).is_some_and(|s| s < 15.0),
        "requeued for the remaining time: {again:?}"
    );
    Run {
        events_refused,
        control,
        metrics,
    }
}

#[tokio::test]
async fn scale_up_applies_workload_registry_and_status() {
    let r = run(Scenario::ScaleUp).await;
    assert!(r.events_refused >= 1, "a ScaledUp event was attempted");
    let pushes = r.control.pushes.lock().expect("pushes").clone();
    let targets: Vec<&str> = pushes.iter().map(|(name, _, _)| name.as_str()).collect();
    assert_eq!(
        targets,
        ["chat-a", "chat-b", "chat-router-a", "chat-router-b"],
        "policy pushed to both ready engines and both routers"
    );
    // Each router, at its pod address and the router contract's admin port, got the engines.
    let sets = r.control.endpoint_pushes.lock().expect("sets").clone();
    let engines = vec!["chat-a".to_string(), "chat-b".to_string()];
    assert_eq!(
        sets,
        vec![
            ("http://10.0.0.101:8001".to_string(), engines.clone()),
            ("http://10.0.0.102:8001".to_string(), engines),
        ]
    );
    let (_, token, policy) = &pushes[0];
    assert_eq!(token.len(), 64, "the created admin token is used");
    assert_eq!(policy.admitted_tenants, vec!["acme".to_string()]);
    assert_eq!(policy.api_keys.len(), 1);
    assert_eq!(policy.api_keys[0].tenant, "acme");
    assert_eq!(policy.api_keys[0].key_sha256.len(), 64);
    let text = r.metrics.encode();
    assert!(
        text.contains("tidegate_operator_desired_replicas{namespace=\"prod\",pool=\"chat\"} 3"),
        "{text}"
    );
    assert!(text.contains("tidegate_operator_scaling_decisions_total{namespace=\"prod\",pool=\"chat\",direction=\"up\"} 1"), "{text}");
    assert!(
        text.contains("tidegate_operator_reconciles_total 1"),
        "{text}"
    );
}

#[tokio::test]
async fn missing_tier_policy_still_reconciles() {
    let r = run(Scenario::TierPolicyMissing).await;
    assert!(
        r.control.pushes.lock().expect("pushes").is_empty(),
        "no ready engines"
    );
    let text = r.metrics.encode();
    assert!(
        text.contains("tidegate_operator_metrics_available{namespace=\"prod\",pool=\"chat\"} 0"),
        "{text}"
    );
}

#[tokio::test]
async fn scale_down_drains_then_removes_the_drained_pod() {
    let r = run(Scenario::ScaleDown).await;
    assert_eq!(
        *r.control.drains.lock().expect("drains"),
        vec!["chat-c".to_string()]
    );
}

#[test]
fn status_type_round_trips() {
    // The status patch body deserializes as the CRD's status type.
    let s = InferencePoolStatus::default();
    let v = serde_json::to_value(&s).expect("json");
    let back: InferencePoolStatus = serde_json::from_value(v).expect("status");
    assert_eq!(back, s);
}
