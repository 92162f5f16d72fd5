//! [`GpuEngine`]: the [`Engine`] kernels on one CUDA device.
//!
//! Each call takes a *lane* from a pool (a stream with two pinned staging buffers), so calls
//! from several threads — a commit stores tensors in parallel — run on their own streams and
//! overlap: one tensor's copies with another's kernels. Host bytes go to the device through
//! the pinned buffers in pieces, the copy of one piece overlapping the filling of the next;
//! bytes the caller keeps ([`Engine::keep`]) are copied once and reused by every kernel that
//! reads them. Any driver failure falls back to the CPU engine for that call (the bytes are
//! the same either way) and is logged.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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
use cudarc::nvrtc::Ptx;
use mdl_codec::engine::{
    check_ungroup, scales, sum, Assigned, CodePairs, CpuEngine, Engine, ErrorStats, FloatView,
    Kept, KeyStats, Lut, Moments, ERROR_CHUNK,
};
use mdl_codec::huffman::{Histogram, Plan, Stream, StreamBody, StreamWriter, CHUNK_LOG2};
use mdl_codec::planes::{PlaneSpec, Transform};
use mdl_format::{Dtype, FormatError};
use rayon::prelude::*;

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

/// The device, its kernels, the lane pool and the bytes kept on the device.
pub(crate) struct Gpu {
    ctx: Arc<CudaContext>,
    funcs: HashMap<&'static str, CudaFunction>,
    lanes: Mutex<Vec<Lane>>,
    kept: Mutex<Vec<Resident>>,
    next_id: AtomicU64,
    /// Calls a driver failure sent to the CPU.
    fallbacks: AtomicU64,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").finish_non_exhaustive()
    }
}

/// Host bytes with a copy on the device (see [`Engine::keep`]).
struct Resident {
    id: u64,
    ptr: usize,
    len: usize,
    dev: Arc<CudaSlice<u8>>,
}

/// A stream with its pinned staging buffers.
struct Lane {
    stream: Arc<CudaStream>,
    pinned: [PinnedHostSlice<u8>; 2],
    /// The last copy that used each staging buffer.
    busy: [Option<CudaEvent>; 2],
}

impl Gpu {
    /// Loads the kernels into `ctx`.
    pub(crate) fn load(ctx: Arc<CudaContext>, ptx: Ptx) -> Res<Gpu> {
        let module = ctx.load_module(ptx)?;
        let mut funcs = HashMap::new();
        for &name in crate::KERNELS {
            funcs.insert(name, module.load_function(name)?);
        }
        Ok(Gpu {
            ctx,
            funcs,
            lanes: Mutex::new(Vec::new()),
            kept: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            fallbacks: AtomicU64::new(0),
        })
    }

    /// Logs and counts a driver failure of `what`; `instead` says what happens instead.
    fn failed(&self, what: &str, e: DriverError, instead: &str) {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("GPU {what} failed ({e}); {instead}");
    }

    fn f(&self, name: &str) -> &CudaFunction {
        &self.funcs[name]
    }

    /// Runs `work` on a lane from the pool (a new one when all are busy).
    fn with_lane<R>(&self, work: impl FnOnce(&mut Lane) -> Res<R>) -> Res<R> {
        let taken = self.lanes.lock().unwrap().pop();
        let mut lane = match taken {
            Some(l) => l,
            None => Lane {
                stream: self.ctx.new_stream()?,
                // SAFETY: staging memory is always written before it is read.
                pinned: unsafe {
                    [
                        self.ctx.alloc_pinned_with_flags::<u8>(STAGE, 0)?,
                        self.ctx.alloc_pinned_with_flags::<u8>(STAGE, 0)?,
                    ]
                },
                busy: [None, None],
            },
        };
        let out = work(&mut lane);
        if out.is_ok() {
            self.lanes.lock().unwrap().push(lane);
        }
        out
    }

    /// The device copy of `host`, if a kept range holds it: the buffer and the offset.
    fn resident(&self, host: &[u8]) -> Option<(Arc<CudaSlice<u8>>, usize)> {
        let p = host.as_ptr() as usize;
        self.kept
            .lock()
            .unwrap()
            .iter()
            .find(|r| p >= r.ptr && p + host.len() <= r.ptr + r.len)
            .map(|r| (r.dev.clone(), p - r.ptr))
    }
}

/// Device bytes for a host slice: kept ones, or a copy made for this call.
enum Dev {
    Kept(Arc<CudaSlice<u8>>, usize, usize),
    Own(CudaSlice<u8>),
}

