//! mdl's GPU engine: the codec kernels of [`mdl_codec::engine::Engine`] on CUDA, producing
//! byte for byte what the CPU engine produces.
//!
//! Nothing of CUDA is needed to build or to run without a GPU: the driver (`libcuda`) and NVRTC
//! are loaded at run time through cudarc. [`probe`] checks, without panicking, that the driver
//! library is present, that it starts and sees a device, and that the kernels load — compiled
//! by NVRTC for the device when NVRTC is present, otherwise from the PTX committed beside the
//! source (`kernels/mdl.ptx`). It says why when one of those fails, and the caller falls back
//! to the CPU engine.
//!
//! With the `emulate` feature (tests only; see `src/emu.rs`), [`probe`] returns the engine on an
//! emulated device instead: the same host code over host memory, and the kernel source compiled
//! for the CPU (`emu/emu.cpp`), so the GPU engine's tests run on machines without a GPU.
//!
//! The kernels (`kernels/mdl.cu`) compute what the CPU reference computes: integer sums
//! (order-free), floating-point sums in the CPU's chunk order with `--fmad=false` (no fused
//! multiply-adds, so each product is rounded as on the CPU), and Huffman lanes whose bits are
//! fixed by the symbols and the code. What is decided from the kernels' results (codes, plans,
//! record layout) stays in `mdl-codec`, shared by both engines.

// cudarc's kernel launches, device allocations and raw-pointer views are `unsafe`: this crate
// is the one place mdl talks to the GPU, so it allows what the workspace denies elsewhere. Each
// use says what it relies on.
#![allow(unsafe_code)]

#[cfg(feature = "emulate")]
mod emu;
mod engine;

use std::sync::{Arc, OnceLock};

#[cfg(feature = "bench")]
pub use engine::BenchRow;
pub use engine::{DeviceBuffer, GpuEngine};

#[cfg(not(feature = "emulate"))]
use cudarc::driver::CudaContext;
use cudarc::nvrtc::{CompileOptions, Ptx};

/// The kernels' CUDA C source.
pub const KERNEL_SOURCE: &str = include_str!("../kernels/mdl.cu");

/// PTX of [`KERNEL_SOURCE`] for `compute_70`, committed for machines without NVRTC (a driver
/// JIT-compiles it for the device). Its first line names the source hash it was made from.
pub const COMMITTED_PTX: &str = include_str!("../kernels/mdl.ptx");

/// The architecture the committed PTX targets (the oldest with the warp intrinsics used).
pub const PTX_ARCH: &str = "compute_70";

/// Every kernel the engine launches (a module missing one does not load).
pub const KERNELS: &[&str] = &[
    "split_planes",
    "merge_planes",
    "byte_histogram",
    "flag_bytes",
    "compact_nonzero",
    "huff_lane_bits",
    "huff_write",
    "copy_jobs",
    "huff_decode",
    "sparse_scatter",
    "count_flags",
    "fill_bytes",
    "max_abs",
    "key_stats",
    "assign_codes",
    "protected_indices",
    "code_pairs",
    "group_counts",
    "group_starts",
    "group_scatter",
    "error_chunks",
    "residual_distance",
    "residual_measure",
    "residual_codes",
    "residual_exact",
    "residual_scan",
    "residual_rebuild",
    "second_moment_sum",
    "blake3_chunks",
    "blake3_parents",
];

/// What the engine has asked of its device, counted by the emulated device
/// ([`GpuEngine::counts`]): the things that cost time on a real one whatever the kernels do.
/// Counts since the process started; an operation's are the difference of two readings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCounts {
    /// Kernel launches, memsets included (queued work of the same cost).
    pub launches: u64,
    /// Times the host waited for the device (a stream or an event synchronised).
    pub syncs: u64,
    /// Device memory allocations.
    pub allocations: u64,
    /// Pinned host memory allocations.
    pub pinned_allocations: u64,
    /// Streams created.
    pub streams: u64,
    /// Bytes copied from the host to the device.
    pub to_device: u64,
    /// Bytes copied from the device to the host.
    pub to_host: u64,
    /// Bytes copied within the device.
    pub on_device: u64,
}

