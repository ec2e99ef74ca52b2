//! One file's download: appended to a partial file (resumed from its length), hashed as it
//! is written, checked for size and checksum, then renamed into place.
//!
//! Invariants: a file reaches its final name only whole and verified (temp + fsync +
//! rename); a partial file is only ever resumed for the same content (the caller names it
//! by the object's version: S3's ETag, the hub's blob id), otherwise it is started over.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use md5::{Digest as _, Md5};
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::info;

use crate::error::Cause;

/// What the source says the file's bytes hash to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checksum {
    /// The source publishes none (S3 multipart objects, the hub's small git files): the
    /// size is checked alone.
    None,
    /// Hex MD5 (S3's ETag of a single-part, unencrypted object).
    Md5(String),
    /// Hex SHA-256 (the hub's LFS files, named by it).
    Sha256(String),
}

enum Hasher {
    None,
    Md5(Md5),
    Sha256(Sha256),
}

impl Hasher {
    fn new(c: &Checksum) -> Self {
        match c {
            Checksum::None => Hasher::None,
            Checksum::Md5(_) => Hasher::Md5(Md5::new()),
            Checksum::Sha256(_) => Hasher::Sha256(Sha256::new()),
        }
    }

    fn update(&mut self, b: &[u8]) {
        match self {
            Hasher::None => {}
            Hasher::Md5(h) => h.update(b),
            Hasher::Sha256(h) => h.update(b),
        }
    }

    fn hex(self) -> Option<String> {
        let bytes: Vec<u8> = match self {
            Hasher::None => return None,
            Hasher::Md5(h) => h.finalize().to_vec(),
            Hasher::Sha256(h) => h.finalize().to_vec(),
        };
        Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }
}

/// A file being downloaded.
pub struct Partial {
    path: PathBuf,
    file: tokio::fs::File,
    hasher: Hasher,
    have: u64,
    progress: Progress,
}

impl Partial {
    /// Opens (or creates) the partial file at `path` and hashes what it already holds, so the
    /// download resumes at [`Partial::offset`]. A partial longer than `size` is started over.
    pub async fn open(
        path: &Path,
        checksum: &Checksum,
        size: u64,
        name: &str,
    ) -> Result<Self, Cause> {
        if let Some(dir) = path.parent() {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|e| Cause::io(dir, e))?;
        }
        let mut hasher = Hasher::new(checksum);
        let mut have = 0u64;
        if let Ok(mut f) = tokio::fs::File::open(path).await {
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = f.read(&mut buf).await.map_err(|e| Cause::io(path, e))?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                have += n as u64;
            }
        }
        if have > size {
            tokio::fs::remove_file(path)
                .await
                .map_err(|e| Cause::io(path, e))?;
            hasher = Hasher::new(checksum);
            have = 0;
        }
        let file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .await
            .map_err(|e| Cause::io(path, e))?;
        if have > 0 {
            info!(
                file = name,
                resumed_at = have,
                size,
                "resuming a partial download"
            );
        }
        Ok(Partial {
            path: path.to_path_buf(),
            file,
            hasher,
            have,
            progress: Progress::new(name, size, have),
        })
    }

    /// Drops what the partial held (the source answered a resume with the whole file).
    pub async fn restart(&mut self, checksum: &Checksum) -> Result<(), Cause> {
        self.file
            .set_len(0)
            .await
            .map_err(|e| Cause::io(&self.path, e))?;
        self.hasher = Hasher::new(checksum);
        self.have = 0;
        Ok(())
    }

    /// Bytes already held: where the download resumes.
    pub fn offset(&self) -> u64 {
        self.have
    }

    /// Appends a chunk.
    pub async fn write(&mut self, chunk: &[u8]) -> Result<(), Cause> {
        self.file
            .write_all(chunk)
            .await
            .map_err(|e| Cause::io(&self.path, e))?;
        self.hasher.update(chunk);
        self.have += chunk.len() as u64;
        self.progress.at(self.have);
        Ok(())
    }

    /// Checks size and checksum, syncs, and renames the file to `dest`. A file that fails
    /// its check is removed (the next try downloads it again).
    pub async fn finish(
        mut self,
        size: u64,
        checksum: &Checksum,
        dest: &Path,
    ) -> Result<(), Cause> {
        self.file
            .flush()
            .await
            .map_err(|e| Cause::io(&self.path, e))?;
        self.file
            .sync_all()
            .await
            .map_err(|e| Cause::io(&self.path, e))?;
        let bad = if self.have != size {
            Some(format!(
                "{}: {} bytes, the source says {size}",
                self.progress.name, self.have
            ))
        } else {
            let want = match checksum {
                Checksum::None => None,
                Checksum::Md5(h) | Checksum::Sha256(h) => Some(h.to_ascii_lowercase()),
            };
            let got = std::mem::replace(&mut self.hasher, Hasher::None).hex();
            match (want, got) {
                (Some(w), Some(g)) if w != g => Some(format!(
                    "{}: checksum {g}, the source says {w}",
                    self.progress.name
                )),
                _ => None,
            }
        };
        if let Some(why) = bad {
            let _ = tokio::fs::remove_file(&self.path).await;
            return Err(Cause::Corrupt(why));
        }
        if let Some(dir) = dest.parent() {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|e| Cause::io(dir, e))?;
        }
        tokio::fs::rename(&self.path, dest)
            .await
            .map_err(|e| Cause::io(dest, e))?;
        self.progress.done();
        Ok(())
    }
}