impl Dev {
    fn view(&self) -> CudaView<'_, u8> {
        match self {
            Dev::Kept(s, off, len) => s.slice(*off..*off + *len),
            Dev::Own(s) => s.slice(..),
        }
    }
}

impl Lane {
    /// A device buffer of `len` elements (contents unspecified).
    fn alloc<T: DeviceRepr>(&self, len: usize) -> Res<CudaSlice<T>> {
        // SAFETY: every buffer allocated here is written by a copy or kernel before any read.
        unsafe { self.stream.alloc::<T>(len.max(1)) }
    }

    fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Res<CudaSlice<T>> {
        self.stream.alloc_zeros::<T>(len.max(1))
    }

    /// Copies `host` to a new device buffer through the pinned staging buffers: piece k + 1
    /// is copied into one buffer while piece k crosses the bus from the other.
    fn upload(&mut self, host: &[u8]) -> Res<CudaSlice<u8>> {
        let mut dev = self.alloc::<u8>(host.len())?;
        self.upload_into(host, &mut dev.slice_mut(..host.len()))?;
        Ok(dev)
    }

    /// Like [`Lane::upload`], into `dev` (at least as long as `host`).
    fn upload_into(&mut self, host: &[u8], dev: &mut CudaViewMut<'_, u8>) -> Res<()> {
        for (k, piece) in host.chunks(STAGE).enumerate() {
            let b = k % 2;
            if let Some(e) = self.busy[b].take() {
                e.synchronize()?;
            }
            copy_par(&mut self.pinned[b].as_mut_slice()?[..piece.len()], piece);
            let src = &self.pinned[b].as_slice()?[..piece.len()];
            let mut dst = dev.slice_mut(k * STAGE..k * STAGE + piece.len());
            self.stream.memcpy_htod(src, &mut dst)?;
            self.busy[b] = Some(self.stream.record_event(None)?);
        }
        Ok(())
    }

    /// The device bytes of `host`: the kept copy, or an upload.
    fn bytes(&mut self, gpu: &Gpu, host: &[u8]) -> Res<Dev> {
        Ok(match gpu.resident(host) {
            Some((s, off)) => Dev::Kept(s, off, host.len()),
            None => Dev::Own(self.upload(host)?),
        })
    }

    /// Copies device bytes into `host` through the staging buffers (piece k + 1 crosses the
    /// bus while piece k is copied out). Waits for everything queued on the lane before.
    fn download(&mut self, dev: &CudaView<'_, u8>, host: &mut [u8]) -> Res<()> {
        let pieces = host.len().div_ceil(STAGE);
        let issue = |lane: &mut Lane, k: usize| -> Res<()> {
            let (lo, hi) = (k * STAGE, ((k + 1) * STAGE).min(dev.len()));
            let b = k % 2;
            if let Some(e) = lane.busy[b].take() {
                e.synchronize()?;
            }
            let buf = &mut lane.pinned[b].as_mut_slice()?[..hi - lo];
            lane.stream.memcpy_dtoh(&dev.slice(lo..hi), buf)?;
            lane.busy[b] = Some(lane.stream.record_event(None)?);
            Ok(())
        };
        if pieces > 0 {
            issue(self, 0)?;
        }
        for k in 0..pieces {
            if k + 1 < pieces {
                issue(self, k + 1)?;
            }
            let b = k % 2;
            if let Some(e) = self.busy[b].take() {
                e.synchronize()?;
            }
            let (lo, hi) = (k * STAGE, ((k + 1) * STAGE).min(host.len()));
            let src = &self.pinned[b].as_slice()?[..hi - lo];
            copy_par(&mut host[lo..hi], src);
        }
        Ok(())
    }

    /// A small device buffer's contents.
    fn fetch<T: DeviceRepr + Default + Clone>(
        &self,
        dev: &CudaSlice<T>,
        len: usize,
    ) -> Res<Vec<T>> {
        let mut out = vec![T::default(); len];
        if len > 0 {
            self.stream.memcpy_dtoh(&dev.slice(..len), &mut out[..])?;
            self.stream.synchronize()?;
        }
        Ok(out)
    }

    /// A small host array on the device.
    fn put<T: DeviceRepr>(&self, host: &[T]) -> Res<CudaSlice<T>> {
        let mut dev = self.alloc::<T>(host.len())?;
        if !host.is_empty() {
            self.stream
                .memcpy_htod(host, &mut dev.slice_mut(..host.len()))?;
        }
        Ok(dev)
    }
}

