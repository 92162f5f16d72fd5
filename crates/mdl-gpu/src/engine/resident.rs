//! What the device holds for host bytes, as [`super::device::Gpu`] records it: device
//! allocations ([`DevBuf`]), host ranges with a device copy ([`Resident`]) and host buffers
//! whose results go to device memory ([`Output`]). How they are made and used: `kept.rs`.

use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::scratch::Scratch;
use super::CudaSlice;

/// Device memory holding a kept range: the engine's own (given back to its lane when
/// dropped), or the caller's (adopted), which is never freed here.
pub(super) enum DevBuf {
    Own(Scratch<u8>),
    Lent(ManuallyDrop<CudaSlice<u8>>),
}

impl DevBuf {
    /// Whether the memory is the caller's.
    pub(super) fn lent(&self) -> bool {
        matches!(self, DevBuf::Lent(_))
    }
}

impl Deref for DevBuf {
    type Target = CudaSlice<u8>;
    fn deref(&self) -> &CudaSlice<u8> {
        match self {
            DevBuf::Own(s) => s,
            DevBuf::Lent(s) => s,
        }
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if let DevBuf::Lent(s) = self {
            // SAFETY: taken once, here; the caller's memory is left to the caller.
            unsafe { ManuallyDrop::take(s) }.leak();
        }
    }
}

/// Host bytes `ptr..ptr + len` with a copy on the device, from `dev[at..]`.
pub(super) struct Resident {
    pub(super) id: u64,
    pub(super) ptr: usize,
    pub(super) len: usize,
    pub(super) dev: Arc<DevBuf>,
    pub(super) at: usize,
}

/// A host buffer `ptr..ptr + len` being filled whose result goes to device memory at
/// `address`: decodes write there instead (`written` counts their bytes), other code writes
/// the host buffer and is copied over after.
pub(super) struct Output {
    pub(super) id: u64,
    pub(super) ptr: usize,
    pub(super) len: usize,
    pub(super) address: u64,
    pub(super) written: Arc<AtomicU64>,
}
