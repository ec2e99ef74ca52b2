//! A team of compute threads that spin between parallel loops, for the decode step's many
//! short loops.
//!
//! Why not rayon here: a decode step of a small model runs a few hundred parallel loops, many
//! over matrices that take 10–30 µs to stream. Rayon's idle workers go to sleep after a few
//! yields, so most loops pay a futex wake-up and a reschedule on every other thread, which on
//! a VM is of the order of the loop itself. The team's threads instead spin for
//! [`SPIN_FOR`] after each loop (as llama.cpp's threads spin at their barriers), and only
//! then park, so a step's loops find them awake, and an idle engine costs no CPU.
//!
//! Invariants:
//! - One loop at a time: [`for_each_task`] holds the team for the whole loop; a second caller
//!   meanwhile (another engine in the same process, a nested call from inside a task) runs
//!   its loop on its own thread, serially, so results never depend on who got the team.
//! - A worker runs a task only of the loop it claims for: the claim counter carries the
//!   loop's generation beside the next task index, a claim is a compare-exchange on both, and
//!   the worker claims with the generation stored in the loop it read, so a late worker can
//!   never run a task of a loop that has returned (its closure is gone), nor claim an index
//!   of one loop against another's counter.
//! - The caller returns only after every claimed task has finished; a panicking task is
//!   caught on its thread, counted as finished, and re-raised on the caller's thread.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker spins for the next loop before it parks. Longer than the serial
/// work between two loops of a step (a norm, a residual add: a few µs) and than the engine's
/// own work between steps (sampling, streaming a token), short enough that an idle engine
/// stops burning its cores at once.
const SPIN_FOR: Duration = Duration::from_micros(300);

/// The task closure of the loop in flight, its lifetime erased (see [`for_each_task`]).
type TaskRef = *const (dyn Fn(usize) + Sync);

struct Loop {
    /// The generation this loop is published under: a worker claims with this one, never
    /// with the generation it saw in `claim`, because `current` is replaced just before
    /// `claim` moves on (a worker between the two would otherwise claim an index of the new
    /// loop against the old loop's counter).
    generation: u64,
    task: TaskRef,
    tasks: usize,
}

// SAFETY: the pointer is only dereferenced by workers holding a claim of the loop it belongs
// to, while the caller waits for them (module invariants); the closure is `Sync`.
#[allow(unsafe_code)]
unsafe impl Send for Loop {}

struct Team {
    /// Taken by the caller of a loop for its whole duration.
    busy: Mutex<()>,
    /// The loop in flight; written by the caller before it publishes a generation.
    current: Mutex<Option<Loop>>,
    /// `generation << 32 | next task index`; see the module invariants.
    claim: AtomicU64,
    /// Tasks of the current loop not yet finished.
    pending: AtomicUsize,
    panicked: AtomicBool,
    /// Workers parked on `wake`; the caller notifies only when there are any.
    parked: AtomicUsize,
    park: Mutex<()>,
    wake: Condvar,
    workers: usize,
}

static TEAM: OnceLock<&'static Team> = OnceLock::new();

thread_local! {
    /// Set on the team's own threads and on a caller while its loop runs: a nested loop runs
    /// serially instead of waiting for the team it is part of.
    static INSIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The size of the team, the calling thread included: the rayon pool's, which the engine's
/// `--threads` sets before the first step.
pub(crate) fn threads() -> usize {
    rayon::current_num_threads().max(1)
}

/// Runs `f(i)` for every `i` in `0..tasks`, spread over the team, and returns when all have
/// finished. Tasks are claimed one at a time, so uneven tasks balance themselves.
pub(crate) fn for_each_task(tasks: usize, f: impl Fn(usize) + Sync) {
    if tasks == 0 {
        return;
    }
    let team = if tasks == 1 || INSIDE.with(|c| c.get()) {
        None
    } else {
        team()
    };
    let Some(team) = team else {
        return (0..tasks).for_each(f);
    };
    let Ok(_busy) = team.busy.try_lock() else {
        return (0..tasks).for_each(f);
    };
    team.run(tasks, &f);
}

/// Hands each of `items` to one task: `f(item)` on the team. The items are what the caller
/// split safely beforehand (disjoint `chunks_mut` of its outputs, zipped with its inputs),
/// so a parallel loop over rows needs no unsafe code at its call site.
pub(crate) fn for_each_item<I: Send>(items: Vec<I>, f: impl Fn(I) + Sync) {
    let slots: Vec<Mutex<Option<I>>> = items.into_iter().map(|i| Mutex::new(Some(i))).collect();
    for_each_task(slots.len(), |i| {
        if let Some(item) = lock(&slots[i]).take() {
            f(item)
        }
    });
}

fn team() -> Option<&'static Team> {
    let team = *TEAM.get_or_init(|| Team::start(threads() - 1));
    (team.workers > 0).then_some(team)
}

