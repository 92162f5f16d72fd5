//! A newer commit's tensors written into the tensors a caller holds, where they lie: a tensor
//! stored as a masked delta over the version the caller's bytes hold (an RL step over the step
//! before) has only its changed elements written, a cache-sized window at a time, each window
//! hashed as it is patched; the result is checked against the newer version's id. All or none:
//! where any tensor fails, every tensor patched is restored before the error returns.

use mdl_format::ObjectId;
use rayon::prelude::*;

use super::Placed;
use crate::{Repository, Result};

/// One tensor to patch: the newer version's place, and the version the caller's bytes hold
/// (its id and those bytes).
pub struct Target<'a> {
    /// The newer version.
    pub placed: &'a Placed,
    /// The id of the version `bytes` hold.
    pub id: ObjectId,
    /// The caller's bytes: the tensor itself.
    pub bytes: &'a mut [u8],
}

/// Whether each `(newer version, id of the version held)` is stored as a masked delta over the
/// version held: what [`patch_in_place`] takes. Reads a byte of each record, decodes nothing.
pub fn patchable(repo: &Repository, held: &[(&Placed, ObjectId)]) -> Result<Vec<bool>> {
    let store = repo.store();
    held.par_iter()
        .map(|(p, id)| Ok(store.is_masked_over(&p.id, &p.entry, id)?))
        .collect()
}

/// Brings every one of `targets` to its newer version in place, tensor-parallel: true. All or
/// none: where one is not stored as a masked delta over the version held (a record that
/// maintenance re-encoded since [`patchable`] said so), false with nothing written; where a
/// record is damaged or bytes held are not the version their id names (the patched tensor's
/// hash differs), an error, every tensor as it was.
pub fn patch_in_place(repo: &Repository, targets: &mut [Target<'_>]) -> Result<bool> {
    let store = repo.store();
    let done: Vec<Result<Option<_>>> = targets
        .par_iter_mut()
        .map(
            |t| match store.masked_over(&t.placed.id, &t.placed.entry, &t.id)? {
                Some(over) => Ok(Some(over.patch(t.bytes)?)),
                None => Ok(None),
            },
        )
        .collect();
    if done.iter().all(|d| matches!(d, Ok(Some(_)))) {
        return Ok(true);
    }
    // Put back what was written, then report the first failure.
    targets
        .par_iter_mut()
        .zip(&done)
        .filter_map(|(t, d)| Some((t, d.as_ref().ok()?.as_ref()?)))
        .try_for_each(|(t, delta)| delta.unpatch(t.bytes))
        .map_err(|e| mdl_store::StoreError::Output(std::io::Error::other(e.to_string())))?;
    match done.into_iter().find_map(std::result::Result::err) {
        Some(e) => Err(e),
        None => Ok(false),
    }
}
