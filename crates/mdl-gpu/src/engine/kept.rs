//! Host bytes with a copy on the device: kept for a while ([`Engine::keep`]), lent by the
//! caller ([`Engine::adopt`]: a snapshot PyTorch made on the GPU), or kept across commits
//! ([`Engine::keep_shared`]: the warm set). Kernels called on kept bytes (or a part of them)
//! read the device copy instead of copying the bytes over again. And host buffers being
//! decoded into whose results go to device memory instead ([`Engine::mirror_into`]): the
//! decode kernels write there in place, and the content is hashed there.

use mdl_codec::engine::{DeviceCopy, Mirror};

use super::device::{Gpu, Lane};
use super::resident::{DevBuf, Output, Resident};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mdl_codec::engine::{CpuEngine, Engine, Kept};

use super::scratch::Scratch;
use super::Res;
use crate::GpuEngine;

/// Where a decode into `host` writes instead: the device address and the written-bytes count;
/// `complete` when `host` is the whole output and every byte of it was written there (its
/// content is on the device only).
pub(super) struct OutputAt {
    pub(super) address: u64,
    pub(super) written: Arc<AtomicU64>,
    pub(super) complete: bool,
}

/// The entry of `entries` whose host range (`range`: start address, length) holds all of
/// `host`, and where `host` starts in it.
fn holding<'a, T>(
    entries: &'a [T],
    host: &[u8],
    range: impl Fn(&T) -> (usize, usize),
) -> Option<(&'a T, usize)> {
    let p = host.as_ptr() as usize;
    entries.iter().find_map(|e| {
        let (ptr, len) = range(e);
        (p >= ptr && p + host.len() <= ptr + len).then(|| (e, p - ptr))
    })
}

/// Releases a kept device copy (and whatever else it holds: the warm set's content).
struct KeptGuard<T> {
    gpu: Arc<Gpu>,
    id: u64,
    _holds: T,
}

impl<T> Drop for KeptGuard<T> {
    fn drop(&mut self) {
        self.gpu.kept.lock().unwrap().retain(|r| r.id != self.id);
    }
}

impl Gpu {
    /// Registers `host` as held by `dev[at..]`; the guard unregisters it.
    fn register<'a, T: Send + 'a>(
        self: &Arc<Self>,
        host: &[u8],
        dev: Arc<DevBuf>,
        at: usize,
        holds: T,
    ) -> Kept<'a> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.kept.lock().unwrap().push(Resident {
            id,
            ptr: host.as_ptr() as usize,
            len: host.len(),
            dev,
            at,
        });
        Kept::new(Box::new(KeptGuard {
            gpu: self.clone(),
            id,
            _holds: holds,
        }))
    }

    /// The device copy of `host`, if a kept range holds it: the buffer and the offset.
    pub(super) fn resident(&self, host: &[u8]) -> Option<(Arc<DevBuf>, usize)> {
        let kept = self.kept.lock().unwrap();
        let (r, off) = holding(&kept, host, |r| (r.ptr, r.len))?;
        Some((r.dev.clone(), r.at + off))
    }

    /// Where a decode into `host` writes instead, if it is (part of) a mirrored output.
    pub(super) fn output(&self, host: &[u8]) -> Option<OutputAt> {
        let outputs = self.outputs.lock().unwrap();
        let (o, off) = holding(&outputs, host, |o| (o.ptr, o.len))?;
        Some(OutputAt {
            address: o.address + off as u64,
            written: o.written.clone(),
            complete: off == 0
                && host.len() == o.len
                && o.written.load(Ordering::Relaxed) == o.len as u64,
        })
    }

    /// Whether `bytes` more fit on the device with half of its free memory to spare.
    fn has_room(&self, bytes: usize) -> bool {
        matches!(self.ctx.mem_get_info(), Ok((free, _)) if bytes <= free / 2)
    }
}

impl GpuEngine {
    pub(super) fn keep_bytes<'a>(&'a self, bytes: &'a [u8]) -> Kept<'a> {
        if bytes.len() < self.min_bytes.max(1) || self.gpu.resident(bytes).is_some() {
            return Kept::nothing();
        }
        match self.gpu.with_lane(|lane| {
            let dev = lane.upload(bytes)?;
            lane.stream.synchronize()?;
            Ok(dev)
        }) {
            Ok(dev) => self.gpu.register(bytes, Arc::new(DevBuf::Own(dev)), 0, ()),
            Err(e) => {
                self.gpu.failed("copy", e, "kernels will copy as they go");
                Kept::nothing()
            }
        }
    }

