//! Offloaded KV bytes off the device: host RAM first, spilled to disk files, dropped last.
//!
//! Invariants:
//! - `host_used ≤ host_budget` and `disk_used ≤ disk_budget` at every instant: room is made
//!   (LRU host entries spill to disk, LRU disk entries are dropped) before bytes are placed,
//!   and an entry larger than a budget never goes to that place;
//! - `host_used` / `disk_used` equal the sum of the sizes of the entries in each place (on
//!   disk: the file's size, header included, so the disk budget bounds real usage), and
//!   each entry is in exactly one place with exactly one LRU record;
//! - a disk entry owns exactly one file, removed when the entry is taken, dropped, or the store
//!   itself is dropped. A failed write means "not stored" (the caller drops the KV); a failed
//!   read back is a [`SpillReadError`] naming the file and the cause (the entry is gone either
//!   way and the caller recomputes), never an error that stops the engine;
//! - disk files are written by the spill writer thread ([`super::spill_writer`]), never on
//!   the caller's thread: an entry is *writing* until the writer answers, its bytes already
//!   counted in `disk_used`. Taking a writing entry waits for its file; an entry removed while
//!   writing has its file deleted when the write is answered; a write that fails removes the
//!   entry and reports its owner ([`OffloadStore::take_failed`]), who recomputes;
//! - bytes come back from [`OffloadStore::take`] only if they are exactly what was put: disk
//!   files carry their length and a checksum ([`super::spill_file`]), so a truncated,
//!   missing or corrupted file is a read error, not KV.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use super::spill_file::{HEADER_BYTES, SpillFault, read_spill, write_spill};
use super::spill_writer::{SpillWriter, Written};

/// An offloaded entry whose spill file could not be read back intact.
#[derive(Debug, thiserror::Error)]
#[error("spill file {}: {fault}", path.display())]
pub struct SpillReadError {
    /// The file.
    pub path: PathBuf,
    /// What was wrong with it.
    pub fault: SpillFault,
}

pub use super::ids::EntryId;

/// Where an entry's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Host RAM.
    Host,
    /// A file in the disk directory.
    Disk,
}

/// Budgets and the spill directory. Budgets count KV bytes (whole blocks; on disk also each
/// file's header); the small per-session metadata (token ids) lives outside them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoreConfig {
    /// Host RAM for offloaded KV.
    pub host_budget_bytes: usize,
    /// Disk space for spilled KV.
    pub disk_budget_bytes: usize,
    /// Directory for spill files; `None` disables disk.
    pub disk_dir: Option<PathBuf>,
}

/// Counters of the store's own decisions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Entries moved from host RAM to disk.
    pub spills_to_disk: u64,
    /// Entries dropped for lack of room (their owners recompute).
    pub dropped: u64,
    /// Disk writes or reads that failed.
    pub disk_errors: u64,
}

struct Entry<K> {
    owner: K,
    bytes: usize,
    last_use: u64,
    host: Option<Vec<u8>>,
    file: Option<PathBuf>,
}

/// Result of [`OffloadStore::put`].
#[derive(Debug)]
pub struct Put<K> {
    /// The new entry, or `None` if it fit nowhere (the bytes were dropped).
    pub stored: Option<(EntryId, Place)>,
    /// Owners of older entries dropped to make room.
    pub dropped: Vec<K>,
}

/// Host + disk store of offloaded KV, keyed by entry id, remembering each entry's owner.
pub struct OffloadStore<K> {
    cfg: StoreConfig,
    entries: HashMap<EntryId, Entry<K>>,
    host_lru: BTreeSet<(u64, EntryId)>,
    disk_lru: BTreeSet<(u64, EntryId)>,
    host_used: usize,
    disk_used: usize,
    next_id: EntryId,
    instance: u64,
    stats: StoreStats,
    /// Started on the first spill.
    writer: Option<SpillWriter>,
    /// Entries whose file write is in flight.
    writing: HashSet<EntryId>,
    /// Owners of entries whose file write failed, not yet taken.
    failed: Vec<K>,
}

static INSTANCES: AtomicU64 = AtomicU64::new(0);

