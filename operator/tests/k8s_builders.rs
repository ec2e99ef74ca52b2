//! Unit tests of the pure Kubernetes object builders: pod security, GPU resources, probes,
//! drain timing, model volumes, owner references, Service/PDB/Secret shapes, registry shards,
//! the router Deployment and PDB, and the selectors that keep routers and engines apart.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ObjectMeta;
use tidegate_api::{InferencePool, InferencePoolSpec};
use tidegate_operator::k8s::deployment::{self, model_location};
use tidegate_operator::k8s::objects;
use tidegate_operator::k8s::owners::{OwnerBook, owner_reference};
use tidegate_operator::k8s::router;
use tidegate_operator::k8s::{router_selector_labels, selector_labels};
use tidegate_operator::ports::PoolRef;
use tidegate_operator::registry_store::config_map::{
    DIGEST_ANNOTATION, PARTS_ANNOTATION, REGISTRY_KEY, SHARD_BYTES, registry_config_maps,
};

fn spec(extra: serde_json::Value) -> InferencePoolSpec {
    let mut base = serde_json::json!({
        "model": {"name": "llama-8b", "uri": "pvc://weights/llama/8b"},
        "engine": {
            "image": "ghcr.io/tidegate/engine:1",
            "resources": {"gpus": 2, "cpu": "8", "memory": "64Gi"},
            "kvCache": {"diskOffload": "200Gi"},
            "drainGracePeriod": "90s"
        },
        "replicas": {"min": 1, "max": 4}
    });
    if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(base).expect("spec")
}

fn pool() -> InferencePool {
    let mut p = InferencePool::new("chat", spec(serde_json::json!({})));
    p.metadata = ObjectMeta {
        name: Some("chat".into()),
        namespace: Some("prod".into()),
        uid: Some("uid-1".into()),
        ..ObjectMeta::default()
    };
    p
}

#[test]
fn deployment_runs_restricted_pods_with_gpus() {
    let p = pool();
    let owners = vec![owner_reference(&p).expect("owner")];
    let d = deployment::deployment("chat", "prod", &p.spec, 3, owners).expect("deployment");
    let ds = d.spec.expect("spec");
    assert_eq!(ds.replicas, Some(3));
    let sel = ds.selector.match_labels.expect("selector");
    assert_eq!(sel["app.kubernetes.io/name"], "tidegate-engine");
    assert_eq!(sel["tidegate.dev/pool"], "chat");
    let owner = &d.metadata.owner_references.expect("owners")[0];
    assert_eq!(owner.controller, Some(true));
    assert_eq!(owner.kind, "InferencePool");
    assert_eq!(owner.uid, "uid-1");

    let tpl = ds.template;
    let ann = tpl
        .metadata
        .expect("meta")
        .annotations
        .expect("annotations");
    assert_eq!(ann["prometheus.io/scrape"], "true");
    assert_eq!(ann["prometheus.io/port"], "8000");
    let pod = tpl.spec.expect("pod");
    assert_eq!(pod.automount_service_account_token, Some(false));
    // 5s preStop + 90s drain + 10s margin.
    assert_eq!(pod.termination_grace_period_seconds, Some(105));
    let psc = pod.security_context.expect("pod sc");
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(
        psc.seccomp_profile.expect("seccomp").type_,
        "RuntimeDefault"
    );

    let c = &pod.containers[0];
    let sc = c.security_context.clone().expect("sc");
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(
        sc.capabilities.expect("caps").drop,
        Some(vec!["ALL".into()])
    );
    assert_eq!(sc.seccomp_profile.expect("seccomp").type_, "RuntimeDefault");

    let res = c.resources.clone().expect("resources");
    let limits = res.limits.expect("limits");
    assert_eq!(limits["nvidia.com/gpu"].0, "2");
    assert_eq!(limits["cpu"].0, "8");
    assert_eq!(limits["memory"].0, "64Gi");
    assert_eq!(res.requests.expect("requests")["nvidia.com/gpu"].0, "2");

    assert_http_probes(c);
    let pre = c
        .lifecycle
        .clone()
        .expect("lifecycle")
        .pre_stop
        .expect("preStop");
    assert_eq!(pre.sleep.expect("sleep").seconds, 5);

    let ports: Vec<(String, i32)> = c
        .ports
        .clone()
        .expect("ports")
        .into_iter()
        .map(|p| (p.name.unwrap_or_default(), p.container_port))
        .collect();
    assert_eq!(ports, vec![("http".into(), 8000), ("admin".into(), 8001)]);

    let args = c.args.clone().expect("args");
    let joined = args.join(" ");
    assert!(args[0] == "serve", "{joined}");
    for want in [
        "--model /model/llama/8b",
        "--listen 0.0.0.0:8000",
        "--admin-listen 0.0.0.0:8001",
        "--max-batch-size 64",
        "--max-batch-tokens 8192",
        "--max-queued-requests 256",
        "--kv-block-tokens 16",
        "--drain-grace 90s",
    ] {
        assert!(joined.contains(want), "{want} missing in {joined}");
    }

    let env = c.env.clone().expect("env");
    let token = env
        .iter()
        .find(|e| e.name == "TIDEGATE_ADMIN_TOKEN")
        .expect("token env");
    let key = token
        .value_from
        .clone()
        .expect("from")
        .secret_key_ref
        .expect("secret ref");
    assert_eq!(
        (key.name.as_str(), key.key.as_str()),
        ("chat-admin", "token")
    );

    let vols = pod.volumes.expect("volumes");
    let model = vols
        .iter()
        .find(|v| v.name == "model")
        .expect("model volume");
    let pvc = model.persistent_volume_claim.clone().expect("pvc");
    assert_eq!(
        (pvc.claim_name.as_str(), pvc.read_only),
        ("weights", Some(true))
    );
    let kv = vols
        .iter()
        .find(|v| v.name == "kv-offload")
        .expect("kv volume");
    assert_eq!(
        kv.empty_dir
            .clone()
            .expect("emptyDir")
            .size_limit
            .expect("limit")
            .0,
        "200Gi"
    );
    assert!(vols.iter().any(|v| v.name == "tmp"));
    let mounts = c.volume_mounts.clone().expect("mounts");
    let m = mounts
        .iter()
        .find(|m| m.name == "model")
        .expect("model mount");
    assert_eq!(m.read_only, Some(true));
}

