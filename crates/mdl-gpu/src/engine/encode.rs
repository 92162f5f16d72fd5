//! The two-pass Huffman encoder on the device, for one tensor's planes or for a batch of
//! tensors at once. Each pass launches for every tensor of the batch before the host waits for
//! what it needs from them (the sparse planes' value counts, then every lane's bit count, then
//! the coded bytes), so a batch costs the host three waits whatever the number of tensors.

use mdl_codec::huffman::{Lanes, Plan, StreamWriter};
use mdl_codec::planes::PlaneSpec;
use rayon::prelude::*;

use super::device::{cfg, grid, Geometry, Gpu, Lane, NULL};
use super::{CudaViewMut, PushKernelArg, Res, Scratch, CHUNK};
use crate::GpuEngine;

/// Lanes of a wide chunk, and the bytes of its lane table.
const L: usize = Lanes::Wide.count();
const TABLE: u64 = Lanes::Wide.table_len() as u64;

/// One chunk to code on the device.
struct Segment {
    /// Offset of its symbols in the symbols buffer.
    at: u64,
    /// Symbols.
    n: u64,
    /// Code table.
    table: u64,
}

/// How one plane's chunks are laid out in the output.
enum PlaneJob {
    Stored,
    Constant,
    /// One segment a chunk, starting at this segment index.
    Huffman(usize),
    /// Two segments a chunk (flags, then values), starting at this index.
    Sparse(usize),
}

/// Codes `data`'s planes (split against `base`) with `writers`: `result[plane][chunk]`.
pub(super) fn encode_on(
    gpu: &Gpu,
    lane: &mut Lane,
    spec: PlaneSpec,
    data: &[u8],
    base: Option<&[u8]>,
    writers: &[StreamWriter],
) -> Res<Vec<Vec<Vec<u8>>>> {
    let job = Encoding::split(gpu, lane, spec, data, base, writers)?;
    Ok(encode_all(gpu, lane, vec![job])?.pop().expect("one job"))
}

/// Codes the first `writers.len()` planes of `g` in `sym` (planes at `p * stride`, then, when a
/// writer is sparse, [`Geometry::sparse_room`] bytes of room after them): `result[plane][chunk]`.
pub(super) fn encode_symbols(
    gpu: &Gpu,
    lane: &mut Lane,
    g: Geometry,
    sym: Scratch<u8>,
    writers: &[StreamWriter],
) -> Res<Vec<Vec<Vec<u8>>>> {
    let job = Encoding::new(g, sym, writers);
    Ok(encode_all(gpu, lane, vec![job])?.pop().expect("one job"))
}

/// One tensor's encode, between its passes.
pub(super) struct Encoding<'w> {
    g: Geometry,
    /// The planes, and the room of a sparse encode after them.
    sym: Scratch<u8>,
    writers: &'w [StreamWriter],
    chunks: usize,
    sparse: bool,
    segs: Vec<Segment>,
    jobs: Vec<PlaneJob>,
    /// The code tables (code | length << 16), 256 entries a table.
    codes: Vec<u32>,
    /// The segments (at, n, table, 0) and tables on the device, for both passes.
    dsegs: Option<Scratch<u64>>,
    dcodes: Option<Scratch<u32>>,
    lane_bits: Vec<u64>,
    /// Each lane's start in the output.
    lane_at: Vec<u64>,
    /// Stored chunks: (source, length, destination) triples.
    copies: Vec<u64>,
    /// (plane, chunk) → (start, length) in the output.
    spans: Vec<(u64, u64)>,
    /// Bytes of output.
    total: usize,
}