impl Team {
    /// Starts `workers` threads; the team lives as long as the process. A thread that cannot
    /// be spawned leaves a smaller team (its share is run by the others).
    fn start(workers: usize) -> &'static Team {
        let team: &'static Team = Box::leak(Box::new(Team {
            busy: Mutex::new(()),
            current: Mutex::new(None),
            claim: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            parked: AtomicUsize::new(0),
            park: Mutex::new(()),
            wake: Condvar::new(),
            workers,
        }));
        for i in 0..workers {
            let spawned = std::thread::Builder::new()
                .name(format!("tidegate-compute-{}", i + 1))
                .spawn(move || team.work());
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "a compute thread could not be started; the team runs with fewer");
            }
        }
        team
    }

    /// The caller's side of a loop: publish it, run tasks alongside the workers, wait.
    fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        // SAFETY (lifetime erasure): `f` outlives this call, and no worker dereferences the
        // pointer after this call returns: workers only run tasks they claimed for this
        // generation, and we wait below until every task has finished.
        #[allow(unsafe_code)]
        let task: TaskRef = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), TaskRef>(f) };
        let generation = (self.claim.load(Ordering::Acquire) >> 32).wrapping_add(1) & 0xffff_ffff;
        *lock(&self.current) = Some(Loop {
            generation,
            task,
            tasks,
        });
        self.pending.store(tasks, Ordering::Release);
        // Tests widen the window between publishing the loop and its generation, where a
        // worker that claimed with the generation it saw, not the loop's, went wrong.
        #[cfg(test)]
        std::thread::sleep(Duration::from_micros(20));
        self.claim.store(generation << 32, Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) > 0 {
            let _g = lock(&self.park);
            self.wake.notify_all();
        }
        INSIDE.with(|c| c.set(true));
        self.take_tasks(generation, task, tasks);
        INSIDE.with(|c| c.set(false));
        loop {
            match self.pending.load(Ordering::Acquire) {
                0 => break,
                // More unfinished than there are tasks: a task was counted twice (the
                // invariants broke); fail loudly rather than wait for ever.
                p if p > tasks => panic!("compute team: {p} tasks pending of {tasks}"),
                _ => relax(),
            }
        }
        *lock(&self.current) = None;
        if self.panicked.swap(false, Ordering::AcqRel) {
            panic!("a compute task panicked (its message is above)");
        }
    }

    /// Claims and runs tasks of `generation` until none are left.
    fn take_tasks(&self, generation: u64, task: TaskRef, tasks: usize) {
        let mut seen = self.claim.load(Ordering::Acquire);
        loop {
            let next = seen & 0xffff_ffff;
            if seen >> 32 != generation || next as usize >= tasks {
                return;
            }
            match self.claim.compare_exchange_weak(
                seen,
                seen + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    // SAFETY: we hold a claim of this generation, so its caller is waiting
                    // for us and the closure is alive (module invariants).
                    #[allow(unsafe_code)]
                    let f = unsafe { &*task };
                    if catch_unwind(AssertUnwindSafe(|| f(next as usize))).is_err() {
                        self.panicked.store(true, Ordering::Release);
                    }
                    self.pending.fetch_sub(1, Ordering::AcqRel);
                    seen = self.claim.load(Ordering::Acquire);
                }
                Err(now) => seen = now,
            }
        }
    }

    /// A worker: wait for a new generation (spinning, then parked), join its loop, repeat.
    fn work(&self) {
        INSIDE.with(|c| c.set(true));
        let mut done_generation = 0u64;
        loop {
            done_generation = self.wait_for_loop(done_generation);
            let current = lock(&self.current)
                .as_ref()
                .map(|l| (l.generation, l.task, l.tasks));
            if let Some((generation, task, tasks)) = current {
                self.take_tasks(generation, task, tasks);
            }
        }
    }

    /// Returns the first generation after `done`, spinning for [`SPIN_FOR`], then parked.
    fn wait_for_loop(&self, done: u64) -> u64 {
        let generation = || self.claim.load(Ordering::SeqCst) >> 32;
        let start = Instant::now();
        while generation() == done {
            relax();
            if start.elapsed() > SPIN_FOR {
                let mut g = lock(&self.park);
                self.parked.fetch_add(1, Ordering::SeqCst);
                while generation() == done {
                    g = self.wake.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                self.parked.fetch_sub(1, Ordering::SeqCst);
            }
        }
        generation()
    }
}

