//! The ConfigMap registry store against an in-memory ConfigMap API (kube's mock service):
//! a registry too large for one ConfigMap is split into parts and read back whole, and when
//! it shrinks the left-over shards are deleted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tidegate_operator::k8s::owners::OwnerBook;
use tidegate_operator::ports::{PoolRef, RegistryStore};
use tidegate_operator::registry::{Registry, TenantEntry};
use tidegate_operator::registry_store::config_map::{ConfigMapRegistry, SHARD_BYTES, part_name};

const PREFIX: &str = "/api/v1/namespaces/prod/configmaps/";

type Store = Arc<Mutex<BTreeMap<String, Value>>>;

fn reply(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .body(Body::from(serde_json::to_vec(body).expect("json")))
        .expect("response")
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": if code < 300 { "Success" } else { "Failure" }, "reason": reason, "code": code})
}

/// Serves GET, server-side apply (PATCH) and DELETE of ConfigMaps in namespace `prod`.
async fn serve(mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>, store: Store) {
    while let Some((req, send)) = handle.next_request().await {
        let (parts, body) = req.into_parts();
        let bytes = body.collect_bytes().await.expect("body");
        let name = parts
            .uri
            .path()
            .strip_prefix(PREFIX)
            .unwrap_or_else(|| panic!("unexpected path {}", parts.uri))
            .to_string();
        let mut cms = store.lock().expect("store");
        let response = match parts.method {
            Method::GET => match cms.get(&name) {
                Some(cm) => reply(StatusCode::OK, cm),
                None => reply(StatusCode::NOT_FOUND, &status(404, "NotFound")),
            },
            Method::PATCH => {
                let cm: Value = serde_json::from_slice(&bytes).expect("ConfigMap JSON");
                cms.insert(name, cm.clone());
                reply(StatusCode::OK, &cm)
            }
            Method::DELETE => match cms.remove(&name) {
                Some(_) => reply(StatusCode::OK, &status(200, "")),
                None => reply(StatusCode::NOT_FOUND, &status(404, "NotFound")),
            },
            m => panic!("unexpected method {m}"),
        };
        send.send_response(response);
    }
}

/// `n` tenants with ids that do not compress (so the encoded registry is large).
fn registry(n: u64) -> Registry {
    let mut r = Registry::default();
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        r.tenants.insert(
            format!("{x:016x}{i:08x}"),
            TenantEntry {
                tier: "free".into(),
                // Minute precision, as the registry persists it.
                last_seen_ms: 1_700_000_040_000,
            },
        );
    }
    r
}

/// Equality without printing a quarter of a million tenants on failure.
fn same(got: &Registry, want: &Registry) {
    assert_eq!(got.len(), want.len());
    assert!(got == want, "same size, different contents");
}

#[tokio::test]
async fn a_registry_that_shrinks_leaves_no_shards_behind() {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let store = Store::default();
    tokio::spawn(serve(handle, store.clone()));
    let client = Client::new(service, "default");
    let registries = ConfigMapRegistry::new(client, OwnerBook::new());
    let pool = PoolRef {
        namespace: "prod".into(),
        name: "chat".into(),
    };
    let names = || {
        store
            .lock()
            .expect("store")
            .keys()
            .cloned()
            .collect::<Vec<_>>()
    };

    assert_eq!(
        registries.load(&pool).await.expect("load"),
        Registry::default()
    );
    let big = registry(250_000);
    let parts = big.encode().len().div_ceil(SHARD_BYTES);
    assert!(parts >= 3, "{parts} parts");
    registries.save(&pool, &big).await.expect("save big");
    let mut expected: Vec<String> = (0..parts).map(|i| part_name("chat", i)).collect();
    expected.sort();
    assert_eq!(names(), expected);
    same(&registries.load(&pool).await.expect("load big"), &big);

    let small = registry(10);
    registries.save(&pool, &small).await.expect("save small");
    assert_eq!(names(), vec!["chat-tenants".to_string()]);
    same(&registries.load(&pool).await.expect("load small"), &small);

    // A store that starts fresh (an operator restart) learns the count when it loads.
    registries.save(&pool, &big).await.expect("save big again");
    let restarted = ConfigMapRegistry::new(
        Client::new(
            {
                let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
                tokio::spawn(serve(handle, store.clone()));
                service
            },
            "default",
        ),
        OwnerBook::new(),
    );
    same(
        &restarted.load(&pool).await.expect("load after restart"),
        &big,
    );
    restarted
        .save(&pool, &small)
        .await
        .expect("save small after restart");
    assert_eq!(names(), vec!["chat-tenants".to_string()]);
}
