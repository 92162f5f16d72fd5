//! Float planes on the device: the lane-parallel decoder, and the grouped order of the quantized deltas.

use std::sync::atomic::Ordering;

use mdl_codec::huffman::{Lanes, Stream, StreamBody, StreamWriter};
use mdl_codec::planes::PlaneSpec;

use super::device::{arg_opt, cfg, grid, launch_planes, Dev, Geometry, Gpu, Lane};
use super::{CudaSlice, PushKernelArg, Res, Scratch, CHUNK, GROUP_TILE};

/// The grouped order on the device: forward (`cur` given) writes `(base − cur) mod m` in the
/// grouped order; inverse (`deltas` given) writes each element's code back in index order.
pub(super) fn grouped(
    gpu: &Gpu,
    lane: &mut Lane,
    base: &[u8],
    cur: Option<&[u8]>,
    deltas: Option<&[u8]>,
    modulus: u8,
    out: &mut [u8],
) -> Res<()> {
    let n = base.len() as u64;
    let tiles = n.div_ceil(GROUP_TILE).max(1);
    let db = lane.bytes(gpu, base)?;
    let dc = cur.map(|c| lane.bytes(gpu, c)).transpose()?;
    let dd = deltas.map(|d| lane.bytes(gpu, d)).transpose()?;
    let bv = db.view();
    let mut tile_counts = lane.alloc::<u32>(256 * tiles as usize)?;
    let mut starts = lane.alloc::<u64>(256)?;
    let mut l = lane.stream.launch_builder(gpu.f("group_counts"));
    l.arg(&bv).arg(&n).arg(&tiles).arg(&mut *tile_counts);
    // SAFETY: one block a tile; writes 256 counts a tile.
    unsafe { l.launch(cfg((tiles as u32, 1), 256)) }?;
    let mut l = lane.stream.launch_builder(gpu.f("group_starts"));
    l.arg(&tiles).arg(&mut *tile_counts).arg(&mut *starts);
    // SAFETY: one block of 256 threads, one a group.
    unsafe { l.launch(cfg((1, 1), 256)) }?;
    let mut dout = lane.alloc::<u8>(n as usize)?;
    let m = modulus as u32;
    let inverse = deltas.is_some() as i32;
    let (cv, dv) = (dc.as_ref().map(Dev::view), dd.as_ref().map(Dev::view));
    let mut l = lane.stream.launch_builder(gpu.f("group_scatter"));
    l.arg(&bv);
    arg_opt(&mut l, cv.as_ref());
    l.arg(&n)
        .arg(&tiles)
        .arg(&*tile_counts)
        .arg(&*starts)
        .arg(&m)
        .arg(&inverse);
    arg_opt(&mut l, dv.as_ref());
    l.arg(&mut *dout);
    // SAFETY: 8 warps a block, one warp a tile; every position is below n.
    unsafe { l.launch(cfg((tiles.div_ceil(8) as u32, 1), 256)) }?;
    lane.download(&dout.slice(..n as usize), out)
}

/// Each plane's whole stream from its writer and its coded chunks ([`StreamWriter::assemble`]).
pub(super) fn assemble_streams(writers: &[StreamWriter], coded: &[Vec<Vec<u8>>]) -> Vec<Vec<u8>> {
    writers
        .iter()
        .zip(coded)
        .map(|(w, chunks)| {
            let chunks: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
            let mut stream = Vec::new();
            w.assemble(&chunks, &mut stream);
            stream
        })
        .collect()
}

