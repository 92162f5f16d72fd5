//! [`GpuEngine`]: the [`Engine`] kernels on one CUDA device.
//!
//! Each call takes a *lane* from a pool (a stream with two pinned staging buffers), so calls
//! from several threads — a commit stores tensors in parallel — run on their own streams and
//! overlap: one tensor's copies with another's kernels. Host bytes go to the device through
//! the pinned buffers in pieces, the copy of one piece overlapping the filling of the next;
//! bytes the caller keeps ([`Engine::keep`]) are copied once and reused by every kernel that
//! reads them. Any driver failure falls back to the CPU engine for that call (the bytes are
//! the same either way) and is logged.

use std::sync::atomic::Ordering;
use std::sync::Arc;

// The CUDA driver, or with the `emulate` feature the emulated device of the same shape.
#[cfg(feature = "emulate")]
use crate::emu::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr,
    DriverError, LaunchArgs, LaunchConfig, PinnedHostSlice, PushKernelArg, ValidAsZeroBits,
};
#[cfg(not(feature = "emulate"))]
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr,
    DriverError, LaunchArgs, LaunchConfig, PinnedHostSlice, PushKernelArg, ValidAsZeroBits,
};
use mdl_codec::engine::{
    check_ungroup, scales, sum, Assigned, CodePairs, CpuEngine, DeviceCopy, Engine, ErrorStats,
    FloatView, Kept, KeyStats, Lut, Mirror, Moments, WholeCounts, ERROR_CHUNK,
};
use mdl_codec::huffman::{Histogram, Stream, StreamWriter, CHUNK_LOG2};
use mdl_codec::planes::PlaneSpec;
use mdl_codec::residual::{Mode, ResidualStats, Steps};
use mdl_format::{Dtype, FormatError, ObjectId};

/// Symbols per Huffman chunk (the float codecs' chunking).
const CHUNK: usize = 1 << CHUNK_LOG2;

/// Bytes per piece of a staged copy (two pieces per lane in flight).
const STAGE: usize = 32 << 20;

/// Inputs smaller than this are left to the CPU unless already on the device: launches and
/// copies would cost more than they save.
const DEFAULT_MIN_BYTES: usize = 1 << 20;

/// Elements per tile of the ordered compactions (protected indices).
const TILE: u64 = 1 << 14;

/// Elements per tile of the grouped deltas (the kernel's `GROUP_TILE`).
const GROUP_TILE: u64 = 4096;

type Res<T> = Result<T, DriverError>;

/// What a failed call does instead (see [`Gpu::failed`]).
const CPU_INSTEAD: &str = "using the CPU for it";

mod batch;
#[cfg(feature = "bench")]
mod bench;
mod buffer;
mod coding;
mod device;
mod encode;
mod hash;
mod kept;
mod resident;
mod residual;
mod scratch;
use scratch::Scratch;

#[cfg(feature = "bench")]
pub use bench::BenchRow;
pub use buffer::DeviceBuffer;
use coding::{decode_on, grouped};
pub(crate) use device::Gpu;
use device::{
    arg_opt, cfg, dtype_code, fold_error_sums, grid, launch_max_abs, launch_planes, plane_counts,
    starts_of, Dev, Geometry, Lane, MomentsOn,
};
use encode::encode_on;

/// The codec kernels on a CUDA device (see the crate documentation). Identical results to
/// [`CpuEngine`], which also does what is too small to be worth a launch.
#[derive(Clone, Debug)]
pub struct GpuEngine {
    gpu: Arc<Gpu>,
    min_bytes: usize,
}

impl GpuEngine {
    pub(crate) fn new(gpu: Arc<Gpu>) -> GpuEngine {
        GpuEngine {
            gpu,
            min_bytes: DEFAULT_MIN_BYTES,
        }
    }

    /// The same engine, sending inputs of at least `bytes` to the device (tests use 0 so that
    /// every kernel runs on the GPU whatever the size).
    pub fn with_min_bytes(mut self, bytes: usize) -> GpuEngine {
        self.min_bytes = bytes;
        self
    }