impl std::ops::Sub for DeviceCounts {
    type Output = DeviceCounts;

    /// What was counted between two readings (`later - earlier`).
    fn sub(self, earlier: DeviceCounts) -> DeviceCounts {
        DeviceCounts {
            launches: self.launches - earlier.launches,
            syncs: self.syncs - earlier.syncs,
            allocations: self.allocations - earlier.allocations,
            pinned_allocations: self.pinned_allocations - earlier.pinned_allocations,
            streams: self.streams - earlier.streams,
            to_device: self.to_device - earlier.to_device,
            to_host: self.to_host - earlier.to_host,
            on_device: self.on_device - earlier.on_device,
        }
    }
}

impl std::fmt::Display for DeviceCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} launches, {} syncs, {} allocations ({} pinned), {} streams; \
             {} B to the device, {} B to the host, {} B within it",
            self.launches,
            self.syncs,
            self.allocations,
            self.pinned_allocations,
            self.streams,
            self.to_device,
            self.to_host,
            self.on_device
        )
    }
}

/// Why the GPU engine is not available (the CPU engine is used instead).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unavailable {}

/// A 64-bit FNV-1a hash of the kernel source, written into the committed PTX's first line so a
/// stale PTX is caught (`tests/kernels.rs`).
pub fn source_hash() -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in KERNEL_SOURCE.as_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The first line of the committed PTX for the current source.
pub fn ptx_header() -> String {
    format!("// mdl kernels {PTX_ARCH}, source {}", source_hash())
}

/// Whether the NVRTC library can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the library by its usual names; nothing is called in it.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles the kernels with NVRTC for `arch` (such as `compute_90`). Fails with NVRTC's log
/// when the source does not compile; the caller must check [`nvrtc_present`] first.
pub fn compile(arch: &str) -> Result<Ptx, String> {
    let opts = CompileOptions {
        // Products rounded before they are added, as the CPU reference does.
        fmad: Some(false),
        options: vec![
            format!("--gpu-architecture={arch}"),
            "--std=c++17".into(),
            "-default-device".into(),
        ],
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(KERNEL_SOURCE, opts).map_err(|e| e.to_string())
}

/// What one kernel needs of a multiprocessor once compiled to machine code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resources {
    /// The kernel.
    pub name: String,
    /// Registers a thread.
    pub registers: u32,
    /// Static shared memory a block, in bytes.
    pub shared_bytes: u32,
}

/// Compiles the kernels with NVRTC to machine code for `sm` (such as `sm_90`), as the driver
/// does with PTX when it loads the module, and reads what each kernel needs from the
/// assembler's report. A kernel that needs more than a block can have fails its launch on a
/// device, which no PTX check sees. The caller must check [`nvrtc_present`] first.
pub fn machine_code_resources(sm: &str) -> Result<Vec<Resources>, String> {
    use cudarc::nvrtc::result;
    let src = std::ffi::CString::new(KERNEL_SOURCE).map_err(|e| e.to_string())?;
    let prog = result::create_program(&src, None).map_err(|e| e.to_string())?;
    let opts = [
        format!("--gpu-architecture={sm}"),
        "--std=c++17".into(),
        "-default-device".into(),
        "--fmad=false".into(),
        "-Xptxas=-v".into(),
    ];
    // SAFETY: `prog` was created above and is destroyed once, after its last use.
    let (compiled, log) = unsafe {
        let compiled = result::compile_program(prog, &opts);
        let log = result::get_program_log(prog);
        let _ = result::destroy_program(prog);
        (compiled, log)
    };
    let log: Vec<u8> = log
        .map_err(|e| e.to_string())?
        .into_iter()
        .take_while(|&c| c != 0)
        .map(|c| c as u8)
        .collect();
    let log = String::from_utf8_lossy(&log);
    compiled.map_err(|e| format!("{e}: {log}"))?;
    // "Compiling entry function 'k' for 'sm_90'", then "Used 32 registers, ..., 256 bytes smem".
    let mut out = Vec::new();
    let mut name: Option<String> = None;
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            name = rest.split('\'').next().map(str::to_string);
        } else if let (Some(k), Some(rest)) = (&name, line.split("Used ").nth(1)) {
            let number_before = |unit: &str| -> u32 {
                rest.split(", ")
                    .find_map(|part| part.trim().strip_suffix(unit)?.trim().parse().ok())
                    .unwrap_or(0)
            };
            out.push(Resources {
                name: k.clone(),
                registers: number_before("registers"),
                shared_bytes: number_before("bytes smem"),
            });
            name = None;
        }
    }
    Ok(out)
}

