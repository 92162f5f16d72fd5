//! Device memory a caller holds, as PyTorch's CUDA tensors are held: for tests and benchmarks
//! that hand the engine device-resident input or ask it to decode into device memory.

use std::sync::Arc;

use super::device::Gpu;

/// Bytes in this engine's device memory, freed when dropped.
pub struct DeviceBuffer {
    gpu: Arc<Gpu>,
    address: u64,
    len: usize,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({} bytes at {:#x})", self.len, self.address)
    }
}

impl DeviceBuffer {
    /// A buffer on `gpu` holding a copy of `bytes`; `None` if the device refused.
    pub(super) fn new(gpu: Arc<Gpu>, bytes: &[u8]) -> Option<DeviceBuffer> {
        let address = gpu
            .with_lane(|lane| {
                // The caller's memory, not the engine's: allocated apart from the lanes' spares.
                let mut dev = lane.stream.alloc_zeros::<u8>(bytes.len().max(1))?;
                if !bytes.is_empty() {
                    lane.stream
                        .memcpy_htod(bytes, &mut dev.slice_mut(..bytes.len()))?;
                }
                lane.stream.synchronize()?;
                Ok(dev.leak())
            })
            .ok()?;
        Some(DeviceBuffer {
            gpu,
            address,
            len: bytes.len(),
        })
    }

    /// Its device address (what a [`mdl_codec::engine::DeviceCopy`] names).
    pub fn address(&self) -> u64 {
        self.address
    }

    /// Its contents, copied back to the host.
    pub fn read(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len];
        self.gpu
            .with_lane(|lane| {
                // SAFETY: this buffer owns `len` bytes at `address`; the slice is leaked, not
                // freed, here.
                let dev = unsafe {
                    lane.stream
                        .upgrade_device_ptr::<u8>(self.address, self.len.max(1))
                };
                let done = if self.len > 0 {
                    lane.stream
                        .memcpy_dtoh(&dev.slice(..self.len), &mut out[..])
                        .and_then(|()| lane.stream.synchronize())
                } else {
                    Ok(())
                };
                dev.leak();
                done
            })
            .expect("reading a device buffer back");
        out
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _ = self.gpu.with_lane(|lane| {
            // SAFETY: this buffer owns the allocation; dropping the slice frees it, once.
            let dev = unsafe {
                lane.stream
                    .upgrade_device_ptr::<u8>(self.address, self.len.max(1))
            };
            drop(dev);
            lane.stream.synchronize()
        });
    }
}
