//! Pieces stored after the piece whose stored content they are coded against (a copy after its
//! master, `cast.rs`; a first moment after its second moment, here): a first moment is a
//! residual in units of its commit's second moment as that was stored (docs/DECISIONS.md, "A
//! first moment is coded in units of its own commit's second moment").

use std::sync::Arc;

use mdl_format::Exactness;

use super::{StoreCtx, Stored};
use crate::lossy::Reference;
use crate::Result;

impl StoreCtx<'_> {
    /// The chain depth of what `stored` names (`u32::MAX` where the index lacks it).
    pub(super) fn depth_of(&self, stored: &Stored) -> Result<u32> {
        Ok(match &stored.added {
            Some((_, entry)) => entry.depth,
            None => (self.repo.store().meta().read()?)
                .object(&stored.id)?
                .map_or(u32::MAX, |e| e.depth),
        })
    }

    /// Stores piece `i`, whose plan follows piece `j` (stored as `base`): a residual against
    /// `j`'s content as stored; under a base at the policy's depth cap (the residual would be a
    /// step deeper), as its plan says otherwise ([`crate::lossy::TensorPlan::follow`]).
    pub(super) fn store_follower(
        &self,
        i: usize,
        j: usize,
        base: &Stored,
    ) -> Result<(Stored, Exactness)> {
        let plan = self.plans[i].as_ref().expect("a follower has a plan");
        let depth = self.depth_of(base)?;
        let reference = match depth < self.policy.max_depth {
            true => {
                let kept = self.kept.lock().unwrap().get(&j).cloned();
                let content = match kept {
                    Some(kept) => kept,
                    None => {
                        let mut buf = vec![0u8; self.input.pieces[j].len as usize];
                        self.input.read_into(j, 0, &mut buf)?;
                        Arc::new(buf)
                    }
                };
                Some(Reference {
                    id: base.id,
                    depth,
                    content,
                })
            }
            false => None,
        };
        let _ = self.resolved[&i].set(plan.follow(reference));
        self.store_tensor(i)
    }

    /// Keeps piece `j`'s stored content for the pieces that follow it (its copies, its first
    /// moment) where it is not the content read.
    pub(super) fn keep_for_followers(&self, j: usize, content: &Arc<Vec<u8>>) {
        if self.followed.contains(&j) {
            self.kept.lock().unwrap().insert(j, content.clone());
        }
    }

    /// Drops piece `j`'s kept content, once every piece that follows it is stored.
    pub(super) fn forget_followed(&self, j: usize) {
        self.kept.lock().unwrap().remove(&j);
    }
}
