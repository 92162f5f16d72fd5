//! An emulated CUDA device for tests on machines without a GPU (feature `emulate`).
//!
//! The same names and shapes as the parts of cudarc's driver API the engine uses, over host
//! memory: "device" buffers are host allocations, every stream operation happens when it is
//! issued, and a launch runs the kernel source compiled by the host C++ compiler
//! (`emu/emu.cpp`), block after block, each block's threads as cooperative fibers. So the
//! engine's host code and the kernels' logic run unchanged wherever the tests run; what is left
//! to a real device is timing, the driver's asynchrony and the PTX toolchain.
//!
//! Mistakes that a GPU would turn into wrong bytes, hangs or crashes are made loud here: a
//! kernel that writes past the end of a buffer (guard bytes are checked after every launch), a
//! barrier that can never be released, or a warp collective over lanes that exited panics with
//! the kernel's name. New buffers are filled with a pattern, so reading what was never written
//! shows up as a difference from the CPU.
//!
//! And it counts what costs time on a real device ([`counts`]): kernel launches, host
//! synchronisations, allocations, streams and the bytes each kind of copy moves. Those counts do
//! not depend on timing, so tests hold the engine's operations to budgets of them
//! (`crates/mdl/tests/device_budgets.rs`) between the rare runs on a real GPU.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use crate::DeviceCounts;

pub(crate) use cudarc::driver::{DriverError, LaunchConfig};

extern "C" {
    fn mdl_emu_has(name: *const c_char) -> c_int;
    fn mdl_emu_launch(
        name: *const c_char,
        grid: *const u32,
        block: *const u32,
        args: *mut *mut c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
}

/// Guard bytes after every buffer, checked after each launch.
const GUARD: usize = 4096;
const GUARD_BYTE: u8 = 0xa5;
/// What a buffer holds before anything writes it.
const POISON: u8 = 0xcd;

/// Element types a buffer can hold (as cudarc's trait of the same name).
///
/// # Safety
/// Plain data: any bit pattern of its size is read back as it was written.
pub(crate) unsafe trait DeviceRepr: Copy + 'static {}
/// Types for which all-zero bytes are a value.
///
/// # Safety
/// The all-zero bit pattern is a valid value.
pub(crate) unsafe trait ValidAsZeroBits {}

macro_rules! plain {
    ($($t:ty),*) => {$(
        // SAFETY: primitive numbers.
        unsafe impl DeviceRepr for $t {}
        // SAFETY: zero is a number.
        unsafe impl ValidAsZeroBits for $t {}
    )*};
}
plain!(u8, u16, u32, u64, i32, i64, f32, f64);

/// What has been asked of the emulated device since the process started, field by field as
/// [`DeviceCounts`] names them.
static COUNTS: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];

/// The [`COUNTS`] slots.
#[derive(Clone, Copy)]
enum Count {
    Launches,
    Syncs,
    Allocations,
    Pinned,
    Streams,
    ToDevice,
    ToHost,
    OnDevice,
}

fn add(what: Count, n: u64) {
    COUNTS[what as usize].fetch_add(n, Ordering::Relaxed);
}

/// Everything counted so far.
pub(crate) fn counts() -> DeviceCounts {
    let c = |what: Count| COUNTS[what as usize].load(Ordering::Relaxed);
    DeviceCounts {
        launches: c(Count::Launches),
        syncs: c(Count::Syncs),
        allocations: c(Count::Allocations),
        pinned_allocations: c(Count::Pinned),
        streams: c(Count::Streams),
        to_device: c(Count::ToDevice),
        to_host: c(Count::ToHost),
        on_device: c(Count::OnDevice),
    }
}

/// Live buffers: start address → (bytes in use, the guard following them; bytes allocated).
/// A buffer reused for fewer bytes than it holds ([`reuse`]) is guarded after those.
type Live = HashMap<usize, (usize, usize)>;

fn live() -> &'static Mutex<Live> {
    static LIVE: OnceLock<Mutex<Live>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The live buffers (a panic elsewhere does not make them unreadable).