    /// How many calls a driver failure has sent to the CPU since the engine started (the
    /// bytes are the same either way; tests check that nothing fell back).
    pub fn fallbacks(&self) -> u64 {
        self.gpu.fallbacks.load(Ordering::Relaxed)
    }

    /// A copy of `bytes` in this engine's device memory, as a caller's CUDA tensor would lie
    /// there (tests and benchmarks); `None` if the device refused the allocation.
    pub fn device_buffer(&self, bytes: &[u8]) -> Option<DeviceBuffer> {
        DeviceBuffer::new(self.gpu.clone(), bytes)
    }

    /// Bytes of content copied from the host to the device since the engine started: tensors,
    /// bases and codes, not the coded streams a decode takes (tests check that kept and
    /// adopted bytes are not copied again).
    pub fn uploaded(&self) -> u64 {
        self.gpu.uploaded.load(Ordering::Relaxed)
    }

    /// What the engine has asked of the device so far, where the device counts it: the
    /// emulated device does (feature `emulate`), a real one does not (`None`).
    pub fn counts(&self) -> Option<crate::DeviceCounts> {
        #[cfg(feature = "emulate")]
        return Some(crate::emu::counts());
        #[cfg(not(feature = "emulate"))]
        None
    }

    /// Whether `host` goes to the device.
    fn wants(&self, host: &[u8]) -> bool {
        host.len() >= self.min_bytes || self.gpu.resident(host).is_some()
    }

    /// Runs `gpu_work`; on a driver failure logs it and runs `cpu_work` instead.
    fn run<R>(
        &self,
        what: &str,
        gpu_work: impl FnOnce(&Gpu, &mut Lane) -> Res<R>,
        cpu_work: impl FnOnce() -> R,
    ) -> R {
        match self.gpu.with_lane(|lane| gpu_work(&self.gpu, lane)) {
            Ok(r) => r,
            Err(e) => {
                self.gpu.failed(what, e, CPU_INSTEAD);
                cpu_work()
            }
        }
    }

