//! Commits in the background: a training loop stages its state ([`Staged`]: copied to host
//! memory, or files mapped) and goes on while the compression and the durable write run on a
//! thread of their own ([`Committer`]).
//!
//! At most one commit is in flight: submitting another first waits for the one before, so
//! commits land in the order they were submitted, each on top of the last. A commit that fails
//! in the background reports its error on its [`Handle`] and again on the next
//! [`Committer::submit`] (which then commits nothing; the one after goes ahead) or
//! [`Committer::finish`], so a failure is never silent. Dropping the committer waits for the commit in flight: a submitted commit is
//! never abandoned.
//!
//! Each commit opens the repository for itself and closes it when done, so a long-lived
//! process (a training run) holds the repository's lock only while a commit is stored. What it
//! keeps between commits is the last commit's tensors ([`WarmTensors`], within a budget), so
//! the next commit's deltas need not decode their bases from the store again. Where the
//! repository defers its reverse re-encodes (`delta.defer`), the committer's thread does them
//! after each commit has landed ([`Committer::working_deferred`]): a commit waited for costs what
//! a first commit costs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::commit::{
    check_metrics, commit_staged, pending_deferred, run_deferred, writer_waiting, CommitOptions,
    CommitOutcome, Staged,
};
use crate::warm::{WarmTensors, DEFAULT_WARM_BYTES};
use crate::{Error, NoProgress, Repository, Result};

pub use crate::error::{failure, Failure};

/// One background commit: its outcome once it is known.
#[derive(Clone)]
pub struct Handle(Arc<Shared>);

struct Shared {
    outcome: Mutex<Option<std::result::Result<CommitOutcome, Failure>>>,
    ready: Condvar,
}

impl Handle {
    /// Waits for the commit; its outcome, or its error.
    pub fn wait(&self) -> Result<CommitOutcome> {
        let mut outcome = self.0.outcome.lock().unwrap_or_else(|p| p.into_inner());
        while outcome.is_none() {
            outcome = self
                .0
                .ready
                .wait(outcome)
                .unwrap_or_else(|p| p.into_inner());
        }
        match outcome.as_ref().expect("set before notified") {
            Ok(o) => Ok(o.clone()),
            Err(e) => Err(Error::Background(e.clone())),
        }
    }

    /// Whether the commit has finished (landed or failed).
    pub fn done(&self) -> bool {
        self.0
            .outcome
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    fn set(&self, outcome: std::result::Result<CommitOutcome, Failure>) {
        *self.0.outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
        self.0.ready.notify_all();
    }
}

/// Stores one staged commit: in a repository it opens for the purpose (and, for a repository
/// elsewhere, sends it there).
pub type Store =
    dyn Fn(Staged, &CommitOptions) -> std::result::Result<CommitOutcome, Failure> + Send + Sync;

/// Work done on the committer's thread after a commit lands (the deferred re-encodes), given
/// the commit's options and a flag that asks it to stop (set when the next commit is submitted).
pub type After = dyn Fn(&CommitOptions, &AtomicBool) + Send + Sync;

/// Runs staged commits on a background thread, one at a time.
pub struct Committer {
    store: Arc<Store>,
    /// What runs after each commit that landed.
    after: Option<Arc<After>>,
    /// Asks the work after a commit to stop (a new commit is waiting).
    stop: Arc<AtomicBool>,
    slot: Mutex<Slot>,
    /// The last commit's tensors, for the next commit's deltas.
    warm: Arc<WarmTensors>,
}

#[derive(Default)]
struct Slot {
    /// The last commit's outcome, until a submit or [`Committer::finish`] takes it.
    pending: Option<Handle>,
    /// The last commit's thread: storing it, then working the deferred re-encodes.
    thread: Option<JoinHandle<()>>,
}

impl Committer {
    /// A committer into the repository `open` opens (for writing) for each commit, keeping
    /// up to [`DEFAULT_WARM_BYTES`] of the last commit's tensors.
    pub fn new(open: impl Fn() -> Result<Repository> + Send + Sync + 'static) -> Committer {
        Committer::keeping(open, DEFAULT_WARM_BYTES)
    }

    /// A committer keeping up to `warm_bytes` of the last commit's tensors (0: none).
    pub fn keeping(
        open: impl Fn() -> Result<Repository> + Send + Sync + 'static,
        warm_bytes: u64,
    ) -> Committer {
        let open = Arc::new(open);
        let for_commits = open.clone();
        Committer::storing(
            move |staged, opts| {
                for_commits()
                    .and_then(|repo| commit_staged(&repo, staged, opts, &NoProgress))
                    .map_err(failure)
            },
            warm_bytes,
        )
        .working_deferred(move || open())
    }