fn live_buffers() -> std::sync::MutexGuard<'static, Live> {
    live().lock().unwrap_or_else(|e| e.into_inner())
}

/// Panics naming `after` if some buffer's guard bytes were written. That buffer is reported
/// once: it leaves the list of live buffers (its memory is leaked).
fn check_guards(after: &str) {
    let mut live = live_buffers();
    let broken = live.iter().find_map(|(&at, &(len, _))| {
        // SAFETY: a live buffer owns `len + GUARD` bytes from `at`.
        let guard = unsafe { std::slice::from_raw_parts((at + len) as *const u8, GUARD) };
        let last = guard.iter().rposition(|&b| b != GUARD_BYTE)?;
        Some((at, len, last + 1))
    });
    if let Some((at, len, k)) = broken {
        live.remove(&at);
        drop(live);
        panic!("emulated device: {after} wrote {k} bytes past the end of a {len}-byte buffer");
    }
}

/// The emulated device.
#[derive(Debug)]
pub(crate) struct CudaContext;

impl CudaContext {
    pub(crate) fn new() -> Arc<CudaContext> {
        Arc::new(CudaContext)
    }

    pub(crate) fn ordinal(&self) -> usize {
        0
    }

    /// Free and total memory: the emulated device has room for anything.
    pub(crate) fn mem_get_info(&self) -> Result<(usize, usize), DriverError> {
        Ok((usize::MAX / 2, usize::MAX / 2))
    }

    pub(crate) fn new_stream(self: &Arc<Self>) -> Result<Arc<CudaStream>, DriverError> {
        add(Count::Streams, 1);
        Ok(Arc::new(CudaStream { _ctx: self.clone() }))
    }

    /// Host memory standing in for pinned memory.
    ///
    /// # Safety
    /// As cudarc's: the contents are unspecified until written.
    pub(crate) unsafe fn alloc_pinned_with_flags<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
        _flags: u32,
    ) -> Result<PinnedHostSlice<T>, DriverError> {
        add(Count::Pinned, 1);
        // SAFETY: T is plain data for which zero bits are a value.
        Ok(PinnedHostSlice(vec![unsafe { std::mem::zeroed() }; len]))
    }

    pub(crate) fn load_module(
        &self,
        _ptx: cudarc::nvrtc::Ptx,
    ) -> Result<Arc<CudaModule>, DriverError> {
        Ok(Arc::new(CudaModule))
    }
}

/// The kernels compiled into the emulator.
#[derive(Debug)]
pub(crate) struct CudaModule;

impl CudaModule {
    /// The kernel `name`; panics when the emulator has none of that name (the engine asks only
    /// for the kernels it launches, so this is a mistake in the emulator's table).
    pub(crate) fn load_function(self: &Arc<Self>, name: &str) -> Result<CudaFunction, DriverError> {
        let c = CString::new(name).expect("kernel names have no NUL");
        // SAFETY: a NUL-terminated string, only read.
        let found = unsafe { mdl_emu_has(c.as_ptr()) } != 0;
        assert!(found, "emulated device: no kernel {name} in emu/emu.cpp");
        Ok(CudaFunction(c))
    }
}

/// A kernel, by name.
#[derive(Debug)]
pub(crate) struct CudaFunction(CString);

/// Host memory standing in for pinned host memory.
pub(crate) struct PinnedHostSlice<T>(Vec<T>);

impl<T> PinnedHostSlice<T> {
    pub(crate) fn as_slice(&self) -> Result<&[T], DriverError> {
        Ok(&self.0)
    }

    pub(crate) fn as_mut_slice(&mut self) -> Result<&mut [T], DriverError> {
        Ok(&mut self.0)
    }
}

