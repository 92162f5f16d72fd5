//! The residual quantizer on the device (mdl-codec's `residual` module): how far a tensor moved,
//! the statistics of a step search, and a payload's codes, exact values, reconstruction and
//! entropy streams. The quantizer's tables are built by mdl-codec
//! ([`residual::device_quantizer`]) and the sums kept in its order ([`residual::LANES`] per
//! block, blocks then chunks in order), so the results are the CPU engine's bits.

use mdl_codec::residual::{self, Codes, Mode, ResidualStats};
use mdl_codec::scalar;

use mdl_codec::engine::{scales, sum, FloatView, Moments};
use mdl_codec::huffman::{Histogram, Plan, Stream, StreamWriter};
use mdl_format::Dtype;

use super::coding::{assemble_streams, decode_symbols, fill_output};
use super::device::{
    arg_opt, cfg, dtype_code, fold_error_sums, grid, launch_max_abs, plane_counts, starts_of, Dev,
    Geometry, Gpu, Lane, MomentsOn,
};
use super::encode::encode_symbols;
use super::{PushKernelArg, Res, CHUNK};

/// Threads of a block of the chunk kernels: 32 warps, two of a chunk's 64 blocks each.
const CHUNK_THREADS: u32 = 1024;

/// Elements per tile of the codes kernel (the kernel's `R_TILE`).
const CODE_TILE: u64 = 4096;

/// Counters per step of the measuring kernel: low bytes, high bytes, the exact count.
const COUNTERS: usize = 513;

/// Whether the device computes what the CPU would for these inputs: a lossy dtype, and a
/// reference and moments of the tensor's length.
pub(super) fn fits(
    values: FloatView<'_>,
    reference: Option<&[u8]>,
    moments: Option<Moments<'_>>,
) -> bool {
    let n = values.len();
    scalar::lossy_supported(values.dtype)
        && n > 0
        && reference.is_none_or(|r| r.len() == values.bytes.len())
        && moments.is_none_or(|mv| {
            [mv.m, mv.v]
                .iter()
                .all(|t| scalar::lossy_supported(t.dtype) && t.len() == n)
        })
}

fn chunks_of(values: FloatView<'_>) -> u64 {
    (values.len() as u64).div_ceil(residual::CHUNK as u64)
}

/// [`residual::distance_sq`]: one block a chunk sums its blocks in lanes; the chunks' sums are
/// added on the host in order.
pub(super) fn distance_on(
    gpu: &Gpu,
    lane: &mut Lane,
    values: FloatView<'_>,
    reference: Option<&[u8]>,
) -> Res<f64> {
    let n = values.len() as u64;
    let chunks = chunks_of(values);
    let dx = lane.bytes(gpu, values.bytes)?;
    let dr = reference.map(|r| lane.bytes(gpu, r)).transpose()?;
    let mut sums = lane.zeros::<f64>(chunks as usize)?;
    let (xv, rv) = (dx.view(), dr.as_ref().map(Dev::view));
    let dt = dtype_code(values.dtype);
    let mut l = lane.stream.launch_builder(gpu.f("residual_distance"));
    l.arg(&xv);
    arg_opt(&mut l, rv.as_ref());
    l.arg(&n).arg(&dt).arg(&mut *sums);
    // SAFETY: one block a chunk reads its elements and writes its sum.
    unsafe { l.launch(cfg((chunks as u32, 1), CHUNK_THREADS)) }?;
    let sums = lane.fetch(&sums, chunks as usize)?;
    Ok(residual::distance_of_chunks(&sums))
}