/// The kernels as PTX for a device of compute capability `cc`: compiled by NVRTC when it is
/// present, else the committed PTX. Says which in the second value.
#[cfg(not(feature = "emulate"))]
fn kernels_for(cc: (i32, i32)) -> Result<(Ptx, &'static str), Unavailable> {
    if nvrtc_present() {
        let arch = format!("compute_{}{}", cc.0, cc.1);
        return compile(&arch)
            .map(|p| (p, "kernels compiled by NVRTC"))
            .map_err(|e| Unavailable(format!("the GPU kernels did not compile: {e}")));
    }
    Ok((
        Ptx::from_src(COMMITTED_PTX),
        "kernels from the committed PTX (no NVRTC)",
    ))
}

/// What [`probe`] found: the engine, or why there is none. Probed once per process.
static PROBED: OnceLock<Result<(Arc<engine::Gpu>, String), Unavailable>> = OnceLock::new();

/// The GPU engine on device 0, with a line describing it (device, memory, where the kernels
/// came from), or why there is none. Never panics; the first call probes and compiles the
/// kernels (NVRTC, about a second), later calls return the same result.
pub fn probe() -> Result<(GpuEngine, String), Unavailable> {
    PROBED
        .get_or_init(|| {
            std::panic::catch_unwind(start)
                .unwrap_or_else(|_| Err(Unavailable("the CUDA driver panicked on start".into())))
        })
        .clone()
        .map(|(gpu, line)| (GpuEngine::new(gpu), line))
}

/// The line [`probe`] described the GPU engine with, if this process has probed and found one
/// (probes nothing itself).
pub fn probed() -> Option<String> {
    PROBED.get()?.as_ref().ok().map(|(_, line)| line.clone())
}

/// The emulated device (feature `emulate`, for tests): the kernels compiled for the CPU.
#[cfg(feature = "emulate")]
fn start() -> Result<(Arc<engine::Gpu>, String), Unavailable> {
    let gpu = engine::Gpu::load(emu::CudaContext::new(), Ptx::from_src(""))
        .map_err(|e| Unavailable(format!("the emulated kernels did not load: {e}")))?;
    let line = "emulated CUDA device (the kernels compiled for the CPU; feature emulate)";
    Ok((Arc::new(gpu), line.into()))
}

#[cfg(not(feature = "emulate"))]
fn start() -> Result<(Arc<engine::Gpu>, String), Unavailable> {
    // SAFETY: only tries to open the library by its usual names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Unavailable(
            "no CUDA driver library (libcuda) on this machine".into(),
        ));
    }
    let count = CudaContext::device_count()
        .map_err(|e| Unavailable(format!("the CUDA driver did not start: {e}")))?;
    if count < 1 {
        return Err(Unavailable("the CUDA driver sees no device".into()));
    }
    let ctx = CudaContext::new(0)
        .map_err(|e| Unavailable(format!("could not open CUDA device 0: {e}")))?;
    let cc = ctx
        .compute_capability()
        .map_err(|e| Unavailable(format!("could not query CUDA device 0: {e}")))?;
    if cc.0 < 7 {
        return Err(Unavailable(format!(
            "CUDA device 0 has compute capability {}.{}; the kernels need 7.0 or later",
            cc.0, cc.1
        )));
    }
    let (ptx, source) = kernels_for(cc)?;
    let gpu = engine::Gpu::load(ctx.clone(), ptx)
        .map_err(|e| Unavailable(format!("the GPU kernels did not load: {e}")))?;
    let name = ctx.name().unwrap_or_else(|_| "CUDA device 0".into());
    let mem = ctx.total_mem().unwrap_or(0) >> 30;
    let line = format!("{name} (compute {}.{}, {mem} GiB), {source}", cc.0, cc.1);
    Ok((Arc::new(gpu), line))
}