/// A moment in a stream (everything issued is already done). Its time is read only by the
/// kernel benchmark (the `bench` feature).
pub(crate) struct CudaEvent(#[cfg_attr(not(feature = "bench"), allow(dead_code))] Instant);

impl CudaEvent {
    pub(crate) fn synchronize(&self) -> Result<(), DriverError> {
        add(Count::Syncs, 1);
        Ok(())
    }

    #[cfg_attr(not(feature = "bench"), allow(dead_code))]
    pub(crate) fn elapsed_ms(&self, end: &CudaEvent) -> Result<f32, DriverError> {
        Ok(end.0.duration_since(self.0).as_secs_f32() * 1e3)
    }
}

/// A device buffer of `len` elements in host memory, followed by guard bytes.
pub(crate) struct CudaSlice<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: the buffer is owned memory, reached only through the slice's borrows (as cudarc's).
unsafe impl<T: Send> Send for CudaSlice<T> {}
// SAFETY: as above; shared access only reads.
unsafe impl<T: Sync> Sync for CudaSlice<T> {}

fn layout(bytes: usize) -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(bytes + GUARD, 256).expect("buffer size")
}

impl<T: DeviceRepr> CudaSlice<T> {
    fn new(len: usize, fill: u8) -> CudaSlice<T> {
        let bytes = len * std::mem::size_of::<T>();
        // SAFETY: the layout is never zero-sized (GUARD bytes at least).
        let ptr = unsafe { std::alloc::alloc(layout(bytes)) };
        assert!(!ptr.is_null(), "emulated device: out of memory");
        // SAFETY: the allocation holds bytes + GUARD bytes.
        unsafe {
            std::ptr::write_bytes(ptr, fill, bytes);
            std::ptr::write_bytes(ptr.add(bytes), GUARD_BYTE, GUARD);
        }
        live_buffers().insert(ptr as usize, (bytes, bytes));
        CudaSlice {
            ptr: ptr.cast(),
            len,
        }
    }
}

impl<T> CudaSlice<T> {
    /// Gives up the buffer without freeing it; its address (as cudarc's).
    pub(crate) fn leak(self) -> u64 {
        let ptr = self.ptr as u64;
        std::mem::forget(self);
        ptr
    }
}

impl<T> Drop for CudaSlice<T> {
    fn drop(&mut self) {
        // Freed whole, whatever length the slice had (as the driver frees an allocation).
        let Some((used, bytes)) = live_buffers().remove(&(self.ptr as usize)) else {
            // Reported by a launch already; left allocated.
            return;
        };
        // SAFETY: allocated in `new` with this layout (`used <= bytes`); the guard is checked
        // before it goes.
        unsafe {
            let guard = std::slice::from_raw_parts((self.ptr as *const u8).add(used), GUARD);
            let intact = guard.iter().all(|&b| b == GUARD_BYTE);
            std::alloc::dealloc(self.ptr.cast(), layout(bytes));
            if !intact && !std::thread::panicking() {
                panic!("emulated device: a {used}-byte buffer was written past its end");
            }
        }
    }
}

/// The engine hands out again the allocation at `address` for `bytes` of it: poisoned as a new
/// buffer is, and guarded after those bytes (so an overrun into the rest is caught too).
pub(crate) fn reuse(address: u64, bytes: usize) {
    let mut live = live_buffers();
    let Some((used, held)) = live.get_mut(&(address as usize)) else {
        panic!("emulated device: reuse of memory that is not allocated");
    };
    assert!(
        bytes <= *held,
        "emulated device: {bytes} bytes reused of a {held}-byte allocation"
    );
    *used = bytes;
    let ptr = address as usize as *mut u8;
    // SAFETY: the allocation holds `held + GUARD >= bytes + GUARD` bytes from `ptr`.
    unsafe {
        std::ptr::write_bytes(ptr, POISON, bytes);
        std::ptr::write_bytes(ptr.add(bytes), GUARD_BYTE, GUARD);
    }
}