/// One round of waiting for another thread: a few pause instructions, then a yield, so that
/// where the engine has more threads than cores (two engines on one node, a test beside the
/// engine) the thread we wait for gets a core at once instead of after our time slice. With a
/// core to spare the yield returns at once, so a wake-up still costs well under a µs.
fn relax() {
    for _ in 0..16 {
        std::hint::spin_loop();
    }
    std::thread::yield_now();
}

/// A poisoned lock only means a task panicked while another thread held it; the data under
/// these locks (a loop descriptor, nothing) is valid either way.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Runs a loop of `tasks` tasks; whether each ran exactly once.
    fn each_task_runs_once(tasks: usize) -> bool {
        let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
        for_each_task(tasks, |i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
        });
        hits.iter().all(|h| h.load(Ordering::Relaxed) == 1)
    }

    #[test]
    fn every_task_runs_exactly_once_across_many_loops() {
        for tasks in [0, 1, 2, 3, 7, 64, 1000] {
            for _ in 0..50 {
                assert!(each_task_runs_once(tasks), "{tasks}");
            }
        }
    }

    #[test]
    fn loops_of_alternating_sizes_never_share_a_task_between_them() {
        // A small loop followed at once by a large one is where a worker that read the new
        // loop against the old loop's counter would run one task twice (and never return).
        for round in 0..3000 {
            let tasks = [2, 200, 3, 64][round % 4];
            assert!(each_task_runs_once(tasks), "round {round}");
        }
    }

    #[test]
    fn a_nested_loop_runs_serially_and_completes() {
        let sum = AtomicUsize::new(0);
        for_each_task(8, |_| {
            for_each_task(4, |j| {
                sum.fetch_add(j, Ordering::Relaxed);
            })
        });
        assert_eq!(sum.load(Ordering::Relaxed), 8 * 6);
    }

    #[test]
    fn loops_from_several_threads_at_once_all_complete() {
        std::thread::scope(|s| {
            for t in 0..4usize {
                s.spawn(move || {
                    for _ in 0..200 {
                        let sum = AtomicUsize::new(0);
                        for_each_task(16, |i| {
                            sum.fetch_add(i + t, Ordering::Relaxed);
                        });
                        assert_eq!(sum.load(Ordering::Relaxed), 120 + 16 * t);
                    }
                });
            }
        });
    }

    #[test]
    fn workers_park_when_idle_and_wake_for_the_next_loop() {
        let sum = AtomicUsize::new(0);
        for_each_task(4, |i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        std::thread::sleep(SPIN_FOR * 20);
        for_each_task(4, |i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 12);
    }

    #[test]
    fn a_panicking_task_is_raised_on_the_caller_and_the_team_survives() {
        let r = std::panic::catch_unwind(|| {
            for_each_task(8, |i| {
                if i == 5 {
                    panic!("task 5");
                }
            })
        });
        assert!(r.is_err());
        let n = AtomicUsize::new(0);
        for_each_task(8, |_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 8);
    }
}