impl<K> std::fmt::Debug for OffloadStore<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OffloadStore")
            .field("entries", &self.entries.len())
            .field("host_used", &self.host_used)
            .field("disk_used", &self.disk_used)
            .finish()
    }
}

impl<K: Clone> OffloadStore<K> {
    /// An empty store.
    pub fn new(cfg: StoreConfig) -> Self {
        OffloadStore {
            cfg,
            entries: HashMap::new(),
            host_lru: BTreeSet::new(),
            disk_lru: BTreeSet::new(),
            host_used: 0,
            disk_used: 0,
            next_id: 0,
            instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
            stats: StoreStats::default(),
            writer: None,
            writing: HashSet::new(),
            failed: Vec::new(),
        }
    }

    /// Bytes held in host RAM.
    pub fn host_used(&self) -> usize {
        self.host_used
    }

    /// Bytes held on disk.
    pub fn disk_used(&self) -> usize {
        self.disk_used
    }

    /// The configured budgets.
    pub fn config(&self) -> &StoreConfig {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> StoreStats {
        self.stats
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the store holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Size and place of an entry.
    pub fn peek(&self, id: EntryId) -> Option<(usize, Place)> {
        self.entries.get(&id).map(|e| (e.bytes, place_of(e)))
    }

    /// Stores `data` for `owner`: in host RAM if it can fit there (spilling older entries to
    /// disk), else on disk (dropping older disk entries), else nowhere.
    pub fn put(&mut self, owner: K, data: Vec<u8>, now: u64) -> Put<K> {
        let id = self.next_id;
        self.next_id += 1;
        let bytes = data.len();
        let mut dropped = Vec::new();
        let mut entry = Entry {
            owner,
            bytes,
            last_use: now,
            host: None,
            file: None,
        };
        if bytes <= self.cfg.host_budget_bytes {
            while self.host_used + bytes > self.cfg.host_budget_bytes {
                let Some(&(_, victim)) = self.host_lru.iter().next() else {
                    break;
                };
                self.spill(victim, &mut dropped);
            }
            if self.host_used + bytes <= self.cfg.host_budget_bytes {
                self.host_used += bytes;
                self.host_lru.insert((now, id));
                entry.host = Some(data);
                self.entries.insert(id, entry);
                return Put {
                    stored: Some((id, Place::Host)),
                    dropped,
                };
            }
        }
        match self.write_disk(id, data, &mut dropped) {
            Some(path) => {
                self.disk_used += on_disk(bytes);
                self.disk_lru.insert((now, id));
                entry.file = Some(path);
                self.entries.insert(id, entry);
                Put {
                    stored: Some((id, Place::Disk)),
                    dropped,
                }
            }
            None => {
                self.stats.dropped += 1;
                Put {
                    stored: None,
                    dropped,
                }
            }
        }
    }

    /// Removes an entry and returns its bytes and where they were: `Ok(None)` if there is no
    /// such entry, an error if its file could not be read back intact (the entry and its file
    /// are gone then too).
    pub fn take(&mut self, id: EntryId) -> Result<Option<(Vec<u8>, Place)>, SpillReadError> {
        if self.writing.contains(&id) {
            self.wait_written(id);
        }
        let Some(e) = self.unlink(id) else {
            return Ok(None);
        };
        if let Some(data) = e.host {
            return Ok(Some((data, Place::Host)));
        }
        let Some(path) = e.file else {
            return Ok(None);
        };
        let read = read_spill(&path, e.bytes);
        let _ = std::fs::remove_file(&path);
        match read {
            Ok(data) => Ok(Some((data, Place::Disk))),
            Err(fault) => {
                self.stats.disk_errors += 1;
                Err(SpillReadError { path, fault })
            }
        }
    }

    /// Removes an entry, discarding its bytes. Returns whether it existed.
    pub fn remove(&mut self, id: EntryId) -> bool {
        match self.unlink(id) {
            Some(e) => {
                if let Some(path) = e.file {
                    let _ = std::fs::remove_file(path);
                }
                true
            }
            None => false,
        }
    }

    fn unlink(&mut self, id: EntryId) -> Option<Entry<K>> {
        let e = self.entries.remove(&id)?;
        if e.host.is_some() {
            self.host_lru.remove(&(e.last_use, id));
            self.host_used -= e.bytes;
        } else {
            self.disk_lru.remove(&(e.last_use, id));
            self.disk_used -= on_disk(e.bytes);
        }
        Some(e)
    }

    /// Moves host entry `id` to disk, or drops it if disk cannot take it.
    fn spill(&mut self, id: EntryId, dropped: &mut Vec<K>) {
        let Some(mut e) = self.unlink(id) else {
            return;
        };
        let data = e.host.take().unwrap_or_default();
        match self.write_disk(id, data, dropped) {
            Some(path) => {
                self.stats.spills_to_disk += 1;
                self.disk_used += on_disk(e.bytes);
                self.disk_lru.insert((e.last_use, id));
                e.file = Some(path);
                self.entries.insert(id, e);
            }
            None => {
                self.stats.dropped += 1;
                dropped.push(e.owner);
            }
        }
    }

    /// Makes room on disk (dropping LRU disk entries) and hands `data` to the spill writer;
    /// `None` if disk is disabled or too small (or, without a writer thread, the write failed).
    fn write_disk(&mut self, id: EntryId, data: Vec<u8>, dropped: &mut Vec<K>) -> Option<PathBuf> {
        let dir = self.cfg.disk_dir.clone()?;
        let cost = on_disk(data.len());
        if cost > self.cfg.disk_budget_bytes {
            return None;
        }
        while self.disk_used + cost > self.cfg.disk_budget_bytes {
            let &(_, victim) = self.disk_lru.iter().next()?;
            if let Some(e) = self.unlink(victim) {
                if let Some(path) = e.file {
                    let _ = std::fs::remove_file(path);
                }
                self.stats.dropped += 1;
                dropped.push(e.owner);
            }
        }
        let path = dir.join(format!(
            "kv-{}-{}-{id}.bin",
            std::process::id(),
            self.instance
        ));
        if self.writer.is_none() {
            self.writer = SpillWriter::start()
                .inspect_err(|e| tracing::warn!(error = %e, "no KV spill writer thread; writing spills inline"))
                .ok();
        }
        let data = match &self.writer {
            Some(writer) => match writer.submit(id, path.clone(), data) {
                Ok(()) => {
                    self.writing.insert(id);
                    return Some(path);
                }
                Err(data) => data,
            },
            None => data,
        };
        let written = std::fs::create_dir_all(&dir).and_then(|()| write_spill(&path, &data));
        match written {
            Ok(()) => Some(path),
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "KV spill write failed; not offloaded");
                let _ = std::fs::remove_file(&path);
                self.stats.disk_errors += 1;
                None
            }
        }
    }

