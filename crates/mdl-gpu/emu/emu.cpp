// A CPU emulator for mdl's CUDA kernels, for tests on machines without a GPU (feature
// `emulate`). The kernel source (kernels/mdl.cu) is compiled here by the host C++ compiler
// against a small prelude that supplies CUDA's built-in variables and intrinsics, and every
// launch runs its blocks one after another, each block's threads as cooperative fibers:
//
// - a thread runs until it reaches a barrier (__syncthreads, a warp collective) or returns;
// - a barrier is released when every thread it waits for has arrived; warp collectives are
//   computed from all participants' values at once;
// - a barrier that can never be released (a thread that returned, or one waiting elsewhere) is
//   reported as an error naming the kernel, as is a warp collective whose mask names a lane
//   that is not there. On a GPU those are hangs or undefined results.
//
// Threads run to their next barrier in order, so a missing __syncthreads between a write and
// another thread's read shows up as a wrong result. Atomics are plain read-modify-writes: one
// fiber runs at a time and launches are serialised.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace mdl_emu {

struct uint3 {
    unsigned x, y, z;
};

// ---------------------------------------------------------------------------------------------
// Fibers: a stack each, switched by a few instructions (x86-64) or ucontext elsewhere.

#if defined(__x86_64__)
extern "C" void mdl_emu_switch(void** save, void* to);
// Saves the callee-saved registers on the current stack, stores its pointer in *save, moves
// to `to` and restores what was saved there.
asm(R"(
    .text
    .globl mdl_emu_switch
    .type mdl_emu_switch, @function
mdl_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size mdl_emu_switch, .-mdl_emu_switch
)");
#endif

enum State { RUN, WAIT_BLOCK, WAIT_WARP, DONE };
enum WarpOp { OP_SYNC, OP_SHFL_UP, OP_SHFL_DOWN, OP_SHFL_XOR, OP_MATCH_ANY };

struct Fiber {
#if defined(__x86_64__)
    void* sp;
#else
    ucontext_t ctx;
#endif
    State state;
    unsigned tid;
    // A pending warp collective: what, with which lanes, this lane's value and operand.
    WarpOp op;
    unsigned mask;
    uint64_t value;
    unsigned operand;
    uint64_t result;
};

constexpr size_t STACK = 64 * 1024;

// The launch in progress (launches are serialised by `launch_lock`).
struct Launch {
    void (*invoke)(void**);
    void** args;
    std::vector<Fiber> fibers;
    char* stacks;
    unsigned current;
#if defined(__x86_64__)
    void* sched_sp;
#else
    ucontext_t sched;
#endif
};

Launch* run = nullptr;
uint3 block_idx, block_dim, grid_dim;
std::mutex launch_lock;

inline Fiber& me() {
    return run->fibers[run->current];
}

// Back to the scheduler; returns when this fiber is resumed.
inline void yield() {
#if defined(__x86_64__)
    mdl_emu_switch(&me().sp, run->sched_sp);
#else
    swapcontext(&me().ctx, &run->sched);
#endif
}

// Where every fiber starts: the kernel for this thread, then done.
extern "C" void mdl_emu_fiber_main() {
    run->invoke(run->args);
    me().state = DONE;
    yield();
    __builtin_unreachable();
}

// Resumes fiber t until it waits or finishes.
inline void resume(unsigned t) {
    run->current = t;
    Fiber& f = run->fibers[t];
#if defined(__x86_64__)
    mdl_emu_switch(&run->sched_sp, f.sp);
#else
    swapcontext(&run->sched, &f.ctx);
#endif
}

// Prepares fiber t to start at mdl_emu_fiber_main on its own stack.
inline void prepare(unsigned t) {
    Fiber& f = run->fibers[t];
    char* top = run->stacks + (size_t)(t + 1) * STACK;
#if defined(__x86_64__)
    // mdl_emu_switch pops six registers and returns: the return address sits at a 16-byte
    // boundary, so the entry sees the stack as a call leaves it (rsp + 8 aligned).
    // Stack tops are staggered by whole cache lines: at the same offset in every 64 KiB they
    // would all fall in one cache set.
    uintptr_t a = ((uintptr_t)top - 32 - (t % 61) * 64) & ~(uintptr_t)15;
    void** sp = (void**)a;
    sp[1] = nullptr;  // no caller
    sp[0] = (void*)&mdl_emu_fiber_main;
    for (int r = 1; r <= 6; r++) sp[-r] = nullptr;
    f.sp = sp - 6;
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = top - STACK;
    f.ctx.uc_stack.ss_size = STACK;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, (void (*)())mdl_emu_fiber_main, 0);
