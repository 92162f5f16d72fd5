//! Several tensors at once, on one lane: their ids, their whole counts and their codes. Each
//! pass is launched for every tensor of a group before the host waits for its results, so a
//! commit of many tensors waits on the device a few times a group of [`GROUP_BYTES`], not a
//! few times a tensor.

use mdl_codec::engine::{CpuEngine, Engine, WholeCounts};
use mdl_codec::huffman::{Histogram, StreamWriter};
use mdl_codec::planes::{forget_unwanted_flags, sample_len, PlaneSpec};
use mdl_format::ObjectId;

use super::device::{launch_flag_histogram, launch_histogram, Geometry, Gpu, Lane};
use super::encode::{encode_all, Encoding};
use super::hash::{hash_tree, id_of};
use super::Res;
use crate::GpuEngine;

/// Bytes of input a group holds at most (a larger tensor is a group alone): an encode keeps
/// its group's planes and coded bytes on the device until the group's last wait.
const GROUP_BYTES: usize = 1 << 30;

impl GpuEngine {
    /// `work` of each item: on the device, a group of consecutive items that `on_device`
    /// takes at a time (a driver failure sends the group to `on_host`), else on the host.
    fn grouped<I, R>(
        &self,
        what: &str,
        items: &[I],
        bytes: impl Fn(&I) -> usize,
        on_device: impl Fn(&I) -> bool,
        work: impl Fn(&Gpu, &mut Lane, &[&I]) -> Res<Vec<R>>,
        on_host: impl Fn(&I) -> R,
    ) -> Vec<R> {
        let mut out: Vec<Option<R>> = items.iter().map(|_| None).collect();
        let mut group: Vec<usize> = Vec::new();
        let mut held = 0;
        let flush = |group: &mut Vec<usize>, out: &mut Vec<Option<R>>| {
            if group.is_empty() {
                return;
            }
            let these: Vec<&I> = group.iter().map(|&k| &items[k]).collect();
            let results = self.run(
                what,
                |gpu, lane| work(gpu, lane, &these),
                || these.iter().map(|i| on_host(i)).collect(),
            );
            for (&k, r) in group.iter().zip(results) {
                out[k] = Some(r);
            }
            group.clear();
        };
        for (k, item) in items.iter().enumerate() {
            if !on_device(item) {
                out[k] = Some(on_host(item));
                continue;
            }
            let b = bytes(item);
            if held + b > GROUP_BYTES {
                flush(&mut group, &mut out);
                held = 0;
            }
            group.push(k);
            held += b;
        }
        flush(&mut group, &mut out);
        out.into_iter()
            .map(|r| r.expect("every item done"))
            .collect()
    }

    /// [`Engine::content_ids`]: kept tensors hashed on the device, one wait a group; the rest
    /// as [`Engine::content_id`] hashes them.
    pub(super) fn ids_at_once(&self, items: &[(&[u8], &[u8])]) -> Vec<ObjectId> {
        self.grouped(
            "hash",
            items,
            |(_, data)| data.len(),
            |(_, data)| self.gpu.resident(data).is_some(),
            |gpu, lane, group| {
                let mut roots = lane.alloc::<u32>(8 * group.len())?;
                for (j, (prefix, data)) in group.iter().enumerate() {
                    let d = lane.bytes(gpu, data)?;
                    let root = hash_tree(gpu, lane, prefix, &d.view())?;
                    let mut slot = roots.slice_mut(8 * j..8 * j + 8);
                    lane.stream.memcpy_dtod(&root.slice(..8), &mut slot)?;
                }
                let words = lane.fetch(&roots, 8 * group.len())?;
                Ok(words.chunks_exact(8).map(id_of).collect())
            },
            |&(prefix, data)| self.content_id(prefix, data),
        )
    }

    /// [`Engine::whole_counts`]: each tensor split once on the device and its sample and whole
    /// counted from the planes, one wait a group.
    pub(super) fn whole_counts_at_once(&self, items: &[(PlaneSpec, &[u8])]) -> Vec<WholeCounts> {
        self.grouped(
            "plane histograms",
            items,
            |(_, data)| data.len(),
            |(_, data)| self.wants(data),
            |gpu, lane, group| {
                // Per tensor: the sample's symbols and flags, then the whole's.
                let geometries: Vec<Geometry> = (group.iter())
                    .map(|(spec, data)| Geometry::of(*spec, data.len()))
                    .collect();
                let lens: Vec<usize> = geometries.iter().map(|g| 4 * 256 * g.planes).collect();
                let mut counts = lane.zeros::<u64>(lens.iter().sum())?;
                let mut at = 0;
                for (((_, data), &g), len) in group.iter().zip(&geometries).zip(&lens) {
                    let planes = Self::split(gpu, lane, g, data, None, 0)?;
                    let sample = Geometry {
                        n: sample_len(g.n as usize) as u64,
                        ..g
                    };
                    let part = len / 4;
                    for (k, g) in [sample, sample, g, g].into_iter().enumerate() {
                        let mut hist = counts.slice_mut(at + k * part..at + (k + 1) * part);
                        match k % 2 {
                            0 => launch_histogram(gpu, lane, g, &planes, &mut hist)?,
                            _ => launch_flag_histogram(gpu, lane, g, &planes, &mut hist)?,
                        }
                    }
                    at += len;
                }
                let counts = lane.fetch(&counts, at)?;
                let mut parts = counts.chunks_exact(256).map(|c| {
                    let mut h = Histogram::default();
                    h.0.copy_from_slice(c);
                    h
                });
                Ok(geometries
                    .iter()
                    .map(|g| {
                        let mut take =
                            || -> Vec<Histogram> { parts.by_ref().take(g.planes).collect() };
                        let (ss, sf, ws, wf) = (take(), take(), take(), take());
                        let mut sample: Vec<_> = ss.into_iter().zip(sf).collect();
                        forget_unwanted_flags(&mut sample);
                        WholeCounts {
                            sample,
                            all: ws.into_iter().zip(wf).collect(),
                        }
                    })
                    .collect())
            },
            |item| CpuEngine.whole_counts(std::slice::from_ref(item)).remove(0),
        )
    }

    /// [`Engine::encode_many`]: the tensors of a group split and coded together, three waits a
    /// group.
    pub(super) fn encode_at_once(
        &self,
        items: &[(PlaneSpec, &[u8], &[StreamWriter])],
    ) -> Vec<Vec<Vec<Vec<u8>>>> {
        self.grouped(
            "encode",
            items,
            |(_, data, _)| data.len(),
            |(_, data, _)| self.wants(data),
            |gpu, lane, group| {
                let jobs = (group.iter())
                    .map(|(spec, data, writers)| {
                        Encoding::split(gpu, lane, *spec, data, None, writers)
                    })
                    .collect::<Res<Vec<_>>>()?;
                encode_all(gpu, lane, jobs)
            },
            |&(spec, data, writers)| CpuEngine.encode_planes(spec, data, None, writers),
        )
    }
}