fn range(bounds: impl RangeBounds<usize>, len: usize) -> (usize, usize) {
    let lo = match bounds.start_bound() {
        Bound::Included(&a) => a,
        Bound::Excluded(&a) => a + 1,
        Bound::Unbounded => 0,
    };
    let hi = match bounds.end_bound() {
        Bound::Included(&b) => b + 1,
        Bound::Excluded(&b) => b,
        Bound::Unbounded => len,
    };
    assert!(
        lo <= hi && hi <= len,
        "emulated device: range {lo}..{hi} of a {len}-element buffer"
    );
    (lo, hi)
}

/// A borrowed part of a device buffer.
pub(crate) struct CudaView<'a, T> {
    ptr: *const T,
    len: usize,
    _borrow: PhantomData<&'a T>,
}

/// A mutably borrowed part of a device buffer.
pub(crate) struct CudaViewMut<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut T>,
}

impl<'a, T> CudaView<'a, T> {
    /// Elements `bounds` of the `len` from `ptr`.
    fn part(ptr: *const T, len: usize, bounds: impl RangeBounds<usize>) -> CudaView<'a, T> {
        let (lo, hi) = range(bounds, len);
        CudaView {
            ptr: ptr.wrapping_add(lo),
            len: hi - lo,
            _borrow: PhantomData,
        }
    }
}

impl<'a, T> CudaViewMut<'a, T> {
    /// Elements `bounds` of the `len` from `ptr`.
    fn part(ptr: *mut T, len: usize, bounds: impl RangeBounds<usize>) -> CudaViewMut<'a, T> {
        let (lo, hi) = range(bounds, len);
        CudaViewMut {
            ptr: ptr.wrapping_add(lo),
            len: hi - lo,
            _borrow: PhantomData,
        }
    }

    /// The `len` elements from `ptr` as two parts, split at `mid`.
    fn halves(ptr: *mut T, len: usize, mid: usize) -> (CudaViewMut<'a, T>, CudaViewMut<'a, T>) {
        (Self::part(ptr, len, ..mid), Self::part(ptr, len, mid..))
    }
}

impl<T> CudaSlice<T> {
    pub(crate) fn slice(&self, bounds: impl RangeBounds<usize>) -> CudaView<'_, T> {
        CudaView::part(self.ptr, self.len, bounds)
    }

    pub(crate) fn slice_mut(&mut self, bounds: impl RangeBounds<usize>) -> CudaViewMut<'_, T> {
        CudaViewMut::part(self.ptr, self.len, bounds)
    }

    pub(crate) fn split_at_mut(&mut self, mid: usize) -> (CudaViewMut<'_, T>, CudaViewMut<'_, T>) {
        CudaViewMut::halves(self.ptr, self.len, mid)
    }
}

impl<T> CudaView<'_, T> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn slice(&self, bounds: impl RangeBounds<usize>) -> CudaView<'_, T> {
        CudaView::part(self.ptr, self.len, bounds)
    }
}

impl<T> CudaViewMut<'_, T> {
    pub(crate) fn split_at_mut(&mut self, mid: usize) -> (CudaViewMut<'_, T>, CudaViewMut<'_, T>) {
        CudaViewMut::halves(self.ptr, self.len, mid)
    }

    pub(crate) fn slice_mut(&mut self, bounds: impl RangeBounds<usize>) -> CudaViewMut<'_, T> {
        CudaViewMut::part(self.ptr, self.len, bounds)
    }
}

/// Device memory that can be read: its address and length.
pub(crate) trait DevicePtr<T> {
    fn raw(&self) -> (*const T, usize);
}

/// Device memory that can be written.
pub(crate) trait DevicePtrMut<T> {
    fn raw_mut(&mut self) -> (*mut T, usize);
}

impl<T> DevicePtr<T> for CudaSlice<T> {
    fn raw(&self) -> (*const T, usize) {
        (self.ptr, self.len)
    }
}

impl<T> DevicePtr<T> for CudaView<'_, T> {
    fn raw(&self) -> (*const T, usize) {
        (self.ptr, self.len)
    }
}

impl<T> DevicePtr<T> for CudaViewMut<'_, T> {
    fn raw(&self) -> (*const T, usize) {
        (self.ptr, self.len)
    }
}