    pub(super) fn adopt_bytes<'a>(&'a self, bytes: &'a [u8], copy: DeviceCopy) -> Kept<'a> {
        if bytes.is_empty() || copy.ordinal != self.gpu.ctx.ordinal() {
            return Kept::nothing();
        }
        let lent = self.gpu.with_lane(|lane| {
            // SAFETY: the caller holds `bytes.len()` bytes at `copy.address` on this device,
            // unchanged while the guard lives; the slice is leaked, never freed (DevBuf).
            Ok(unsafe {
                lane.stream
                    .upgrade_device_ptr::<u8>(copy.address, bytes.len())
            })
        });
        match lent {
            Ok(slice) => {
                let dev = DevBuf::Lent(std::mem::ManuallyDrop::new(slice));
                self.gpu.register(bytes, Arc::new(dev), 0, ())
            }
            Err(e) => {
                self.gpu
                    .failed("adopting a device copy", e, "kernels will copy as they go");
                Kept::nothing()
            }
        }
    }

    pub(super) fn keep_shared_bytes(
        &self,
        content: &Arc<Vec<u8>>,
        like: Option<&[u8]>,
    ) -> Kept<'static> {
        let bytes: &[u8] = content;
        if bytes.len() < self.min_bytes.max(1) {
            return Kept::nothing();
        }
        let holder = content.clone();
        // The content itself is kept (by the engine's own buffer): share that buffer.
        if let Some((dev, at)) = self.gpu.resident(bytes).filter(|(d, _)| !d.lent()) {
            return self.gpu.register(bytes, dev, at, holder);
        }
        // A copy of the same bytes is on the device: copy it there, if there is room.
        let Some((src, at)) = like
            .filter(|l| l.len() == bytes.len())
            .and_then(|l| self.gpu.resident(l))
        else {
            return Kept::nothing();
        };
        if !self.gpu.has_room(bytes.len()) {
            return Kept::nothing();
        }
        let copied = self.gpu.with_lane(|lane: &mut Lane| -> Res<Scratch<u8>> {
            let mut dev = lane.alloc::<u8>(bytes.len())?;
            lane.stream.memcpy_dtod(
                &src.slice(at..at + bytes.len()),
                &mut dev.slice_mut(..bytes.len()),
            )?;
            lane.stream.synchronize()?;
            Ok(dev)
        });
        match copied {
            Ok(dev) => self
                .gpu
                .register(bytes, Arc::new(DevBuf::Own(dev)), 0, holder),
            Err(e) => {
                self.gpu
                    .failed("device copy", e, "the content is not kept there");
                Kept::nothing()
            }
        }
    }

    pub(super) fn mirror_bytes(
        &self,
        out: &mut [u8],
        copy: DeviceCopy,
        fill: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> Mirror {
        if out.is_empty() || copy.ordinal != self.gpu.ctx.ordinal() {
            return CpuEngine.mirror_into(out, copy, fill);
        }
        let id = self.gpu.next_id.fetch_add(1, Ordering::Relaxed);
        let written = Arc::new(AtomicU64::new(0));
        self.gpu.outputs.lock().unwrap().push(Output {
            id,
            ptr: out.as_ptr() as usize,
            len: out.len(),
            address: copy.address,
            written: written.clone(),
        });
        let filled = fill(out);
        self.gpu.outputs.lock().unwrap().retain(|o| o.id != id);
        if !filled {
            return Mirror::Failed;
        }
        // Every byte written by a decode (decodes write disjoint ranges of the output), and
        // verified there.
        match written.load(Ordering::Relaxed) {
            w if w == out.len() as u64 => return Mirror::Written,
            // Some by a decode, some on the host: neither side has it all (a decode writes
            // every chunk of a tensor, so this does not happen; the verification above would
            // have failed).
            0 => {}
            _ => return Mirror::Failed,
        }
        // SAFETY: the caller's device memory holds out.len() bytes at copy.address, for us.
        let copied = self
            .gpu
            .with_lane(|lane| unsafe { lane.upload_to(out, copy.address) });
        match copied {
            Ok(()) => Mirror::Copied,
            Err(e) => {
                self.gpu
                    .failed("copy to the device", e, "the caller copies it");
                Mirror::NotMine
            }
        }
    }
}