    /// Also works the repository's deferred re-encodes ([`run_deferred`], `delta.defer`) after
    /// each commit lands, on the committer's thread, in the repository `open` opens for
    /// writing, with the commit's tensors still warm. Submitting the next commit, or another
    /// process waiting to write, stops the work at its next tensor (what is left stays queued
    /// for the next turn); [`Committer::finish`] and dropping the committer let it run to the
    /// end. A failure there is logged, not reported: the commit itself landed, and its
    /// re-encode stays queued.
    pub fn working_deferred(
        mut self,
        open: impl Fn() -> Result<Repository> + Send + Sync + 'static,
    ) -> Committer {
        self.after = Some(Arc::new(move |opts: &CommitOptions, stop: &AtomicBool| {
            let worked = open().and_then(|repo| {
                if pending_deferred(&repo)? == 0 {
                    return Ok(());
                }
                let stop = || stop.load(Ordering::Relaxed) || writer_waiting(&repo);
                run_deferred(&repo, opts.warm.as_deref(), &stop).map(drop)
            });
            if let Err(e) = worked {
                tracing::warn!("deferred re-encode after a commit: {e}");
            }
        }));
        self
    }

    /// A committer whose commits `store` stores, keeping up to `warm_bytes` of the last
    /// commit's tensors.
    pub fn storing(
        store: impl Fn(Staged, &CommitOptions) -> std::result::Result<CommitOutcome, Failure>
            + Send
            + Sync
            + 'static,
        warm_bytes: u64,
    ) -> Committer {
        Committer {
            store: Arc::new(store),
            after: None,
            stop: Arc::new(AtomicBool::new(false)),
            slot: Mutex::new(Slot::default()),
            warm: Arc::new(WarmTensors::new(warm_bytes)),
        }
    }

    /// Starts committing `staged` once the commit before has finished, and returns then. The
    /// error of the commit before, if it failed, is returned instead (and nothing is started),
    /// as are malformed options.
    pub fn submit(&self, staged: Staged, mut opts: CommitOptions) -> Result<Handle> {
        check_metrics(&opts.metrics)?;
        opts.warm.get_or_insert_with(|| self.warm.clone());
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(thread) = slot.thread.take() {
            // The work after the last commit stops at its next tensor (what is left stays
            // queued).
            self.stop.store(true, Ordering::Relaxed);
            let _ = thread.join();
            self.stop.store(false, Ordering::Relaxed);
        }
        if let Some(before) = slot.pending.take() {
            before.wait()?;
        }
        let handle = Handle(Arc::new(Shared {
            outcome: Mutex::new(None),
            ready: Condvar::new(),
        }));
        let (store, done) = (self.store.clone(), handle.clone());
        let (after, stop) = (self.after.clone(), self.stop.clone());
        let thread = std::thread::Builder::new()
            .name("mdl-commit".into())
            .spawn(move || {
                let run =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| store(staged, &opts)));
                let landed = matches!(run, Ok(Ok(_)));
                done.set(match run {
                    Ok(outcome) => outcome,
                    Err(_) => Err(failure(std::io::Error::other(
                        "the background commit panicked",
                    ))),
                });
                if let Some(after) = after.filter(|_| landed) {
                    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        after(&opts, &stop)
                    }));
                    if run.is_err() {
                        tracing::warn!("the work after a commit panicked");
                    }
                }
            })
            .map_err(|e| {
                let why = std::io::Error::other(format!("cannot start a commit thread: {e}"));
                Error::Background(failure(why))
            })?;
        slot.pending = Some(handle.clone());
        slot.thread = Some(thread);
        Ok(handle)
    }

    /// Waits until the commit in flight, if any, has landed or failed, leaving its outcome to
    /// [`Committer::finish`] and the next submit: what a read through the same committer's
    /// repository waits for, so that it sees every commit submitted before it.
    pub fn settle(&self) {
        let pending = self
            .slot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pending
            .clone();
        if let Some(handle) = pending {
            let _ = handle.wait();
        }
    }

    /// Waits for the commit in flight, if any, and takes its outcome (`None` when there was
    /// none): a failure is reported here instead of on the next submit. It returns once the
    /// commit has landed; the deferred re-encodes after it go on (the next submit stops them,
    /// dropping the committer waits for them).
    pub fn finish(&self) -> Result<Option<CommitOutcome>> {
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        match slot.pending.take() {
            Some(handle) => handle.wait().map(Some),
            None => Ok(None),
        }
    }
}

impl Drop for Committer {
    /// Waits for the commit in flight: a submitted commit finishes.
    fn drop(&mut self) {
        let slot = self.slot.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(thread) = slot.thread.take() {
            let _ = thread.join();
        }
    }
}
