//! A local replica's process: a child this runtime started, or an engine an earlier operator
//! started and this one adopted after a restart. An adopted engine is not our child: it is
//! watched through /proc and signalled with `kill`, and how it exited is not known.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Child;
use tracing::{info, warn};

use crate::ports::RuntimeError;

/// One replica's process: program, arguments and environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Where its spilled KV goes (created before the start), when the pool has a disk tier.
    pub kv_disk_dir: Option<PathBuf>,
}

/// How a replica's process stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcessState {
    Running,
    /// Exited 0: an engine does so once drained.
    Succeeded,
    /// Exited otherwise (a crash), with the status in words.
    Failed(String),
    /// An adopted engine that is gone; how it ended is not known.
    Gone,
}

/// The process behind a replica.
#[derive(Debug)]
pub enum Process {
    Child(Child),
    /// An earlier operator's engine, by pid, serving the API on `api_port` (which tells it
    /// from another process that got the pid since).
    Adopted {
        pid: u32,
        api_port: u16,
    },
}

impl Process {
    pub fn pid(&self) -> Option<u32> {
        match self {
            Process::Child(c) => c.id(),
            Process::Adopted { pid, .. } => Some(*pid),
        }
    }

    /// Whether it still runs, and if not, how it ended.
    pub fn state(&mut self) -> ProcessState {
        match self {
            Process::Child(c) => match c.try_wait() {
                Ok(Some(status)) if status.success() => ProcessState::Succeeded,
                Ok(Some(status)) => ProcessState::Failed(status.to_string()),
                _ => ProcessState::Running,
            },
            Process::Adopted { pid, api_port } => {
                if engine_alive(*pid, *api_port) {
                    ProcessState::Running
                } else {
                    ProcessState::Gone
                }
            }
        }
    }

    /// SIGKILL, without waiting.
    pub fn kill_now(&mut self) {
        match self {
            Process::Child(c) => {
                let _ = c.start_kill();
            }
            Process::Adopted { pid, .. } => signal(*pid, "-KILL"),
        }
    }

    /// SIGTERM now (the engine drains), SIGKILL if it still runs after `grace`.
    pub fn stop(mut self, replica: String, grace: Duration) {
        if let Some(pid) = self.pid() {
            signal(pid, "-TERM");
        }
        tokio::spawn(async move {
            let exited = match &mut self {
                Process::Child(c) => match tokio::time::timeout(grace, c.wait()).await {
                    Ok(Ok(status)) => Some(status.to_string()),
                    _ => None,
                },
                Process::Adopted { pid, api_port } => {
                    let deadline = tokio::time::Instant::now() + grace;
                    loop {
                        if !engine_alive(*pid, *api_port) {
                            break Some("exited".to_string());
                        }
                        if tokio::time::Instant::now() >= deadline {
                            break None;
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            };
            match exited {
                Some(status) => info!(replica = %replica, %status, "engine exited"),
                None => {
                    warn!(replica = %replica, "engine outlived its drain grace period; killing it");
                    self.kill_now();
                    if let Process::Child(c) = &mut self {
                        let _ = c.wait().await;
                    }
                }
            }
        });
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .arg(sig)
        .arg(pid.to_string())
        .stderr(std::process::Stdio::null())
        .status();
}

/// Whether `pid` is still a live engine serving on `api_port`. With /proc (Linux) a zombie
/// or a process that reused the pid does not count; elsewhere `kill -0` is all there is.
pub fn engine_alive(pid: u32, api_port: u16) -> bool {
    let proc_dir = std::path::Path::new("/proc").join(pid.to_string());
    if !std::path::Path::new("/proc/self").exists() {
        return std::process::Command::new("kill")
            .arg("-0")
            .arg(pid.to_string())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    }
    let Ok(stat) = std::fs::read_to_string(proc_dir.join("stat")) else {
        return false;
    };
    // The state follows the parenthesized command name: "pid (comm) S ...".
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim().chars().next());
    if matches!(state, Some('Z' | 'X') | None) {
        return false;
    }
    let Ok(cmdline) = std::fs::read(proc_dir.join("cmdline")) else {
        return false;
    };
    let listen = format!(":{api_port}");
    cmdline
        .split(|b| *b == 0)
        .any(|arg| arg.ends_with(listen.as_bytes()))
}

/// Starts `launch` (an engine or a router) with stdout and stderr in a fresh file at
/// `log_path`; the child is killed if its handle is dropped.
pub fn spawn_logged(
    launch: &LocalCommand,
    log_path: &Path,
    what: &str,
) -> Result<Process, RuntimeError> {
    let log = std::fs::File::create(log_path)
        .map_err(|e| RuntimeError(format!("{}: {e}", log_path.display())))?;
    let err_log = log.try_clone().map_err(|e| RuntimeError(e.to_string()))?;
    let mut cmd = tokio::process::Command::new(&launch.program);
    cmd.args(&launch.args)
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(log))
        .stderr(std::process::Stdio::from(err_log))
        .kill_on_drop(true);
    let child = cmd
        .spawn()
        .map_err(|e| RuntimeError(format!("spawn {what} {}: {e}", launch.program.display())))?;
    Ok(Process::Child(child))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_without_the_port_on_its_command_line_is_not_the_engine() {
        let me = std::process::id();
        assert!(!engine_alive(me, 1));
        assert!(!engine_alive(u32::MAX - 1, 1), "no such pid");
    }
}
