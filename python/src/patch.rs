//! A newer commit's tensors written into a model's own CPU tensors where they lie
//! (`Repo.patch_tensors`, `mdl::checkout::patch`): only their changed elements, checked
//! against the newer versions' ids, all or none.

use mdl::checkout::patch;
use mdl::checkout::Placed;
use mdl::{ObjectId, Repository};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;

use crate::error;

/// A writable, C-contiguous byte buffer of the caller's (a numpy view of a CPU tensor), held
/// exported from the check to the write.
struct Lent {
    buffer: PyBuffer<u8>,
}

impl Lent {
    fn new(obj: &Bound<'_, PyAny>) -> PyResult<Lent> {
        let buffer = PyBuffer::<u8>::get(obj)?;
        if !buffer.is_c_contiguous() || buffer.readonly() {
            return Err(error(
                "a tensor to patch must be writable, contiguous bytes",
            ));
        }
        Ok(Lent { buffer })
    }

    /// The bytes' addresses, first and past the last.
    fn span(&self) -> (usize, usize) {
        let at = self.buffer.buf_ptr() as usize;
        (at, at + self.buffer.len_bytes())
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        if self.buffer.len_bytes() == 0 {
            return &mut [];
        }
        #[allow(unsafe_code)]
        // SAFETY: the buffer is exported (pinned) while `self.buffer` lives, C-contiguous,
        // `len_bytes` long and writable (checked in `new`); `&mut self` makes this the only
        // borrow of it on the Rust side. The Python caller does not touch the tensor during
        // the call (`load_state` documents it), as for any in-place copy into it.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.buffer.buf_ptr() as *mut u8,
                self.buffer.len_bytes(),
            )
        }
    }
}

/// Whether each `placed[i]` is stored as a masked delta over the version `held[i]` names.
pub(crate) fn patchable(
    py: Python<'_>,
    repo: &Repository,
    placed: &[&Placed],
    held: &[String],
) -> PyResult<Vec<bool>> {
    let pairs: Vec<_> = placed
        .iter()
        .zip(held)
        .map(|(p, id)| Ok((*p, id.parse::<ObjectId>().map_err(error)?)))
        .collect::<PyResult<_>>()?;
    py.detach(|| patch::patchable(repo, &pairs)).map_err(error)
}

/// Brings the caller's tensors to `placed[i]` in place, each stored as a masked delta over the
/// version `held[i]` names (its id, and the writable bytes of the tensor holding it): true.
/// All or none: false where one is not (nothing written), an error where one fails (every
/// tensor as it was).
pub(crate) fn patch_in_place(
    py: Python<'_>,
    repo: &Repository,
    placed: &[&Placed],
    held: Vec<(String, Bound<'_, PyAny>)>,
) -> PyResult<bool> {
    if held.len() != placed.len() {
        return Err(error("one held version a tensor"));
    }
    let mut lent = Vec::new();
    for (id, bytes) in held {
        lent.push((id.parse::<ObjectId>().map_err(error)?, Lent::new(&bytes)?));
    }
    // Each a `&mut` of its own: tensors sharing bytes (tied weights) are the caller's to
    // write once.
    let mut spans: Vec<_> = lent.iter().map(|(_, l)| l.span()).collect();
    spans.sort_unstable();
    if spans.windows(2).any(|w| w[1].0 < w[0].1) {
        return Err(error("tensors to patch share bytes"));
    }
    py.detach(|| {
        let mut targets: Vec<_> = placed
            .iter()
            .zip(lent.iter_mut())
            .map(|(p, (id, l))| patch::Target {
                placed: p,
                id: *id,
                bytes: l.bytes_mut(),
            })
            .collect();
        patch::patch_in_place(repo, &mut targets)
    })
    .map_err(error)
}