#[test]
fn cpu_pool_has_no_gpu_and_file_models_no_volume() {
    let s = spec(serde_json::json!({
        "model": {"name": "tiny", "uri": "file:///models/tiny"},
        "engine": {"image": "e", "resources": {"gpus": 0}}
    }));
    let d = deployment::deployment("tiny", "dev", &s, 1, vec![]).expect("deployment");
    let pod = d.spec.expect("spec").template.spec.expect("pod");
    let c = &pod.containers[0];
    assert!(c.resources.clone().expect("res").limits.is_none());
    assert!(
        c.args
            .clone()
            .expect("args")
            .join(" ")
            .contains("--model /models/tiny")
    );
    let vols = pod.volumes.expect("volumes");
    assert!(
        vols.iter()
            .all(|v| v.name != "model" && v.name != "kv-offload")
    );
    assert!(d.metadata.owner_references.is_none());
}

#[test]
fn model_uris() {
    assert_eq!(model_location("file:///m").expect("file").path, "/m");
    let l = model_location("pvc://claim").expect("pvc");
    assert_eq!(
        (l.path.as_str(), l.claim.as_deref()),
        ("/model", Some("claim"))
    );
    assert!(model_location("pvc://claim/../etc").is_err());
    let s3 = model_location("s3://bucket/x").expect("s3");
    assert!(s3.fetched && s3.claim.is_none() && s3.image.is_none());
    assert!(
        s3.path
            .starts_with(&format!("{}/s3-bucket-x-", deployment::MODEL_CACHE_MOUNT)),
        "{}",
        s3.path
    );
    assert!(model_location("hf://org/m@v1").expect("hf").fetched);
    assert!(model_location("s3:///x").is_err());
    assert!(model_location("gs://bucket/x").is_err());
    assert!(model_location("file://relative").is_err());
    let oci = model_location("oci://registry.example.com:5000/models/m:q4").expect("oci");
    assert_eq!(
        (
            oci.path.as_str(),
            oci.image.as_deref(),
            oci.claim.as_deref()
        ),
        (
            "/model",
            Some("registry.example.com:5000/models/m:q4"),
            None
        )
    );
    let digest = format!("oci://r/m@sha256:{}", "a".repeat(64));
    assert!(model_location(&digest).is_ok_and(|l| l.image.is_some()));
    // No tag or digest means :latest, pulled every time: refused.
    assert!(model_location("oci://registry.example.com:5000/models/m").is_err());
    assert!(model_location("oci://").is_err());
}

