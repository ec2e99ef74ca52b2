//! The disk spill writer: one thread that writes spill files, so the engine loop never waits
//! on a disk write while it serves.
//!
//! Invariants: jobs are written in the order they were submitted, each answered by exactly one
//! [`Written`]; a failed write leaves no file behind; [`SpillWriter::finish`] writes every job
//! already submitted and answers it before it returns (the store then deletes the files).

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

use super::ids::EntryId;
use super::spill_file::write_spill;

/// One spill file to write.
struct Job {
    id: EntryId,
    path: PathBuf,
    data: Vec<u8>,
}

/// A job's answer.
#[derive(Debug)]
pub(super) struct Written {
    /// The entry the file belongs to.
    pub id: EntryId,
    /// The file.
    pub path: PathBuf,
    /// Whether it is on disk, whole.
    pub result: std::io::Result<()>,
}

/// The writer thread and its two channels.
#[derive(Debug)]
pub(super) struct SpillWriter {
    jobs: Option<Sender<Job>>,
    done: Receiver<Written>,
    thread: Option<JoinHandle<()>>,
}

impl SpillWriter {
    /// Starts the thread.
    pub(super) fn start() -> std::io::Result<Self> {
        let (jobs, rx) = channel::<Job>();
        let (tx, done) = channel();
        let thread = std::thread::Builder::new()
            .name("kv-spill-writer".into())
            .spawn(move || {
                for job in rx {
                    let result = write_job(&job);
                    let written = Written {
                        id: job.id,
                        path: job.path,
                        result,
                    };
                    if tx.send(written).is_err() {
                        break;
                    }
                }
            })?;
        Ok(SpillWriter {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
        })
    }

    /// Queues a file; the bytes come back when the thread is gone (the caller writes them).
    pub(super) fn submit(&self, id: EntryId, path: PathBuf, data: Vec<u8>) -> Result<(), Vec<u8>> {
        match &self.jobs {
            Some(jobs) => jobs
                .send(Job { id, path, data })
                .map_err(|refused| refused.0.data),
            None => Err(data),
        }
    }

    /// Answers that arrived, without waiting.
    pub(super) fn ready(&self) -> Vec<Written> {
        self.done.try_iter().collect()
    }

    /// The next answer, waiting for it; `None` when the thread is gone.
    pub(super) fn next(&self) -> Option<Written> {
        self.done.recv().ok()
    }

    /// Writes what was submitted, stops the thread and returns the answers not yet taken.
    pub(super) fn finish(&mut self) -> Vec<Written> {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.done.try_iter().collect()
    }
}

impl Drop for SpillWriter {
    fn drop(&mut self) {
        self.finish();
    }
}

fn write_job(job: &Job) -> std::io::Result<()> {
    let written = match job.path.parent() {
        Some(dir) => std::fs::create_dir_all(dir),
        None => Ok(()),
    }
    .and_then(|()| write_spill(&job.path, &job.data));
    if written.is_err() {
        let _ = std::fs::remove_file(&job.path);
    }
    written
}
