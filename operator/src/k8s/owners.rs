//! Owner references: every object made for a pool is owned by its InferencePool
//! (controller=true), so deleting the pool deletes them.
//!
//! The ports take a `PoolRef`, which has no uid; the controller records each pool's owner
//! reference in a shared [`OwnerBook`] before it ticks the driver, and the adapters read it.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use tidegate_api::InferencePool;

use crate::ports::PoolRef;

/// The owner reference (controller=true, blockOwnerDeletion=true) to a pool.
pub fn owner_reference(pool: &InferencePool) -> Option<OwnerReference> {
    let mut owner = pool.controller_owner_ref(&())?;
    owner.block_owner_deletion = Some(true);
    Some(owner)
}

/// Owner references of the pools being reconciled, shared by the controller and adapters.
#[derive(Clone, Debug, Default)]
pub struct OwnerBook(Arc<RwLock<HashMap<PoolRef, OwnerReference>>>);

impl OwnerBook {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records (or refreshes) a pool's owner reference.
    pub fn record(&self, pool: &InferencePool) {
        let (Some(ns), Some(owner)) = (pool.meta().namespace.clone(), owner_reference(pool)) else {
            return;
        };
        let key = PoolRef {
            namespace: ns,
            name: owner.name.clone(),
        };
        if let Ok(mut book) = self.0.write() {
            book.insert(key, owner);
        }
    }

    /// Forgets a deleted pool.
    pub fn forget(&self, pool: &PoolRef) {
        if let Ok(mut book) = self.0.write() {
            book.remove(pool);
        }
    }

    /// The owner references to put on an object of this pool (empty if unknown).
    pub fn refs(&self, pool: &PoolRef) -> Vec<OwnerReference> {
        self.0
            .read()
            .ok()
            .and_then(|book| book.get(pool).cloned())
            .into_iter()
            .collect()
    }
}
