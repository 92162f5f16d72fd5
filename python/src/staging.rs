//! A staging buffer of the Python side — or, for a commit the caller waits for, one of its
//! own tensors — read in place by a background commit; and a model's tensors lent to a read
//! (`Ops.fetch(held=)`, `Repo.read_tensors(held=)`), read in place while the call runs.

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;

/// A part of a file given in parts (`MemoryFile::in_parts`).
pub(crate) type Part = Box<dyn AsRef<[u8]> + Send + Sync>;

/// The bytes of a Python object exporting a contiguous `u8` buffer (a numpy array, or a torch
/// tensor's `.numpy()`), held exported until the commit that reads them is done.
pub(crate) struct Exported {
    buffer: PyBuffer<u8>,
    ptr: *const u8,
    len: usize,
}

// The pointer is into memory the held `PyBuffer` keeps alive; it is only read.
#[allow(unsafe_code)]
// SAFETY: `PyBuffer` itself is Send and Sync; the raw pointer is a read-only view of memory
// it pins.
unsafe impl Send for Exported {}
#[allow(unsafe_code)]
// SAFETY: as above; shared access only reads.
unsafe impl Sync for Exported {}

impl Exported {
    /// The buffer of `obj`, which must be C-contiguous bytes.
    pub(crate) fn new(obj: &Bound<'_, PyAny>) -> PyResult<Exported> {
        let buffer = PyBuffer::<u8>::get(obj)?;
        if !buffer.is_c_contiguous() {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "a staging buffer must be C-contiguous bytes",
            ));
        }
        let (ptr, len) = (buffer.buf_ptr() as *const u8, buffer.len_bytes());
        Ok(Exported { buffer, ptr, len })
    }
}

impl AsRef<[u8]> for Exported {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        let _ = &self.buffer;
        #[allow(unsafe_code)]
        // SAFETY: `ptr..ptr + len` is the exported buffer, valid while `self.buffer` holds the
        // export. The Python side does not write to a staging buffer until the commit reading
        // it has finished (python/mdl/_state.py waits for it before reusing the buffer). A
        // tensor of the caller's, given as a part, is written only by a thread of the caller's
        // that trains on while it waits, against the package's documentation; the commit
        // copies each such part once (`Input::is_stable`) before hashing or coding it, as it
        // does a mapped file another process may write, so the record is what was read.
        unsafe {
            std::slice::from_raw_parts(self.ptr, self.len)
        }
    }
}
