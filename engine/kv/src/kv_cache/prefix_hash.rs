//! Content hashes of full KV blocks, chained so that a block's hash covers every token before it.
//!
//! Invariant: `block_hash(parent, tokens)` depends only on its arguments (deterministic within
//! one process), and the first block of a sequence uses [`ROOT_HASH`] as its parent. Two blocks
//! with equal hashes are candidates only: the pool also compares the parent hash and the tokens
//! before it reports a hit, so a 64-bit collision can never alias two different prefixes'
//! last blocks.

use std::hash::{DefaultHasher, Hash, Hasher};

/// Parent hash of a sequence's first block.
pub const ROOT_HASH: u64 = 0x7469_6465_6761_7465;

/// Hash of a full block holding `tokens`, whose predecessor block has hash `parent`.
pub fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chained_hash_depends_on_parent_and_tokens() {
        let a = block_hash(ROOT_HASH, &[1, 2, 3, 4]);
        assert_eq!(a, block_hash(ROOT_HASH, &[1, 2, 3, 4]));
        assert_ne!(a, block_hash(ROOT_HASH, &[1, 2, 3, 5]));
        assert_ne!(block_hash(a, &[5, 6]), block_hash(ROOT_HASH, &[5, 6]));
    }
}
