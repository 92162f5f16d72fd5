//! What a process that commits again and again keeps of its last commit: the content of its
//! tensors, by object id, within a byte budget. The next commit's deltas and residuals are taken
//! against exactly these versions, which otherwise it would read and decode from the store again.
//! A commit offers its tensors only when the next one reads them so (a lossy commit, or eager
//! deltas; see `commit::next_commit_reads`).
//!
//! Content is keyed by its object id (the hash of that content and its header), so a kept
//! tensor is the object's content whichever repository or commit asks for it: the cache can be
//! out of date only in what it holds, never wrong in what it returns.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use mdl_codec::engine::Kept;
use mdl_format::ObjectId;

/// The default budget of a long-lived committer (the Python package, `mdl serve`).
pub const DEFAULT_WARM_BYTES: u64 = 2 << 30;

/// The tensors of the last commit made through this cache (see the module docs).
pub struct WarmTensors {
    budget: u64,
    inner: Mutex<Generations>,
}

#[derive(Default)]
struct Generations {
    /// The last published commit's tensors: what the next commit reads.
    last: HashMap<ObjectId, Held>,
    /// The commit at work's tensors, published when it lands.
    next: HashMap<ObjectId, Held>,
    next_bytes: u64,
}

/// A kept tensor, and its copy where the engine that stored it computes (a GPU's memory), if
/// it kept one ([`mdl_codec::engine::Engine::keep_shared`]).
struct Held {
    content: Arc<Vec<u8>>,
    _on_device: Kept<'static>,
}

impl WarmTensors {
    /// A cache holding at most `budget` bytes of one commit's tensors (0: nothing is kept);
    /// while a commit is stored, its tensors are gathered beside the last one's (up to twice
    /// the budget in all until it lands).
    pub fn new(budget: u64) -> WarmTensors {
        WarmTensors {
            budget,
            inner: Mutex::new(Generations::default()),
        }
    }

    /// The content of object `id`, if the last commit kept it.
    pub fn get(&self, id: &ObjectId) -> Option<Arc<Vec<u8>>> {
        self.lock().last.get(id).map(|h| h.content.clone())
    }

    /// Offers the content of object `id`, just committed, with its device copy (the engine's
    /// guard; [`Kept::nothing`] for none); kept while the budget allows. The device copies are
    /// of kept tensors only, so the budget bounds them too.
    pub fn offer(&self, id: ObjectId, content: Arc<Vec<u8>>, on_device: Kept<'static>) {
        let len = content.len() as u64;
        let mut g = self.lock();
        if g.next_bytes + len > self.budget || g.next.contains_key(&id) {
            return;
        }
        g.next_bytes += len;
        g.next.insert(
            id,
            Held {
                content,
                _on_device: on_device,
            },
        );
    }

    /// Starts a commit: what an earlier unfinished one offered is dropped.
    pub(crate) fn begin(&self) {
        let mut g = self.lock();
        g.next.clear();
        g.next_bytes = 0;
    }

    /// The commit landed: its tensors replace the last commit's.
    pub(crate) fn publish(&self) {
        let mut g = self.lock();
        g.last = std::mem::take(&mut g.next);
        g.next_bytes = 0;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Generations> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl std::fmt::Debug for WarmTensors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmTensors")
            .field("budget", &self.budget)
            .field("kept", &self.lock().last.len())
            .finish()
    }
}