/// How often progress is logged while a file downloads.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Progress of one file, logged every few seconds and at the end.
struct Progress {
    name: String,
    total: u64,
    started_at: u64,
    started: Instant,
    last: Instant,
}

impl Progress {
    fn new(name: &str, total: u64, have: u64) -> Self {
        let now = Instant::now();
        Progress {
            name: name.to_string(),
            total,
            started_at: have,
            started: now,
            last: now,
        }
    }

    fn at(&mut self, have: u64) {
        if self.last.elapsed() < PROGRESS_EVERY {
            return;
        }
        self.last = Instant::now();
        info!(
            file = %self.name,
            bytes = have,
            total = self.total,
            percent = format!("{:.1}", 100.0 * have as f64 / self.total.max(1) as f64),
            mib_per_s = format!("{:.1}", self.rate(have)),
            "downloading"
        );
    }

    fn rate(&self, have: u64) -> f64 {
        let s = self.started.elapsed().as_secs_f64().max(1e-3);
        (have - self.started_at) as f64 / s / (1024.0 * 1024.0)
    }

    fn done(&self) {
        info!(
            file = %self.name,
            bytes = self.total,
            seconds = format!("{:.2}", self.started.elapsed().as_secs_f64()),
            mib_per_s = format!("{:.1}", self.rate(self.total)),
            "downloaded and verified"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MD5_HELLO: &str = "5d41402abc4b2a76b9719d911017c592";

    #[tokio::test]
    async fn a_resumed_download_hashes_the_bytes_it_already_had() {
        let dir = tempfile::tempdir().unwrap();
        let part = dir.path().join("p/x.part");
        let c = Checksum::Md5(MD5_HELLO.into());
        // What an interrupted download left on disk.
        std::fs::create_dir_all(part.parent().unwrap()).unwrap();
        std::fs::write(&part, b"he").unwrap();
        let mut p = Partial::open(&part, &c, 5, "x").await.unwrap();
        assert_eq!(p.offset(), 2);
        p.write(b"llo").await.unwrap();
        let dest = dir.path().join("out/x");
        p.finish(5, &c, &dest).await.unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"hello");
        assert!(!part.exists());
    }

    #[tokio::test]
    async fn a_wrong_checksum_or_size_fails_and_leaves_nothing_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let part = dir.path().join("x.part");
        let dest = dir.path().join("x");
        let c = Checksum::Md5(MD5_HELLO.into());
        let mut p = Partial::open(&part, &c, 5, "x").await.unwrap();
        p.write(b"hellO").await.unwrap();
        let e = p.finish(5, &c, &dest).await.unwrap_err();
        assert!(e.to_string().contains("checksum"), "{e}");
        let mut p = Partial::open(&part, &Checksum::None, 5, "x").await.unwrap();
        p.write(b"hell").await.unwrap();
        let e = p.finish(5, &Checksum::None, &dest).await.unwrap_err();
        assert!(e.to_string().contains("4 bytes, the source says 5"), "{e}");
        assert!(!dest.exists() && !part.exists());
    }
}
