//! `ConfigMapRegistry`: the RegistryStore port on Kubernetes. A pool's admitted-tenant
//! registry is ConfigMap `<pool>-tenants`, binaryData `registry.bin` = `Registry::encode()`.
//!
//! A registry larger than SHARD_BYTES is split: the first part stays in `<pool>-tenants`,
//! the rest go to `<pool>-tenants-1..N-1`. Every part carries the SHA-256 of the whole blob
//! and the part count; shards are written before the head, so a reader that finds parts of
//! two different writes sees mismatched digests. It then starts from an empty registry with
//! a warning rather than blocking the pool: engines re-report the tenants they admitted
//! (their watermarks are gone too), so only tenants known solely from removed engines are
//! lost. Shards left over from an earlier, larger registry are ignored (the head's count
//! says how many to read) and deleted once the smaller head is written.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Patch;
use kube::{Api, Client};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::k8s::apply_params;
use crate::k8s::objects::{binary_config_map, hex};
use crate::k8s::owners::OwnerBook;
use crate::ports::{PoolRef, RegistryError, RegistryStore};
use crate::registry::Registry;

/// binaryData key of the registry.
pub const REGISTRY_KEY: &str = "registry.bin";
/// Largest part stored in one ConfigMap (the API server refuses objects over 1 MiB).
pub const SHARD_BYTES: usize = 900 * 1024;
/// Annotation: number of parts.
pub const PARTS_ANNOTATION: &str = "tidegate.dev/registry-parts";
/// Annotation: SHA-256 (hex) of the whole encoded registry.
pub const DIGEST_ANNOTATION: &str = "tidegate.dev/registry-sha256";

/// Name of part `i` of a pool's registry (0 is the head).
pub fn part_name(pool: &str, i: usize) -> String {
    if i == 0 {
        format!("{pool}-tenants")
    } else {
        format!("{pool}-tenants-{i}")
    }
}

/// The ConfigMaps holding `bytes`, head first.
pub fn registry_config_maps(pool: &PoolRef, bytes: &[u8], owners: &OwnerBook) -> Vec<ConfigMap> {
    let digest = hex(&Sha256::digest(bytes));
    let chunks: Vec<&[u8]> = if bytes.is_empty() {
        vec![bytes]
    } else {
        bytes.chunks(SHARD_BYTES).collect()
    };
    let parts = chunks.len();
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| {
            let annotations = BTreeMap::from([
                (PARTS_ANNOTATION.to_string(), parts.to_string()),
                (DIGEST_ANNOTATION.to_string(), digest.clone()),
            ]);
            binary_config_map(
                part_name(&pool.name, i),
                &pool.name,
                &pool.namespace,
                REGISTRY_KEY,
                chunk.to_vec(),
                annotations,
                owners.refs(pool),
            )
        })
        .collect()
}

fn annotation<'a>(cm: &'a ConfigMap, key: &str) -> Option<&'a str> {
    cm.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn part_bytes(cm: &ConfigMap) -> Vec<u8> {
    cm.binary_data
        .as_ref()
        .and_then(|d| d.get(REGISTRY_KEY))
        .map(|b| b.0.clone())
        .unwrap_or_default()
}

/// The registry in ConfigMaps.
pub struct ConfigMapRegistry {
    client: Client,
    owners: OwnerBook,
    /// Parts each pool's registry has on the server, as last read or written.
    parts: Mutex<HashMap<PoolRef, usize>>,
}

impl ConfigMapRegistry {
    pub fn new(client: Client, owners: OwnerBook) -> Self {
        ConfigMapRegistry {
            client,
            owners,
            parts: Mutex::new(HashMap::new()),
        }
    }

    fn remember_parts(&self, pool: &PoolRef, parts: usize) -> Option<usize> {
        let mut known = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        known.insert(pool.clone(), parts)
    }
}

fn rerr(what: &str, pool: &PoolRef, e: impl std::fmt::Display) -> RegistryError {
    RegistryError(format!("{what} of {pool}: {e}"))
}

impl RegistryStore for ConfigMapRegistry {
    async fn load(&self, pool: &PoolRef) -> Result<Registry, RegistryError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &pool.namespace);
        let Some(head) = api
            .get_opt(&part_name(&pool.name, 0))
            .await
            .map_err(|e| rerr("reading the registry", pool, e))?
        else {
            self.remember_parts(pool, 0);
            return Ok(Registry::default());
        };
        let parts: usize = annotation(&head, PARTS_ANNOTATION)
            .and_then(|p| p.parse().ok())
            .unwrap_or(1);
        self.remember_parts(pool, parts);
        let digest = annotation(&head, DIGEST_ANNOTATION).map(str::to_string);
        let mut bytes = part_bytes(&head);
        let mut consistent = true;
        for i in 1..parts {
            let part = api
                .get_opt(&part_name(&pool.name, i))
                .await
                .map_err(|e| rerr("reading the registry", pool, e))?;
            match part {
                Some(p) if annotation(&p, DIGEST_ANNOTATION).map(str::to_string) == digest => {
                    bytes.extend(part_bytes(&p));
                }
                _ => consistent = false,
            }
        }
        if let Some(d) = &digest
            && consistent
        {
            consistent = hex(&Sha256::digest(&bytes)) == *d;
        }
        if !consistent {
            warn!(pool = %pool, "tenant registry parts do not match (interrupted write); starting empty, engines will report their tenants again");
            return Ok(Registry::default());
        }
        match Registry::decode(&bytes) {
            Ok(r) => {
                info!(pool = %pool, tenants = r.len(), parts, "loaded tenant registry");
                Ok(r)
            }
            Err(e) => {
                warn!(pool = %pool, error = %e, "tenant registry unreadable; starting empty, engines will report their tenants again");
                Ok(Registry::default())
            }
        }
    }

    async fn save(&self, pool: &PoolRef, registry: &Registry) -> Result<(), RegistryError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &pool.namespace);
        let maps = registry_config_maps(pool, &registry.encode(), &self.owners);
        // Shards first, head last: the head's digest commits the write.
        for cm in maps.iter().skip(1).chain(maps.first()) {
            let name = cm.metadata.name.clone().unwrap_or_default();
            api.patch(&name, &apply_params(), &Patch::Apply(cm))
                .await
                .map_err(|e| rerr("writing the registry", pool, e))?;
        }
        // The head now says how many parts there are; shards past that are left-overs of a
        // larger registry. A failed delete is retried after the next save.
        let before = self.remember_parts(pool, maps.len()).unwrap_or(0);
        for i in maps.len().max(1)..before {
            let name = part_name(&pool.name, i);
            match api.delete(&name, &Default::default()).await {
                Ok(_) => info!(pool = %pool, shard = %name, "deleted a left-over registry shard"),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    warn!(pool = %pool, shard = %name, error = %e, "could not delete a left-over registry shard");
                    self.remember_parts(pool, before);
                }
            }
        }
        Ok(())
    }
}
