//! Device memory a lane reuses from call to call: once a commit's tensors have been through
//! the engine, the next commit of the same shapes allocates nothing.
//!
//! A lane's buffers go back to its own [`Spare`] when dropped and are handed out again only on
//! that lane's stream, so work queued with the new holder runs after work queued with the old
//! one (stream order); another lane that read one has no use of it in flight, as every call
//! ends with its lane idle (see `Gpu::load`).
//! Sizes are rounded up to a class (eighths of a power of two), and a request takes the
//! smallest spare buffer of its class or of the two above it, so a buffer serves the next
//! request of about its size (a coded output a little longer than the last) without taking the
//! buffer of a request much larger; what is kept spare across all lanes is bounded
//! ([`SPARE_LIMIT`]), and a buffer that would go past the bound is freed instead.

use std::collections::BTreeMap;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::{CudaSlice, CudaStream, DeviceRepr, Res};

/// Bytes of device memory kept spare for reuse, all lanes together.
pub(super) const SPARE_LIMIT: usize = 1 << 30;

/// The smallest class: buffers of a few elements share it.
const SMALLEST: usize = 4096;

/// The class of a request of `bytes`: rounded up to an eighth of its power of two (at most
/// 12.5 % more), and to [`SMALLEST`].
pub(super) fn class_of(bytes: usize) -> usize {
    let b = bytes.max(SMALLEST);
    let step = 1usize << (usize::BITS - 1 - b.leading_zeros()).saturating_sub(3);
    b.div_ceil(step) * step
}

/// A lane's spare buffers by class (device addresses of allocations of that many bytes).
pub(super) struct Spare {
    stream: Arc<CudaStream>,
    free: Mutex<BTreeMap<usize, Vec<u64>>>,
    /// Bytes held spare by every lane of the device.
    held: Arc<AtomicUsize>,
}

impl Spare {
    pub(super) fn new(stream: Arc<CudaStream>, held: Arc<AtomicUsize>) -> Spare {
        Spare {
            stream,
            free: Mutex::new(BTreeMap::new()),
            held,
        }
    }

    /// A buffer of `len` elements (at least one; contents unspecified): a spare one of its
    /// class, or a new allocation.
    pub(super) fn take<T: DeviceRepr>(self: &Arc<Self>, len: usize) -> Res<Scratch<T>> {
        let len = len.max(1);
        let bytes = len * std::mem::size_of::<T>();
        let wanted = class_of(bytes);
        let reused = {
            let mut free = self.free.lock().unwrap();
            let found = free
                .range_mut(wanted..=wanted + wanted / 4)
                .find_map(|(&c, list)| Some((c, list.pop()?)));
            free.retain(|_, list| !list.is_empty());
            found
        };
        let (class, address) = match reused {
            Some((c, a)) => {
                self.held.fetch_sub(c, Ordering::Relaxed);
                (c, a)
            }
            // SAFETY: written by a copy or kernel before it is read (as every buffer here).
            None => (wanted, unsafe { self.stream.alloc::<u8>(wanted) }?.leak()),
        };
        #[cfg(feature = "emulate")]
        crate::emu::reuse(address, bytes);
        // SAFETY: the allocation at `address` holds `class >= bytes` bytes and is this
        // buffer's alone until it is given back (leaked, never freed, by the slice).
        let slice = unsafe { self.stream.upgrade_device_ptr::<T>(address, len) };
        Ok(Scratch {
            slice: ManuallyDrop::new(slice),
            class,
            spare: self.clone(),
        })
    }

    /// Takes back an allocation of `class` bytes at `address`, or frees it when the device's
    /// spare memory would pass [`SPARE_LIMIT`].
    fn give(&self, class: usize, address: u64) {
        if self.held.fetch_add(class, Ordering::Relaxed) + class > SPARE_LIMIT {
            self.held.fetch_sub(class, Ordering::Relaxed);
            self.free_now(class, address);
            return;
        }
        self.free
            .lock()
            .unwrap()
            .entry(class)
            .or_default()
            .push(address);
    }

    fn free_now(&self, class: usize, address: u64) {
        // SAFETY: an allocation of `class` bytes this spare made and nothing else holds;
        // dropping the slice frees it once.
        drop(unsafe { self.stream.upgrade_device_ptr::<u8>(address, class) });
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        let free = std::mem::take(self.free.get_mut().unwrap_or_else(|e| e.into_inner()));
        for (class, addresses) in free {
            for a in addresses {
                self.held.fetch_sub(class, Ordering::Relaxed);
                self.free_now(class, a);
            }
        }
    }
}

/// A device buffer from a lane's [`Spare`], given back when dropped. Used as the
/// [`CudaSlice`] it derefs to (kernel arguments take `&*buf` or `&mut *buf`).
pub(super) struct Scratch<T> {
    slice: ManuallyDrop<CudaSlice<T>>,
    class: usize,
    spare: Arc<Spare>,
}

impl<T> Deref for Scratch<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.slice
    }
}

impl<T> DerefMut for Scratch<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }
}

impl<T> Drop for Scratch<T> {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the field is not used after.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        self.spare.give(self.class, slice.leak());
    }
}

#[cfg(test)]
mod tests {
    use super::class_of;

    #[test]
    fn classes_round_up_by_at_most_an_eighth() {
        assert_eq!(class_of(0), 4096);
        assert_eq!(class_of(4097), 4608);
        for b in [
            5000usize,
            65_537,
            1 << 20,
            (1 << 20) + 1,
            3 << 29,
            123_456_789,
        ] {
            let c = class_of(b);
            assert!(c >= b && (c - b) * 8 <= b, "{b} -> {c}");
            assert_eq!(class_of(c), c, "a class is its own class");
        }
    }
}
