//! The on-disk form of one offloaded entry (a session's KV blocks, concatenated), and the
//! checks that make a bad file an error instead of KV.
//!
//! Layout: a 24-byte header — magic `TGKVSPL1`, payload length (u64 LE), checksum of the
//! payload (u64 LE) — followed by the payload. Files are written and read by the same process
//! (their names carry its pid, and they are removed when it lets go of them), so the format
//! needs no compatibility story; the magic only makes a stray file recognisable.
//!
//! Invariant: [`read_spill`] returns bytes only when the file is exactly header + the
//! expected length, its header matches, and the payload's checksum matches. That catches a
//! missing file, a short (or long) file, and a same-length file whose bytes changed — the
//! last would otherwise be restored as if it were the session's KV.
//!
//! Why one checksum per file, not per block: the file is the unit that is restored or
//! recomputed (a session's KV is only useful as a prefix, and a bad block makes the rest of
//! the entry suspect), so naming the file is enough and the check stays one pass.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

/// Bytes in front of the payload.
pub const HEADER_BYTES: usize = 24;
const MAGIC: [u8; 8] = *b"TGKVSPL1";

/// Why a spill file could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum SpillFault {
    /// The file is gone.
    #[error("file is missing")]
    Missing,
    /// Opening or reading it failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The file is shorter (truncated) or longer than header + payload.
    #[error("file has {got} bytes, expected {want}")]
    Length {
        /// Bytes on disk.
        got: u64,
        /// Header plus the entry's length.
        want: u64,
    },
    /// The magic or the recorded length does not match.
    #[error("bad header")]
    Header,
    /// The payload is not what was written.
    #[error("checksum mismatch (stored {stored:016x}, computed {computed:016x})")]
    Checksum {
        /// Checksum in the header.
        stored: u64,
        /// Checksum of the bytes read.
        computed: u64,
    },
}

/// A 64-bit checksum, one multiply per 8 bytes (a small fraction of the cost of reading the
/// file). Each step `h → (rotl(h) ^ word) · K` is a bijection in both `h` and `word`, so a
/// change confined to one 8-byte word always changes the result; the length is mixed in
/// first, so a length change does too. It guards against accidents (a torn or corrupted
/// file), not against someone who can write the spill directory.
pub fn checksum(data: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = (data.len() as u64) ^ 0x005E_ED0F_C0FF_EE00;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let mut a = [0u8; 8];
        a.copy_from_slice(w);
        h = (h.rotate_left(23) ^ u64::from_le_bytes(a)).wrapping_mul(K);
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut a = [0u8; 8];
        a[..rest.len()].copy_from_slice(rest);
        h = (h.rotate_left(23) ^ u64::from_le_bytes(a)).wrapping_mul(K);
    }
    // Final avalanche (bijective), so nearby inputs do not give nearby sums.
    h ^= h >> 33;
    h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    h ^ (h >> 33)
}

fn header(data: &[u8]) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[..8].copy_from_slice(&MAGIC);
    h[8..16].copy_from_slice(&(data.len() as u64).to_le_bytes());
    h[16..].copy_from_slice(&checksum(data).to_le_bytes());
    h
}

fn u64_at(h: &[u8; HEADER_BYTES], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&h[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Suffix of a spill file while it is being written (beside its final name).
pub const PARTIAL_SUFFIX: &str = ".part";

/// Writes `data` to a new file at `path` (replacing any file there): first under the same
/// name plus [`PARTIAL_SUFFIX`], then renamed, so a file at `path` is always whole (whoever
/// lists the directory while the writer thread works sees no half-written file; a failed
/// write leaves nothing at `path`). No fsync: spilled KV is a cache that dies with the process.
pub fn write_spill(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(PARTIAL_SUFFIX);
    let partial = std::path::PathBuf::from(partial);
    let written = File::create(&partial).and_then(|mut f| {
        f.write_all(&header(data))?;
        f.write_all(data)?;
        f.flush()
    });
    match written.and_then(|()| std::fs::rename(&partial, path)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
}

/// Reads back the payload of the file at `path`, which must hold exactly `want` bytes that
/// match their checksum.
pub fn read_spill(path: &Path, want: usize) -> Result<Vec<u8>, SpillFault> {
    let mut f = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => SpillFault::Missing,
        _ => SpillFault::Io(e),
    })?;
    let expect = (HEADER_BYTES + want) as u64;
    let len = f.metadata()?.len();
    if len != expect {
        return Err(SpillFault::Length {
            got: len,
            want: expect,
        });
    }
    let mut h = [0u8; HEADER_BYTES];
    f.read_exact(&mut h)?;
    if h[..8] != MAGIC || u64_at(&h, 8) != want as u64 {
        return Err(SpillFault::Header);
    }
    let mut data = vec![0u8; want];
    f.read_exact(&mut data)?;
    let (stored, computed) = (u64_at(&h, 16), checksum(&data));
    if stored != computed {
        return Err(SpillFault::Checksum { stored, computed });
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spilled(data: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kv.bin");
        write_spill(&path, data).unwrap();
        (dir, path)
    }

    #[test]
    fn round_trips() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let (_dir, path) = spilled(&data);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len() as usize,
            HEADER_BYTES + 1000
        );
        assert_eq!(read_spill(&path, 1000).unwrap(), data);
        let err = read_spill(&path, 0).unwrap_err();
        assert_eq!(err.to_string(), "file has 1024 bytes, expected 24");
    }

    #[test]
    fn truncated_missing_and_corrupt_files_are_errors() {
        let data = vec![3u8; 64];
        let (_dir, path) = spilled(&data);
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(50).unwrap();
        assert!(matches!(
            read_spill(&path, 64),
            Err(SpillFault::Length { got: 50, want: 88 })
        ));
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(read_spill(&path, 64), Err(SpillFault::Missing)));
        // Every single-bit flip anywhere in the file is caught.
        write_spill(&path, &data).unwrap();
        let good = std::fs::read(&path).unwrap();
        for i in 0..good.len() * 8 {
            let mut bad = good.clone();
            bad[i / 8] ^= 1 << (i % 8);
            std::fs::write(&path, &bad).unwrap();
            assert!(read_spill(&path, 64).is_err(), "bit {i} flipped unnoticed");
        }
    }

    #[test]
    fn checksum_sees_length_and_word_changes() {
        assert_ne!(checksum(&[]), checksum(&[0]));
        assert_ne!(checksum(&[0; 8]), checksum(&[0; 16]));
        let a = vec![0u8; 4096];
        let mut b = a.clone();
        b[4000] = 0xFF;
        assert_ne!(checksum(&a), checksum(&b));
    }
}
