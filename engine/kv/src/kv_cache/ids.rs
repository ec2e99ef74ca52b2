//! Identities that several layers of the cache name: a leaf, so that the layer that owns a
//! thing and the layers that refer to it do not import each other.

/// Identifies a request (sequence) for the whole of its life (owned by the manager; the
/// transfer plan names it).
pub type SeqId = u64;

/// Identifies one entry of the offload store (owned by the store; the spill writer answers
/// with it).
pub type EntryId = u64;
