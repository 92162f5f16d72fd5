//! [`Unpublished`]: the records a batch wrote, taken back when the operation that wrote them
//! fails before its index transaction names them — so that a commit that filled the disk leaves
//! its space free at once, not for `mdl gc` an hour later.

use std::sync::{Arc, Mutex};

use mdl_format::ObjectId;

use crate::Store;

/// What a batch has written, as (id, generation), shared with the batch.
pub(super) type Ledger = Arc<Mutex<Vec<(ObjectId, u32)>>>;

/// The records of one batch ([`super::ObjectBatch::unpublished`]) until the operation says
/// they are [`published`](Self::published). Dropped before that — the operation returned an
/// error or panicked — it removes every one of them that the index does not name at its
/// generation.
///
/// Only for the process that wrote them, holding the repository's writer until this is
/// dropped (declare it after the writer's guard): no other writer can then be about to index
/// a record at the same path. A record the index names is left alone, and so is everything
/// when the index cannot be read (a database that failed on a full disk): `mdl gc` sweeps
/// those once they are older than its grace period.
#[must_use = "dropped, it removes the batch's records at once"]
pub struct Unpublished<'s> {
    store: &'s Store,
    ledger: Ledger,
    published: bool,
}

impl<'s> Unpublished<'s> {
    pub(super) fn new(store: &'s Store, ledger: Ledger) -> Self {
        Unpublished {
            store,
            ledger,
            published: false,
        }
    }

    /// The index now names the records (or the operation decided to keep them): keep them.
    pub fn published(mut self) {
        self.published = true;
    }

    /// Removes the records the index does not name; how many were removed.
    fn take_back(&self) -> usize {
        let written = std::mem::take(&mut *self.ledger.lock().unwrap_or_else(|p| p.into_inner()));
        if written.is_empty() {
            return 0;
        }
        let unindexed = self.store.meta().read().and_then(|meta| {
            let mut out = Vec::new();
            for (id, generation) in written {
                if meta.object(&id)?.is_none_or(|e| e.generation != generation) {
                    out.push((id, generation));
                }
            }
            Ok(out)
        });
        match unindexed {
            Ok(unindexed) => {
                for (id, generation) in &unindexed {
                    self.store.remove_record(id, *generation);
                }
                unindexed.len()
            }
            Err(e) => {
                tracing::warn!(error = %e, "records of a failed write left for gc");
                0
            }
        }
    }
}

impl Drop for Unpublished<'_> {
    fn drop(&mut self) {
        if !self.published {
            let n = self.take_back();
            if n > 0 {
                tracing::info!(records = n, "took back the records of a failed write");
            }
        }
    }
}