    /// Applies the spill writer's answers that have arrived (without waiting).
    pub fn poll_writes(&mut self) {
        let ready = self
            .writer
            .as_ref()
            .map(SpillWriter::ready)
            .unwrap_or_default();
        for w in ready {
            self.written(w);
        }
    }

    /// Waits until every file write in flight is answered (tests, benchmarks, shutdown).
    pub fn wait_for_writes(&mut self) {
        while !self.writing.is_empty() {
            let Some(w) = self.writer.as_ref().and_then(SpillWriter::next) else {
                self.writing.clear();
                return;
            };
            self.written(w);
        }
    }

    /// Owners whose entry was removed because its file could not be written.
    pub fn take_failed(&mut self) -> Vec<K> {
        std::mem::take(&mut self.failed)
    }

    /// Waits for entry `id`'s file write (applying every answer that comes first).
    fn wait_written(&mut self, id: EntryId) {
        while self.writing.contains(&id) {
            let Some(w) = self.writer.as_ref().and_then(SpillWriter::next) else {
                self.writing.remove(&id);
                return;
            };
            self.written(w);
        }
    }

    /// One write answered: the entry is on disk, or (write failed) gone with its owner
    /// reported; a file whose entry was removed meanwhile is deleted.
    fn written(&mut self, w: Written) {
        self.writing.remove(&w.id);
        let current = self
            .entries
            .get(&w.id)
            .is_some_and(|e| e.file.as_deref() == Some(w.path.as_path()));
        if !current {
            let _ = std::fs::remove_file(&w.path);
            return;
        }
        if let Err(e) = w.result {
            tracing::warn!(file = %w.path.display(), error = %e, "KV spill write failed; the session will recompute");
            self.stats.disk_errors += 1;
            self.stats.dropped += 1;
            if let Some(entry) = self.unlink(w.id) {
                self.failed.push(entry.owner);
            }
        }
    }