#endif
}

// ---------------------------------------------------------------------------------------------
// Built-in variables and intrinsics for the kernel source.

inline uint3 thread_idx() {
    return uint3{me().tid, 0, 0};
}

inline void syncthreads() {
    me().state = WAIT_BLOCK;
    yield();
}

inline uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, unsigned operand) {
    Fiber& f = me();
    f.state = WAIT_WARP;
    f.op = op;
    f.mask = mask;
    f.value = value;
    f.operand = operand;
    yield();
    return me().result;
}

template <typename T>
inline T as(uint64_t bits) {
    T v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
}

template <typename T>
inline uint64_t bits_of(T v) {
    static_assert(sizeof(T) <= 8, "warp values of up to 64 bits");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof v);
    return b;
}

}  // namespace mdl_emu

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define threadIdx (mdl_emu::thread_idx())
#define blockIdx (mdl_emu::block_idx)
#define blockDim (mdl_emu::block_dim)
#define gridDim (mdl_emu::grid_dim)

inline void __syncthreads() {
    mdl_emu::syncthreads();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    mdl_emu::warp_op(mdl_emu::OP_SYNC, mask, 0, 0);
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned d) {
    return mdl_emu::as<T>(mdl_emu::warp_op(mdl_emu::OP_SHFL_UP, mask, mdl_emu::bits_of(v), d));
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned d) {
    return mdl_emu::as<T>(mdl_emu::warp_op(mdl_emu::OP_SHFL_DOWN, mask, mdl_emu::bits_of(v), d));
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, unsigned d) {
    return mdl_emu::as<T>(mdl_emu::warp_op(mdl_emu::OP_SHFL_XOR, mask, mdl_emu::bits_of(v), d));
}
template <typename T>
inline unsigned __match_any_sync(unsigned mask, T v) {
    return (unsigned)mdl_emu::warp_op(mdl_emu::OP_MATCH_ANY, mask, mdl_emu::bits_of(v), 0);
}
inline int __popc(unsigned x) {
    return __builtin_popcount(x);
}
inline int __ffs(unsigned x) {
    return __builtin_ffs((int)x);
}
inline float __uint_as_float(unsigned x) {
    return mdl_emu::as<float>(x);
}
inline unsigned __float_as_uint(float x) {
    return (unsigned)mdl_emu::bits_of(x);
}
inline long long __double_as_longlong(double x) {
    return mdl_emu::as<long long>(mdl_emu::bits_of(x));
}
// Rounded double arithmetic: plain operations, built with -ffp-contract=off.
inline double __dmul_rn(double a, double b) {
    return a * b;
}
inline double __dadd_rn(double a, double b) {
    return a + b;
}
inline double __dsub_rn(double a, double b) {
    return a - b;
}
inline double __ddiv_rn(double a, double b) {
    return a / b;
}
inline double __dsqrt_rn(double a) {
    return std::sqrt(a);
}
inline float __double2float_rn(double a) {
    return (float)a;
}
template <typename T>
inline T atomicAdd(T* p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}
template <typename T>
inline T atomicOr(T* p, T v) {
    T old = *p;
    *p = old | v;
    return old;
}
template <typename T>
inline T atomicMax(T* p, T v) {
    T old = *p;
    *p = old > v ? old : v;
    return old;
}
using std::fabs;
using std::fmax;
using std::fmin;
using std::isfinite;
using std::isnan;
using std::log2;
using std::round;

// glibc declares `finite`; the kernels define their own.
#define finite mdl_kernel_finite
#include "../kernels/mdl.cu"
#undef finite

// Kernels with the mistakes the emulator is there to catch, for its own tests (src/emu.rs).

// Half a warp waits at the block barrier, the other half at a warp barrier that needs it.
extern "C" void emu_test_deadlock(u32* out) {
    if (threadIdx.x < 16)
        __syncthreads();
    else
        __syncwarp();
    out[threadIdx.x] = 1;
}

// Lane 5 leaves before a shuffle that names every lane.
extern "C" void emu_test_exited_lane(u32* out) {
    if (threadIdx.x == 5) return;
    out[threadIdx.x] = __shfl_down_sync(0xffffffffu, (u32)threadIdx.x, 1);
}