impl<T> DevicePtrMut<T> for CudaSlice<T> {
    fn raw_mut(&mut self) -> (*mut T, usize) {
        (self.ptr, self.len)
    }
}

impl<T> DevicePtrMut<T> for CudaViewMut<'_, T> {
    fn raw_mut(&mut self) -> (*mut T, usize) {
        (self.ptr, self.len)
    }
}

/// Host memory a copy can read (as cudarc's trait of the same name).
pub(crate) trait HostSlice<T> {
    fn host(&self) -> &[T];
}

impl<T> HostSlice<T> for [T] {
    fn host(&self) -> &[T] {
        self
    }
}

impl<T> HostSlice<T> for Vec<T> {
    fn host(&self) -> &[T] {
        self
    }
}

/// A stream: everything issued on it happens at once.
#[derive(Debug)]
pub(crate) struct CudaStream {
    _ctx: Arc<CudaContext>,
}

impl CudaStream {
    /// A buffer whose contents are unspecified (here: a poison pattern).
    ///
    /// # Safety
    /// As cudarc's: the caller writes before reading.
    pub(crate) unsafe fn alloc<T: DeviceRepr>(
        self: &Arc<Self>,
        len: usize,
    ) -> Result<CudaSlice<T>, DriverError> {
        add(Count::Allocations, 1);
        Ok(CudaSlice::new(len, POISON))
    }

    /// A slice over memory someone else allocated (here: any host memory of `len` elements at
    /// `ptr`), to be given up with [`CudaSlice::leak`] rather than dropped.
    ///
    /// # Safety
    /// As cudarc's: `ptr` holds `len` elements for as long as the slice is used.
    pub(crate) unsafe fn upgrade_device_ptr<T>(
        self: &Arc<Self>,
        ptr: u64,
        len: usize,
    ) -> CudaSlice<T> {
        CudaSlice {
            ptr: ptr as usize as *mut T,
            len,
        }
    }

    pub(crate) fn alloc_zeros<T: DeviceRepr + ValidAsZeroBits>(
        self: &Arc<Self>,
        len: usize,
    ) -> Result<CudaSlice<T>, DriverError> {
        add(Count::Allocations, 1);
        Ok(CudaSlice::new(len, 0))
    }

    pub(crate) fn memcpy_htod<T: DeviceRepr, Src: HostSlice<T> + ?Sized, Dst: DevicePtrMut<T>>(
        self: &Arc<Self>,
        src: &Src,
        dst: &mut Dst,
    ) -> Result<(), DriverError> {
        let src = src.host();
        let (to, len) = dst.raw_mut();
        assert!(
            len >= src.len(),
            "emulated device: copy into a shorter buffer"
        );
        add(Count::ToDevice, std::mem::size_of_val(src) as u64);
        // SAFETY: dst holds at least src.len() elements; host and device memory are disjoint.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), to, src.len()) };
        Ok(())
    }

    pub(crate) fn memcpy_dtoh<T: DeviceRepr, Src: DevicePtr<T>>(
        self: &Arc<Self>,
        src: &Src,
        dst: &mut [T],
    ) -> Result<(), DriverError> {
        let (from, len) = src.raw();
        assert!(
            dst.len() >= len,
            "emulated device: copy into a shorter host slice"
        );
        add(Count::ToHost, (len * std::mem::size_of::<T>()) as u64);
        // SAFETY: src holds len elements; host and device memory are disjoint.
        unsafe { std::ptr::copy_nonoverlapping(from, dst.as_mut_ptr(), len) };
        Ok(())
    }

    /// Zeroes `dst` (counted as a launch: a memset is queued work like a kernel).
    pub(crate) fn memset_zeros<T: DeviceRepr + ValidAsZeroBits, Dst: DevicePtrMut<T>>(
        self: &Arc<Self>,
        dst: &mut Dst,
    ) -> Result<(), DriverError> {
        add(Count::Launches, 1);
        let (to, len) = dst.raw_mut();
        // SAFETY: dst holds len elements, for which zero bits are a value.
        unsafe { std::ptr::write_bytes(to, 0, len) };
        Ok(())
    }

