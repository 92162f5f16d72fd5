//! The device side: the CUDA context and its kernels, lanes (a stream with pinned staging
//! buffers), resident copies of kept bytes, and the launch helpers.

use super::resident::{DevBuf, Output, Resident};
use super::scratch::{Scratch, Spare};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::nvrtc::Ptx;
use mdl_codec::engine::{ErrorStats, Moments};
use mdl_codec::planes::{PlaneSpec, Transform};
use mdl_format::Dtype;
use rayon::prelude::*;

use super::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr,
    DriverError, LaunchArgs, LaunchConfig, PinnedHostSlice, PushKernelArg, Res, ValidAsZeroBits,
    STAGE,
};

/// The device, its kernels, the lane pool and the bytes kept on the device.
pub(crate) struct Gpu {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) funcs: HashMap<&'static str, CudaFunction>,
    pub(super) lanes: Mutex<Vec<Lane>>,
    pub(super) kept: Mutex<Vec<Resident>>,
    /// Host buffers being filled whose results also go to device memory (`mirror_into`).
    pub(super) outputs: Mutex<Vec<Output>>,
    pub(super) next_id: AtomicU64,
    /// Calls a driver failure sent to the CPU.
    pub(super) fallbacks: AtomicU64,
    /// Bytes of content (not coded streams) copied from the host ([`Lane::upload`]).
    pub(super) uploaded: Arc<AtomicU64>,
    /// Bytes of device memory the lanes keep spare ([`Spare`]).
    spare_held: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").finish_non_exhaustive()
    }
}

/// A stream with its pinned staging buffers and the device memory it reuses.
pub(super) struct Lane {
    pub(super) stream: Arc<CudaStream>,
    spare: Arc<Spare>,
    pub(super) pinned: [PinnedHostSlice<u8>; 2],
    /// The last copy that used each staging buffer.
    pub(super) busy: [Option<CudaEvent>; 2],
    /// The device's count of content bytes copied from the host.
    uploaded: Arc<AtomicU64>,
}

impl Gpu {
    /// Loads the kernels into `ctx`, which the engine then orders across its streams itself.
    ///
    /// cudarc would otherwise track every buffer's uses with events (two created with each
    /// buffer, a wait and a record on every launch argument: a dozen driver calls a launch), and
    /// synchronise the whole context — the training loop's streams too, as PyTorch shares the
    /// primary context — when the engine creates its first stream. What that tracking ensures,
    /// the engine ensures by construction: every call ends with its lane's stream idle (its
    /// results fetched or downloaded, [`Lane::fetch`], [`Lane::download`], or an explicit
    /// synchronisation), so a buffer another lane reads ([`super::resident::DevBuf`]: written
    /// and synchronised before it is registered) has no use in flight when it is dropped or
    /// reused; a lane's scratch buffers are reused on its own stream only (`scratch.rs`); and no
    /// two streams write one buffer.
    pub(crate) fn load(ctx: Arc<CudaContext>, ptx: Ptx) -> Res<Gpu> {
        // SAFETY: called before the engine creates any stream or buffer; the engine keeps
        // cudarc's three rules for untracked buffers as the doc above says.
        #[cfg(not(feature = "emulate"))]
        unsafe {
            ctx.disable_event_tracking();
        }
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
            outputs: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            fallbacks: AtomicU64::new(0),
            uploaded: Arc::new(AtomicU64::new(0)),
            spare_held: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// Logs and counts a driver failure of `what`; `instead` says what happens instead.
    pub(super) fn failed(&self, what: &str, e: DriverError, instead: &str) {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("GPU {what} failed ({e}); {instead}");
    }

    pub(super) fn f(&self, name: &str) -> &CudaFunction {
        &self.funcs[name]
    }

    /// Runs `work` on a lane from the pool (a new one when all are busy).
    pub(super) fn with_lane<R>(&self, work: impl FnOnce(&mut Lane) -> Res<R>) -> Res<R> {
        let taken = self.lanes.lock().unwrap().pop();
        let mut lane = match taken {
            Some(l) => l,
            None => {
                let stream = self.ctx.new_stream()?;
                Lane {
                    spare: Arc::new(Spare::new(stream.clone(), self.spare_held.clone())),
                    stream,
                    // SAFETY: staging memory is always written before it is read.
                    pinned: unsafe {
                        [
                            self.ctx.alloc_pinned_with_flags::<u8>(STAGE, 0)?,
                            self.ctx.alloc_pinned_with_flags::<u8>(STAGE, 0)?,
                        ]
                    },
                    busy: [None, None],
                    uploaded: self.uploaded.clone(),
                }
            }
        };
        let out = work(&mut lane);
        if out.is_ok() {
            self.lanes.lock().unwrap().push(lane);
        }
        out
    }
}

/// Device bytes for a host slice: kept ones (buffer, offset, length), or a copy made for this
/// call (buffer, length: an empty slice's buffer holds one byte).
pub(super) enum Dev {
    Kept(Arc<DevBuf>, usize, usize),
    Own(Scratch<u8>, usize),
}

impl Dev {
    pub(super) fn view(&self) -> CudaView<'_, u8> {
        match self {
            Dev::Kept(s, off, len) => s.slice(*off..*off + *len),
            Dev::Own(s, len) => s.slice(..*len),
        }
    }
}