/// [`residual::measure_steps`]: one block a (chunk, valid step); counts come back per step, error
/// sums per (step, chunk), folded on the host in chunk order.
#[allow(clippy::too_many_arguments)]
pub(super) fn measure_on(
    gpu: &Gpu,
    lane: &mut Lane,
    values: FloatView<'_>,
    reference: Option<&[u8]>,
    moments: Option<Moments<'_>>,
    mode: Mode,
    steps: &[f64],
    every: usize,
) -> Res<Vec<ResidualStats>> {
    let mut out = vec![ResidualStats::default(); steps.len()];
    // An invalid step measures nothing, as on the CPU.
    let valid: Vec<(usize, Vec<f64>)> = steps
        .iter()
        .enumerate()
        .filter_map(|(i, &s)| residual::device_quantizer(mode, s).map(|q| (i, q)))
        .collect();
    if valid.is_empty() {
        return Ok(out);
    }
    let n = values.len() as u64;
    let chunks = chunks_of(values);
    let quants: Vec<f64> = valid.iter().flat_map(|(_, q)| q.iter().copied()).collect();
    let dq = lane.put(&quants)?;
    let dx = lane.bytes(gpu, values.bytes)?;
    let dr = reference.map(|r| lane.bytes(gpu, r)).transpose()?;
    let on = MomentsOn::of(gpu, lane, values.dtype, moments)?;
    let mut err = lane.zeros::<f64>(valid.len() * chunks as usize * 5)?;
    let mut hist = lane.zeros::<u64>(valid.len() * COUNTERS)?;
    let dts = on.dtypes;
    let (mode_code, every) = (mode as i32, every.max(1) as u64);
    let (xv, rv) = (dx.view(), dr.as_ref().map(Dev::view));
    let (mv, vv) = on.views();
    let mut l = lane.stream.launch_builder(gpu.f("residual_measure"));
    l.arg(&xv);
    arg_opt(&mut l, rv.as_ref());
    arg_opt(&mut l, mv.as_ref());
    arg_opt(&mut l, vv.as_ref());
    l.arg(&n)
        .arg(&dts[0])
        .arg(&dts[1])
        .arg(&dts[2])
        .arg(&mode_code)
        .arg(&*dq)
        .arg(&every)
        .arg(&mut *err)
        .arg(&mut *hist);
    // SAFETY: one block a (chunk, step) reads the chunk's elements, writes its 5 sums and adds
    // to the step's counters.
    unsafe { l.launch(cfg((chunks as u32, valid.len() as u32), CHUNK_THREADS)) }?;
    let err = lane.fetch(&err, valid.len() * chunks as usize * 5)?;
    let hist = lane.fetch(&hist, valid.len() * COUNTERS)?;
    let per_step = err.chunks_exact(chunks as usize * 5);
    for (((i, _), counts), sums) in valid.iter().zip(hist.chunks_exact(COUNTERS)).zip(per_step) {
        let mut st = ResidualStats::default();
        st.codes.0.copy_from_slice(&counts[..256]);
        st.high.0.copy_from_slice(&counts[256..512]);
        st.exact = counts[512];
        // High bytes of 0 are every code not counted with a wider one (as on the CPU).
        let wide: u64 = st.high.0[1..].iter().sum();
        st.high.0[0] = st.codes.total() - wide;
        st.err = fold_error_sums(sums);
        out[*i] = st;
    }
    Ok(out)
}