/// Decodes on the device; `Ok(false)` when a stream is damaged (the caller asks the CPU why).
pub(super) fn decode_on(
    gpu: &Gpu,
    lane: &mut Lane,
    spec: PlaneSpec,
    streams: &[Stream<'_>],
    base: Option<&[u8]>,
    out: &mut [u8],
) -> Res<bool> {
    let g = Geometry::of(spec, out.len());
    let Some(sym) = decode_symbols(gpu, lane, g, streams)? else {
        return Ok(false);
    };
    let b = base.map(|b| lane.bytes(gpu, b)).transpose()?;
    let bv = b.as_ref().map(Dev::view);
    let sv = sym.slice(..);
    fill_output(gpu, lane, out, |lane, dout| {
        launch_planes(gpu, lane, "merge_planes", g, &sv, bv.as_ref(), dout)
    })?;
    Ok(true)
}

/// Runs `fill`, a decode's last kernels, into device memory for `out`. A mirrored output
/// (`mirror_into`) is written straight into the caller's device memory and stays there
/// (verified there, `content_id`); any other is written into a buffer and downloaded into `out`.
pub(super) fn fill_output(
    gpu: &Gpu,
    lane: &mut Lane,
    out: &mut [u8],
    fill: impl FnOnce(&Lane, &mut CudaSlice<u8>) -> Res<()>,
) -> Res<()> {
    match gpu.output(out) {
        Some(at) => {
            // SAFETY: the caller's device memory holds out.len() bytes there while the output
            // is registered (for the whole of this call); leaked below, never freed.
            let mut dout = unsafe { lane.stream.upgrade_device_ptr::<u8>(at.address, out.len()) };
            let done = fill(lane, &mut dout).and_then(|()| lane.stream.synchronize());
            dout.leak();
            done?;
            at.written.fetch_add(out.len() as u64, Ordering::Relaxed);
        }
        None => {
            let mut dout = lane.alloc::<u8>(out.len())?;
            fill(lane, &mut dout)?;
            lane.download(&dout.slice(..out.len()), out)?;
        }
    }
    Ok(())
}

/// Decodes one entropy stream per plane into device symbols laid out as `g` (plane `p` at
/// `p · stride`, with a sparse stream's room after the planes); `None` when a stream is damaged.
pub(super) fn decode_symbols(
    gpu: &Gpu,
    lane: &mut Lane,
    g: Geometry,
    streams: &[Stream<'_>],
) -> Res<Option<Scratch<u8>>> {
    let (n, stride, planes) = (g.n, g.stride, g.planes);
    let fstride = stride / 8;
    let chunks = n.div_ceil(CHUNK as u64) as usize;
    let chunk_n = |c: usize| (n - (c * CHUNK) as u64).min(CHUNK as u64);
    // Planes, then (for sparse streams) flag bytes and non-zero values.
    let sparse = streams.iter().any(|s| {
        matches!(
            s.body(),
            StreamBody::Coded {
                values: Some(_),
                ..
            }
        )
    });
    let flags_at = stride * planes as u64;
    let values_at = flags_at + fstride * planes as u64;
    let extra = if sparse {
        (fstride + stride) as usize * planes
    } else {
        0
    };
    let mut sym = lane.alloc::<u8>(g.planes_len() + extra)?;

    // The coded bytes of every plane, one after the other.
    let mut tables: Vec<u16> = Vec::new();
    let mut table = |d: &mdl_codec::huffman::Decoder| -> u64 {
        let t = (tables.len() / 4096) as u64;
        tables.extend_from_slice(d.table());
        t
    };
    let mut input_len = 0usize;
    let mut coded: Vec<(usize, &[u8])> = Vec::new();
    let mut first_jobs: Vec<u64> = Vec::new(); // Huffman chunks and sparse flag chunks
    let mut value_jobs: Vec<u64> = Vec::new();
    let mut flag_counts: Vec<u64> = Vec::new(); // (flags offset, flag bytes) per sparse chunk
    let mut scatter: Vec<u64> = Vec::new();
    for (p, s) in streams.iter().enumerate().take(planes) {
        let plane_at = p as u64 * stride;
        match s.body() {
            StreamBody::Stored(b) => {
                lane.stream.memcpy_htod(
                    *b,
                    &mut sym.slice_mut(plane_at as usize..plane_at as usize + b.len()),
                )?;
            }
            StreamBody::Constant(v) => {
                let v = *v as u32;
                let mut view = sym.slice_mut(plane_at as usize..(plane_at + n) as usize);
                let mut l = lane.stream.launch_builder(gpu.f("fill_bytes"));
                l.arg(&mut view).arg(&n).arg(&v);
                // SAFETY: fills the plane's n bytes.
                unsafe { l.launch(cfg((grid(n).min(4096), 1), 256)) }?;
            }
            StreamBody::Coded {
                lanes,
                decoder,
                values,
                offsets,
                data,
            } => {
                let lanes = lanes.count() as u64;
                let base_at = input_len as u64;
                coded.push((input_len, *data));
                input_len += data.len();
                let td = table(decoder);
                let tv = values.as_deref().map(&mut table);
                for c in 0..chunks {
                    let (lo, hi) = (offsets[c] as u64, offsets[c + 1] as u64);
                    match tv {
                        None => first_jobs.extend([
                            base_at + lo,
                            hi - lo,
                            chunk_n(c),
                            td,
                            plane_at + (c * CHUNK) as u64,
                            lanes,
                        ]),
                        Some(tv) => {
                            let bytes = &data[lo as usize..hi as usize];
                            if bytes.len() < 4 {
                                return Ok(None);
                            }
                            let flen = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as u64;
                            if flen > hi - lo - 4 {
                                return Ok(None);
                            }
                            let f_at = flags_at + p as u64 * fstride + (c * CHUNK / 8) as u64;
                            let v_at = values_at + plane_at + (c * CHUNK) as u64;
                            let job = (flag_counts.len() / 2) as u64;
                            first_jobs.extend([
                                base_at + lo + 4,
                                flen,
                                chunk_n(c).div_ceil(8),
                                td,
                                f_at,
                                lanes,
                            ]);
                            value_jobs.extend([
                                base_at + lo + 4 + flen,
                                hi - lo - 4 - flen,
                                job,
                                tv | 1 << 63,
                                v_at,
                                lanes,
                            ]);
                            flag_counts.extend([f_at, chunk_n(c).div_ceil(8)]);
                            scatter.extend([f_at, v_at, plane_at + (c * CHUNK) as u64, chunk_n(c)]);
                        }
                    }
                }
            }
        }
    }
    let mut input = lane.alloc::<u8>(input_len)?;
    for (at, bytes) in &coded {
        lane.upload_into(bytes, &mut input.slice_mut(*at..*at + bytes.len()))?;
    }
    let dtables = lane.put(&tables)?;
    let mut err = lane.zeros::<i32>(1)?;
    let sparse_jobs = (flag_counts.len() / 2) as u64;
    let mut counts = lane.zeros::<u64>(sparse_jobs as usize)?;
    let decode = |lane: &Lane,
                  jobs: &[u64],
                  sym: &mut CudaSlice<u8>,
                  counts: &CudaSlice<u64>,
                  err: &mut CudaSlice<i32>|
     -> Res<()> {
        if jobs.is_empty() {
            return Ok(());
        }
        let njobs = (jobs.len() / 6) as u64;
        let d = lane.put(jobs)?;
        let mut l = lane.stream.launch_builder(gpu.f("huff_decode"));
        l.arg(&*input)
            .arg(&*d)
            .arg(&njobs)
            .arg(&*dtables)
            .arg(counts)
            .arg(sym)
            .arg(err);
        // SAFETY: one thread a lane (32 a job); every read is checked against its chunk's
        // length and every write stays in the job's output span.
        let threads = njobs * Lanes::Wide.count() as u64;
        unsafe { l.launch(cfg((threads.div_ceil(128) as u32, 1), 128)) }.map(drop)
    };
    decode(lane, &first_jobs, &mut sym, &counts, &mut err)?;
    if sparse_jobs > 0 {
        let d = lane.put(&flag_counts)?;
        let mut l = lane.stream.launch_builder(gpu.f("count_flags"));
        l.arg(&*sym).arg(&*d).arg(&mut *counts);
        // SAFETY: one block a sparse chunk; reads its flag bytes.
        unsafe { l.launch(cfg((sparse_jobs as u32, 1), 256)) }?;
        decode(lane, &value_jobs, &mut sym, &counts, &mut err)?;
        let d = lane.put(&scatter)?;
        let mut l = lane.stream.launch_builder(gpu.f("sparse_scatter"));
        l.arg(&*sym)
            .arg(&*sym)
            .arg(&*d)
            .arg(&*counts)
            .arg(&*sym)
            .arg(&mut *err);
        // SAFETY: reads flags and values, writes the chunk's symbols; the three areas of the
        // buffer are disjoint.
        unsafe { l.launch(cfg((sparse_jobs as u32, 1), 256)) }?;
    }
    if lane.fetch(&err, 1)?[0] != 0 {
        return Ok(None);
    }
    Ok(Some(sym))
}