    pub(crate) fn memcpy_dtod<T, Src: DevicePtr<T>, Dst: DevicePtrMut<T>>(
        self: &Arc<Self>,
        src: &Src,
        dst: &mut Dst,
    ) -> Result<(), DriverError> {
        let (from, len) = src.raw();
        let (to, cap) = dst.raw_mut();
        assert!(cap >= len, "emulated device: copy into a shorter buffer");
        add(Count::OnDevice, (len * std::mem::size_of::<T>()) as u64);
        // SAFETY: both hold len elements; `copy` allows overlap.
        unsafe { std::ptr::copy(from, to, len) };
        Ok(())
    }

    pub(crate) fn launch_builder<'a>(&'a self, func: &'a CudaFunction) -> LaunchArgs<'a> {
        LaunchArgs {
            func,
            args: Vec::new(),
            _borrows: PhantomData,
        }
    }

    pub(crate) fn record_event(
        &self,
        _flags: Option<cudarc::driver::sys::CUevent_flags>,
    ) -> Result<CudaEvent, DriverError> {
        Ok(CudaEvent(Instant::now()))
    }

    pub(crate) fn synchronize(&self) -> Result<(), DriverError> {
        add(Count::Syncs, 1);
        Ok(())
    }
}

/// A kernel launch being built: pointers to each argument's value, as the driver takes them.
pub(crate) struct LaunchArgs<'a> {
    func: &'a CudaFunction,
    args: Vec<Arg>,
    _borrows: PhantomData<&'a ()>,
}

/// One kernel argument: a value where it lies, or a device address (passed by value).
enum Arg {
    Value(*const c_void),
    Address(u64),
}

/// Adds an argument to a launch (as cudarc's trait of the same name).
pub(crate) trait PushKernelArg<T> {
    fn arg(&mut self, arg: T) -> &mut Self;
}

impl LaunchArgs<'_> {
    fn address(&mut self, ptr: usize) -> &mut Self {
        self.args.push(Arg::Address(ptr as u64));
        self
    }

    /// Runs the kernel over the grid, then checks every buffer's guard bytes.
    ///
    /// # Safety
    /// As cudarc's: the arguments match the kernel's parameters.
    pub(crate) unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), DriverError> {
        let grid = [cfg.grid_dim.0, cfg.grid_dim.1, cfg.grid_dim.2];
        let block = [cfg.block_dim.0, cfg.block_dim.1, cfg.block_dim.2];
        add(Count::Launches, 1);
        // One launch at a time, checked before the next: a kernel's overrun is its own.
        static LAUNCH: Mutex<()> = Mutex::new(());
        let _one = LAUNCH.lock().unwrap_or_else(|e| e.into_inner());
        // What the driver takes: a pointer to each argument's value.
        let addresses: Vec<u64> = self
            .args
            .iter()
            .map(|a| match a {
                Arg::Address(x) => *x,
                Arg::Value(_) => 0,
            })
            .collect();
        let mut args: Vec<*mut c_void> = self
            .args
            .iter()
            .zip(&addresses)
            .map(|(a, x)| match a {
                Arg::Value(p) => p.cast_mut(),
                Arg::Address(_) => x as *const u64 as *mut c_void,
            })
            .collect();
        let mut err = vec![0 as c_char; 512];
        // SAFETY: the caller's arguments match the kernel's parameters and point at live
        // values; the error buffer's length is passed with it.
        let failed = unsafe {
            mdl_emu_launch(
                self.func.0.as_ptr(),
                grid.as_ptr(),
                block.as_ptr(),
                args.as_mut_ptr(),
                err.as_mut_ptr(),
                err.len(),
            )
        } != 0;
        let name = self.func.0.to_string_lossy();
        if failed {
            // SAFETY: the emulator wrote a NUL-terminated message into the buffer.
            let why = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) };
            panic!("emulated device: {}", why.to_string_lossy());
        }
        check_guards(&format!("kernel {name}"));
        Ok(())
    }
}