/// [`residual::encode`]: the codes and the reconstruction are computed on the device, the exact
/// elements gathered there in order, and the code planes entropy-coded there; what comes back
/// is the payload's parts and the reconstruction.
pub(super) fn quantize_on(
    gpu: &Gpu,
    lane: &mut Lane,
    values: FloatView<'_>,
    reference: Option<&[u8]>,
    mode: Mode,
    step: f64,
) -> Res<(Vec<u8>, Vec<u8>)> {
    let quant = residual::device_quantizer(mode, step).expect("a valid residual step");
    let n = values.len() as u64;
    let size = values.dtype.size();
    let dt = dtype_code(values.dtype);
    let mode_code = mode as i32;
    // The codes' two byte planes, with the room a sparse stream needs after them.
    let g = Geometry::bytes(n, 2);
    let dq = lane.put(&quant)?;
    let dx = lane.bytes(gpu, values.bytes)?;
    let dr = reference.map(|r| lane.bytes(gpu, r)).transpose()?;
    let mut sym = lane.alloc::<u8>(g.planes_len() + g.sparse_room())?;
    let mut render = lane.alloc::<u8>(values.bytes.len())?;
    let mut wide = lane.zeros::<u32>(1)?;
    let tiles = n.div_ceil(CODE_TILE);
    let mut tile_exact = lane.alloc::<u64>(tiles as usize)?;
    let (xv, rv) = (dx.view(), dr.as_ref().map(Dev::view));
    let mut l = lane.stream.launch_builder(gpu.f("residual_codes"));
    l.arg(&xv);
    arg_opt(&mut l, rv.as_ref());
    l.arg(&n)
        .arg(&dt)
        .arg(&mode_code)
        .arg(&*dq)
        .arg(&mut *sym)
        .arg(&g.stride)
        .arg(&mut *render)
        .arg(&mut *wide)
        .arg(&mut *tile_exact);
    // SAFETY: one block a tile writes its elements' code bytes, reconstruction and count.
    unsafe { l.launch(cfg((tiles as u32, 1), 256)) }?;

    // The exact elements, in element order: each tile writes from its start.
    let (starts, exact) = starts_of(&lane.fetch(&tile_exact, tiles as usize)?);
    let mut exact_values = vec![0u8; exact as usize * size];
    if exact > 0 {
        let dstarts = lane.put(&starts)?;
        let mut dvalues = lane.alloc::<u8>(exact_values.len())?;
        let mut l = lane.stream.launch_builder(gpu.f("residual_exact"));
        l.arg(&xv)
            .arg(&n)
            .arg(&dt)
            .arg(&*sym)
            .arg(&g.stride)
            .arg(&*dstarts)
            .arg(&mut *dvalues);
        // SAFETY: each tile writes its counted exact values from its start.
        unsafe { l.launch(cfg((tiles as u32, 1), 256)) }?;
        lane.download(&dvalues.slice(..), &mut exact_values)?;
    }

    // One plane of codes, or two when some code needs its high byte; each plane's stream is
    // planned from its counts as `huffman::encode_stream` plans it.
    let planes = if lane.fetch(&wide, 1)?[0] != 0 { 2 } else { 1 };
    let g = Geometry::bytes(n, planes);
    let (hist, flags) = plane_counts(gpu, lane, g, &sym, true, true)?;
    let writers: Vec<StreamWriter> = (0..planes)
        .map(|p| {
            let counts = |v: &[u64]| {
                let mut h = Histogram::default();
                h.0.copy_from_slice(&v[256 * p..256 * (p + 1)]);
                h
            };
            StreamWriter::new(Plan::choose(&counts(&hist), Some(&counts(&flags))).0)
        })
        .collect();
    let coded = encode_symbols(gpu, lane, g, sym, &writers)?;
    let streams = assemble_streams(&writers, &coded);
    let mut host = vec![0u8; values.bytes.len()];
    lane.download(&render.slice(..), &mut host)?;
    let payload = residual::assemble(mode, quant[0], exact, &exact_values, &streams);
    Ok((payload, host))
}

/// [`mdl_codec::engine::mean_second_moment`]: the maximum of `v` sets the fixed-point scale, as
/// on the CPU, then one pass sums the second moment in it.
pub(super) fn mean_v_on(
    gpu: &Gpu,
    lane: &mut Lane,
    w: FloatView<'_>,
    moments: Moments<'_>,
) -> Res<f64> {
    let n = w.len() as u64;
    let dw = lane.bytes(gpu, w.bytes)?;
    let dm = lane.bytes(gpu, moments.m.bytes)?;
    let dv = lane.bytes(gpu, moments.v.bytes)?;
    let dts = [w.dtype, moments.m.dtype, moments.v.dtype].map(dtype_code);
    let mut max = lane.zeros::<u64>(1)?;
    let (wv, mv, vv) = (dw.view(), dm.view(), dv.view());
    launch_max_abs(gpu, lane, &vv, n, dts[2], &mut max.slice_mut(..))?;
    let vmax = f64::from_bits(lane.fetch(&max, 1)?[0]);
    let sc = scales(n as usize, 0.0, 0.0, vmax)[sum::V];
    let mut total = lane.zeros::<u64>(1)?;
    let mut l = lane.stream.launch_builder(gpu.f("second_moment_sum"));
    l.arg(&wv)
        .arg(&mv)
        .arg(&vv)
        .arg(&n)
        .arg(&dts[0])
        .arg(&dts[1])
        .arg(&dts[2])
        .arg(&sc)
        .arg(&mut *total);
    // SAFETY: reads n elements of each; one atomic add of each warp's sum.
    unsafe { l.launch(cfg((grid(n).min(4096), 1), 256)) }?;
    let total = lane.fetch(&total, 1)?[0] as i64;
    Ok(total as f64 / sc / n as f64)
}

