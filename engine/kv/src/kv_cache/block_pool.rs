//! A preallocated pool of fixed-size KV blocks with reference counts, an O(1) intrusive free
//! list in LRU order, and a content-hash index of full blocks for prefix sharing.
//!
//! Invariants (checked by [`BlockPool::check`]):
//! - the pool never grows: `num_blocks` is fixed at construction, so the device byte budget
//!   (`num_blocks × block_bytes`) cannot be exceeded;
//! - a block is on the free list if and only if its reference count is 0;
//! - the free list is ordered by reclaim preference: blocks without cached content sit at the
//!   head (reused first), cached blocks are appended at the tail when their last holder
//!   releases them, so the head-most cached block is the least recently used;
//! - every entry of the hash index points at a block whose `content` carries that hash, and a
//!   block with content is in the index; allocating a cached block from the free list evicts
//!   its content (it leaves the index) before it is handed out.

use std::collections::HashMap;

use super::prefix_hash::block_hash;

/// Index of a block in the pool (and in the tensor-side paged KV store).
pub type BlockId = u32;

const NIL: u32 = u32::MAX;

/// What a full, hashed block holds: enough to verify a hash hit exactly.
#[derive(Clone, Debug)]
struct Content {
    hash: u64,
    parent: u64,
    tokens: Box<[u32]>,
}

#[derive(Clone, Debug)]
struct Slot {
    ref_count: u32,
    prev: u32,
    next: u32,
    on_free_list: bool,
    content: Option<Content>,
}

/// The block pool. "No room" is `None`, never an error.
#[derive(Debug)]
pub struct BlockPool {
    slots: Vec<Slot>,
    head: u32,
    tail: u32,
    num_free: usize,
    index: HashMap<u64, BlockId>,
    cached_evictions: u64,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks, all free. At most `u32::MAX - 1` blocks.
    pub fn new(num_blocks: u32) -> Self {
        let n = num_blocks.min(NIL - 1);
        let mut pool = BlockPool {
            slots: Vec::with_capacity(n as usize),
            head: NIL,
            tail: NIL,
            num_free: 0,
            index: HashMap::new(),
            cached_evictions: 0,
        };
        for _ in 0..n {
            pool.slots.push(Slot {
                ref_count: 0,
                prev: NIL,
                next: NIL,
                on_free_list: false,
                content: None,
            });
        }
        for b in 0..n {
            pool.push_back(b);
        }
        pool
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.slots.len()
    }

    /// Blocks that can be handed out now (free, including cached blocks nobody holds).
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Blocks held by at least one owner.
    pub fn num_used(&self) -> usize {
        self.slots.len() - self.num_free
    }

    /// Cached blocks whose content was evicted to make room.
    pub fn cached_evictions(&self) -> u64 {
        self.cached_evictions
    }

    /// Reference count of `block` (0 when free or out of range).
    pub fn ref_count(&self, block: BlockId) -> u32 {
        self.slots.get(block as usize).map_or(0, |s| s.ref_count)
    }

    /// Whether `block` holds hashed (immutable, shareable) content.
    pub fn is_cached(&self, block: BlockId) -> bool {
        self.slots
            .get(block as usize)
            .is_some_and(|s| s.content.is_some())
    }

    /// Hash of `block`'s content, if it is a hashed full block.
    pub fn hash_of(&self, block: BlockId) -> Option<u64> {
        self.slots
            .get(block as usize)
            .and_then(|s| s.content.as_ref().map(|c| c.hash))
    }

