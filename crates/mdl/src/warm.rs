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
    last: HashMap<ObjectId, Arc<Held>>,
    /// The commit at work's tensors, published when it lands.
    next: HashMap<ObjectId, Arc<Held>>,
    next_bytes: u64,
}

/// A kept tensor, and its copy where the engine that stored it computes (a GPU's memory), if
/// it kept one ([`mdl_codec::engine::Engine::keep_shared`]); shared by both generations where
/// a commit left the tensor unchanged (the guard behind a lock only so that it may be).
struct Held {
    content: Arc<Vec<u8>>,
    _on_device: Mutex<Kept<'static>>,
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
            Arc::new(Held {
                content,
                _on_device: Mutex::new(on_device),
            }),
        );
    }

    /// Whether the commit at work keeps object `id` already, or now does because the last
    /// commit kept it (an unchanged tensor: its buffer and device copy carried over as they
    /// are, nothing copied).
    pub(crate) fn carry(&self, id: &ObjectId) -> bool {
        let mut g = self.lock();
        if g.next.contains_key(id) {
            return true;
        }
        let Some(held) = g.last.get(id).cloned() else {
            return false;
        };
        let len = held.content.len() as u64;
        if g.next_bytes + len > self.budget {
            return false;
        }
        g.next_bytes += len;
        g.next.insert(*id, held);
        true
    }

    /// The buffer of object `id`, taken out of the last commit's tensors to be written over,
    /// if it is `len` bytes long and nothing else holds it (its device copy is let go): a
    /// commit that changes a tensor writes the new version into the old one's buffer rather
    /// than faulting in fresh memory. The object is no longer kept.
    pub(crate) fn reclaim(&self, id: &ObjectId, len: usize) -> Option<Vec<u8>> {
        let mut g = self.lock();
        if g.last.get(id)?.content.len() != len {
            return None;
        }
        let held = g.last.remove(id)?;
        let held = match Arc::try_unwrap(held) {
            Ok(held) => held,
            Err(shared) => {
                g.last.insert(*id, shared);
                return None;
            }
        };
        let Held {
            content,
            _on_device,
        } = held;
        drop(_on_device);
        match Arc::try_unwrap(content) {
            Ok(buf) => Some(buf),
            // Read by someone (a delta being made against it): kept for them, not reused.
            Err(content) => {
                let kept = Held {
                    content,
                    _on_device: Mutex::new(Kept::nothing()),
                };
                g.last.insert(*id, Arc::new(kept));
                None
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(warm: &WarmTensors, content: &[u8]) -> (ObjectId, Arc<Vec<u8>>) {
        let id = ObjectId::hash(content);
        let buf = Arc::new(content.to_vec());
        warm.offer(id, buf.clone(), Kept::nothing());
        (id, buf)
    }

    #[test]
    fn a_buffer_is_reclaimed_only_when_nothing_else_holds_it() {
        let warm = WarmTensors::new(1 << 20);
        let (a, held) = kept(&warm, b"version a");
        let (b, _) = kept(&warm, b"version b");
        warm.publish();
        // Read by someone: kept for them, not handed out to be written over.
        assert!(warm.reclaim(&a, 9).is_none());
        assert_eq!(warm.get(&a).as_deref(), Some(&b"version a".to_vec()));
        drop(held);
        // Of another length: not this tensor's buffer.
        assert!(warm.reclaim(&a, 8).is_none());
        assert_eq!(warm.reclaim(&a, 9).as_deref(), Some(&b"version a"[..]));
        // Taken: no longer kept as `a`.
        assert!(warm.get(&a).is_none());
        // An unchanged tensor is carried over to the next commit as it is.
        warm.begin();
        assert!(warm.carry(&b));
        assert!(!warm.carry(&a));
        warm.publish();
        assert_eq!(warm.get(&b).as_deref(), Some(&b"version b".to_vec()));
    }
}