    /// Verifies the invariants in the module note.
    pub fn check(&self) -> Result<(), String> {
        if self.host_used > self.cfg.host_budget_bytes {
            return Err(format!("host {} > budget", self.host_used));
        }
        if self.disk_used > self.cfg.disk_budget_bytes {
            return Err(format!("disk {} > budget", self.disk_used));
        }
        let host: usize = self
            .entries
            .values()
            .filter(|e| e.host.is_some())
            .map(|e| e.bytes)
            .sum();
        let disk: usize = self
            .entries
            .values()
            .filter(|e| e.file.is_some())
            .map(|e| on_disk(e.bytes))
            .sum();
        if host != self.host_used || disk != self.disk_used {
            return Err(format!(
                "accounting: host {host}/{} disk {disk}/{}",
                self.host_used, self.disk_used
            ));
        }
        if self.host_lru.len() + self.disk_lru.len() != self.entries.len() {
            return Err("lru records != entries".into());
        }
        Ok(())
    }
}

/// Disk bytes an entry of `bytes` takes: its file, header included, so the disk budget bounds
/// what is really on disk.
fn on_disk(bytes: usize) -> usize {
    bytes + HEADER_BYTES
}

fn place_of<K>(e: &Entry<K>) -> Place {
    if e.host.is_some() {
        Place::Host
    } else {
        Place::Disk
    }
}