#[test]
fn an_oci_model_is_an_image_volume_mounted_read_only_at_model() {
    let s = spec(serde_json::json!({
        "model": {"name": "m", "uri": "oci://r.example/models/m:1"},
        "engine": {"image": "e", "resources": {"gpus": 0}}
    }));
    let d = deployment::deployment("p", "ns", &s, 1, vec![]).expect("deployment");
    let pod = d.spec.expect("spec").template.spec.expect("pod spec");
    let vol = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "model")
        .expect("a model volume");
    let image = vol.image.as_ref().expect("an image volume");
    assert_eq!(image.reference.as_deref(), Some("r.example/models/m:1"));
    assert_eq!(image.pull_policy.as_deref(), Some("IfNotPresent"));
    let m = pod.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "model")
        .expect("mounted");
    assert_eq!((m.mount_path.as_str(), m.read_only), ("/model", Some(true)));
    let args = pod.containers[0].args.clone().unwrap_or_default();
    let at = args.iter().position(|a| a == "--model").expect("--model");
    assert_eq!(args[at + 1], "/model");
}

#[test]
fn an_s3_model_is_fetched_by_a_restricted_init_container_into_a_cache_volume() {
    let s = spec(serde_json::json!({
        "model": {"name": "m", "uri": "s3://models/m", "source": {
            "credentialsSecret": "creds", "endpoint": "http://s3:8333", "cacheSize": "3Gi"}},
        "engine": {"image": "e", "resources": {"gpus": 0}}
    }));
    let d = deployment::deployment("p", "ns", &s, 1, vec![]).expect("deployment");
    let pod = d.spec.expect("spec").template.spec.expect("pod spec");
    let init = pod.init_containers.clone().expect("init containers");
    let fetch = &init[0];
    assert_eq!(fetch.name, deployment::FETCH_CONTAINER);
    assert_eq!(fetch.image.as_deref(), Some("e"));
    let sc = fetch.security_context.clone().expect("security context");
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(
        fetch.termination_message_path.as_deref(),
        Some(deployment::TERMINATION_MESSAGE_PATH)
    );
    let cache = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "model-cache")
        .expect("the cache volume");
    let size = cache.empty_dir.as_ref().and_then(|e| e.size_limit.clone());
    assert_eq!(size.map(|q| q.0).as_deref(), Some("3Gi"));
    let rw = fetch
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "model-cache");
    assert_eq!(
        rw.and_then(|m| m.read_only),
        Some(false),
        "the fetch writes the cache"
    );
    let ro = pod.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "model-cache");
    assert_eq!(
        ro.and_then(|m| m.read_only),
        Some(true),
        "the engine only reads it"
    );
    let secret_refs: Vec<(String, String)> = fetch
        .env
        .iter()
        .flatten()
        .filter_map(|e| e.value_from.as_ref()?.secret_key_ref.as_ref())
        .map(|r| (r.name.clone(), r.key.clone()))
        .collect();
    assert_eq!(secret_refs.len(), 3, "{secret_refs:?}");
    assert!(secret_refs.iter().all(|(name, _)| name == "creds"));
    let file = spec(serde_json::json!({}));
    let d = deployment::deployment("p", "ns", &file, 1, vec![]).expect("deployment");
    let pod = d.spec.expect("spec").template.spec.expect("pod spec");
    assert!(
        pod.init_containers.is_none(),
        "a volume model has no fetch step"
    );
}

/// Readiness on /readyz and liveness on /healthz, both through the `http` port (the engine
/// and router containers share the probe contract).
fn assert_http_probes(c: &k8s_openapi::api::core::v1::Container) {
    let ready = c
        .readiness_probe
        .clone()
        .expect("readiness")
        .http_get
        .expect("get");
    assert_eq!(ready.path.as_deref(), Some("/readyz"));
    assert_eq!(ready.port, IntOrString::String("http".into()));
    let live = c
        .liveness_probe
        .clone()
        .expect("liveness")
        .http_get
        .expect("get");
    assert_eq!(live.path.as_deref(), Some("/healthz"));
}

fn port_list(svc: &k8s_openapi::api::core::v1::Service) -> Vec<(String, i32)> {
    svc.spec
        .clone()
        .expect("spec")
        .ports
        .expect("ports")
        .iter()
        .map(|p| (p.name.clone().unwrap_or_default(), p.port))
        .collect()
}