    /// Takes the block at the head of the free list (reference count 1), evicting its cached
    /// content if it had any. `None` when no block is free.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let b = self.head;
        if b == NIL {
            return None;
        }
        self.unlink(b);
        self.drop_content(b);
        self.slots[b as usize].ref_count = 1;
        Some(b)
    }

    /// Adds a holder to `block` (taking it off the free list if it was free). Returns false for
    /// an out-of-range block.
    pub fn acquire(&mut self, block: BlockId) -> bool {
        let Some(slot) = self.slots.get(block as usize) else {
            return false;
        };
        if slot.ref_count == 0 {
            self.unlink(block);
        }
        self.slots[block as usize].ref_count += 1;
        true
    }

    /// Drops one holder of `block`. When the last holder leaves, the block joins the free list:
    /// at the tail if it holds cached content (most recently used), else at the head. Returns
    /// false, changing nothing, if the block was not held (a double free).
    pub fn release(&mut self, block: BlockId) -> bool {
        let Some(slot) = self.slots.get_mut(block as usize) else {
            return false;
        };
        if slot.ref_count == 0 {
            return false;
        }
        slot.ref_count -= 1;
        if slot.ref_count == 0 {
            if slot.content.is_some() {
                self.push_back(block);
            } else {
                self.push_front(block);
            }
        }
        true
    }

    /// Looks up a cached full block holding `tokens` after a block hashed `parent`. A hit is
    /// verified against the stored parent hash and tokens.
    pub fn lookup(&self, parent: u64, tokens: &[u32]) -> Option<BlockId> {
        let hash = block_hash(parent, tokens);
        let &b = self.index.get(&hash)?;
        let c = self.slots.get(b as usize)?.content.as_ref()?;
        (c.parent == parent && *c.tokens == *tokens).then_some(b)
    }

    /// Marks held block `block` as a full block holding `tokens` after parent hash `parent`,
    /// and returns its hash. If another block already caches the same content, this block
    /// stays unhashed (a private duplicate) and the shared hash is still returned, so chains
    /// continue. A block that already has content keeps it.
    pub fn set_content(&mut self, block: BlockId, parent: u64, tokens: &[u32]) -> u64 {
        let hash = block_hash(parent, tokens);
        let Some(slot) = self.slots.get_mut(block as usize) else {
            return hash;
        };
        if let Some(c) = &slot.content {
            return c.hash;
        }
        if self.index.contains_key(&hash) {
            return hash;
        }
        slot.content = Some(Content {
            hash,
            parent,
            tokens: tokens.into(),
        });
        self.index.insert(hash, block);
        hash
    }

    /// Removes `block`'s cached content so it may be written in place (only valid for a block
    /// with a single holder; the caller checks).
    pub fn clear_content(&mut self, block: BlockId) {
        self.drop_content(block);
    }

    fn drop_content(&mut self, block: BlockId) {
        if let Some(c) = self
            .slots
            .get_mut(block as usize)
            .and_then(|s| s.content.take())
        {
            if self.index.get(&c.hash) == Some(&block) {
                self.index.remove(&c.hash);
            }
            if self.slots[block as usize].ref_count == 0 {
                self.cached_evictions += 1;
            }
        }
    }

    fn unlink(&mut self, b: BlockId) {
        let (prev, next) = {
            let s = &self.slots[b as usize];
            if !s.on_free_list {
                return;
            }
            (s.prev, s.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.slots[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.slots[next as usize].prev = prev;
        }
        let s = &mut self.slots[b as usize];
        s.prev = NIL;
        s.next = NIL;
        s.on_free_list = false;
        self.num_free -= 1;
    }

    fn push_back(&mut self, b: BlockId) {
        let old_tail = self.tail;
        {
            let s = &mut self.slots[b as usize];
            s.prev = old_tail;
            s.next = NIL;
            s.on_free_list = true;
        }
        if old_tail == NIL {
            self.head = b;
        } else {
            self.slots[old_tail as usize].next = b;
        }
        self.tail = b;
        self.num_free += 1;
    }

    fn push_front(&mut self, b: BlockId) {
        let old_head = self.head;
        {
            let s = &mut self.slots[b as usize];
            s.prev = NIL;
            s.next = old_head;
            s.on_free_list = true;
        }
        if old_head == NIL {
            self.tail = b;
        } else {
            self.slots[old_head as usize].prev = b;
        }
        self.head = b;
        self.num_free += 1;
    }

    /// Free-list order from head (next to reuse) to tail.
    pub fn free_order(&self) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(self.num_free);
        let mut b = self.head;
        while b != NIL && out.len() <= self.slots.len() {
            out.push(b);
            b = self.slots[b as usize].next;
        }
        out
    }

    /// Verifies the invariants in the module note; returns the first violation found.
    pub fn check(&self) -> Result<(), String> {
        let order = self.free_order();
        if order.len() != self.num_free {
            return Err(format!(
                "free list walk {} != num_free {}",
                order.len(),
                self.num_free
            ));
        }
        for &b in &order {
            let s = &self.slots[b as usize];
            if s.ref_count != 0 || !s.on_free_list {
                return Err(format!("block {b} on free list with ref {}", s.ref_count));
            }
        }
        let zero = self.slots.iter().filter(|s| s.ref_count == 0).count();
        if zero != self.num_free {
            return Err(format!("{zero} blocks unheld but {} free", self.num_free));
        }
        for (&h, &b) in &self.index {
            match self.slots.get(b as usize).and_then(|s| s.content.as_ref()) {
                Some(c) if c.hash == h => {}
                _ => {
                    return Err(format!(
                        "index entry {h:x} -> block {b} without that content"
                    ));
                }
            }
        }
        let with_content = self.slots.iter().filter(|s| s.content.is_some()).count();
        if with_content != self.index.len() {
            return Err(format!(
                "{with_content} blocks with content, {} indexed",
                self.index.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::prefix_hash::ROOT_HASH;
    use super::*;

    #[test]
    fn allocate_until_empty_then_none() {
        let mut p = BlockPool::new(3);
        let a: Vec<_> = (0..3).map(|_| p.allocate().unwrap()).collect();
        assert_eq!(a.len(), 3);
        assert_eq!(p.allocate(), None);
        assert_eq!(p.num_used(), 3);
        assert!(p.release(a[1]));
        assert_eq!(p.allocate(), Some(a[1]));
        p.check().unwrap();
    }

    #[test]
    fn double_free_is_refused() {
        let mut p = BlockPool::new(2);
        let b = p.allocate().unwrap();
        assert!(p.release(b));
        assert!(!p.release(b));
        assert_eq!(p.num_free(), 2);
        p.check().unwrap();
    }

    #[test]
    fn cached_blocks_are_reclaimed_lru_after_uncached() {
        let mut p = BlockPool::new(4);
        let blocks: Vec<_> = (0..4).map(|_| p.allocate().unwrap()).collect();
        let h0 = p.set_content(blocks[0], ROOT_HASH, &[1, 2]);
        p.set_content(blocks[1], h0, &[3, 4]);
        // Release cached block 1 first, then cached block 0, then uncached 2 and 3.
        for &b in &[blocks[1], blocks[0], blocks[2], blocks[3]] {
            p.release(b);
        }
        // Uncached first (most recently freed uncached at head), then cached in LRU order.
        assert_eq!(
            p.free_order(),
            vec![blocks[3], blocks[2], blocks[1], blocks[0]]
        );
        // A prefix hit revives a cached block without allocating.
        let hit = p.lookup(ROOT_HASH, &[1, 2]).unwrap();
        assert_eq!(hit, blocks[0]);
        assert!(p.acquire(hit));
        assert_eq!(p.num_free(), 3);
        p.check().unwrap();
        // Allocation drains uncached, then evicts the LRU cached block.
        assert_eq!(p.allocate(), Some(blocks[3]));
        assert_eq!(p.allocate(), Some(blocks[2]));
        assert_eq!(p.allocate(), Some(blocks[1]));
        assert_eq!(p.lookup(h0, &[3, 4]), None);
        assert_eq!(p.cached_evictions(), 1);
        p.check().unwrap();
    }

    #[test]
    fn lookup_verifies_parent_and_tokens() {
        let mut p = BlockPool::new(2);
        let b = p.allocate().unwrap();
        p.set_content(b, ROOT_HASH, &[7, 8]);
        assert_eq!(p.lookup(ROOT_HASH, &[7, 8]), Some(b));
        assert_eq!(p.lookup(ROOT_HASH + 1, &[7, 8]), None);
        assert_eq!(p.lookup(ROOT_HASH, &[7, 9]), None);
        // A duplicate stays private; the original keeps the index entry.
        let d = p.allocate().unwrap();
        p.set_content(d, ROOT_HASH, &[7, 8]);
        assert!(!p.is_cached(d));
        p.clear_content(b);
        assert_eq!(p.lookup(ROOT_HASH, &[7, 8]), None);
        p.check().unwrap();
    }
}
