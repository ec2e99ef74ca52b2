//! The admitted-tenant registry of a pool: who counts as an *existing* tenant.
//!
//! The operator owns it: it merges what engines report, forgets tenants not seen within the
//! memory window, persists it (so an operator restart loses nothing) and pushes it back to
//! every engine, so all replicas make the same admission decision.
//!
//! Encoding (for a ConfigMap's binaryData, ≥ 100,000 tenants): a version byte, a tier table,
//! then three columns over the tenants sorted by id: ids with the shared prefix of the
//! previous id elided (front coding), tier indices, and last-seen as LEB128 minutes before
//! the newest entry; the whole deflated. Invariant:
//! `decode(encode(r)) == r` up to minute precision of last-seen.

use std::collections::BTreeMap;
use std::io::{Read, Write};

use tidegate_api::engine_admin::AdmittedTenants;

const FORMAT_VERSION: u8 = 1;

/// One tenant's entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantEntry {
    pub tier: String,
    /// Unix milliseconds of the last admission seen (minute precision once persisted).
    pub last_seen_ms: u64,
}

/// The registry: tenant id → entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Registry {
    pub tenants: BTreeMap<String, TenantEntry>,
    /// Engine clock watermark per engine (name → `now_ms` of its last answer), so each
    /// collection asks only for what is new.
    pub watermarks: BTreeMap<String, u64>,
}

/// A registry that could not be decoded.
#[derive(Debug, thiserror::Error)]
#[error("corrupt tenant registry: {0}")]
pub struct DecodeError(String);

impl Registry {
    pub fn len(&self) -> usize {
        self.tenants.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }

    pub fn contains(&self, tenant: &str) -> bool {
        self.tenants.contains_key(tenant)
    }

    /// Merges what one engine reported; returns how many tenants were new to the registry.
    pub fn merge(&mut self, engine: &str, report: &AdmittedTenants) -> usize {
        let mut added = 0;
        for t in &report.tenants {
            let e = self.tenants.entry(t.tenant.clone()).or_insert_with(|| {
                added += 1;
                TenantEntry {
                    tier: t.tier.clone(),
                    last_seen_ms: 0,
                }
            });
            e.last_seen_ms = e.last_seen_ms.max(t.first_admitted_ms);
            e.tier.clone_from(&t.tier);
        }
        self.watermarks.insert(engine.to_string(), report.now_ms);
        added
    }

    /// Forgets tenants not seen within `window_ms` before `now_ms`; returns how many.
    pub fn prune(&mut self, now_ms: u64, window_ms: u64) -> usize {
        let before = self.tenants.len();
        let cutoff = now_ms.saturating_sub(window_ms);
        self.tenants.retain(|_, e| e.last_seen_ms >= cutoff);
        before - self.tenants.len()
    }

    /// Tenant ids, sorted.
    pub fn tenant_ids(&self) -> Vec<String> {
        self.tenants.keys().cloned().collect()
    }

    /// The compact, deflated binary form.
    pub fn encode(&self) -> Vec<u8> {
        let mut tiers: Vec<&str> = self.tenants.values().map(|e| e.tier.as_str()).collect();
        tiers.sort_unstable();
        tiers.dedup();
        let mut raw = vec![FORMAT_VERSION];
        put_varint(&mut raw, tiers.len() as u64);
        for t in &tiers {
            put_bytes(&mut raw, t.as_bytes());
        }
        // Columns compress better than rows: ids, then tiers, then ages.
        let newest = self
            .tenants
            .values()
            .map(|e| e.last_seen_ms / 60_000)
            .max()
            .unwrap_or(0);
        put_varint(&mut raw, self.tenants.len() as u64);
        put_varint(&mut raw, newest);
        let mut prev: &[u8] = &[];
        for id in self.tenants.keys() {
            let id = id.as_bytes();
            let shared = prev.iter().zip(id).take_while(|(a, b)| a == b).count();
            put_varint(&mut raw, shared as u64);
            put_bytes(&mut raw, &id[shared..]);
            prev = id;
        }
        for e in self.tenants.values() {
            let tier = tiers.binary_search(&e.tier.as_str()).unwrap_or(0);
            put_varint(&mut raw, tier as u64);
        }
        for e in self.tenants.values() {
            // Age in minutes before the newest entry: small numbers within the memory window.
            put_varint(&mut raw, newest - e.last_seen_ms / 60_000);
        }
        put_varint(&mut raw, self.watermarks.len() as u64);
        for (engine, ms) in &self.watermarks {
            put_bytes(&mut raw, engine.as_bytes());
            put_varint(&mut raw, *ms);
        }
        let mut z = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
        // Writing into a Vec cannot fail.
        let _ = z.write_all(&raw);
        z.finish().unwrap_or_default()
    }