/// Copies between host buffers (pageable and pinned staging) a megabyte a task: one core
/// cannot keep up with the bus.
fn copy_par(dst: &mut [u8], src: &[u8]) {
    dst.par_chunks_mut(1 << 20)
        .zip(src.par_chunks(1 << 20))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

/// Blocks for a grid-stride kernel over `n` items.
fn grid(n: u64) -> u32 {
    (n.div_ceil(256)).clamp(1, 65_535 * 8) as u32
}

fn cfg(blocks: (u32, u32), threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks.0.max(1), blocks.1.max(1), 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The kernels' element type codes.
fn dtype_code(d: Dtype) -> i32 {
    match d {
        Dtype::BF16 => 0,
        Dtype::F16 => 1,
        _ => 2,
    }
}

/// How a tensor's planes lie on the device: plane `p` of `n` bytes at `p * stride`.
#[derive(Clone, Copy)]
struct Geometry {
    /// The kernels' number for the layout (`K_*` in mdl.cu).
    kind: i32,
    /// Elements (bytes a plane).
    n: u64,
    /// Bytes between planes: `n` rounded up to a multiple of 8, so every plane's flag bytes
    /// start at `p * stride / 8`.
    stride: u64,
    planes: usize,
    /// Bits XORed with the base (float planes).
    mask: u64,
}

impl Geometry {
    /// The geometry of `bytes` bytes taken apart as `spec` says (float dtypes only; the width
    /// and plane count are mdl-codec's).
    fn of(spec: PlaneSpec, bytes: usize) -> Geometry {
        let (width, planes) = spec.shape().expect("float dtypes only");
        let kind = match (spec.transform, spec.dtype) {
            (Transform::Planes, Dtype::BF16) => 0,
            (Transform::Planes, Dtype::F16) => 1,
            (Transform::Planes, Dtype::F32) => 2,
            (Transform::Planes, _) => 3,
            (Transform::Sub, Dtype::BF16 | Dtype::F16) => 4,
            (Transform::Sub, Dtype::F32) => 5,
            (Transform::Sub, _) => 6,
        };
        let n = (bytes / width) as u64;
        Geometry {
            kind,
            n,
            stride: n.next_multiple_of(8).max(8),
            planes,
            mask: spec.mask,
        }
    }

    /// Bytes of all planes.
    fn planes_len(&self) -> usize {
        self.stride as usize * self.planes
    }
}

/// The null pointer, for a kernel's optional inputs.
static NULL: u64 = 0;

/// Pushes an optional device input: its pointer, or null.
fn arg_opt<'a, 'b: 'a, 'c: 'b>(l: &mut LaunchArgs<'a>, v: Option<&'b CudaView<'c, u8>>) {
    match v {
        Some(v) => l.arg(v),
        None => l.arg(&NULL),
    };
}

/// Runs `split_planes` (the elements of `input`, XORed with or subtracted from `base`, into the
/// planes of `out`) or `merge_planes` (the planes of `input`, with `base`, into the elements of
/// `out`): the two kernels take the same arguments.
fn launch_planes(
    gpu: &Gpu,
    lane: &Lane,
    kernel: &str,
    g: Geometry,
    input: &CudaView<'_, u8>,
    base: Option<&CudaView<'_, u8>>,
    out: &mut CudaSlice<u8>,
) -> Res<()> {
    let mut l = lane.stream.launch_builder(gpu.f(kernel));
    l.arg(input);
    arg_opt(&mut l, base);
    l.arg(out)
        .arg(&g.n)
        .arg(&g.stride)
        .arg(&g.kind)
        .arg(&g.mask);
    // SAFETY: reads n elements (split) or `planes` planes of n bytes at `stride` (merge), and
    // base's n elements; writes the other form, which the callers' buffers hold.
    unsafe { l.launch(cfg((grid(g.n), 1), 256)) }.map(drop)
}

/// Byte histograms of every plane into `hist` (256 zeroed counts a plane).
fn launch_histogram(
    gpu: &Gpu,
    lane: &Lane,
    g: Geometry,
    planes: &CudaSlice<u8>,
    hist: &mut CudaSlice<u64>,
) -> Res<()> {
    let mut l = lane.stream.launch_builder(gpu.f("byte_histogram"));
    l.arg(planes).arg(&g.n).arg(&g.stride).arg(hist);
    // SAFETY: reads n bytes of each plane; writes 256 counts a plane.
    unsafe { l.launch(cfg((grid(g.n).min(1024), g.planes as u32), 256)) }.map(drop)
}

/// The codec kernels on a CUDA device (see the crate documentation). Identical results to
/// [`CpuEngine`], which also does what is too small to be worth a launch.
#[derive(Clone, Debug)]
pub struct GpuEngine {
    gpu: Arc<Gpu>,
    min_bytes: usize,
}

/// Releases a kept device copy.
struct KeptGuard {
    gpu: Arc<Gpu>,
    id: u64,
}

impl Drop for KeptGuard {
    fn drop(&mut self) {
        self.gpu.kept.lock().unwrap().retain(|r| r.id != self.id);
    }
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

    /// Splits `data` into its planes on the device, in a buffer with `extra` bytes after
    /// them.
    fn split(
        gpu: &Gpu,
        lane: &mut Lane,
        g: Geometry,
        data: &[u8],
        base: Option<&[u8]>,
        extra: usize,
    ) -> Res<CudaSlice<u8>> {
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
        if bytes.len() < self.min_bytes.max(1) || self.gpu.resident(bytes).is_some() {
            return Kept::nothing();
        }
        let copied = self.gpu.with_lane(|lane| {
            let dev = lane.upload(bytes)?;
            lane.stream.synchronize()?;
            Ok(dev)
        });
        match copied {
            Ok(dev) => {
                let id = self.gpu.next_id.fetch_add(1, Ordering::Relaxed);
                self.gpu.kept.lock().unwrap().push(Resident {
                    id,
                    ptr: bytes.as_ptr() as usize,
                    len: bytes.len(),
                    dev: Arc::new(dev),
                });
                Kept::new(Box::new(KeptGuard {
                    gpu: self.gpu.clone(),
                    id,
                }))
            }
            Err(e) => {
                self.gpu.failed("copy", e, "kernels will copy as they go");
                Kept::nothing()
            }
        }
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
                let mut hist = lane.zeros::<u64>(256 * planes)?;
                if want.iter().any(|w| w.0) {
                    launch_histogram(gpu, lane, g, &planes_buf, &mut hist)?;
                }
                let mut flags = lane.zeros::<u64>(256 * planes)?;
                if want.iter().any(|w| w.1) {
                    let mut l = lane.stream.launch_builder(gpu.f("flag_bytes"));
                    l.arg(&planes_buf)
                        .arg(&g.n)
                        .arg(&g.stride)
                        .arg(&NULL)
                        .arg(&NULL)
                        .arg(&mut flags);
                    // SAFETY: reads n bytes of each plane; writes 256 counts a plane and no
                    // flag bytes (null).
                    unsafe { l.launch(cfg((grid(g.n).min(1024), planes as u32), 256)) }?;
                }
                let h = lane.fetch(&hist, 256 * planes)?;
                let f = lane.fetch(&flags, 256 * planes)?;
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
        if !self.wants(out) {
            return CpuEngine.decode_planes(spec, streams, base, out);
        }
        let done = self
            .gpu
            .with_lane(|lane| decode_on(&self.gpu, lane, spec, streams, base, out));
        match done {
            Ok(true) => Ok(()),
            // A damaged stream: the CPU says what is wrong with it.
            Ok(false) => CpuEngine.decode_planes(spec, streams, base, out),
            Err(e) => {
                self.gpu.failed("decode", e, CPU_INSTEAD);
                CpuEngine.decode_planes(spec, streams, base, out)
            }
        }
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
                let dm = moments.map(|mv| lane.bytes(gpu, mv.m.bytes)).transpose()?;
                let dv = moments.map(|mv| lane.bytes(gpu, mv.v.bytes)).transpose()?;
                let mut maxima = lane.zeros::<u64>(3)?;
                let views = [
                    Some(dw.view()),
                    dm.as_ref().map(Dev::view),
                    dv.as_ref().map(Dev::view),
                ];
                let dtypes = [
                    dtype_code(w.dtype),
                    moments.map_or(2, |mv| dtype_code(mv.m.dtype)),
                    moments.map_or(2, |mv| dtype_code(mv.v.dtype)),
                ];
                for (k, v) in views.iter().enumerate() {
                    let Some(v) = v else { continue };
                    let mut slot = maxima.slice_mut(k..k + 1);
                    let mut l = lane.stream.launch_builder(gpu.f("max_abs"));
                    l.arg(v).arg(&n).arg(&dtypes[k]).arg(&mut slot);
                    // SAFETY: reads n elements; one atomic max into the slot.
                    unsafe { l.launch(cfg((grid(n).min(4096), 1), 256)) }?;
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
                    .arg(&dsc)
                    .arg(&mut count)
                    .arg(&mut acc);
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
                    .arg(&code)
                    .arg(&protect)
                    .arg(&mut codes)
                    .arg(&TILE)
                    .arg(&mut tile_counts);
                // SAFETY: one block a tile of TILE elements; writes n codes and a count a tile.
                unsafe { l.launch(cfg((tiles as u32, 1), 256)) }?;
                let counts = lane.fetch(&tile_counts, tiles as usize)?;
                let mut starts = Vec::with_capacity(counts.len());
                let mut total = 0u64;
                for c in &counts {
                    starts.push(total);
                    total += c;
                }
                let mut protected = vec![0u64; total as usize];
                if total > 0 {
                    let dstarts = lane.put(&starts)?;
                    let mut idx = lane.alloc::<u64>(total as usize)?;
                    let mut l = lane.stream.launch_builder(gpu.f("protected_indices"));
                    l.arg(&view)
                        .arg(&n)
                        .arg(&dt)
                        .arg(&protect)
                        .arg(&TILE)
                        .arg(&dstarts)
                        .arg(&mut idx);
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
                    .arg(&code)
                    .arg(&bv)
                    .arg(&b64)
                    .arg(&cells)
                    .arg(&mut count);
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
                let d_m = moments.map(|mv| lane.bytes(gpu, mv.m.bytes)).transpose()?;
                let d_v = moments.map(|mv| lane.bytes(gpu, mv.v.bytes)).transpose()?;
                let dts = [
                    dtype_code(orig.dtype),
                    moments.map_or(2, |mv| dtype_code(mv.m.dtype)),
                    moments.map_or(2, |mv| dtype_code(mv.v.dtype)),
                ];
                let mut sums = lane.zeros::<f64>(5 * chunks as usize)?;
                let (ov, rv) = (d_o.view(), d_r.view());
                let (mv, vv) = (d_m.as_ref().map(Dev::view), d_v.as_ref().map(Dev::view));
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
                    .arg(&mut sums);
                // SAFETY: one thread a chunk reads its elements and writes its 5 sums.
                unsafe { l.launch(cfg((chunks.div_ceil(64) as u32, 1), 64)) }?;
                let s = lane.fetch(&sums, 5 * chunks as usize)?;
                let per: Vec<ErrorStats> = s
                    .chunks_exact(5)
                    .map(|c| ErrorStats {
                        max_abs: c[0],
                        sum_sq_err: c[1],
                        sum_sq: c[2],
                        sum_m_delta: c[3],
                        sum_v_delta2: c[4],
                    })
                    .collect();
                Ok(ErrorStats::fold(&per))
            },
            cpu,
        )
    }
}

/// The grouped order on the device: forward (`cur` given) writes `(base − cur) mod m` in the
/// grouped order; inverse (`deltas` given) writes each element's code back in index order.
fn grouped(
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
    l.arg(&bv).arg(&n).arg(&tiles).arg(&mut tile_counts);
    // SAFETY: one block a tile; writes 256 counts a tile.
    unsafe { l.launch(cfg((tiles as u32, 1), 256)) }?;
    let mut l = lane.stream.launch_builder(gpu.f("group_starts"));
    l.arg(&tiles).arg(&mut tile_counts).arg(&mut starts);
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
        .arg(&tile_counts)
        .arg(&starts)
        .arg(&m)
        .arg(&inverse);
    arg_opt(&mut l, dv.as_ref());
    l.arg(&mut dout);
    // SAFETY: 8 warps a block, one warp a tile; every position is below n.
    unsafe { l.launch(cfg((tiles.div_ceil(8) as u32, 1), 256)) }?;
    lane.download(&dout.slice(..n as usize), out)
}

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

fn encode_on(
    gpu: &Gpu,
    lane: &mut Lane,
    spec: PlaneSpec,
    data: &[u8],
    base: Option<&[u8]>,
    writers: &[StreamWriter],
) -> Res<Vec<Vec<Vec<u8>>>> {
    let g = Geometry::of(spec, data.len());
    let (n, stride, planes) = (g.n, g.stride, g.planes);
    let fstride = stride / 8;
    // Symbols buffer: the planes, then (for sparse plans) each plane's flag bytes and its
    // non-zero values.
    let sparse = writers
        .iter()
        .any(|w| matches!(w.plan(), Plan::Sparse { .. }));
    let flags_at = stride * planes as u64;
    let values_at = flags_at + fstride * planes as u64;
    let extra = if sparse {
        (fstride + stride) as usize * planes
    } else {
        0
    };
    let mut sym = GpuEngine::split(gpu, lane, g, data, base, extra)?;
    let chunks = n.div_ceil(CHUNK as u64) as usize;
    let chunk_n = |c: usize| (n - (c * CHUNK) as u64).min(CHUNK as u64);

    let mut nnz = vec![0u64; planes * chunks];
    if sparse && n > 0 {
        let (mut head, mut rest) = sym.split_at_mut(flags_at as usize);
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
        let mut dnnz = lane.alloc::<u64>(planes * chunks)?;
        let cl = CHUNK as u64;
        let mut l = lane.stream.launch_builder(gpu.f("compact_nonzero"));
        l.arg(&mut head)
            .arg(&n)
            .arg(&stride)
            .arg(&cl)
            .arg(&mut vals)
            .arg(&mut dnnz);
        // SAFETY: one block a (chunk, plane); writes at most the chunk's symbols.
        unsafe { l.launch(cfg((chunks as u32, planes as u32), 1024)) }?;
        nnz = lane.fetch(&dnnz, planes * chunks)?;
    }

    // Code tables and segments.
    let mut codes: Vec<u32> = Vec::new();
    let mut table = |enc: &mdl_codec::huffman::Encoder| -> u64 {
        let t = (codes.len() / 256) as u64;
        codes.extend(
            enc.codes()
                .iter()
                .map(|&(c, l)| c as u32 | (l as u32) << 16),
        );
        t
    };
    let mut segs: Vec<Segment> = Vec::new();
    let mut jobs = Vec::with_capacity(planes);
    for (p, w) in writers.iter().enumerate() {
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
                        n: chunk_n(c),
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
                        n: chunk_n(c).div_ceil(8),
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

    // Pass 1: bits a lane. The segments and code tables go over once for both passes.
    let mut lane_bits = vec![0u64; segs.len() * 4];
    let dsegs = if segs.is_empty() {
        None
    } else {
        let flat: Vec<u64> = segs.iter().flat_map(|s| [s.at, s.n, s.table, 0]).collect();
        Some(lane.put(&flat)?)
    };
    let dcodes = lane.put(&codes)?;
    if let Some(d) = &dsegs {
        let mut bits = lane.alloc::<u64>(segs.len() * 4)?;
        let mut l = lane.stream.launch_builder(gpu.f("huff_lane_bits"));
        l.arg(&sym).arg(d).arg(&dcodes).arg(&mut bits);
        // SAFETY: one block a (segment, lane); reads the segment's symbols.
        unsafe { l.launch(cfg((segs.len() as u32, 4), 256)) }?;
        lane_bits = lane.fetch(&bits, segs.len() * 4)?;
    }
    let lane_bytes = |s: usize, k: usize| lane_bits[s * 4 + k].div_ceil(8);
    let coded_len = |s: usize| 12 + (0..4).map(|k| lane_bytes(s, k)).sum::<u64>();

    // Layout: every chunk's place in one output buffer, plane after plane.
    let mut at = 0u64;
    let mut lane_at = vec![0u64; segs.len() * 4];
    let mut place = |s: usize, at: &mut u64| {
        let mut x = *at + 12;
        for k in 0..4 {
            lane_at[s * 4 + k] = x;
            x += lane_bytes(s, k);
        }
        *at = x;
    };
    let mut copies: Vec<u64> = Vec::new();
    // (plane, chunk) → (start, length) in the output.
    let mut spans = vec![(0u64, 0u64); planes * chunks];
    for (p, job) in jobs.iter().enumerate() {
        for c in 0..chunks {
            let start = at;
            match job {
                PlaneJob::Stored => {
                    copies.extend([p as u64 * stride + (c * CHUNK) as u64, chunk_n(c), at]);
                    at += chunk_n(c);
                }
                PlaneJob::Constant => {}
                PlaneJob::Huffman(first) => place(first + c, &mut at),
                PlaneJob::Sparse(first) => {
                    at += 4;
                    place(first + 2 * c, &mut at);
                    place(first + 2 * c + 1, &mut at);
                }
            }
            spans[p * chunks + c] = (start, at - start);
        }
    }

    // Pass 2: the bits and stored bytes into the zeroed output.
    let total = at as usize;
    let mut out = lane.zeros::<u8>(total.next_multiple_of(4) + 4)?;
    if let Some(d) = &dsegs {
        let dat = lane.put(&lane_at)?;
        let mut l = lane.stream.launch_builder(gpu.f("huff_write"));
        l.arg(&sym).arg(d).arg(&dcodes).arg(&dat).arg(&mut out);
        // SAFETY: each lane writes its bits inside the bytes its bit count reserved.
        unsafe { l.launch(cfg((segs.len() as u32, 4), 256)) }?;
    }
    if !copies.is_empty() {
        let d = lane.put(&copies)?;
        let mut l = lane.stream.launch_builder(gpu.f("copy_jobs"));
        l.arg(&sym).arg(&d).arg(&mut out);
        // SAFETY: each job copies a stored chunk into its reserved span.
        unsafe { l.launch(cfg(((copies.len() / 3) as u32, 1), 256)) }?;
    }
    let mut host = vec![0u8; total];
    lane.download(&out.slice(..total), &mut host)?;
    drop(sym);

    // Lane tables and sparse flag lengths, known from pass 1.
    let write_table = |host: &mut [u8], s: usize, at: usize| {
        for k in 0..3 {
            let len = lane_bytes(s, k) as u32;
            host[at + 4 * k..at + 4 * k + 4].copy_from_slice(&len.to_le_bytes());
        }
    };
    for (p, job) in jobs.iter().enumerate() {
        for c in 0..chunks {
            let start = spans[p * chunks + c].0 as usize;
            match job {
                PlaneJob::Huffman(first) => write_table(&mut host, first + c, start),
                PlaneJob::Sparse(first) => {
                    let f = first + 2 * c;
                    host[start..start + 4].copy_from_slice(&(coded_len(f) as u32).to_le_bytes());
                    write_table(&mut host, f, start + 4);
                    write_table(&mut host, f + 1, start + 4 + coded_len(f) as usize);
                }
                PlaneJob::Stored | PlaneJob::Constant => {}
            }
        }
    }
    Ok((0..planes)
        .map(|p| {
            spans[p * chunks..(p + 1) * chunks]
                .par_iter()
                .map(|&(s, l)| host[s as usize..(s + l) as usize].to_vec())
                .collect()
        })
        .collect())
}

/// Decodes on the device; `Ok(false)` when a stream is damaged (the caller asks the CPU why).
fn decode_on(
    gpu: &Gpu,
    lane: &mut Lane,
    spec: PlaneSpec,
    streams: &[Stream<'_>],
    base: Option<&[u8]>,
    out: &mut [u8],
) -> Res<bool> {
    let g = Geometry::of(spec, out.len());
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
                decoder,
                values,
                offsets,
                data,
            } => {
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
                            0,
                        ]),
                        Some(tv) => {
                            let bytes = &data[lo as usize..hi as usize];
                            if bytes.len() < 4 {
                                return Ok(false);
                            }
                            let flen = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as u64;
                            if flen > hi - lo - 4 {
                                return Ok(false);
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
                                0,
                            ]);
                            value_jobs.extend([
                                base_at + lo + 4 + flen,
                                hi - lo - 4 - flen,
                                job,
                                tv | 1 << 63,
                                v_at,
                                0,
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
        l.arg(&input)
            .arg(&d)
            .arg(&njobs)
            .arg(&dtables)
            .arg(counts)
            .arg(sym)
            .arg(err);
        // SAFETY: one thread a lane; every read is checked against its chunk's length and
        // every write stays in the job's output span.
        unsafe { l.launch(cfg(((njobs * 4).div_ceil(128) as u32, 1), 128)) }.map(drop)
    };
    decode(lane, &first_jobs, &mut sym, &counts, &mut err)?;
    if sparse_jobs > 0 {
        let d = lane.put(&flag_counts)?;
        let mut l = lane.stream.launch_builder(gpu.f("count_flags"));
        l.arg(&sym).arg(&d).arg(&mut counts);
        // SAFETY: one block a sparse chunk; reads its flag bytes.
        unsafe { l.launch(cfg((sparse_jobs as u32, 1), 256)) }?;
        decode(lane, &value_jobs, &mut sym, &counts, &mut err)?;
        let d = lane.put(&scatter)?;
        let mut l = lane.stream.launch_builder(gpu.f("sparse_scatter"));
        l.arg(&sym)
            .arg(&sym)
            .arg(&d)
            .arg(&counts)
            .arg(&sym)
            .arg(&mut err);
        // SAFETY: reads flags and values, writes the chunk's symbols; the three areas of the
        // buffer are disjoint.
        unsafe { l.launch(cfg((sparse_jobs as u32, 1), 256)) }?;
    }
    if lane.fetch(&err, 1)?[0] != 0 {
        return Ok(false);
    }
    let b = base.map(|b| lane.bytes(gpu, b)).transpose()?;
    let bv = b.as_ref().map(Dev::view);
    let mut dout = lane.alloc::<u8>(out.len())?;
    let sv = sym.slice(..);
    launch_planes(gpu, lane, "merge_planes", g, &sv, bv.as_ref(), &mut dout)?;
    lane.download(&dout.slice(..out.len()), out)?;
    Ok(true)
}

/// One row of [`kernel_bench`]: a kernel, the bytes it reads and writes, and its median time.
#[derive(Clone, Debug)]
pub struct BenchRow {
    /// What ran.
    pub name: &'static str,
    /// Bytes read plus bytes written per run.
    pub bytes: u64,
    /// Median of the timed runs, in seconds.
    pub seconds: f64,
}

impl GpuEngine {
    /// Times the byte-moving kernels on `data` (f32 weights, already on the device) beside a
    /// device-to-device copy of the same bytes, with CUDA events: the medians of `runs` runs
    /// after one warm-up. For `examples/kernel-bench.rs`.
    pub fn kernel_bench(&self, data: &[u8], runs: usize) -> Result<Vec<BenchRow>, DriverError> {
        let gpu = &*self.gpu;
        gpu.with_lane(|lane| {
            let spec = PlaneSpec::planes(Dtype::F32, 0);
            let g = Geometry::of(spec, data.len());
            let n = g.n;
            let dev = lane.upload(data)?;
            let mut copy = lane.alloc::<u8>(data.len())?;
            let mut planes = lane.alloc::<u8>(g.planes_len())?;
            let mut merged = lane.alloc::<u8>(data.len())?;
            let mut hist = lane.zeros::<u64>(256 * g.planes)?;
            let time = |lane: &Lane, f: &mut dyn FnMut(&Lane) -> Res<()>| -> Res<f64> {
                f(lane)?;
                let mut t = Vec::with_capacity(runs);
                for _ in 0..runs {
                    let start = lane
                        .stream
                        .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
                    f(lane)?;
                    let end = lane
                        .stream
                        .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
                    end.synchronize()?;
                    t.push(start.elapsed_ms(&end)? as f64 / 1e3);
                }
                t.sort_by(f64::total_cmp);
                Ok(t[t.len() / 2])
            };
            let len = data.len() as u64;
            let mut rows = Vec::new();
            let s = time(lane, &mut |lane| lane.stream.memcpy_dtod(&dev, &mut copy))?;
            rows.push(BenchRow {
                name: "device copy (reference)",
                bytes: 2 * len,
                seconds: s,
            });
            let s = time(lane, &mut |lane| {
                launch_planes(
                    gpu,
                    lane,
                    "split_planes",
                    g,
                    &dev.slice(..),
                    None,
                    &mut planes,
                )
            })?;
            rows.push(BenchRow {
                name: "split f32 planes",
                bytes: 2 * len,
                seconds: s,
            });
            let s = time(lane, &mut |lane| {
                launch_planes(
                    gpu,
                    lane,
                    "merge_planes",
                    g,
                    &planes.slice(..),
                    None,
                    &mut merged,
                )
            })?;
            rows.push(BenchRow {
                name: "merge f32 planes",
                bytes: 2 * len,
                seconds: s,
            });
            let s = time(lane, &mut |lane| {
                launch_histogram(gpu, lane, g, &planes, &mut hist)
            })?;
            rows.push(BenchRow {
                name: "plane histograms",
                bytes: len,
                seconds: s,
            });
            // Whole-codec timings (host to host) for scale: encode and decode of the planes.
            let h = self.plane_histograms(spec, data, None, &[(true, false); 4]);
            let writers: Vec<StreamWriter> = h
                .iter()
                .map(|(h, _)| StreamWriter::new(Plan::choose(h, None).0))
                .collect();
            let t0 = std::time::Instant::now();
            let coded = encode_on(gpu, lane, spec, data, None, &writers)?;
            rows.push(BenchRow {
                name: "encode, host to host",
                bytes: len,
                seconds: t0.elapsed().as_secs_f64(),
            });
            let streams_bytes: Vec<Vec<u8>> = writers
                .iter()
                .zip(&coded)
                .map(|(w, c)| {
                    let refs: Vec<&[u8]> = c.iter().map(Vec::as_slice).collect();
                    let mut v = Vec::new();
                    w.assemble(&refs, &mut v);
                    v
                })
                .collect();
            let streams: Vec<Stream<'_>> = streams_bytes
                .iter()
                .map(|b| Stream::parse(b, n).expect("own stream"))
                .collect();
            let mut out = vec![0u8; data.len()];
            let t0 = std::time::Instant::now();
            let ok = decode_on(gpu, lane, spec, &streams, None, &mut out)?;
            rows.push(BenchRow {
                name: "decode, host to host",
                bytes: len,
                seconds: t0.elapsed().as_secs_f64(),
            });
            assert!(ok && out == data, "decode did not give the data back");
            Ok(rows)
        })
    }
}