// Writes one element past a buffer of blockDim.x.
extern "C" void emu_test_overrun(u32* out) {
    out[threadIdx.x + 1] = 1;
}

// Each thread reads its neighbour's shared value, with or without the barrier between the
// writes and the reads (blocks of 64 threads): out[t] = salt + (t + 1) % 64 only with it.
extern "C" void emu_test_neighbour(u32* out, u32 salt, int barrier) {
    __shared__ u32 s[64];
    s[threadIdx.x] = salt + threadIdx.x;
    if (barrier) __syncthreads();
    out[threadIdx.x] = s[(threadIdx.x + 1) % 64];
}

namespace mdl_emu {

// ---------------------------------------------------------------------------------------------
// Launching: a kernel's arguments come as pointers to their values (as cuLaunchKernel takes
// them); each kernel gets an invoker that reads them with its own parameter types.

template <typename A>
A as_arg(void* p) {
    A v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

template <typename... A, size_t... I>
void call(void (*f)(A...), void** args, std::index_sequence<I...>) {
    f(as_arg<A>(args[I])...);
}

template <typename... A>
void call(void (*f)(A...), void** args) {
    call(f, args, std::index_sequence_for<A...>{});
}

struct Kernel {
    const char* name;
    void (*invoke)(void**);
};

#define KERNEL(k) {#k, [](void** a) { call(&::k, a); }}
const Kernel KERNELS[] = {
    KERNEL(split_planes),     KERNEL(merge_planes),  KERNEL(byte_histogram),
    KERNEL(flag_bytes),       KERNEL(compact_nonzero), KERNEL(huff_lane_bits),
    KERNEL(huff_write),       KERNEL(copy_jobs),     KERNEL(huff_decode),
    KERNEL(sparse_scatter),   KERNEL(count_flags),   KERNEL(fill_bytes),
    KERNEL(max_abs),          KERNEL(key_stats),     KERNEL(assign_codes),
    KERNEL(protected_indices), KERNEL(code_pairs),   KERNEL(group_counts),
    KERNEL(group_starts),     KERNEL(group_scatter), KERNEL(error_chunks),
    KERNEL(residual_distance), KERNEL(residual_measure), KERNEL(residual_codes),
    KERNEL(residual_exact),   KERNEL(residual_scan),     KERNEL(residual_rebuild),
    KERNEL(second_moment_sum), KERNEL(blake3_chunks),
    KERNEL(blake3_parents),
    KERNEL(emu_test_deadlock), KERNEL(emu_test_exited_lane), KERNEL(emu_test_overrun),
    KERNEL(emu_test_neighbour),
};
#undef KERNEL

const Kernel* find(const char* name) {
    for (const Kernel& k : KERNELS)
        if (std::strcmp(k.name, name) == 0) return &k;
    return nullptr;
}

// Releases the warp collectives of warp w that are complete; false with `err` set when one can
// never complete.
bool release_warp(Launch& l, unsigned w, unsigned threads, bool& released, std::string& err) {
    unsigned first = w * 32, lanes = threads - first < 32 ? threads - first : 32;
    for (unsigned i = 0; i < lanes; i++) {
        Fiber& f = l.fibers[first + i];
        if (f.state != WAIT_WARP) continue;
        unsigned mask = f.mask;
        bool ready = true;
        for (unsigned j = 0; j < 32; j++) {
            if (!(mask >> j & 1)) continue;
            if (j >= lanes || l.fibers[first + j].state == DONE) {
                err = "thread " + std::to_string(first + i) + " waits in a warp collective " +
                      "whose mask names lane " + std::to_string(j) + ", which has exited";
                return false;
            }
            Fiber& g = l.fibers[first + j];
            if (g.state != WAIT_WARP) {
                ready = false;
                break;
            }
            if (g.op != f.op || g.mask != mask) {
                err = "lanes of warp " + std::to_string(w) +
                      " wait in different warp collectives";
                return false;
            }
        }
        if (!(mask >> i & 1)) {
            err = "thread " + std::to_string(first + i) +
                  " calls a warp collective whose mask leaves it out";
            return false;
        }
        if (!ready) continue;
        uint64_t v[32];
        for (unsigned j = 0; j < 32; j++)
            if (mask >> j & 1) v[j] = l.fibers[first + j].value;
        for (unsigned j = 0; j < 32; j++) {
            if (!(mask >> j & 1)) continue;
            Fiber& g = l.fibers[first + j];
            unsigned d = g.operand;
            switch (g.op) {
                case OP_SYNC:
                    g.result = 0;
                    break;
                case OP_SHFL_UP:
                case OP_SHFL_DOWN:
                case OP_SHFL_XOR: {
                    long src = g.op == OP_SHFL_UP     ? (long)j - (long)d
                               : g.op == OP_SHFL_DOWN ? (long)j + (long)d
                                                      : (long)(j ^ d);
                    if (src < 0 || src >= 32) {
                        g.result = v[j];
                    } else if (!(mask >> src & 1)) {
                        err = "a shuffle reads lane " + std::to_string(src) +
                              ", which is not in its mask";
                        return false;
                    } else {
                        g.result = v[src];
                    }
                    break;
                }
                case OP_MATCH_ANY: {
                    unsigned m = 0;
                    for (unsigned q = 0; q < 32; q++)
                        if ((mask >> q & 1) && v[q] == v[j]) m |= 1u << q;
                    g.result = m;
                    break;
                }
            }
            g.state = RUN;
        }
        released = true;
    }
    return true;
}

// Runs one block to the end; false with `err` set on a barrier that cannot be released.
bool run_block(Launch& l, unsigned threads, std::string& err) {
    for (unsigned t = 0; t < threads; t++) {
        l.fibers[t].state = RUN;
        l.fibers[t].tid = t;
        prepare(t);
    }
    for (;;) {
        for (unsigned t = 0; t < threads; t++)
            while (l.fibers[t].state == RUN) resume(t);
        unsigned live = 0, at_block = 0;
        for (unsigned t = 0; t < threads; t++) {
            live += l.fibers[t].state != DONE;
            at_block += l.fibers[t].state == WAIT_BLOCK;
        }
        if (live == 0) return true;
        if (at_block == live) {
            for (unsigned t = 0; t < threads; t++)
                if (l.fibers[t].state == WAIT_BLOCK) l.fibers[t].state = RUN;
            continue;
        }
        bool released = false;
        for (unsigned w = 0; w * 32 < threads; w++)
            if (!release_warp(l, w, threads, released, err)) return false;
        if (!released) {
            err = "deadlock: " + std::to_string(at_block) + " of " + std::to_string(live) +
                  " live threads wait at __syncthreads, the others in warp collectives";
            return false;
        }
    }
}

}  // namespace mdl_emu

extern "C" int mdl_emu_has(const char* name) {
    return mdl_emu::find(name) != nullptr;
}

// Runs kernel `name` over the grid; 0 when done, otherwise writes why into `err`.
extern "C" int mdl_emu_launch(const char* name, const unsigned grid[3], const unsigned block[3],
                              void** args, char* err, size_t err_len) {
    using namespace mdl_emu;
    std::lock_guard<std::mutex> guard(launch_lock);
    std::string why;
    const Kernel* k = find(name);
    unsigned threads = block[0] * block[1] * block[2];
    if (!k) {
        why = "no such kernel";
    } else if (block[1] != 1 || block[2] != 1 || grid[2] != 1) {
        why = "the emulator runs 1-D blocks on 2-D grids only";
    } else if (threads == 0 || threads > 1024) {
        why = "blocks hold 1 to 1024 threads";
    } else {
        Launch l;
        l.invoke = k->invoke;
        l.args = args;
        l.fibers.resize(threads);
        // Stacks are kept from launch to launch (allocated once, never touched but by fibers).
        static char* stacks = nullptr;
        static unsigned stack_count = 0;
        if (stack_count < threads) {
            delete[] stacks;
            stacks = new char[(size_t)threads * STACK];
            stack_count = threads;
        }
        l.stacks = stacks;
        run = &l;
        block_dim = uint3{block[0], 1, 1};
        grid_dim = uint3{grid[0], grid[1], 1};
        for (unsigned y = 0; y < grid[1] && why.empty(); y++)
            for (unsigned x = 0; x < grid[0] && why.empty(); x++) {
                block_idx = uint3{x, y, 0};
                if (!run_block(l, threads, why))
                    why = "block (" + std::to_string(x) + ", " + std::to_string(y) + "): " + why;
            }
        run = nullptr;
    }
    if (why.empty()) return 0;
    std::snprintf(err, err_len, "kernel %s: %s", name, why.c_str());
    return 1;
}