impl<K> Drop for OffloadStore<K> {
    fn drop(&mut self) {
        let late = self
            .writer
            .as_mut()
            .map(SpillWriter::finish)
            .unwrap_or_default();
        for w in late {
            let _ = std::fs::remove_file(w.path);
        }
        for e in self.entries.values() {
            if let Some(path) = &e.file {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(host: usize, disk: usize, dir: Option<PathBuf>) -> OffloadStore<&'static str> {
        OffloadStore::new(StoreConfig {
            host_budget_bytes: host,
            disk_budget_bytes: disk,
            disk_dir: dir,
        })
    }

    fn files_bytes(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok()?.metadata().ok())
                    .map(|m| m.len() as usize)
                    .sum()
            })
            .unwrap_or(0)
    }

    #[test]
    fn host_spills_lru_to_disk_then_drops_lru_disk() {
        let dir = tempfile::tempdir().unwrap();
        let disk = 2 * on_disk(10);
        let mut s = store(20, disk, Some(dir.path().to_path_buf()));
        let a = s.put("a", vec![1; 10], 1).stored.unwrap();
        let b = s.put("b", vec![2; 10], 2).stored.unwrap();
        assert_eq!((a.1, b.1), (Place::Host, Place::Host));
        let c = s.put("c", vec![3; 10], 3);
        assert!(c.dropped.is_empty());
        assert_eq!(s.peek(a.0), Some((10, Place::Disk)));
        s.put("d", vec![4; 10], 4);
        s.put("e", vec![5; 10], 5);
        // Each spill now drops the LRU disk entry: a for c's spill, b for d's.
        let dropped = s.put("f", vec![6; 10], 6).dropped;
        assert_eq!(dropped, vec!["b"]);
        assert!(s.host_used() <= 20 && s.disk_used() <= disk);
        assert!(files_bytes(dir.path()) <= disk);
        s.check().unwrap();
        let (data, place) = s.take(s.next_id - 1).unwrap().unwrap();
        assert_eq!((data, place), (vec![6; 10], Place::Host));
        let (data, place) = s.take(3).unwrap().unwrap();
        assert_eq!((data, place), (vec![4; 10], Place::Disk));
        assert!(matches!(s.take(0), Ok(None)));
        s.check().unwrap();
        drop(s);
        assert_eq!(files_bytes(dir.path()), 0);
    }

    #[test]
    fn oversized_or_no_disk_is_dropped() {
        let mut s = store(8, 0, None);
        assert!(s.put("big", vec![0; 9], 0).stored.is_none());
        let a = s.put("a", vec![0; 8], 1).stored.unwrap();
        let p = s.put("b", vec![0; 8], 2);
        assert_eq!(p.dropped, vec!["a"]);
        assert!(s.peek(a.0).is_none());
        assert_eq!(s.stats().dropped, 2);
        s.check().unwrap();
    }

    #[test]
    fn spills_are_written_off_the_callers_thread_and_a_take_waits_for_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = store(0, 10 * on_disk(1 << 16), Some(dir.path().to_path_buf()));
        let ids: Vec<EntryId> = (0..4u8)
            .map(|i| s.put("x", vec![i; 1 << 16], u64::from(i)).stored.unwrap().0)
            .collect();
        s.check().unwrap();
        // Taking the last one waits for its write (and applies the earlier answers).
        let (data, place) = s.take(ids[3]).unwrap().unwrap();
        assert_eq!((data, place), (vec![3; 1 << 16], Place::Disk));
        // Removed while (perhaps) still writing: the file goes when the write is answered.
        assert!(s.remove(ids[0]));
        s.wait_for_writes();
        assert_eq!(files_bytes(dir.path()), 2 * on_disk(1 << 16));
        drop(s);
        assert_eq!(files_bytes(dir.path()), 0, "the store's files die with it");
    }

    #[test]
    fn a_spill_that_cannot_be_written_reports_its_owner_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        // The spill directory is a file: every write fails.
        let blocked = dir.path().join("not-a-dir");
        std::fs::write(&blocked, b"x").unwrap();
        let mut s = store(0, on_disk(16), Some(blocked.join("spill")));
        let (id, _) = s.put("a", vec![1; 16], 0).stored.unwrap();
        s.wait_for_writes();
        assert!(s.peek(id).is_none());
        assert_eq!(s.take_failed(), vec!["a"]);
        assert_eq!((s.disk_used(), s.stats().disk_errors), (0, 1));
        s.check().unwrap();
    }

    /// Puts one 16-byte entry on disk, applies `damage` to its file, and takes it back.
    fn take_damaged(damage: impl Fn(&std::path::Path)) -> (SpillReadError, StoreStats) {
        let dir = tempfile::tempdir().unwrap();
        let mut s = store(0, on_disk(16), Some(dir.path().to_path_buf()));
        let (id, place) = s.put("a", vec![9; 16], 0).stored.unwrap();
        assert_eq!(place, Place::Disk);
        s.wait_for_writes();
        for f in std::fs::read_dir(dir.path()).unwrap() {
            damage(&f.unwrap().path());
        }
        let err = s.take(id).unwrap_err();
        assert_eq!(s.disk_used(), 0);
        assert!(s.peek(id).is_none());
        s.check().unwrap();
        assert_eq!(files_bytes(dir.path()), 0, "the bad file is removed");
        (err, s.stats())
    }

    #[test]
    fn unreadable_file_is_an_error_naming_it() {
        let (err, stats) = take_damaged(|p| std::fs::write(p, b"short").unwrap());
        assert!(
            matches!(err.fault, SpillFault::Length { got: 5, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("kv-"), "{err}");
        assert_eq!(stats.disk_errors, 1);
    }

    #[test]
    fn missing_file_is_an_error() {
        let (err, _) = take_damaged(|p| std::fs::remove_file(p).unwrap());
        assert!(matches!(err.fault, SpillFault::Missing), "{err}");
    }

    #[test]
    fn same_length_corruption_is_caught_by_the_checksum() {
        let (err, _) = take_damaged(|p| {
            let mut bytes = std::fs::read(p).unwrap();
            let last = bytes.len() - 1;
            bytes[last] ^= 0x80;
            std::fs::write(p, bytes).unwrap();
        });
        assert!(matches!(err.fault, SpillFault::Checksum { .. }), "{err}");
    }
}
