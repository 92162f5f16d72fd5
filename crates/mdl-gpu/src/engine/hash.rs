//! Tensor ids on the device: BLAKE3 of a header's canonical prefix and the tensor's bytes
//! (`blake3_chunks`, then one `blake3_parents` launch per level of the tree), the same id
//! `mdl_format::TensorHeader::object_id` computes on the host.

use super::device::{cfg, Gpu, Lane};
use super::{CudaView, PushKernelArg, Res, Scratch};
use crate::GpuEngine;
use mdl_format::{ObjectId, TensorHasher};

/// Bytes a BLAKE3 chunk.
const B3_CHUNK: u64 = 1024;

/// The BLAKE3 hash of `prefix || data`, `data` already on the device. Only the 32 bytes of
/// the id come back.
pub(super) fn hash_on(
    gpu: &Gpu,
    lane: &Lane,
    prefix: &[u8],
    data: &CudaView<'_, u8>,
) -> Res<ObjectId> {
    let root = hash_tree(gpu, lane, prefix, data)?;
    Ok(id_of(&lane.fetch(&root, 8)?))
}

/// The id whose 32 bytes are these 8 little-endian words.
pub(super) fn id_of(words: &[u32]) -> ObjectId {
    let mut id = [0u8; 32];
    for (k, w) in words.iter().enumerate() {
        id[4 * k..4 * k + 4].copy_from_slice(&w.to_le_bytes());
    }
    ObjectId::from_bytes(id)
}

/// Queues the BLAKE3 hash of `prefix || data` (`data` on the device): a buffer whose first 8
/// words will hold it.
pub(super) fn hash_tree(
    gpu: &Gpu,
    lane: &Lane,
    prefix: &[u8],
    data: &CudaView<'_, u8>,
) -> Res<Scratch<u32>> {
    let total = (prefix.len() + data.len()) as u64;
    let chunks = total.div_ceil(B3_CHUNK).max(1);
    let dprefix = lane.put(prefix)?;
    let plen = prefix.len() as u64;
    let mut level = lane.alloc::<u32>(8 * chunks as usize)?;
    let is_root = u32::from(chunks == 1);
    let mut l = lane.stream.launch_builder(gpu.f("blake3_chunks"));
    l.arg(&*dprefix)
        .arg(&plen)
        .arg(data)
        .arg(&total)
        .arg(&chunks)
        .arg(&is_root)
        .arg(&mut *level);
    // SAFETY: a thread a chunk reads its bytes of prefix (plen) and data (total - plen) and
    // writes its 8 words.
    unsafe { l.launch(cfg((chunks.div_ceil(128) as u32, 1), 128)) }?;
    let mut n = chunks;
    let mut next = lane.alloc::<u32>(8 * n.div_ceil(2) as usize)?;
    while n > 1 {
        let is_root = u32::from(n == 2);
        let mut l = lane.stream.launch_builder(gpu.f("blake3_parents"));
        l.arg(&*level).arg(&n).arg(&is_root).arg(&mut *next);
        let parents = n.div_ceil(2);
        // SAFETY: thread i reads nodes 2i and 2i + 1 (below n) and writes node i.
        unsafe { l.launch(cfg((parents.div_ceil(128) as u32, 1), 128)) }?;
        std::mem::swap(&mut level, &mut next);
        n = parents;
    }
    Ok(level)
}

impl GpuEngine {
    /// The id of a tensor whose header has the canonical `prefix` and whose bytes are `data`:
    /// computed on the device where `data` is kept there ([`Engine::keep`]; `force` hashes on
    /// the device whatever the size, uploading if need be), else on the host. The same id
    /// either way.
    pub fn tensor_id(&self, prefix: &[u8], data: &[u8], force: bool) -> ObjectId {
        let cpu = || {
            let mut h = TensorHasher::new(prefix);
            h.update(data);
            h.finalize()
        };
        // A load decoded onto the device is there only: hashed there.
        if let Some(at) = self.gpu.output(data).filter(|at| at.complete) {
            let on_device = self.gpu.with_lane(|lane| {
                // SAFETY: the output's device memory holds data.len() bytes while it is
                // registered (the caller's decode is under way); leaked, never freed.
                let dev = unsafe { lane.stream.upgrade_device_ptr::<u8>(at.address, data.len()) };
                let id = hash_on(&self.gpu, lane, prefix, &dev.slice(..data.len()));
                dev.leak();
                id
            });
            // Without the device there is nothing to hash: a mismatch, reported as such.
            return on_device.unwrap_or_else(|e| {
                self.gpu.failed("hash", e, "the content cannot be checked");
                ObjectId::from_bytes([0; 32])
            });
        }
        if !force && self.gpu.resident(data).is_none() {
            return cpu();
        }
        self.run(
            "hash",
            |gpu, lane| {
                let d = lane.bytes(gpu, data)?;
                hash_on(gpu, lane, prefix, &d.view())
            },
            cpu,
        )
    }
}