/// [`residual::decode`] on the device: the code streams are decoded there and checked as the
/// CPU checks them, and each element is rebuilt from its code and the reference. `Ok(false)`
/// when the CPU should decode instead (a damaged payload, whose fault it then names, or a
/// stream of another chunk size).
pub(super) fn decode_on(
    gpu: &Gpu,
    lane: &mut Lane,
    dtype: Dtype,
    payload: &[u8],
    reference: Option<&[u8]>,
    out: &mut [u8],
) -> Res<bool> {
    let Ok(parts) = residual::parse(dtype, payload, reference.map(<[u8]>::len), out.len()) else {
        return Ok(false);
    };
    let n = (out.len() / dtype.size()) as u64;
    let (sym, g, wide) = match parts.codes {
        Codes::Huffman { low, high } => {
            let mut streams = Vec::with_capacity(2);
            for bytes in [Some(low), high].into_iter().flatten() {
                match Stream::parse(bytes, n) {
                    Ok(s) if s.chunk_len() == CHUNK => streams.push(s),
                    _ => return Ok(false),
                }
            }
            let g = Geometry::bytes(n, streams.len());
            let Some(sym) = decode_symbols(gpu, lane, g, &streams)? else {
                return Ok(false);
            };
            (sym, g, high.is_some())
        }
        // Codes by classes are decoded on the host (rANS chunks are sequential within).
        Codes::Classed(_) => match parts.codes.planes(n as usize) {
            Ok((low, _)) => (lane.put(&low)?, Geometry::bytes(n, 1), false),
            Err(_) => return Ok(false),
        },
    };
    let low = sym.slice(..n as usize);
    let high = wide.then(|| sym.slice(g.stride as usize..(g.stride + n) as usize));
    let tiles = n.div_ceil(CODE_TILE);
    let mut tile_exact = lane.alloc::<u64>(tiles as usize)?;
    let mut bad = lane.zeros::<u32>(1)?;
    let moment = i32::from(parts.mode != Mode::Linear);
    let mut l = lane.stream.launch_builder(gpu.f("residual_scan"));
    l.arg(&low);
    arg_opt(&mut l, high.as_ref());
    l.arg(&n).arg(&moment).arg(&mut *tile_exact).arg(&mut *bad);
    // SAFETY: one block a tile reads its codes and writes its count.
    unsafe { l.launch(cfg((tiles as u32, 1), 256)) }?;
    let (starts, exact) = starts_of(&lane.fetch(&tile_exact, tiles as usize)?);
    if lane.fetch(&bad, 1)?[0] != 0 || exact != parts.exact_count {
        return Ok(false);
    }
    let dq = lane.put(&parts.device_quantizer())?;
    let dstarts = lane.put(&starts)?;
    let dexact = lane.put(parts.exact)?;
    let dr = reference.map(|r| lane.bytes(gpu, r)).transpose()?;
    let rv = dr.as_ref().map(Dev::view);
    let (dt, mode) = (dtype_code(dtype), parts.mode as i32);
    fill_output(gpu, lane, out, |lane, dout| {
        let mut l = lane.stream.launch_builder(gpu.f("residual_rebuild"));
        l.arg(&low);
        arg_opt(&mut l, high.as_ref());
        l.arg(&n).arg(&dt).arg(&mode).arg(&*dq);
        arg_opt(&mut l, rv.as_ref());
        l.arg(&*dexact).arg(&*dstarts).arg(dout);
        // SAFETY: one block a tile writes its elements; the exact values it reads were
        // counted from its start by residual_scan, and their total checked.
        unsafe { l.launch(cfg((tiles as u32, 1), 256)) }.map(drop)
    })?;
    Ok(true)
}