#[test]
fn service_pdb_and_secret() {
    let owners = vec![owner_reference(&pool()).expect("owner")];
    // The front door keeps the pool's name (clients' URLs) and selects the routers.
    let svc = objects::service("chat", "prod", owners.clone());
    assert_eq!(svc.metadata.name.as_deref(), Some("chat"));
    assert_eq!(port_list(&svc), vec![("http".into(), 8000)]);
    let front = svc.spec.clone().expect("spec");
    assert_eq!(front.selector, Some(router_selector_labels("chat")));
    assert_eq!(front.cluster_ip, None, "a load-balancing address");
    // The engines' Service is internal and headless.
    let engines = objects::engines_service("chat", "prod", owners.clone());
    assert_eq!(engines.metadata.name.as_deref(), Some("chat-engines"));
    assert_eq!(
        port_list(&engines),
        vec![("http".into(), 8000), ("admin".into(), 8001)]
    );
    let es = engines.spec.clone().expect("spec");
    assert_eq!(es.selector, Some(selector_labels("chat")));
    assert_eq!(es.cluster_ip.as_deref(), Some("None"));
    assert!(engines.metadata.owner_references.expect("owners")[0].controller == Some(true));
    let pdb = objects::pod_disruption_budget("chat", "prod", owners.clone());
    assert_eq!(
        pdb.spec.expect("spec").max_unavailable,
        Some(IntOrString::Int(1))
    );
    let token = objects::random_token().expect("token");
    assert_eq!(token.len(), 64);
    assert_ne!(token, objects::random_token().expect("token"));
    let secret = objects::admin_secret("chat", "prod", &token, owners);
    assert_eq!(secret.metadata.name.as_deref(), Some("chat-admin"));
    assert_eq!(secret.string_data.expect("data")["token"], token);
    assert_eq!(
        secret.metadata.owner_references.expect("owners")[0].controller,
        Some(true)
    );
}