    /// A decode into `out`: on the device by `on_device` (`Ok(false)`: one the CPU must do, a
    /// damaged input whose fault the CPU then names) where `out` is large or bound for the
    /// device, else or after a driver failure by `on_cpu`. A decode bound for the device that
    /// the CPU did is copied there, so that the device holds the whole output.
    fn decode_with(
        &self,
        out: &mut [u8],
        on_device: impl FnOnce(&Gpu, &mut Lane, &mut [u8]) -> Res<bool>,
        on_cpu: impl FnOnce(&mut [u8]) -> Result<(), FormatError>,
    ) -> Result<(), FormatError> {
        if !self.wants(out) && self.gpu.output(out).is_none() {
            return on_cpu(out);
        }
        match self.gpu.with_lane(|lane| on_device(&self.gpu, lane, out)) {
            Ok(true) => return Ok(()),
            Ok(false) => on_cpu(out)?,
            Err(e) => {
                self.gpu.failed("decode", e, CPU_INSTEAD);
                on_cpu(out)?
            }
        }
        if let Some(at) = self.gpu.output(out) {
            // SAFETY: the output's device memory holds these out.len() bytes while it is
            // registered (the whole of this call), and only this decode writes them.
            let copied = self
                .gpu
                .with_lane(|lane| unsafe { lane.upload_to(out, at.address) });
            if let Err(e) = copied {
                self.gpu.failed("copy to the device", e, "the load fails");
                return Err(FormatError::invalid("device copy", e.to_string()));
            }
            at.written.fetch_add(out.len() as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Splits `data` into its planes on the device, in a buffer with `extra` bytes after
    /// them.
    fn split(
        gpu: &Gpu,
        lane: &mut Lane,
        g: Geometry,
        data: &[u8],
        base: Option<&[u8]>,
        extra: usize,
    ) -> Res<Scratch<u8>> {
        let d = lane.bytes(gpu, data)?;
        let b = base.map(|b| lane.bytes(gpu, b)).transpose()?;
        let mut out = lane.alloc::<u8>(g.planes_len() + extra)?;
        let bv = b.as_ref().map(Dev::view);
        launch_planes(
            gpu,
            lane,
            "split_planes",
            g,
            &d.view(),
            bv.as_ref(),
            &mut out,
        )?;
        Ok(out)
    }
}

impl Engine for GpuEngine {
    fn name(&self) -> &'static str {
        "gpu"
    }

    fn keep<'a>(&'a self, bytes: &'a [u8]) -> Kept<'a> {
        self.keep_bytes(bytes)
    }

    fn adopt<'a>(&'a self, bytes: &'a [u8], copy: DeviceCopy) -> Kept<'a> {
        self.adopt_bytes(bytes, copy)
    }

    fn keep_shared(&self, content: &Arc<Vec<u8>>, like: Option<&[u8]>) -> Kept<'static> {
        self.keep_shared_bytes(content, like)
    }

    fn splits_on_host(&self, data: &[u8]) -> bool {
        !self.wants(data)
    }

    fn content_id(&self, prefix: &[u8], data: &[u8]) -> ObjectId {
        self.tensor_id(prefix, data, false)
    }

    fn mirror_into(
        &self,
        out: &mut [u8],
        copy: DeviceCopy,
        fill: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> Mirror {
        self.mirror_bytes(out, copy, fill)
    }

    fn content_ids(&self, items: &[(&[u8], &[u8])]) -> Vec<ObjectId> {
        self.ids_at_once(items)
    }

    fn whole_counts(&self, items: &[(PlaneSpec, &[u8])]) -> Vec<WholeCounts> {
        self.whole_counts_at_once(items)
    }

    fn encode_many(&self, items: &[(PlaneSpec, &[u8], &[StreamWriter])]) -> Vec<Vec<Vec<Vec<u8>>>> {
        self.encode_at_once(items)
    }

    fn plane_histograms(
        &self,
        spec: PlaneSpec,
        data: &[u8],
        base: Option<&[u8]>,
        want: &[(bool, bool)],
    ) -> Vec<(Histogram, Histogram)> {
        let cpu = || CpuEngine.plane_histograms(spec, data, base, want);
        if !self.wants(data) {
            return cpu();
        }
        self.run(
            "plane histograms",
            |gpu, lane| {
                let g = Geometry::of(spec, data.len());
                let planes = g.planes;
                let planes_buf = Self::split(gpu, lane, g, data, base, 0)?;
                // Only what some plane wants is counted.
                let (symbols, flags) = (want.iter().any(|w| w.0), want.iter().any(|w| w.1));
                let (h, f) = plane_counts(gpu, lane, g, &planes_buf, symbols, flags)?;
                Ok((0..planes)
                    .map(|p| {
                        let take = |v: &[u64], yes: bool| {
                            let mut out = Histogram::default();
                            if yes {
                                out.0.copy_from_slice(&v[256 * p..256 * (p + 1)]);
                            }
                            out
                        };
                        (take(&h, want[p].0), take(&f, want[p].1))
                    })
                    .collect())
            },
            cpu,
        )
    }

    fn encode_planes(
        &self,
        spec: PlaneSpec,
        data: &[u8],
        base: Option<&[u8]>,
        writers: &[StreamWriter],
    ) -> Vec<Vec<Vec<u8>>> {
        let cpu = || CpuEngine.encode_planes(spec, data, base, writers);
        if !self.wants(data) {
            return cpu();
        }
        self.run(
            "encode",
            |gpu, lane| encode_on(gpu, lane, spec, data, base, writers),
            cpu,
        )
    }

    fn decode_planes(
        &self,
        spec: PlaneSpec,
        streams: &[Stream<'_>],
        base: Option<&[u8]>,
        out: &mut [u8],
    ) -> Result<(), FormatError> {
        self.decode_with(
            out,
            |gpu, lane, out| decode_on(gpu, lane, spec, streams, base, out),
            |out| CpuEngine.decode_planes(spec, streams, base, out),
        )
    }

    fn key_stats(&self, w: FloatView<'_>, moments: Option<Moments<'_>>) -> KeyStats {
        let cpu = || CpuEngine.key_stats(w, moments);
        if !self.wants(w.bytes) {
            return cpu();
        }
        self.run(
            "key histogram",
            |gpu, lane| {
                let n = w.len() as u64;
                let dw = lane.bytes(gpu, w.bytes)?;
                let on = MomentsOn::of(gpu, lane, w.dtype, moments)?;
                let mut maxima = lane.zeros::<u64>(3)?;
                let (mv, vv) = on.views();
                let views = [Some(dw.view()), mv, vv];
                let dtypes = on.dtypes;
                for (k, v) in views.iter().enumerate() {
                    let Some(v) = v else { continue };
                    launch_max_abs(gpu, lane, v, n, dtypes[k], &mut maxima.slice_mut(k..k + 1))?;
                }
                let m = lane.fetch(&maxima, 3)?;
                let max = |k: usize| f64::from_bits(m[k]);
                let sc = scales(n as usize, max(0), max(1), max(2));
                let dsc = lane.put(&sc)?;
                let keys = mdl_codec::scalar::KEYS;
                let mut count = lane.zeros::<u64>(keys)?;
                let mut acc = lane.zeros::<u64>(keys * sum::N)?;
                let mut l = lane.stream.launch_builder(gpu.f("key_stats"));
                l.arg(views[0].as_ref().unwrap());
                arg_opt(&mut l, views[1].as_ref());
                arg_opt(&mut l, views[2].as_ref());
                l.arg(&n)
                    .arg(&dtypes[0])
                    .arg(&dtypes[1])
                    .arg(&dtypes[2])
                    .arg(&*dsc)
                    .arg(&mut *count)
                    .arg(&mut *acc);
                // SAFETY: reads n elements of each input; counts into 65,536 keys × 8 sums.
                unsafe { l.launch(cfg((grid(n).min(8192), 1), 256)) }?;
                let count = lane.fetch(&count, keys)?;
                let acc = lane.fetch(&acc, keys * sum::N)?;
                // The keys that occur, ascending, with their wrapping i64 sums.
                let entries = count
                    .iter()
                    .zip(acc.chunks_exact(sum::N))
                    .enumerate()
                    .filter(|(_, (&c, _))| c > 0)
                    .map(|(k, (&c, a))| (k as u16, c, std::array::from_fn(|j| a[j] as i64)));
                Ok(KeyStats::from_fixed_point(
                    n,
                    entries,
                    &sc,
                    moments.is_some(),
                ))
            },
            cpu,
        )
    }

    fn assign(&self, w: FloatView<'_>, lut: &Lut) -> Assigned {
        let cpu = || CpuEngine.assign(w, lut);
        if !self.wants(w.bytes) {
            return cpu();
        }
        self.run(
            "code assignment",
            |gpu, lane| {
                let n = w.len() as u64;
                let dt = dtype_code(w.dtype);
                let dw = lane.bytes(gpu, w.bytes)?;
                let code = lane.put(&lut.code)?;
                let protect: Vec<u8> = lut.protect.iter().map(|&p| p as u8).collect();
                let protect = lane.put(&protect)?;
                let mut codes = lane.alloc::<u8>(n as usize)?;
                let tiles = n.div_ceil(TILE).max(1);
                let mut tile_counts = lane.alloc::<u64>(tiles as usize)?;
                let view = dw.view();
                let mut l = lane.stream.launch_builder(gpu.f("assign_codes"));
                l.arg(&view)
                    .arg(&n)
                    .arg(&dt)
                    .arg(&*code)
                    .arg(&*protect)
                    .arg(&mut *codes)
                    .arg(&TILE)
                    .arg(&mut *tile_counts);
                // SAFETY: one block a tile of TILE elements; writes n codes and a count a tile.
                unsafe { l.launch(cfg((tiles as u32, 1), 256)) }?;
                let (starts, total) = starts_of(&lane.fetch(&tile_counts, tiles as usize)?);
                let mut protected = vec![0u64; total as usize];
                if total > 0 {
                    let dstarts = lane.put(&starts)?;
                    let mut idx = lane.alloc::<u64>(total as usize)?;
                    let mut l = lane.stream.launch_builder(gpu.f("protected_indices"));
                    l.arg(&view)
                        .arg(&n)
                        .arg(&dt)
                        .arg(&*protect)
                        .arg(&TILE)
                        .arg(&*dstarts)
                        .arg(&mut *idx);
                    // SAFETY: each tile writes its counted indices from its start.
                    unsafe { l.launch(cfg((tiles as u32, 1), 256)) }?;
                    protected = lane.fetch(&idx, total as usize)?;
                }
                let mut host = vec![0u8; n as usize];
                lane.download(&codes.slice(..n as usize), &mut host)?;
                Ok(Assigned {
                    codes: host,
                    protected,
                })
            },
            cpu,
        )
    }

    fn code_pairs(
        &self,
        w: FloatView<'_>,
        lut: &Lut,
        bins: usize,
        base: &[u8],
        base_bins: usize,
    ) -> CodePairs {
        let cpu = || CpuEngine.code_pairs(w, lut, bins, base, base_bins);
        if !self.wants(w.bytes) {
            return cpu();
        }
        self.run(
            "code pairs",
            |gpu, lane| {
                let n = w.len() as u64;
                let dt = dtype_code(w.dtype);
                let dw = lane.bytes(gpu, w.bytes)?;
                let db = lane.bytes(gpu, base)?;
                let code = lane.put(&lut.code)?;
                let cells = (base_bins * bins) as u64;
                let mut count = lane.zeros::<u64>(cells as usize)?;
                let (wv, bv) = (dw.view(), db.view());
                let b64 = bins as u64;
                let mut l = lane.stream.launch_builder(gpu.f("code_pairs"));
                l.arg(&wv)
                    .arg(&n)
                    .arg(&dt)
                    .arg(&*code)
                    .arg(&bv)
                    .arg(&b64)
                    .arg(&cells)
                    .arg(&mut *count);
                // SAFETY: base codes are below base_bins and lut codes below bins, so every
                // cell index is below `cells`.
                unsafe { l.launch(cfg((grid(n).min(2048), 1), 256)) }?;
                Ok(CodePairs {
                    bins,
                    count: lane.fetch(&count, cells as usize)?,
                })
            },
            cpu,
        )
    }

    fn group_delta(&self, base: &[u8], cur: &[u8], modulus: u8) -> Vec<u8> {
        let cpu = || CpuEngine.group_delta(base, cur, modulus);
        if !self.wants(base) || base.len() != cur.len() {
            return cpu();
        }
        self.run(
            "grouped delta",
            |gpu, lane| {
                let mut out = vec![0u8; base.len()];
                grouped(gpu, lane, base, Some(cur), None, modulus, &mut out)?;
                Ok(out)
            },
            cpu,
        )
    }

    fn ungroup_delta(
        &self,
        base: &[u8],
        deltas: &[u8],
        modulus: u8,
        out: &mut [u8],
    ) -> Result<(), FormatError> {
        check_ungroup(base, deltas, modulus, out.len())?;
        if !self.wants(base) {
            return CpuEngine.ungroup_delta(base, deltas, modulus, out);
        }
        match self
            .gpu
            .with_lane(|lane| grouped(&self.gpu, lane, base, None, Some(deltas), modulus, out))
        {
            Ok(()) => Ok(()),
            Err(e) => {
                self.gpu.failed("grouped delta", e, CPU_INSTEAD);
                CpuEngine.ungroup_delta(base, deltas, modulus, out)
            }
        }
    }

    fn mean_second_moment(&self, w: FloatView<'_>, moments: Moments<'_>) -> f64 {
        let cpu = || CpuEngine.mean_second_moment(w, moments);
        if !self.wants(w.bytes) || !residual::fits(w, None, Some(moments)) {
            return cpu();
        }
        self.run(
            "second moment",
            |gpu, lane| residual::mean_v_on(gpu, lane, w, moments),
            cpu,
        )
    }

    fn residual_distance(&self, values: FloatView<'_>, reference: Option<&[u8]>) -> f64 {
        let cpu = || CpuEngine.residual_distance(values, reference);
        if !self.wants(values.bytes) || !residual::fits(values, reference, None) {
            return cpu();
        }
        self.run(
            "residual distance",
            |gpu, lane| residual::distance_on(gpu, lane, values, reference),
            cpu,
        )
    }

    fn residual_measure(
        &self,
        values: FloatView<'_>,
        reference: Option<&[u8]>,
        moments: Option<Moments<'_>>,
        mode: Mode,
        factors: Option<&Steps>,
        steps: &[f64],
        every: usize,
    ) -> Vec<ResidualStats> {
        let cpu =
            || CpuEngine.residual_measure(values, reference, moments, mode, factors, steps, every);
        // Steps by row and column have no kernel yet: measured on the host.
        if factors.is_some()
            || !self.wants(values.bytes)
            || !residual::fits(values, reference, moments)
        {
            return cpu();
        }
        self.run(
            "residual statistics",
            |gpu, lane| {
                residual::measure_on(gpu, lane, values, reference, moments, mode, steps, every)
            },
            cpu,
        )
    }

    fn residual_encode(
        &self,
        values: FloatView<'_>,
        reference: Option<&[u8]>,
        mode: Mode,
        factors: Option<&Steps>,
        step: f64,
    ) -> (Vec<u8>, Vec<u8>) {
        let cpu = || CpuEngine.residual_encode(values, reference, mode, factors, step);
        if factors.is_some()
            || !self.wants(values.bytes)
            || !residual::fits(values, reference, None)
        {
            return cpu();
        }
        self.run(
            "residual encode",
            |gpu, lane| residual::quantize_on(gpu, lane, values, reference, mode, step),
            cpu,
        )
    }

    fn residual_decode(
        &self,
        dtype: Dtype,
        payload: &[u8],
        reference: Option<&[u8]>,
        out: &mut [u8],
    ) -> Result<(), FormatError> {
        // A predicted payload's reference is computed on the host, as on the CPU engine.
        let predicted =
            mdl_codec::residual::unwrap_predicted(dtype, payload, reference, out.len())?;
        if let Some((prediction, inner)) = predicted {
            return self.residual_decode(dtype, inner, Some(&prediction), out);
        }
        // A stepped payload has no kernel yet: decoded on the host.
        if payload.first() == Some(&mdl_codec::residual::STEPPED) {
            return CpuEngine.residual_decode(dtype, payload, reference, out);
        }
        self.decode_with(
            out,
            |gpu, lane, out| residual::decode_on(gpu, lane, dtype, payload, reference, out),
            |out| CpuEngine.residual_decode(dtype, payload, reference, out),
        )
    }

    fn error_stats(
        &self,
        orig: FloatView<'_>,
        recon: FloatView<'_>,
        moments: Option<Moments<'_>>,
    ) -> ErrorStats {
        let cpu = || CpuEngine.error_stats(orig, recon, moments);
        if !self.wants(orig.bytes) || orig.dtype != recon.dtype {
            return cpu();
        }
        self.run(
            "error sums",
            |gpu, lane| {
                let n = orig.len().min(recon.len()) as u64;
                let chunk = ERROR_CHUNK as u64;
                let chunks = n.div_ceil(chunk);
                let d_o = lane.bytes(gpu, orig.bytes)?;
                let d_r = lane.bytes(gpu, recon.bytes)?;
                let on = MomentsOn::of(gpu, lane, orig.dtype, moments)?;
                let dts = on.dtypes;
                let mut sums = lane.zeros::<f64>(5 * chunks as usize)?;
                let (ov, rv) = (d_o.view(), d_r.view());
                let (mv, vv) = on.views();
                let mut l = lane.stream.launch_builder(gpu.f("error_chunks"));
                l.arg(&ov).arg(&rv);
                arg_opt(&mut l, mv.as_ref());
                arg_opt(&mut l, vv.as_ref());
                l.arg(&n)
                    .arg(&dts[0])
                    .arg(&dts[1])
                    .arg(&dts[2])
                    .arg(&chunk)
                    .arg(&chunks)
                    .arg(&mut *sums);
                // SAFETY: one thread a chunk reads its elements and writes its 5 sums.
                unsafe { l.launch(cfg((chunks.div_ceil(64) as u32, 1), 64)) }?;
                Ok(fold_error_sums(&lane.fetch(&sums, 5 * chunks as usize)?))
            },
            cpu,
        )
    }
}