impl<'w> Encoding<'w> {
    /// The encode of `data`'s planes (split against `base`) with `writers`, split on the
    /// device.
    pub(super) fn split(
        gpu: &Gpu,
        lane: &mut Lane,
        spec: PlaneSpec,
        data: &[u8],
        base: Option<&[u8]>,
        writers: &'w [StreamWriter],
    ) -> Res<Encoding<'w>> {
        let g = Geometry::of(spec, data.len());
        let extra = if is_sparse(writers) {
            g.sparse_room()
        } else {
            0
        };
        let sym = GpuEngine::split(gpu, lane, g, data, base, extra)?;
        Ok(Encoding::new(g, sym, writers))
    }

    /// The encode of the first `writers.len()` planes of `g` in `sym`.
    pub(super) fn new(g: Geometry, sym: Scratch<u8>, writers: &'w [StreamWriter]) -> Encoding<'w> {
        debug_assert!(writers.len() <= g.planes);
        Encoding {
            g,
            sym,
            writers,
            chunks: g.n.div_ceil(CHUNK as u64) as usize,
            sparse: is_sparse(writers) && g.n > 0,
            segs: Vec::new(),
            jobs: Vec::new(),
            codes: Vec::new(),
            dsegs: None,
            dcodes: None,
            lane_bits: Vec::new(),
            lane_at: Vec::new(),
            copies: Vec::new(),
            spans: Vec::new(),
            total: 0,
        }
    }

    fn planes(&self) -> usize {
        self.writers.len()
    }

    fn chunk_n(&self, c: usize) -> u64 {
        (self.g.n - (c * CHUNK) as u64).min(CHUNK as u64)
    }

    /// Bytes between the planes' flag bytes, where the flags start, and where the non-zero
    /// values start in the symbols buffer.
    fn sparse_areas(&self) -> (u64, u64, u64) {
        let fstride = self.g.stride / 8;
        let flags_at = self.g.stride * self.planes() as u64;
        (fstride, flags_at, flags_at + fstride * self.planes() as u64)
    }

    /// Counts the sparse planes' non-zero values need: one a (plane, chunk).
    fn nnz_len(&self) -> usize {
        if self.sparse {
            self.planes() * self.chunks
        } else {
            0
        }
    }

    /// Pass 0 (sparse plans only): every plane's flag bytes and non-zero values, counted a
    /// (plane, chunk) into `nnz`.
    fn launch_sparse(&mut self, gpu: &Gpu, lane: &Lane, nnz: &mut CudaViewMut<'_, u64>) -> Res<()> {
        let (n, stride, planes) = (self.g.n, self.g.stride, self.planes());
        let (fstride, flags_at, _) = self.sparse_areas();
        let (mut head, mut rest) = self.sym.split_at_mut(flags_at as usize);
        let (mut fl, mut vals) = rest.split_at_mut((fstride * planes as u64) as usize);
        let mut l = lane.stream.launch_builder(gpu.f("flag_bytes"));
        l.arg(&mut head)
            .arg(&n)
            .arg(&stride)
            .arg(&mut fl)
            .arg(&fstride)
            .arg(&NULL);
        // SAFETY: writes ceil(n / 8) flag bytes a plane within the flags area.
        unsafe { l.launch(cfg((grid(n / 8 + 1).min(1024), planes as u32), 256)) }?;
        let cl = CHUNK as u64;
        let mut l = lane.stream.launch_builder(gpu.f("compact_nonzero"));
        l.arg(&mut head)
            .arg(&n)
            .arg(&stride)
            .arg(&cl)
            .arg(&mut vals)
            .arg(nnz);
        // SAFETY: one block a (chunk, plane); writes at most the chunk's symbols, and a count
        // a (plane, chunk) within `nnz`.
        unsafe { l.launch(cfg((self.chunks as u32, planes as u32), 1024)) }?;
        Ok(())
    }

    /// The segments and code tables, once the sparse planes' counts (`nnz`) are known.
    fn plan(&mut self, nnz: &[u64]) {
        let (stride, chunks) = (self.g.stride, self.chunks);
        let (fstride, flags_at, values_at) = self.sparse_areas();
        let mut codes = std::mem::take(&mut self.codes);
        let mut table = |enc: &mdl_codec::huffman::Encoder| -> u64 {
            let t = (codes.len() / 256) as u64;
            codes.extend(
                enc.codes()
                    .iter()
                    .map(|&(c, l)| c as u32 | (l as u32) << 16),
            );
            t
        };
        let mut segs = Vec::new();
        let mut jobs = Vec::with_capacity(self.planes());
        for (p, w) in self.writers.iter().enumerate() {
            let p64 = p as u64;
            jobs.push(match (w.plan(), w.encoders()) {
                (Plan::Stored, _) => PlaneJob::Stored,
                (Plan::Constant(_), _) => PlaneJob::Constant,
                (Plan::Huffman(_), Some((enc, _))) => {
                    let t = table(enc);
                    let first = segs.len();
                    for c in 0..chunks {
                        segs.push(Segment {
                            at: p64 * stride + (c * CHUNK) as u64,
                            n: self.chunk_n(c),
                            table: t,
                        });
                    }
                    PlaneJob::Huffman(first)
                }
                (Plan::Sparse { .. }, Some((fenc, Some(venc)))) => {
                    let (tf, tv) = (table(fenc), table(venc));
                    let first = segs.len();
                    for c in 0..chunks {
                        segs.push(Segment {
                            at: flags_at + p64 * fstride + (c * CHUNK / 8) as u64,
                            n: self.chunk_n(c).div_ceil(8),
                            table: tf,
                        });
                        segs.push(Segment {
                            at: values_at + p64 * stride + (c * CHUNK) as u64,
                            n: nnz[p * chunks + c],
                            table: tv,
                        });
                    }
                    PlaneJob::Sparse(first)
                }
                _ => unreachable!("coded plans have encoders"),
            });
        }
        (self.segs, self.jobs, self.codes) = (segs, jobs, codes);
    }

    /// Bit counts pass 1 writes: one a (segment, lane).
    fn bits_len(&self) -> usize {
        self.segs.len() * L
    }

    /// Pass 1: every lane's bit count into `bits`. The segments and code tables go over once
    /// for both passes.
    fn launch_bits(&mut self, gpu: &Gpu, lane: &Lane, bits: &mut CudaViewMut<'_, u64>) -> Res<()> {
        if self.segs.is_empty() {
            return Ok(());
        }
        let flat: Vec<u64> = (self.segs.iter())
            .flat_map(|s| [s.at, s.n, s.table, 0])
            .collect();
        let dsegs = self.dsegs.insert(lane.put(&flat)?);
        let dcodes = self.dcodes.insert(lane.put(&self.codes)?);
        let mut l = lane.stream.launch_builder(gpu.f("huff_lane_bits"));
        l.arg(&*self.sym).arg(&**dsegs).arg(&**dcodes).arg(bits);
        // SAFETY: one block a (segment, lane); reads the segment's symbols.
        unsafe { l.launch(cfg((self.segs.len() as u32, L as u32), 256)) }?;
        Ok(())
    }

    fn lane_bytes(&self, s: usize, k: usize) -> u64 {
        self.lane_bits[s * L + k].div_ceil(8)
    }

    fn coded_len(&self, s: usize) -> u64 {
        TABLE + (0..L).map(|k| self.lane_bytes(s, k)).sum::<u64>()
    }

    /// Every chunk's place in the output, plane after plane, from the lanes' bit counts;
    /// returns the output's length.
    fn lay_out(&mut self, lane_bits: Vec<u64>) -> usize {
        self.lane_bits = lane_bits;
        let (planes, chunks, stride) = (self.planes(), self.chunks, self.g.stride);
        let mut lane_at = vec![0u64; self.segs.len() * L];
        let place = |e: &Encoding<'_>, lane_at: &mut [u64], s: usize, at: &mut u64| {
            let mut x = *at + TABLE;
            for k in 0..L {
                lane_at[s * L + k] = x;
                x += e.lane_bytes(s, k);
            }
            *at = x;
        };
        let mut copies = Vec::new();
        let mut spans = vec![(0u64, 0u64); planes * chunks];
        let mut at = 0u64;
        for (p, job) in self.jobs.iter().enumerate() {
            for c in 0..chunks {
                let start = at;
                match job {
                    PlaneJob::Stored => {
                        let n = self.chunk_n(c);
                        copies.extend([p as u64 * stride + (c * CHUNK) as u64, n, at]);
                        at += n;
                    }
                    PlaneJob::Constant => {}
                    PlaneJob::Huffman(first) => place(self, &mut lane_at, first + c, &mut at),
                    PlaneJob::Sparse(first) => {
                        at += 4;
                        place(self, &mut lane_at, first + 2 * c, &mut at);
                        place(self, &mut lane_at, first + 2 * c + 1, &mut at);
                    }
                }
                spans[p * chunks + c] = (start, at - start);
            }
        }
        (self.lane_at, self.copies, self.spans) = (lane_at, copies, spans);
        self.total = at as usize;
        self.total
    }

    /// Pass 2: the bits and stored bytes into `out` (zeroed, 4-byte aligned, [`room`] bytes).
    fn launch_write(&self, gpu: &Gpu, lane: &Lane, out: &mut CudaViewMut<'_, u8>) -> Res<()> {
        if let (Some(dsegs), Some(dcodes)) = (&self.dsegs, &self.dcodes) {
            let dat = lane.put(&self.lane_at)?;
            let mut l = lane.stream.launch_builder(gpu.f("huff_write"));
            l.arg(&*self.sym)
                .arg(&**dsegs)
                .arg(&**dcodes)
                .arg(&*dat)
                .arg(&mut *out);
            // SAFETY: each lane writes its bits inside the bytes its bit count reserved.
            unsafe { l.launch(cfg((self.segs.len() as u32, L as u32), 256)) }?;
        }
        if !self.copies.is_empty() {
            let d = lane.put(&self.copies)?;
            let mut l = lane.stream.launch_builder(gpu.f("copy_jobs"));
            l.arg(&*self.sym).arg(&*d).arg(out);
            // SAFETY: each job copies a stored chunk into its reserved span.
            unsafe { l.launch(cfg(((self.copies.len() / 3) as u32, 1), 256)) }?;
        }
        Ok(())
    }

    /// The coded chunks (`result[plane][chunk]`) from the output's bytes, with the lane
    /// tables and sparse flag lengths pass 1 made known written in.
    fn finish(self, host: &mut [u8]) -> Vec<Vec<Vec<u8>>> {
        let write_table = |host: &mut [u8], s: usize, at: usize| {
            for k in 0..L - 1 {
                let len = u16::try_from(self.lane_bytes(s, k)).expect("a wide lane fits 16 bits");
                host[at + 2 * k..at + 2 * k + 2].copy_from_slice(&len.to_le_bytes());
            }
        };
        let chunks = self.chunks;
        for (p, job) in self.jobs.iter().enumerate() {
            for c in 0..chunks {
                let start = self.spans[p * chunks + c].0 as usize;
                match job {
                    PlaneJob::Huffman(first) => write_table(host, first + c, start),
                    PlaneJob::Sparse(first) => {
                        let f = first + 2 * c;
                        let flags_len = self.coded_len(f);
                        host[start..start + 4].copy_from_slice(&(flags_len as u32).to_le_bytes());
                        write_table(host, f, start + 4);
                        write_table(host, f + 1, start + 4 + flags_len as usize);
                    }
                    PlaneJob::Stored | PlaneJob::Constant => {}
                }
            }
        }
        let host = &*host;
        (0..self.planes())
            .map(|p| {
                self.spans[p * chunks..(p + 1) * chunks]
                    .par_iter()
                    .map(|&(s, l)| host[s as usize..(s + l) as usize].to_vec())
                    .collect()
            })
            .collect()
    }
}