#[test]
fn large_registries_are_sharded_with_one_digest() {
    let owners = OwnerBook::new();
    owners.record(&pool());
    let pref = PoolRef {
        namespace: "prod".into(),
        name: "chat".into(),
    };
    let bytes: Vec<u8> = (0..(2 * SHARD_BYTES + 10))
        .map(|i| (i % 251) as u8)
        .collect();
    let maps = registry_config_maps(&pref, &bytes, &owners);
    let names: Vec<_> = maps
        .iter()
        .map(|m| m.metadata.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(
        names,
        vec!["chat-tenants", "chat-tenants-1", "chat-tenants-2"]
    );
    let digest = &maps[0].metadata.annotations.as_ref().expect("ann")[DIGEST_ANNOTATION];
    let mut joined: Vec<u8> = Vec::new();
    for m in &maps {
        let ann = m.metadata.annotations.as_ref().expect("ann");
        assert_eq!(&ann[DIGEST_ANNOTATION], digest);
        assert_eq!(ann[PARTS_ANNOTATION], "3");
        assert_eq!(
            m.metadata.owner_references.as_ref().expect("owners")[0].uid,
            "uid-1"
        );
        joined.extend(&m.binary_data.as_ref().expect("data")[REGISTRY_KEY].0);
    }
    assert_eq!(joined, bytes);
    assert_eq!(registry_config_maps(&pref, &[1, 2, 3], &owners).len(), 1);
}

#[test]
fn the_startup_probe_allows_the_startup_grace_period() {
    let failures = |s: &InferencePoolSpec| {
        let d = deployment::deployment("chat", "prod", s, 1, vec![]).expect("deployment");
        let pod = d.spec.expect("spec").template.spec.expect("pod");
        let probe = pod.containers[0].startup_probe.clone().expect("startup");
        (probe.period_seconds, probe.failure_threshold)
    };
    // Default 15m: 90 probes 10 s apart.
    assert_eq!(failures(&spec(serde_json::json!({}))), (Some(10), Some(90)));
    // A large model that loads in up to 25 minutes, and one that starts at once.
    let mut slow = spec(serde_json::json!({}));
    slow.engine.startup_grace_period = std::time::Duration::from_secs(25 * 60).into();
    assert_eq!(failures(&slow), (Some(10), Some(150)));
    let mut fast = spec(serde_json::json!({}));
    fast.engine.startup_grace_period = std::time::Duration::from_secs(0).into();
    assert_eq!(failures(&fast), (Some(10), Some(1)));
}

#[test]
fn the_router_runs_cpu_only_restricted_from_the_router_contract() {
    let p = pool();
    let owners = vec![owner_reference(&p).expect("owner")];
    let d = router::router_deployment("chat", "prod", &p.spec, owners.clone());
    assert_eq!(d.metadata.name.as_deref(), Some("chat-router"));
    assert_eq!(d.metadata.owner_references.expect("owners")[0].uid, "uid-1");
    let ds = d.spec.expect("spec");
    assert_eq!(ds.replicas, Some(2), "spec.router.replicas' default");
    let sel = ds.selector.match_labels.expect("selector");
    assert_eq!(sel, router_selector_labels("chat"));
    let tpl = ds.template;
    let labels = tpl.metadata.clone().expect("meta").labels.expect("labels");
    assert_eq!(labels["app.kubernetes.io/component"], "router");
    // Neither selector matches the other's pods.
    let engine_sel = selector_labels("chat");
    assert!(
        engine_sel.iter().any(|(k, v)| labels.get(k) != Some(v)),
        "the engine selector matches router pods"
    );
    let engine_tpl = deployment::pod_template("chat", &p.spec).expect("engine pod");
    let engine_labels = engine_tpl.metadata.expect("meta").labels.expect("labels");
    assert!(
        sel.iter().any(|(k, v)| engine_labels.get(k) != Some(v)),
        "the router selector matches engine pods"
    );

    let pod = tpl.spec.expect("pod");
    assert_eq!(pod.automount_service_account_token, Some(false));
    let psc = pod.security_context.expect("pod sc");
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(
        psc.seccomp_profile.expect("seccomp").type_,
        "RuntimeDefault"
    );
    let c = &pod.containers[0];
    assert_eq!(c.name, "router");
    assert_eq!(
        c.image.as_deref(),
        Some("ghcr.io/tidegate/engine:1"),
        "one image"
    );
    let sc = c.security_context.clone().expect("sc");
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(
        sc.capabilities.expect("caps").drop,
        Some(vec!["ALL".into()])
    );
    assert_eq!(sc.seccomp_profile.expect("seccomp").type_, "RuntimeDefault");

    // The engines ask for 2 GPUs; the router for none.
    let res = c.resources.clone().expect("resources");
    for amounts in [res.limits.expect("limits"), res.requests.expect("requests")] {
        assert!(!amounts.contains_key("nvidia.com/gpu"), "{amounts:?}");
        assert!(amounts.contains_key("cpu") && amounts.contains_key("memory"));
    }

    let args = c.args.clone().expect("args");
    assert_eq!(
        args,
        tidegate_api::router::router_args(&p.spec, &router::pod_router_site(&p.spec))
    );
    let joined = args.join(" ");
    assert_eq!(args[0], "route", "{joined}");
    for want in [
        "--listen 0.0.0.0:8000",
        "--admin-listen 0.0.0.0:8001",
        "--limit-share 2",
        "--load-factor 1.25",
        "--hold-timeout 300s",
        "--log-format json",
    ] {
        assert!(joined.contains(want), "{want} missing in {joined}");
    }
    assert!(
        !joined.contains("--endpoint"),
        "the operator pushes engines: {joined}"
    );

    let env = c.env.clone().expect("env");
    for name in ["TIDEGATE_ADMIN_TOKEN", "TIDEGATE_ROUTER_TOKEN"] {
        let var = env.iter().find(|e| e.name == name).expect(name);
        assert_eq!(var.value, None, "{name}: never the token itself");
        let key = var
            .value_from
            .clone()
            .expect("from")
            .secret_key_ref
            .expect("secret ref");
        assert_eq!(
            (key.name.as_str(), key.key.as_str()),
            ("chat-admin", "token")
        );
    }

    let ports: Vec<(String, i32)> = c
        .ports
        .clone()
        .expect("ports")
        .into_iter()
        .map(|p| (p.name.unwrap_or_default(), p.container_port))
        .collect();
    assert_eq!(ports, vec![("http".into(), 8000), ("admin".into(), 8001)]);
    assert_http_probes(c);

    let pdb = router::router_pod_disruption_budget("chat", "prod", owners);
    assert_eq!(pdb.metadata.name.as_deref(), Some("chat-router"));
    let ps = pdb.spec.expect("spec");
    assert_eq!(ps.max_unavailable, Some(IntOrString::Int(1)));
    assert_eq!(
        ps.selector.expect("selector").match_labels,
        Some(router_selector_labels("chat"))
    );
}

#[test]
fn router_replicas_follow_the_spec() {
    let p = spec(serde_json::json!({"router": {"replicas": 5}}));
    let d = router::router_deployment("chat", "prod", &p, vec![]);
    let ds = d.spec.expect("spec");
    assert_eq!(ds.replicas, Some(5));
    let args = ds.template.spec.expect("pod").containers[0]
        .args
        .clone()
        .expect("args")
        .join(" ");
    assert!(
        args.contains("--limit-share 5"),
        "each router enforces 1/5: {args}"
    );
    assert!(d.metadata.owner_references.is_none());
}