impl Lane {
    /// A device buffer of `len` elements (contents unspecified), reused from an earlier call
    /// where one of its size is spare.
    pub(super) fn alloc<T: DeviceRepr>(&self, len: usize) -> Res<Scratch<T>> {
        self.spare.take::<T>(len)
    }

    /// A device buffer of `len` zeroed elements.
    pub(super) fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Res<Scratch<T>> {
        let mut buf = self.spare.take::<T>(len)?;
        self.stream.memset_zeros(&mut *buf)?;
        Ok(buf)
    }

    /// Copies `host` to a new device buffer through the pinned staging buffers: piece k + 1
    /// is copied into one buffer while piece k crosses the bus from the other.
    pub(super) fn upload(&mut self, host: &[u8]) -> Res<Scratch<u8>> {
        self.uploaded
            .fetch_add(host.len() as u64, Ordering::Relaxed);
        let mut dev = self.alloc::<u8>(host.len())?;
        self.upload_into(host, &mut dev.slice_mut(..host.len()))?;
        Ok(dev)
    }

    /// Like [`Lane::upload`], into `dev` (at least as long as `host`).
    pub(super) fn upload_into(&mut self, host: &[u8], dev: &mut CudaViewMut<'_, u8>) -> Res<()> {
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

    /// Copies `host` into device memory the caller owns, at `address` (counted as an upload),
    /// and waits for the copy.
    ///
    /// # Safety
    /// `address` holds `host.len()` bytes of this device's memory, which nothing else uses
    /// meanwhile.
    pub(super) unsafe fn upload_to(&mut self, host: &[u8], address: u64) -> Res<()> {
        self.uploaded
            .fetch_add(host.len() as u64, Ordering::Relaxed);
        // SAFETY: as the caller promises; the slice is leaked, never freed.
        let mut dst = unsafe { self.stream.upgrade_device_ptr::<u8>(address, host.len()) };
        let done = self
            .upload_into(host, &mut dst.slice_mut(..host.len()))
            .and_then(|()| self.stream.synchronize());
        dst.leak();
        done
    }

    /// The device bytes of `host`: the kept copy, or an upload.
    pub(super) fn bytes(&mut self, gpu: &Gpu, host: &[u8]) -> Res<Dev> {
        Ok(match gpu.resident(host) {
            Some((s, off)) => Dev::Kept(s, off, host.len()),
            None => Dev::Own(self.upload(host)?, host.len()),
        })
    }

    /// Copies device bytes into `host` through the staging buffers (piece k + 1 crosses the
    /// bus while piece k is copied out). Waits for everything queued on the lane before.
    pub(super) fn download(&mut self, dev: &CudaView<'_, u8>, host: &mut [u8]) -> Res<()> {
        let pieces = host.len().div_ceil(STAGE);
        if pieces == 0 {
            // Nothing to copy; the lane is still left idle, as every call leaves it.
            return self.stream.synchronize();
        }
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
        issue(self, 0)?;
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
    pub(super) fn fetch<T: DeviceRepr + Default + Clone>(
        &self,
        dev: &CudaSlice<T>,
        len: usize,
    ) -> Res<Vec<T>> {
        let mut out = vec![T::default(); len];
        if len > 0 {
            self.stream.memcpy_dtoh(&dev.slice(..len), &mut out[..])?;
        }
        // Even for nothing: every call leaves its lane idle (see `Gpu::load`).
        self.stream.synchronize()?;
        Ok(out)
    }

    /// A small host array on the device.
    pub(super) fn put<T: DeviceRepr>(&self, host: &[T]) -> Res<Scratch<T>> {
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
pub(super) fn copy_par(dst: &mut [u8], src: &[u8]) {
    dst.par_chunks_mut(1 << 20)
        .zip(src.par_chunks(1 << 20))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

/// Blocks for a grid-stride kernel over `n` items.
pub(super) fn grid(n: u64) -> u32 {
    (n.div_ceil(256)).clamp(1, 65_535 * 8) as u32
}

pub(super) fn cfg(blocks: (u32, u32), threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks.0.max(1), blocks.1.max(1), 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The kernels' element type codes.
pub(super) fn dtype_code(d: Dtype) -> i32 {
    match d {
        Dtype::BF16 => 0,
        Dtype::F16 => 1,
        _ => 2,
    }
}

/// A tensor's optimizer moments on the device (kept copies or uploads), and the kernels' dtype
/// codes of the tensor and of each moment (f32's where there are none), as the kernels that
/// take a tensor and its optional moments want them.
pub(super) struct MomentsOn {
    m: Option<Dev>,
    v: Option<Dev>,
    pub(super) dtypes: [i32; 3],
}

impl MomentsOn {
    /// Brings `moments` of a tensor of `dtype` onto the device.
    pub(super) fn of(
        gpu: &Gpu,
        lane: &mut Lane,
        dtype: Dtype,
        moments: Option<Moments<'_>>,
    ) -> Res<MomentsOn> {
        Ok(MomentsOn {
            m: moments.map(|mv| lane.bytes(gpu, mv.m.bytes)).transpose()?,
            v: moments.map(|mv| lane.bytes(gpu, mv.v.bytes)).transpose()?,
            dtypes: [
                dtype_code(dtype),
                moments.map_or(2, |mv| dtype_code(mv.m.dtype)),
                moments.map_or(2, |mv| dtype_code(mv.v.dtype)),
            ],
        })
    }

    /// The moments' device views.
    pub(super) fn views(&self) -> (Option<CudaView<'_, u8>>, Option<CudaView<'_, u8>>) {
        (
            self.m.as_ref().map(Dev::view),
            self.v.as_ref().map(Dev::view),
        )
    }
}

/// How a tensor's planes lie on the device: plane `p` of `n` bytes at `p * stride`.
#[derive(Clone, Copy)]
pub(super) struct Geometry {
    /// The kernels' number for the layout (`K_*` in mdl.cu).
    pub(super) kind: i32,
    /// Elements (bytes a plane).
    pub(super) n: u64,
    /// Bytes between planes: `n` rounded up to a multiple of 8, so every plane's flag bytes
    /// start at `p * stride / 8`.
    pub(super) stride: u64,
    pub(super) planes: usize,
    /// Bits XORed with the base (float planes).
    pub(super) mask: u64,
}

impl Geometry {
    /// The geometry of `bytes` bytes taken apart as `spec` says (float dtypes only; the width
    /// and plane count are mdl-codec's).
    pub(super) fn of(spec: PlaneSpec, bytes: usize) -> Geometry {
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

    /// `planes` byte planes of `n` symbols each (not a float layout: the kernels that split
    /// and merge floats do not take it).
    pub(super) fn bytes(n: u64, planes: usize) -> Geometry {
        Geometry {
            kind: -1,
            n,
            stride: n.next_multiple_of(8).max(8),
            planes,
            mask: 0,
        }
    }

    /// Bytes of all planes.
    pub(super) fn planes_len(&self) -> usize {
        self.stride as usize * self.planes
    }

    /// Room a sparse encode needs after the planes: each plane's flag bytes and its non-zero
    /// values.
    pub(super) fn sparse_room(&self) -> usize {
        (self.stride / 8 + self.stride) as usize * self.planes
    }
}

/// The null pointer, for a kernel's optional inputs.
pub(super) static NULL: u64 = 0;

/// Pushes an optional device input: its pointer, or null.
pub(super) fn arg_opt<'a, 'b: 'a, 'c: 'b>(l: &mut LaunchArgs<'a>, v: Option<&'b CudaView<'c, u8>>) {
    match v {
        Some(v) => l.arg(v),
        None => l.arg(&NULL),
    };
}

/// Runs `split_planes` (the elements of `input`, XORed with or subtracted from `base`, into the
/// planes of `out`) or `merge_planes` (the planes of `input`, with `base`, into the elements of
/// `out`): the two kernels take the same arguments.
pub(super) fn launch_planes(
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

/// Per-chunk error sums as the kernels write them (5 doubles a chunk: max |d|, Σd², Σx², Σm·d,
/// Σv·d²), folded in chunk order.
pub(super) fn fold_error_sums(sums: &[f64]) -> ErrorStats {
    let per: Vec<ErrorStats> = sums
        .chunks_exact(5)
        .map(|c| ErrorStats {
            max_abs: c[0],
            sum_sq_err: c[1],
            sum_sq: c[2],
            sum_m_delta: c[3],
            sum_v_delta2: c[4],
        })
        .collect();
    ErrorStats::fold(&per)
}

/// Where each tile's items start in their concatenation, and the total (the ordered
/// compactions: protected indices, exact values).
pub(super) fn starts_of(counts: &[u64]) -> (Vec<u64>, u64) {
    let mut starts = Vec::with_capacity(counts.len());
    let mut total = 0u64;
    for c in counts {
        starts.push(total);
        total += c;
    }
    (starts, total)
}

/// The largest finite |element| of `v` (`n` elements of the kernels' `dtype`) as the bits of a
/// non-negative double, maxed into `slot` (zeroed beforehand).
pub(super) fn launch_max_abs(
    gpu: &Gpu,
    lane: &Lane,
    v: &CudaView<'_, u8>,
    n: u64,
    dtype: i32,
    slot: &mut CudaViewMut<'_, u64>,
) -> Res<()> {
    let mut l = lane.stream.launch_builder(gpu.f("max_abs"));
    l.arg(v).arg(&n).arg(&dtype).arg(slot);
    // SAFETY: reads n elements; one atomic max into the slot.
    unsafe { l.launch(cfg((grid(n).min(4096), 1), 256)) }.map(drop)
}

/// The byte counts of every plane of `planes` (256 a plane, plane after plane) when `symbols`,
/// and of their sparse-mode flag bytes when `flags` (zeros for what is not counted): one
/// buffer counted into and fetched once.
pub(super) fn plane_counts(
    gpu: &Gpu,
    lane: &Lane,
    g: Geometry,
    planes: &CudaSlice<u8>,
    symbols: bool,
    flags: bool,
) -> Res<(Vec<u64>, Vec<u64>)> {
    let len = 256 * g.planes;
    let mut counts = lane.zeros::<u64>(2 * len)?;
    let (mut of_symbols, mut of_flags) = counts.split_at_mut(len);
    if symbols {
        launch_histogram(gpu, lane, g, planes, &mut of_symbols)?;
    }
    if flags {
        launch_flag_histogram(gpu, lane, g, planes, &mut of_flags)?;
    }
    let mut both = lane.fetch(&counts, 2 * len)?;
    let of_flags = both.split_off(len);
    Ok((both, of_flags))
}

/// Counts the sparse-mode flag bytes of each plane of `planes` into `hist[p * 256 + f]`.
pub(super) fn launch_flag_histogram(
    gpu: &Gpu,
    lane: &Lane,
    g: Geometry,
    planes: &CudaSlice<u8>,
    hist: &mut CudaViewMut<'_, u64>,
) -> Res<()> {
    let mut l = lane.stream.launch_builder(gpu.f("flag_bytes"));
    l.arg(planes)
        .arg(&g.n)
        .arg(&g.stride)
        .arg(&NULL)
        .arg(&NULL)
        .arg(hist);
    // SAFETY: reads n bytes of each plane; writes 256 counts a plane and no flag bytes (null).
    unsafe { l.launch(cfg((grid(g.n).min(1024), g.planes as u32), 256)) }.map(drop)
}

/// Byte histograms of every plane of `planes` into `hist` (256 counts a plane).
pub(super) fn launch_histogram(
    gpu: &Gpu,
    lane: &Lane,
    g: Geometry,
    planes: &CudaSlice<u8>,
    hist: &mut CudaViewMut<'_, u64>,
) -> Res<()> {
    let mut l = lane.stream.launch_builder(gpu.f("byte_histogram"));
    l.arg(planes).arg(&g.n).arg(&g.stride).arg(hist);
    // Blocks of one warp (the kernel's HIST_THREADS), each thread some 64 words or more.
    let blocks = (g.n / 8).div_ceil(32 * 64).clamp(1, 2048) as u32;
    // SAFETY: reads n bytes of each plane; writes 256 counts a plane.
    unsafe { l.launch(cfg((blocks, g.planes as u32), 32)) }.map(drop)
}