fn is_sparse(writers: &[StreamWriter]) -> bool {
    (writers.iter()).any(|w| matches!(w.plan(), Plan::Sparse { .. }))
}

/// Bytes of output buffer an encode of `total` bytes takes: whole 32-bit words (pass 2 ORs
/// words in), and one more.
fn room(total: usize) -> usize {
    total.next_multiple_of(4) + 4
}

/// Runs every job's passes, each pass for all of them before the one wait it needs:
/// `result[job][plane][chunk]`.
pub(super) fn encode_all(
    gpu: &Gpu,
    lane: &mut Lane,
    mut jobs: Vec<Encoding<'_>>,
) -> Res<Vec<Vec<Vec<Vec<u8>>>>> {
    // Pass 0: the sparse planes' value counts.
    let lens: Vec<usize> = jobs.iter().map(Encoding::nnz_len).collect();
    let nnz = gathered(lane, &lens, |k, view| {
        jobs[k].launch_sparse(gpu, lane, view)
    })?;
    for (job, nnz) in jobs.iter_mut().zip(&nnz) {
        job.plan(nnz);
    }
    // Pass 1: the lanes' bit counts.
    let lens: Vec<usize> = jobs.iter().map(Encoding::bits_len).collect();
    let bits = gathered(lane, &lens, |k, view| jobs[k].launch_bits(gpu, lane, view))?;
    // Pass 2: every job's output in one buffer, each at a word boundary.
    let mut starts = Vec::with_capacity(jobs.len());
    let mut room_all = 0;
    for (job, bits) in jobs.iter_mut().zip(bits) {
        starts.push(room_all);
        room_all += room(job.lay_out(bits));
    }
    let mut out = lane.zeros::<u8>(room_all)?;
    for (job, &at) in jobs.iter().zip(&starts) {
        job.launch_write(gpu, lane, &mut out.slice_mut(at..at + room(job.total)))?;
    }
    let mut host = vec![0u8; room_all];
    lane.download(&out.slice(..room_all), &mut host)?;
    drop(out);
    Ok(jobs
        .into_iter()
        .zip(starts)
        .map(|(job, at)| {
            let total = job.total;
            job.finish(&mut host[at..at + total])
        })
        .collect())
}

/// Runs `launch(k, view)` for every `k` with `lens[k] > 0`, each into its own part of one
/// device buffer, and fetches that buffer once: each `k`'s values.
fn gathered(
    lane: &Lane,
    lens: &[usize],
    mut launch: impl FnMut(usize, &mut CudaViewMut<'_, u64>) -> Res<()>,
) -> Res<Vec<Vec<u64>>> {
    let all: usize = lens.iter().sum();
    if all == 0 {
        return Ok(lens.iter().map(|_| Vec::new()).collect());
    }
    let mut buf = lane.alloc::<u64>(all)?;
    let mut at = 0;
    for (k, &len) in lens.iter().enumerate() {
        if len > 0 {
            launch(k, &mut buf.slice_mut(at..at + len))?;
        }
        at += len;
    }
    let mut values = lane.fetch(&buf, all)?.into_iter();
    Ok(lens
        .iter()
        .map(|&len| values.by_ref().take(len).collect())
        .collect())
}