impl<'a, 'b: 'a, T: DeviceRepr> PushKernelArg<&'b T> for LaunchArgs<'a> {
    fn arg(&mut self, arg: &'b T) -> &mut Self {
        self.args.push(Arg::Value(arg as *const T as *const c_void));
        self
    }
}

impl<'a, 'b: 'a, T> PushKernelArg<&'b CudaSlice<T>> for LaunchArgs<'a> {
    fn arg(&mut self, arg: &'b CudaSlice<T>) -> &mut Self {
        self.address(arg.ptr as usize)
    }
}

impl<'a, 'b: 'a, T> PushKernelArg<&'b mut CudaSlice<T>> for LaunchArgs<'a> {
    fn arg(&mut self, arg: &'b mut CudaSlice<T>) -> &mut Self {
        self.address(arg.ptr as usize)
    }
}

impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b CudaView<'c, T>> for LaunchArgs<'a> {
    fn arg(&mut self, arg: &'b CudaView<'c, T>) -> &mut Self {
        self.address(arg.ptr as usize)
    }
}

impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b mut CudaViewMut<'c, T>> for LaunchArgs<'a> {
    fn arg(&mut self, arg: &'b mut CudaViewMut<'c, T>) -> &mut Self {
        self.address(arg.ptr as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Launches test kernel `name` on one block of `threads` threads with an output of `len`
    /// u32s (and `extra` arguments after it); the output, or the emulator's complaint.
    fn run(name: &str, threads: u32, len: usize, extra: &[&u32]) -> Result<Vec<u32>, String> {
        let ctx = CudaContext::new();
        let stream = ctx.new_stream().unwrap();
        let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src("")).unwrap();
        let f = module.load_function(name).unwrap();
        let mut out = stream.alloc_zeros::<u32>(len).unwrap();
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let launched = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut l = stream.launch_builder(&f);
            l.arg(&mut out);
            for a in extra {
                l.arg(*a);
            }
            // SAFETY: the arguments are the test kernels' parameters.
            unsafe { l.launch(cfg) }.unwrap();
        }));
        let failed = launched.err().map(|e| {
            e.downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "a panic without a message".into())
        });
        let mut host = vec![0u32; len];
        stream.memcpy_dtoh(&out, &mut host[..]).unwrap();
        failed.map_or(Ok(host), Err)
    }

    #[test]
    fn a_barrier_that_can_never_be_released_is_reported() {
        let e = run("emu_test_deadlock", 64, 64, &[]).unwrap_err();
        assert!(
            e.contains("emu_test_deadlock") && e.contains("deadlock"),
            "{e}"
        );
    }

    #[test]
    fn a_collective_over_an_exited_lane_is_reported() {
        let e = run("emu_test_exited_lane", 32, 32, &[]).unwrap_err();
        assert!(e.contains("lane 5, which has exited"), "{e}");
    }

    #[test]
    fn a_write_past_a_buffer_is_reported() {
        let e = run("emu_test_overrun", 32, 32, &[]).unwrap_err();
        assert!(e.contains("past the end of a 128-byte buffer"), "{e}");
    }

    #[test]
    fn a_missing_barrier_gives_wrong_results() {
        let want = |salt: u32| (0..64).map(|t| salt + (t + 1) % 64).collect::<Vec<u32>>();
        assert_eq!(
            run("emu_test_neighbour", 64, 64, &[&7, &1]).unwrap(),
            want(7)
        );
        // Without the barrier, thread t reads its neighbour's slot before the neighbour has
        // run, so it sees what the previous launch left there.
        let racy = run("emu_test_neighbour", 64, 64, &[&9, &0]).unwrap();
        assert_ne!(racy, want(9));
        assert_eq!(racy[63], 9, "thread 0 ran before thread 63 read its slot");
    }
}