    /// Parses what `encode` wrote.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut raw = Vec::new();
        flate2::read::DeflateDecoder::new(bytes)
            .read_to_end(&mut raw)
            .map_err(|e| DecodeError(format!("inflate: {e}")))?;
        let mut r = Reader { buf: &raw, pos: 0 };
        if r.byte()? != FORMAT_VERSION {
            return Err(DecodeError("unknown format version".into()));
        }
        let tier_count = r.varint()? as usize;
        let mut tiers = Vec::with_capacity(tier_count.min(1024));
        for _ in 0..tier_count {
            tiers.push(r.string()?);
        }
        let count = r.varint()? as usize;
        let newest = r.varint()?;
        let mut ids = Vec::with_capacity(count.min(1 << 20));
        let mut prev: Vec<u8> = Vec::new();
        for _ in 0..count {
            let shared = r.varint()? as usize;
            if shared > prev.len() {
                return Err(DecodeError("bad prefix length".into()));
            }
            let mut id = prev[..shared].to_vec();
            id.extend_from_slice(r.bytes()?);
            prev.clone_from(&id);
            ids.push(String::from_utf8(id).map_err(|_| DecodeError("tenant id not UTF-8".into()))?);
        }
        let mut tier_of = Vec::with_capacity(ids.len());
        for _ in 0..count {
            let tier = tiers
                .get(r.varint()? as usize)
                .cloned()
                .ok_or_else(|| DecodeError("bad tier index".into()))?;
            tier_of.push(tier);
        }
        let mut out = Registry::default();
        for (id, tier) in ids.into_iter().zip(tier_of) {
            let age = r.varint()?;
            let last_seen_ms = newest.saturating_sub(age).saturating_mul(60_000);
            out.tenants.insert(id, TenantEntry { tier, last_seen_ms });
        }
        let marks = r.varint()? as usize;
        for _ in 0..marks {
            let engine = r.string()?;
            let ms = r.varint()?;
            out.watermarks.insert(engine, ms);
        }
        Ok(out)
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, DecodeError> {
        let b = *self
            .buf
            .get(self.pos)
            .ok_or_else(|| DecodeError("truncated".into()))?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError("varint too long".into()))
    }

    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.varint()? as usize;
        let end = self.pos.checked_add(len).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| DecodeError("truncated".into()))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn string(&mut self) -> Result<String, DecodeError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| DecodeError("not UTF-8".into()))
    }
}

#[cfg(test)]
mod tests {
    use tidegate_api::engine_admin::AdmittedTenant;

    use super::*;

    fn report(now_ms: u64, ids: &[(&str, &str, u64)]) -> AdmittedTenants {
        AdmittedTenants {
            now_ms,
            tenants: ids
                .iter()
                .map(|(t, tier, ms)| AdmittedTenant {
                    tenant: t.to_string(),
                    tier: tier.to_string(),
                    first_admitted_ms: *ms,
                })
                .collect(),
        }
    }

    #[test]
    fn merge_prune_round_trip() {
        let mut r = Registry::default();
        assert_eq!(
            r.merge(
                "e0",
                &report(
                    10_000_000,
                    &[("acme", "standard", 9_000_000), ("zed", "free", 60_000)]
                )
            ),
            2
        );
        assert_eq!(
            r.merge(
                "e1",
                &report(10_000_000, &[("acme", "standard", 9_600_000)])
            ),
            0
        );
        assert_eq!(r.tenants["acme"].last_seen_ms, 9_600_000);
        assert_eq!(r.prune(10_000_000, 3_600_000), 1);
        assert!(r.contains("acme") && !r.contains("zed"));
        assert_eq!(Registry::decode(&r.encode()).unwrap(), r);
    }

    #[test]
    fn holds_100k_tenants_compactly() {
        let mut r = Registry::default();
        let tiers = ["enterprise", "standard", "free"];
        // Realistic ids: an org prefix and a pseudo-random suffix.
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for i in 0..100_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let id = format!("org-{:04}/user-{:010x}", i % 5000, x & 0xff_ffff_ffff);
            r.tenants.insert(
                id,
                TenantEntry {
                    tier: tiers[(i % 3) as usize].to_string(),
                    last_seen_ms: 1_699_999_980_000 + (i * 863 % 1440) * 60_000,
                },
            );
        }
        let bytes = r.encode();
        assert!(
            bytes.len() < 900 * 1024,
            "{} bytes does not fit a ConfigMap",
            bytes.len()
        );
        let back = Registry::decode(&bytes).unwrap();
        assert_eq!(back.len(), 100_000);
        assert!(back == r, "100k registry did not round-trip");
    }

    #[test]
    fn corrupt_input_is_an_error_not_a_panic() {
        assert!(Registry::decode(b"not deflate at all").is_err());
        let mut bytes = Registry::default().encode();
        bytes.truncate(1);
        assert!(Registry::decode(&bytes).is_err());
    }
}
