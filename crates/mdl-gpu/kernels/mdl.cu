// mdl's codec kernels. Compiled at run time by NVRTC (with --fmad=false, so every product is
// rounded before it is added, as on the CPU) or loaded from the committed PTX. Each kernel
// computes exactly what the CPU reference in mdl-codec computes: integer sums (order does not
// matter), floating-point sums in the CPU's fixed order, and coded bits defined by the symbols
// and the code alone. No headers: NVRTC has none by default.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

// ---------------------------------------------------------------------------------------------
// Scalars

// Element types, as the host numbers them.
#define DT_BF16 0
#define DT_F16 1
#define DT_F32 2

// Plane layouts: float planes of each dtype, then the zigzagged difference's byte planes.
#define K_BF16 0
#define K_F16 1
#define K_F32 2
#define K_F64 3
#define K_SUB16 4
#define K_SUB32 5
#define K_SUB64 6

__device__ __forceinline__ u16 load16(const u8* p, u64 i) {
    return (u16)p[2 * i] | ((u16)p[2 * i + 1] << 8);
}

__device__ __forceinline__ u32 load32(const u8* p, u64 i) {
    return (u32)p[4 * i] | ((u32)p[4 * i + 1] << 8) | ((u32)p[4 * i + 2] << 16) |
           ((u32)p[4 * i + 3] << 24);
}

__device__ __forceinline__ u64 load64(const u8* p, u64 i) {
    return (u64)load32(p, 2 * i) | ((u64)load32(p, 2 * i + 1) << 32);
}

__device__ __forceinline__ void store16(u8* p, u64 i, u16 v) {
    p[2 * i] = (u8)v;
    p[2 * i + 1] = (u8)(v >> 8);
}

__device__ __forceinline__ void store32(u8* p, u64 i, u32 v) {
    p[4 * i] = (u8)v;
    p[4 * i + 1] = (u8)(v >> 8);
    p[4 * i + 2] = (u8)(v >> 16);
    p[4 * i + 3] = (u8)(v >> 24);
}

__device__ __forceinline__ void store64(u8* p, u64 i, u64 v) {
    store32(p, 2 * i, (u32)v);
    store32(p, 2 * i + 1, (u32)(v >> 32));
}

// f16 bits to float, exactly (mdl-codec's scalar::f16_to_f32).
__device__ __forceinline__ float f16_to_f32(u16 h) {
    u32 sign = ((u32)(h & 0x8000)) << 16;
    u32 e = (h >> 10) & 0x1f;
    u32 man = h & 0x3ff;
    if (e == 0) {
        if (man == 0) return __uint_as_float(sign);
        float v = (float)man * __uint_as_float(0x33800000u);
        return sign ? -v : v;
    }
    if (e == 0x1f) return __uint_as_float(sign | 0x7f800000u | (man << 13));
    return __uint_as_float(sign | ((e + 112) << 23) | (man << 13));
}

// Element i as a double (scalar::value).
__device__ __forceinline__ double value_of(int dtype, const u8* p, u64 i) {
    if (dtype == DT_F32) return (double)__uint_as_float(load32(p, i));
    if (dtype == DT_BF16) return (double)__uint_as_float(((u32)load16(p, i)) << 16);
    return (double)f16_to_f32(load16(p, i));
}

// Element i's 16-bit key (scalar::key).
__device__ __forceinline__ u32 key_of(int dtype, const u8* p, u64 i) {
    if (dtype == DT_F32) return (u32)p[4 * i + 2] | ((u32)p[4 * i + 3] << 8);
    return load16(p, i);
}

__device__ __forceinline__ bool finite(double x) {
    return isfinite(x);
}

// ---------------------------------------------------------------------------------------------
// Float planes (mdl-codec float.rs). `planes` holds plane p at p * stride.

extern "C" __global__ void split_planes(const u8* data, const u8* base, u8* planes, u64 n,
                                        u64 stride, int kind, u64 mask) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        switch (kind) {
            case K_BF16: {
                u32 w = load16(data, i);
                if (base) w ^= load16(base, i) & (u32)mask;
                planes[i] = (u8)(w >> 7);
                planes[stride + i] = (u8)(((w >> 8) & 0x80) | (w & 0x7f));
                break;
            }
            case K_F16: {
                u32 w = load16(data, i);
                if (base) w ^= load16(base, i) & (u32)mask;
                planes[i] = (u8)((w >> 10) & 0x1f);
                planes[stride + i] = (u8)w;
                planes[2 * stride + i] = (u8)(((w >> 13) & 0x4) | ((w >> 8) & 0x3));
                break;
            }
            case K_F32: {
                u32 w = load32(data, i);
                if (base) w ^= load32(base, i) & (u32)mask;
                planes[i] = (u8)(w >> 23);
                planes[stride + i] = (u8)(((w >> 24) & 0x80) | ((w >> 16) & 0x7f));
                planes[2 * stride + i] = (u8)(w >> 8);
                planes[3 * stride + i] = (u8)w;
                break;
            }
            case K_F64: {
                u64 w = load64(data, i);
                if (base) w ^= load64(base, i) & mask;
                planes[i] = (u8)(w >> 52);
                planes[stride + i] = (u8)(((w >> 56) & 0xf0) | ((w >> 48) & 0x0f));
                for (int k = 0; k < 6; k++) planes[(2 + k) * stride + i] = (u8)(w >> (40 - 8 * k));
                break;
            }
            case K_SUB16: {
                u16 b = base ? load16(base, i) : 0;
                short d = (short)(u16)(load16(data, i) - b);
                u16 z = (u16)((d << 1) ^ (d >> 15));
                planes[i] = (u8)z;
                planes[stride + i] = (u8)(z >> 8);
                break;
            }
            case K_SUB32: {
                u32 b = base ? load32(base, i) : 0;
                int d = (int)(load32(data, i) - b);
                u32 z = (u32)((d << 1) ^ (d >> 31));
                for (int k = 0; k < 4; k++) planes[k * stride + i] = (u8)(z >> (8 * k));
                break;
            }
            case K_SUB64: {
                u64 b = base ? load64(base, i) : 0;
                i64 d = (i64)(load64(data, i) - b);
                u64 z = (u64)((d << 1) ^ (d >> 63));
                for (int k = 0; k < 8; k++) planes[k * stride + i] = (u8)(z >> (8 * k));
                break;
            }
        }
    }
}

extern "C" __global__ void merge_planes(const u8* planes, const u8* base, u8* out, u64 n,
                                        u64 stride, int kind, u64 mask) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        switch (kind) {
            case K_BF16: {
                u32 e = planes[i], m = planes[stride + i];
                u32 w = ((m & 0x80) << 8) | (e << 7) | (m & 0x7f);
                if (base) w ^= load16(base, i) & (u32)mask;
                store16(out, i, (u16)w);
                break;
            }
            case K_F16: {
                u32 e = planes[i] & 0x1f, lo = planes[stride + i], hi = planes[2 * stride + i];
                u32 w = ((hi & 0x4) << 13) | (e << 10) | ((hi & 0x3) << 8) | lo;
                if (base) w ^= load16(base, i) & (u32)mask;
                store16(out, i, (u16)w);
                break;
            }
            case K_F32: {
                u32 e = planes[i], hi = planes[stride + i], mid = planes[2 * stride + i],
                    lo = planes[3 * stride + i];
                u32 w = ((hi & 0x80) << 24) | (e << 23) | ((hi & 0x7f) << 16) | (mid << 8) | lo;
                if (base) w ^= load32(base, i) & (u32)mask;
                store32(out, i, w);
                break;
            }
            case K_F64: {
                u64 b1 = planes[stride + i];
                u64 w = ((b1 & 0xf0) << 56) | ((u64)planes[i] << 52) | ((b1 & 0x0f) << 48);
                for (int k = 0; k < 6; k++) w |= (u64)planes[(2 + k) * stride + i] << (40 - 8 * k);
                if (base) w ^= load64(base, i) & mask;
                store64(out, i, w);
                break;
            }
            case K_SUB16: {
                u16 z = (u16)planes[i] | ((u16)planes[stride + i] << 8);
                short d = (short)(z >> 1) ^ (short)(-(short)(z & 1));
                u16 b = base ? load16(base, i) : 0;
                store16(out, i, (u16)(b + (u16)d));
                break;
            }
            case K_SUB32: {
                u32 z = 0;
                for (int k = 0; k < 4; k++) z |= (u32)planes[k * stride + i] << (8 * k);
                int d = (int)(z >> 1) ^ -(int)(z & 1);
                u32 b = base ? load32(base, i) : 0;
                store32(out, i, b + (u32)d);
                break;
            }
            case K_SUB64: {
                u64 z = 0;
                for (int k = 0; k < 8; k++) z |= (u64)planes[k * stride + i] << (8 * k);
                i64 d = (i64)(z >> 1) ^ -(i64)(z & 1);
                u64 b = base ? load64(base, i) : 0;
                store64(out, i, b + (u64)d);
                break;
            }
        }
    }
}

// Counts one symbol per lane of a warp into the warp's own counters: lanes holding the same
// value are counted by one atomic, from the lowest of them, so a plane of few distinct values
// (the exponents) does not queue a warp on one counter. Every lane of the warp must call it;
// lanes with nothing to count pass `ok` false.
__device__ __forceinline__ void warp_count(u32* counts, u32 s, bool ok) {
    u32 peers = __match_any_sync(0xffffffffu, ok ? s : 256u);
    int lane = threadIdx.x & 31;
    if (ok && __ffs(peers) - 1 == lane) atomicAdd(&counts[s], (u32)__popc(peers));
}

// Adds a block's per-warp counters (HIST_WARPS copies of 256) into hist[256] in global memory.
#define HIST_WARPS 8
__device__ __forceinline__ void flush_counts(u32 (*local)[256], u64* hist) {
    __syncthreads();
    for (int s = threadIdx.x; s < 256; s += blockDim.x) {
        u32 t = 0;
        for (int w = 0; w < HIST_WARPS; w++) t += local[w][s];
        if (t) atomicAdd(&hist[s], (u64)t);
    }
}

// Byte histograms of `planes` planes of n symbols (grid.y = plane): hist[p * 256 + s]. Blocks
// of one warp (HIST_THREADS); each thread counts into its own column of the block's counters in
// shared memory (counts[s][thread]: a thread's counters lie in its own bank, so no two threads
// contend and no atomic or warp vote is needed however alike the symbols are), reading four
// words ahead of counting them (planes start 8-aligned; a warp reads 32 consecutive words); the
// columns are summed at the end.
#define HIST_THREADS 32
extern "C" __global__ void byte_histogram(const u8* planes, u64 n, u64 stride, u64* hist) {
    __shared__ u32 counts[256][HIST_THREADS];
    int t = threadIdx.x;
    for (int s = 0; s < 256; s++) counts[s][t] = 0;
    const u8* p = planes + blockIdx.y * stride;
    const u64* words = (const u64*)p;
    u64 nw = n / 8, step = (u64)gridDim.x * HIST_THREADS;
    u64 i = blockIdx.x * (u64)HIST_THREADS + t;
    for (; i + 3 * step < nw; i += 4 * step) {
        u64 v[4];
        for (int q = 0; q < 4; q++) v[q] = words[i + q * step];
        for (int q = 0; q < 4; q++)
            for (int b = 0; b < 8; b++) counts[(v[q] >> (8 * b)) & 255u][t]++;
    }
    for (; i < nw; i += step) {
        u64 v = words[i];
        for (int b = 0; b < 8; b++) counts[(v >> (8 * b)) & 255u][t]++;
    }
    // The last n % 8 symbols.
    if (blockIdx.x == 0 && (u64)t < n % 8) counts[p[nw * 8 + t]][t]++;
    __syncwarp();
    for (int s = t; s < 256; s += HIST_THREADS) {
        u32 total = 0;
        for (int c = 0; c < HIST_THREADS; c++) total += counts[s][c];
        if (total) atomicAdd(&hist[blockIdx.y * 256 + s], (u64)total);
    }
}

// Sparse mode's flag byte of symbols 8g..8g+7 (bit k: symbol 8g + k is not zero).
__device__ __forceinline__ u8 flag_byte(const u8* p, u64 g, u64 n) {
    u8 f = 0;
    for (int k = 0; k < 8; k++) {
        u64 i = 8 * g + k;
        if (i < n && p[i]) f |= (u8)(1 << k);
    }
    return f;
}

// Writes the flag bytes of each plane (grid.y = plane) to flags + p * fstride, and counts them
// into hist[p * 256 + f] when hist is given. Chunks hold a multiple of 8 symbols, so flags taken
// from the plane's start are the flags of each chunk.
extern "C" __global__ void flag_bytes(const u8* planes, u64 n, u64 stride, u8* flags,
                                      u64 fstride, u64* hist) {
    __shared__ u32 local[HIST_WARPS][256];
    for (int s = threadIdx.x; s < HIST_WARPS * 256; s += blockDim.x) local[s / 256][s % 256] = 0;
    __syncthreads();
    const u8* p = planes + blockIdx.y * stride;
    u32* mine = local[threadIdx.x >> 5];
    u64 groups = (n + 7) / 8, step = (u64)gridDim.x * blockDim.x;
    for (u64 g0 = blockIdx.x * (u64)blockDim.x + (threadIdx.x & ~31u); g0 < groups; g0 += step) {
        u64 g = g0 + (threadIdx.x & 31);
        bool ok = g < groups;
        u8 f = ok ? flag_byte(p, g, n) : 0;
        if (ok && flags) flags[blockIdx.y * fstride + g] = f;
        if (hist) warp_count(mine, f, ok);
    }
    if (hist) flush_counts(local, hist + blockIdx.y * 256);
}

// ---------------------------------------------------------------------------------------------
// Block-wide exclusive scan of one u64 per thread (blockDim.x a multiple of 32, at most 1024).

__device__ u64 block_exclusive_scan(u64 v, u64* total) {
    __shared__ u64 warp_sums[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u64 x = v;
    for (int d = 1; d < 32; d <<= 1) {
        u64 y = __shfl_up_sync(0xffffffffu, x, d);
        if (lane >= d) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    int warps = blockDim.x >> 5;
    if (warp == 0) {
        u64 s = lane < warps ? warp_sums[lane] : 0;
        for (int d = 1; d < 32; d <<= 1) {
            u64 y = __shfl_up_sync(0xffffffffu, s, d);
            if (lane >= d) s += y;
        }
        warp_sums[lane] = s;  // inclusive
    }
    __syncthreads();
    u64 before = (warp > 0 ? warp_sums[warp - 1] : 0) + x - v;
    if (total) *total = warp_sums[warps - 1];
    __syncthreads();
    return before;
}

// Sparse mode's non-zero symbols, per chunk (grid.x = chunk, grid.y = plane), in order: chunk c
// of plane p writes its nnz[p * chunks + c] values from values + p * stride + c * chunk_len.
extern "C" __global__ void compact_nonzero(const u8* planes, u64 n, u64 stride, u64 chunk_len,
                                           u8* values, u64* nnz) {
    u64 c = blockIdx.x, chunks = gridDim.x;
    const u8* p = planes + blockIdx.y * stride + c * chunk_len;
    u8* v = values + blockIdx.y * stride + c * chunk_len;
    u64 len = n - c * chunk_len < chunk_len ? n - c * chunk_len : chunk_len;
    u64 per = (len + blockDim.x - 1) / blockDim.x;
    u64 lo = threadIdx.x * per, hi = lo + per < len ? lo + per : len;
    u64 count = 0;
    for (u64 i = lo; i < hi; i++) count += p[i] != 0;
    u64 total;
    u64 at = block_exclusive_scan(count, &total);
    for (u64 i = lo; i < hi; i++)
        if (p[i]) v[at++] = p[i];
    if (threadIdx.x == 0) nnz[blockIdx.y * chunks + c] = total;
}

// ---------------------------------------------------------------------------------------------
// Huffman chunks (mdl-codec huffman/chunk.rs). A chunk's symbols are split into `lanes`
// contiguous lanes of ceil(n / lanes) symbols (the last ones take what remains), each an
// independent bit stream, least significant bit first, zero-padded to a whole byte, after a table
// of every lane's byte length but the last's: 32 lanes with u16 lengths (format 10 on, what both
// engines write), or 4 lanes with u32 lengths (formats 1-9, still read).
//
// A segment is one chunk to code (always 32 lanes): 4 u64 words per segment in `segs`:
//   [0] offset of its symbols in `symbols`, [1] symbol count, [2] code table index,
//   [3] unused.
// Tables: `codes[t * 256 + s]` is (bit-reversed code) | length << 16.

#define WIDE_LANES 32

__device__ __forceinline__ void lane_range(u64 n, int lanes, int k, u64* lo, u64* hi) {
    u64 q = (n + lanes - 1) / lanes;
    u64 a = k * q, b = (k + 1) * q;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}

// Bits of each lane: bits[seg * 32 + k] (grid.x = segment, grid.y = lane).
extern "C" __global__ void huff_lane_bits(const u8* symbols, const u64* segs, const u32* codes,
                                          u64* bits) {
    const u64* s = segs + 4 * blockIdx.x;
    const u8* sym = symbols + s[0];
    const u32* table = codes + s[2] * 256;
    u64 lo, hi;
    lane_range(s[1], WIDE_LANES, blockIdx.y, &lo, &hi);
    u64 sum = 0;
    for (u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) sum += table[sym[i]] >> 16;
    u64 total;
    block_exclusive_scan(sum, &total);
    if (threadIdx.x == 0) bits[blockIdx.x * WIDE_LANES + blockIdx.y] = total;
}

// Writes each lane's bits at its byte offset: lane_at[seg * 32 + k] (grid as huff_lane_bits).
// `out` is zeroed beforehand and 4-byte aligned; threads OR whole 32-bit words in.
extern "C" __global__ void huff_write(const u8* symbols, const u64* segs, const u32* codes,
                                      const u64* lane_at, u8* out) {
    const u64* s = segs + 4 * blockIdx.x;
    const u8* sym = symbols + s[0];
    const u32* table = codes + s[2] * 256;
    u64 lo, hi;
    lane_range(s[1], WIDE_LANES, blockIdx.y, &lo, &hi);
    u64 len = hi - lo;
    u64 per = (len + blockDim.x - 1) / blockDim.x;
    u64 a = lo + threadIdx.x * per;
    u64 b = a + per < hi ? a + per : hi;
    if (a > hi) a = hi;
    u64 mine = 0;
    for (u64 i = a; i < b; i++) mine += table[sym[i]] >> 16;
    u64 start = block_exclusive_scan(mine, 0);
    u64 bit = lane_at[blockIdx.x * WIDE_LANES + blockIdx.y] * 8 + start;
    u32* words = (u32*)out;
    // Accumulate from the word that holds `bit`, flushing whole words.
    u64 word = bit / 32;
    u32 used = (u32)(bit % 32);
    u64 acc = 0;
    for (u64 i = a; i < b; i++) {
        u32 e = table[sym[i]];
        u32 l = e >> 16;
        acc |= (u64)(e & 0xffff) << used;
        used += l;
        if (used >= 32) {
            atomicOr(&words[word], (u32)acc);
            word++;
            acc >>= 32;
            used -= 32;
        }
    }
    if (used > 0) atomicOr(&words[word], (u32)acc);
}

// Copies stored chunks: 3 u64 per job (source offset, length, destination offset).
extern "C" __global__ void copy_jobs(const u8* src, const u64* jobs, u8* dst) {
    const u64* j = jobs + 3 * blockIdx.x;
    for (u64 i = threadIdx.x; i < j[1]; i += blockDim.x) dst[j[2] + i] = src[j[0] + i];
}

// Decodes one lane per thread (32 threads a job, those past the job's lanes idle). A job is 6
// u64 words:
//   [0] offset of the chunk's bytes in `in`, [1] the chunk's length in bytes, [2] symbol count,
//       or, when [3] has bit 63 set, the index into `counts` of the count
//   [3] decoder table index (low 32 bits), [4] output offset in `out`, [5] lanes (4 or 32).
// Tables: `tables[t * 4096 + bits]` is symbol | length << 8 (length 0: no code).
// Any inconsistency sets *err (the host then decodes on the CPU, which says what is wrong).
extern "C" __global__ void huff_decode(const u8* in, const u64* jobs, u64 njobs,
                                       const u16* tables, const u64* counts, u8* out, int* err) {
    u64 t = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (t >= njobs * WIDE_LANES) return;
    const u64* j = jobs + 6 * (t / WIDE_LANES);
    int k = (int)(t % WIDE_LANES);
    int lanes = (int)j[5];
    if (k >= lanes) return;
    // Lane length table entries: u32 for 4 lanes, u16 for 32.
    int width = lanes == 4 ? 4 : 2;
    const u8* chunk = in + j[0];
    u64 bytes = j[1];
    u64 n = (j[3] >> 63) ? counts[j[2]] : j[2];
    const u16* table = tables + (j[3] & 0xffffffffu) * 4096;
    u64 table_len = (u64)width * (lanes - 1);
    if (bytes < table_len) {
        atomicOr(err, 1);
        return;
    }
    // This lane's byte range from the chunk's table of lane lengths.
    u64 at = table_len, lane_lo = 0, lane_len = 0;
    for (int q = 0; q <= k; q++) {
        u64 len;
        if (q < lanes - 1) {
            len = 0;
            for (int b = 0; b < width; b++) len |= (u64)chunk[q * width + b] << (8 * b);
        } else {
            len = at <= bytes ? bytes - at : 0;
        }
        if (at + len > bytes) {
            atomicOr(err, 1);
            return;
        }
        lane_lo = at;
        lane_len = len;
        at += len;
    }
    const u8* lane = chunk + lane_lo;
    u64 lo, hi;
    lane_range(n, lanes, k, &lo, &hi);
    u8* o = out + j[4];
    u64 total_bits = lane_len * 8, pos = 0;
    // The lane's next bits, least significant first, refilled a byte at a time when fewer
    // than 16 are left (a lookup takes at most 12), so each byte is loaded once; bytes past
    // the lane read as zeros, as the CPU's decoder pads them.
    u64 window = 0, next = 0;
    int have = 0;
    // Symbols leave four at a time, as one aligned word, where the lane's output is aligned.
    u8* dst = o + lo;
    bool packed = (((unsigned long long)dst) & 3) == 0;
    u32 acc = 0;
    int held = 0;
    for (u64 i = lo; i < hi; i++) {
        if (have < 16) {
            do {
                u64 b = next < lane_len ? (u64)lane[next] : 0;
                window |= b << have;
                have += 8;
                next++;
            } while (have <= 56);
        }
        u16 e = table[window & 4095];
        u32 l = e >> 8;
        if (l == 0 || pos + l > total_bits) {
            atomicOr(err, 1);
            return;
        }
        if (packed) {
            acc |= (u32)(u8)e << (8 * held);
            if (++held == 4) {
                *(u32*)(dst + (i - lo) - 3) = acc;
                acc = 0;
                held = 0;
            }
        } else {
            o[i] = (u8)e;
        }
        window >>= l;
        have -= (int)l;
        pos += l;
    }
    for (int b = 0; b < held; b++) dst[(hi - lo) - held + b] = (u8)(acc >> (8 * b));
    if ((pos + 7) / 8 != lane_len) atomicOr(err, 1);
}

// Sparse chunks: places the decoded non-zero values at the positions their flags mark (grid.x =
// job; 4 u64 per job: flags offset in `flags`, values offset in `values`, output offset, symbol
// count), zeros elsewhere. A flag past the end or a zero value is an error, as on the CPU.
extern "C" __global__ void sparse_scatter(const u8* flags, const u8* values, const u64* jobs,
                                          const u64* counts, u8* out, int* err) {
    const u64* j = jobs + 4 * blockIdx.x;
    const u8* f = flags + j[0];
    const u8* v = values + j[1];
    u8* o = out + j[2];
    u64 n = j[3];
    u64 groups = (n + 7) / 8;
    u64 per = (groups + blockDim.x - 1) / blockDim.x;
    u64 lo = threadIdx.x * per, hi = lo + per < groups ? lo + per : groups;
    if (lo > groups) lo = groups;
    u64 mine = 0;
    for (u64 g = lo; g < hi; g++) mine += __popc(f[g]);
    u64 total;
    u64 at = block_exclusive_scan(mine, &total);
    if (threadIdx.x == 0 && total != counts[blockIdx.x]) atomicOr(err, 1);
    for (u64 g = lo; g < hi; g++) {
        for (int b = 0; b < 8; b++) {
            u64 i = 8 * g + b;
            if (f[g] & (1 << b)) {
                if (i >= n || at >= counts[blockIdx.x] || v[at] == 0) {
                    atomicOr(err, 1);
                    return;
                }
                o[i] = v[at++];
            } else if (i < n) {
                o[i] = 0;
            }
        }
    }
}

// Counts the set flags of each sparse chunk: counts[job] (grid.x = job; 2 u64 per job: flags
// offset and flag-byte count).
extern "C" __global__ void count_flags(const u8* flags, const u64* jobs, u64* counts) {
    const u64* j = jobs + 2 * blockIdx.x;
    u64 mine = 0;
    for (u64 g = threadIdx.x; g < j[1]; g += blockDim.x) mine += __popc(flags[j[0] + g]);
    u64 total;
    block_exclusive_scan(mine, &total);
    if (threadIdx.x == 0) counts[blockIdx.x] = total;
}

// ---------------------------------------------------------------------------------------------
// Lossy kernels (mdl-codec engine.rs).

// Largest finite |value| as the bits of a non-negative double (their order is the unsigned
// integers' order, so atomicMax finds it exactly).
extern "C" __global__ void max_abs(const u8* p, u64 n, int dtype, u64* out) {
    u64 best = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        double x = fabs(value_of(dtype, p, i));
        if (finite(x)) {
            u64 b = (u64)__double_as_longlong(x);
            best = b > best ? b : best;
        }
    }
    for (int d = 16; d > 0; d >>= 1) {
        u64 o = __shfl_down_sync(0xffffffffu, best, d);
        best = o > best ? o : best;
    }
    if ((threadIdx.x & 31) == 0) atomicMax(out, best);
}

// Truncation toward zero of x * scale, as Rust's `as i64` (the scales keep it in range).
__device__ __forceinline__ u64 fix(double x, double scale) {
    return (u64)(i64)__dmul_rn(x, scale);
}

// The 16-bit-key histogram with fixed-point sums: count[k], acc[k * 8 + j] (wrapping i64 adds,
// so any order gives the same integers). Sums: w, w², m, m·w, v, v·w, v·w², |m·w|.
extern "C" __global__ void key_stats(const u8* w, const u8* m, const u8* v, u64 n, int dtype,
                                     int mdtype, int vdtype, const double* sc, u64* count,
                                     u64* acc) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        u32 k = key_of(dtype, w, i);
        atomicAdd(&count[k], 1ull);
        double x = value_of(dtype, w, i);
        if (!finite(x)) continue;
        u64* a = acc + 8 * (u64)k;
        atomicAdd(&a[0], fix(x, sc[0]));
        atomicAdd(&a[1], fix(__dmul_rn(x, x), sc[1]));
        if (m) {
            double mm = value_of(mdtype, m, i), vv = value_of(vdtype, v, i);
            if (finite(mm) && finite(vv)) {
                double mw = __dmul_rn(mm, x), vw = __dmul_rn(vv, x);
                atomicAdd(&a[2], fix(mm, sc[2]));
                atomicAdd(&a[3], fix(mw, sc[3]));
                atomicAdd(&a[4], fix(vv, sc[4]));
                atomicAdd(&a[5], fix(vw, sc[5]));
                atomicAdd(&a[6], fix(__dmul_rn(vw, x), sc[6]));
                atomicAdd(&a[7], fix(fabs(mw), sc[7]));
            }
        }
    }
}

// The second moment's fixed-point sum over the elements where the weight and both moments are
// finite (mdl-codec's mean_second_moment): wrapping i64 adds, so any order gives the same sum.
extern "C" __global__ void second_moment_sum(const u8* w, const u8* m, const u8* v, u64 n,
                                             int dtype, int mdtype, int vdtype, double sc,
                                             u64* out) {
    u64 t = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        double x = value_of(dtype, w, i), mm = value_of(mdtype, m, i), vv = value_of(vdtype, v, i);
        if (finite(x) && finite(mm) && finite(vv)) t += fix(vv, sc);
    }
    for (int d = 16; d > 0; d >>= 1) t += __shfl_down_sync(0xffffffffu, t, d);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, t);
}

// Codes by key, and a flag per element for protected keys. Tiles of `tile` elements: protected
// counts per tile in tile_protected[blockIdx.x] (for the ordered compaction below).
extern "C" __global__ void assign_codes(const u8* w, u64 n, int dtype, const u8* code,
                                        const u8* protect, u8* codes, u64 tile,
                                        u64* tile_protected) {
    u64 lo = blockIdx.x * tile, hi = lo + tile < n ? lo + tile : n;
    u64 mine = 0;
    for (u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        u32 k = key_of(dtype, w, i);
        codes[i] = code[k];
        mine += protect[k];
    }
    u64 total;
    block_exclusive_scan(mine, &total);
    if (threadIdx.x == 0) tile_protected[blockIdx.x] = total;
}

// Writes the protected indices of each tile, ascending, from tile_start[blockIdx.x] on.
extern "C" __global__ void protected_indices(const u8* w, u64 n, int dtype, const u8* protect,
                                             u64 tile, const u64* tile_start, u64* out) {
    u64 lo = blockIdx.x * tile, hi = lo + tile < n ? lo + tile : n;
    u64 per = (tile + blockDim.x - 1) / blockDim.x;
    u64 a = lo + threadIdx.x * per, b = a + per < hi ? a + per : hi;
    if (a > hi) a = hi;
    u64 mine = 0;
    for (u64 i = a; i < b; i++) mine += protect[key_of(dtype, w, i)];
    u64 at = tile_start[blockIdx.x] + block_exclusive_scan(mine, 0);
    for (u64 i = a; i < b; i++)
        if (protect[key_of(dtype, w, i)]) out[at++] = i;
}

// Counts of (base code, code by key) pairs: count[b * bins + c]. Shared memory per block when
// the table fits (cells ≤ 8192), global atomics otherwise.
extern "C" __global__ void code_pairs(const u8* w, u64 n, int dtype, const u8* code,
                                      const u8* base, u64 bins, u64 cells, u64* count) {
    __shared__ u32 local[8192];
    bool shared = cells <= 8192;
    if (shared) {
        for (u64 c = threadIdx.x; c < cells; c += blockDim.x) local[c] = 0;
        __syncthreads();
    }
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        u64 cell = base[i] * bins + code[key_of(dtype, w, i)];
        if (shared)
            atomicAdd(&local[cell], 1u);
        else
            atomicAdd(&count[cell], 1ull);
    }
    if (shared) {
        __syncthreads();
        for (u64 c = threadIdx.x; c < cells; c += blockDim.x)
            if (local[c]) atomicAdd(&count[c], (u64)local[c]);
    }
}

// Stable counting sort by base code, in tiles of GROUP_TILE elements, one warp a tile.
#define GROUP_TILE 4096

// Per tile, elements per base code: tile_counts[g * tiles + tile].
extern "C" __global__ void group_counts(const u8* base, u64 n, u64 tiles, u32* tile_counts) {
    __shared__ u32 local[256];
    for (int s = threadIdx.x; s < 256; s += blockDim.x) local[s] = 0;
    __syncthreads();
    u64 lo = blockIdx.x * (u64)GROUP_TILE, hi = lo + GROUP_TILE < n ? lo + GROUP_TILE : n;
    for (u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) atomicAdd(&local[base[i]], 1u);
    __syncthreads();
    for (int s = threadIdx.x; s < 256; s += blockDim.x) tile_counts[s * tiles + blockIdx.x] = local[s];
}

// In place: tile_counts becomes each (group, tile)'s start in the grouped order. One block of
// 256 threads; thread g scans group g's tiles, then the group totals are scanned.
extern "C" __global__ void group_starts(u64 tiles, u32* tile_counts, u64* starts) {
    __shared__ u64 totals[256];
    int g = threadIdx.x;
    u64 sum = 0;
    for (u64 t = 0; t < tiles; t++) {
        u32 c = tile_counts[g * tiles + t];
        tile_counts[g * tiles + t] = (u32)sum;
        sum += c;
    }
    totals[g] = sum;
    __syncthreads();
    if (g == 0) {
        u64 at = 0;
        for (int k = 0; k < 256; k++) {
            u64 c = totals[k];
            totals[k] = at;
            at += c;
        }
    }
    __syncthreads();
    starts[g] = totals[g];
}

// Writes the grouped order (one warp a tile): element i of group g goes to starts[g] + the
// tile's offset within group g + its rank among the tile's earlier elements of group g. Forward:
// out[pos] = (base - cur) mod modulus; inverse: out[i] = (base - deltas[pos]) mod modulus.
extern "C" __global__ void group_scatter(const u8* base, const u8* cur, u64 n, u64 tiles,
                                         const u32* tile_offsets, const u64* starts, u32 modulus,
                                         int inverse, const u8* deltas, u8* out) {
    __shared__ u32 seen_all[8][256];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    u64 tile = blockIdx.x * 8 + warp;
    u32* seen = seen_all[warp];
    for (int s = lane; s < 256; s += 32) seen[s] = 0;
    __syncwarp();
    if (tile >= tiles) return;
    u64 lo = tile * GROUP_TILE, hi = lo + GROUP_TILE < n ? lo + GROUP_TILE : n;
    for (u64 r = lo; r < hi; r += 32) {
        u64 i = r + lane;
        bool live = i < hi;
        u32 g = live ? base[i] : 256 + lane;  // dead lanes match nobody
        u32 peers = __match_any_sync(0xffffffffu, g);
        u32 rank = __popc(peers & ((1u << lane) - 1));
        u32 before = live ? seen[g] : 0;
        __syncwarp();
        if (live && rank == 0) seen[g] = before + __popc(peers);
        __syncwarp();
        if (live) {
            u64 pos = starts[g] + tile_offsets[g * tiles + tile] + before + rank;
            u32 b = g;
            if (!inverse) {
                out[pos] = (u8)((b + modulus - cur[i]) % modulus);
            } else {
                u32 d = deltas[pos] % modulus;
                out[i] = (u8)((b + modulus - d) % modulus);
            }
        }
    }
}

// Error of a reconstruction, one thread per chunk of `chunk` elements summing in index order
// (the CPU's order): 5 doubles per chunk (max |d|, Σd², Σx², Σm·d, Σv·d²).
extern "C" __global__ void error_chunks(const u8* orig, const u8* recon, const u8* m,
                                        const u8* v, u64 n, int dtype, int mdtype, int vdtype,
                                        u64 chunk, u64 chunks, double* out) {
    u64 c = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (c >= chunks) return;
    u64 lo = c * chunk, hi = lo + chunk < n ? lo + chunk : n;
    double mx = 0, se = 0, sq = 0, md = 0, vd = 0;
    for (u64 i = lo; i < hi; i++) {
        double x = value_of(dtype, orig, i), y = value_of(dtype, recon, i);
        if (!finite(x) || !finite(y)) continue;
        double d = __dsub_rn(y, x);
        double ad = fabs(d);
        mx = ad > mx ? ad : mx;
        se = __dadd_rn(se, __dmul_rn(d, d));
        sq = __dadd_rn(sq, __dmul_rn(x, x));
        if (m) {
            double mm = value_of(mdtype, m, i), vv = value_of(vdtype, v, i);
            if (finite(mm) && finite(vv)) {
                md = __dadd_rn(md, __dmul_rn(mm, d));
                vd = __dadd_rn(vd, __dmul_rn(__dmul_rn(vv, d), d));
            }
        }
    }
    double* o = out + 5 * c;
    o[0] = mx;
    o[1] = se;
    o[2] = sq;
    o[3] = md;
    o[4] = vd;
}

// Fills n bytes with v (constant planes).
extern "C" __global__ void fill_bytes(u8* p, u64 n, u32 v) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x)
        p[i] = (u8)v;
}

// ---------------------------------------------------------------------------------------------
// Residual quantization (mdl-codec residual/mod.rs). A quantizer is one step's parameters:
// qp[0] the stored parameter (step, or 2^step in log mode), qp[1] its inverse, qp[2] log2 of it
// (only a guess's divisor), then in log mode 253 factors 2^(q·step) (q = -126…126) and 254
// thresholds 2^((j - 127 + ½)·step), all built on the host.

#define RM_LINEAR 0
#define RM_LOG 1
#define RM_SCALED 2
#define R_EXACT 0xffffu
#define R_ZERO 0xfffeu
#define R_MAX_STEPS 32766
#define R_MAX_MOMENT 126
#define R_QUANT 510  // doubles per quantizer
#define R_BLOCK 1024
#define R_CHUNK 65536
#define R_TILE 4096

// f32 to bf16 bits, rounding to nearest even (scalar::f32_to_bf16).
__device__ __forceinline__ u16 f32_to_bf16(float x) {
    u32 bits = __float_as_uint(x);
    if (x != x) return (u16)((bits >> 16) | 0x40);
    return (u16)((bits + 0x7fffu + ((bits >> 16) & 1)) >> 16);
}

// f32 to f16 bits, rounding to nearest even (scalar::f32_to_f16).
__device__ u16 f32_to_f16(float x) {
    u32 bits = __float_as_uint(x);
    u16 sign = (u16)((bits >> 16) & 0x8000);
    int exp = (int)((bits >> 23) & 0xff);
    u32 man = bits & 0x7fffff;
    if (exp == 0xff) return sign | 0x7c00 | (man ? 0x200 : 0);
    int e = exp - 127 + 15;
    if (e >= 0x1f) return sign | 0x7c00;
    if (e <= 0) {
        if (e < -10) return sign;
        u32 m = man | 0x800000;
        u32 shift = (u32)(14 - e);
        u32 half = 1u << (shift - 1);
        u32 rest = m & ((1u << shift) - 1);
        u32 r = m >> shift;
        if (rest > half || (rest == half && (r & 1))) r++;
        return sign | (u16)r;
    }
    u32 r = ((u32)e << 10) | (man >> 13);
    u32 rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (r & 1))) r++;
    return sign | (u16)r;
}

// x rounded to the dtype's bits (scalar::put_rounded's bits).
__device__ __forceinline__ u32 rounded_bits(int dtype, double x) {
    float f = __double2float_rn(x);
    if (dtype == DT_F32) return __float_as_uint(f);
    if (dtype == DT_BF16) return f32_to_bf16(f);
    return f32_to_f16(f);
}

// The value of the dtype's bits (as value_of).
__device__ __forceinline__ double bits_value(int dtype, u32 b) {
    if (dtype == DT_F32) return (double)__uint_as_float(b);
    if (dtype == DT_BF16) return (double)__uint_as_float(b << 16);
    return (double)f16_to_f32((u16)b);
}

__device__ __forceinline__ void store_bits(int dtype, u8* p, u64 i, u32 b) {
    if (dtype == DT_F32)
        store32(p, i, b);
    else
        store16(p, i, (u16)b);
}

// The log-mode step count of a ratio (residual::log_code): the thresholds decide.
__device__ double log_code(double ratio, double log_param, const double* t) {
    const i64 top = R_MAX_MOMENT + 1;
    double guess = round(log2(ratio) / log_param);
    i64 q = isnan(guess) ? 0 : (i64)fmin(fmax(guess, -(double)top), (double)top);
    while (q > -top && ratio < t[q - 1 + top]) q--;
    while (q < top && ratio >= t[q + top]) q++;
    return (double)q;
}

// The decoder's value of code c against reference r (residual::Quantizer::value).
__device__ __forceinline__ double residual_value(int mode, const double* qp, double r, u32 c) {
    if (c == R_ZERO) return 0.0;
    i64 cc = (i64)c;
    i64 k = (cc >> 1) ^ -(cc & 1);
    if (mode == RM_LINEAR) return __dadd_rn(r, __dmul_rn((double)k, qp[0]));
    if (mode == RM_LOG) return __dmul_rn(r, qp[3 + k + R_MAX_MOMENT]);
    return __dmul_rn(__dmul_rn((double)k, qp[0]), __dsqrt_rn(r));
}

// One element's code (residual::Quantizer::code): R_EXACT when it is kept exactly, else the
// code with the reconstruction's bits in *y.
__device__ u32 residual_code(int mode, const double* qp, int dtype, double x, double r, u32* y) {
    if (!finite(x) || !finite(r)) return R_EXACT;
    double t;
    if (mode == RM_LINEAR) {
        t = round(__dmul_rn(__dsub_rn(x, r), qp[1]));
    } else if (mode == RM_LOG) {
        if (x == 0.0) {
            *y = 0;
            return R_ZERO;
        }
        if (x < 0.0 || r <= 0.0) return R_EXACT;
        t = log_code(__ddiv_rn(x, r), qp[2], qp + 3 + 2 * R_MAX_MOMENT + 1);
    } else {
        if (r < 0.0) return R_EXACT;
        if (x == 0.0) {
            *y = 0;
            return 0;
        }
        if (r == 0.0) return R_EXACT;
        t = round(__ddiv_rn(x, __dmul_rn(qp[0], __dsqrt_rn(r))));
    }
    double max = mode == RM_LINEAR ? (double)R_MAX_STEPS : (double)R_MAX_MOMENT;
    if (isnan(t) || fabs(t) > max) return R_EXACT;
    i64 q = (i64)t;
    u32 c = (u32)(u16)((q << 1) ^ (q >> 63));
    u32 b = rounded_bits(dtype, residual_value(mode, qp, r, c));
    if (!finite(bits_value(dtype, b))) return R_EXACT;
    *y = b;
    return c;
}

// The sum of a warp's lanes in residual::lane_sum's order (the upper half onto the lower).
__device__ __forceinline__ double lane_sum(double v) {
    for (int d = 16; d > 0; d >>= 1) v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, d));
    return v;
}

// residual::distance_sq, a chunk a block of 32 warps: warp w sums the chunk's blocks w and
// w + 32 in lanes, thread 0 adds the blocks in order into sums[chunk].
extern "C" __global__ void residual_distance(const u8* x, const u8* ref, u64 n, int dtype,
                                             double* sums) {
    __shared__ double blocks[R_CHUNK / R_BLOCK];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    u64 chunk = blockIdx.x;
    for (int j = warp; j < R_CHUNK / R_BLOCK; j += blockDim.x >> 5) {
        u64 start = chunk * R_CHUNK + (u64)j * R_BLOCK;
        double s = 0;
        for (u64 i = start + lane; i < start + R_BLOCK && i < n; i += 32) {
            double d = __dsub_rn(value_of(dtype, x, i), ref ? value_of(dtype, ref, i) : 0.0);
            if (finite(d)) s = __dadd_rn(s, __dmul_rn(d, d));
        }
        s = lane_sum(s);
        if (lane == 0) blocks[j] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0;
        for (int j = 0; j < R_CHUNK / R_BLOCK; j++)
            if (chunk * R_CHUNK + (u64)j * R_BLOCK < n) s = __dadd_rn(s, blocks[j]);
        sums[chunk] = s;
    }
}

// residual::measure_steps (grid.x = chunk, grid.y = step; 32 warps a block): warp w measures
// the chunk's blocks w and w + 32 that the sample takes (block j when j % every == 0), lane l
// its elements l, l + 32, … as residual::LANES does; thread 0 adds the blocks in order into
// err[(step * chunks + chunk) * 5] (as error_chunks: max |d|, Σd², Σx², Σm·d, Σv·d²). Counts go to
// hist[step * 513 + …]: 256 low bytes, 256 high bytes (codes 256 … ZERO), the exact count.
extern "C" __global__ void residual_measure(const u8* x, const u8* ref, const u8* m,
                                            const u8* v, u64 n, int dtype, int mdtype,
                                            int vdtype, int mode, const double* quants,
                                            u64 every, double* err, u64* hist) {
    __shared__ double blocks[R_CHUNK / R_BLOCK][5];
    __shared__ u32 low[256], high[256], exact;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    u64 chunk = blockIdx.x, step = blockIdx.y, chunks = gridDim.x;
    const double* qp = quants + step * R_QUANT;
    for (int s = threadIdx.x; s < 256; s += blockDim.x) low[s] = high[s] = 0;
    if (threadIdx.x == 0) exact = 0;
    __syncthreads();
    for (int j = warp; j < R_CHUNK / R_BLOCK; j += blockDim.x >> 5) {
        u64 start = chunk * R_CHUNK + (u64)j * R_BLOCK;
        if (j % every != 0 || start >= n) continue;
        double sq = 0, se = 0, mx = 0, md = 0, vd = 0;
        for (u64 i = start + lane; i < start + R_BLOCK && i < n; i += 32) {
            double xi = value_of(dtype, x, i), ri = ref ? value_of(dtype, ref, i) : 0.0;
            if (finite(xi)) sq = __dadd_rn(sq, __dmul_rn(xi, xi));
            u32 yb = 0;
            u32 c = residual_code(mode, qp, dtype, xi, ri, &yb);
            if (c == R_EXACT) {
                atomicAdd(&low[255], 1u);
                atomicAdd(&exact, 1u);
                continue;
            }
            atomicAdd(&low[c & 255], 1u);
            if (c >= 256 && c < R_ZERO) atomicAdd(&high[c >> 8], 1u);
            double d = __dsub_rn(bits_value(dtype, yb), xi);
            se = __dadd_rn(se, __dmul_rn(d, d));
            mx = fmax(mx, fabs(d));
            if (m) {
                md = __dadd_rn(md, __dmul_rn(value_of(mdtype, m, i), d));
                vd = __dadd_rn(vd, __dmul_rn(__dmul_rn(value_of(vdtype, v, i), d), d));
            }
        }
        sq = lane_sum(sq);
        se = lane_sum(se);
        md = lane_sum(md);
        vd = lane_sum(vd);
        for (int d = 16; d > 0; d >>= 1) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, d));
        if (lane == 0) {
            blocks[j][0] = sq;
            blocks[j][1] = se;
            blocks[j][2] = mx;
            blocks[j][3] = md;
            blocks[j][4] = vd;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double e[5] = {0, 0, 0, 0, 0};
        for (int j = 0; j < R_CHUNK / R_BLOCK; j++) {
            if (j % every != 0 || chunk * R_CHUNK + (u64)j * R_BLOCK >= n) continue;
            e[0] = __dadd_rn(e[0], blocks[j][0]);
            e[1] = __dadd_rn(e[1], blocks[j][1]);
            e[2] = fmax(e[2], blocks[j][2]);
            e[3] = __dadd_rn(e[3], blocks[j][3]);
            e[4] = __dadd_rn(e[4], blocks[j][4]);
        }
        // In error_chunks' order: max |d|, Σd², Σx², Σm·d, Σv·d².
        double* o = err + (step * chunks + chunk) * 5;
        o[0] = e[2];
        o[1] = e[1];
        o[2] = e[0];
        o[3] = e[3];
        o[4] = e[4];
    }
    u64* h = hist + step * 513;
    for (int s = threadIdx.x; s < 256; s += blockDim.x) {
        if (low[s]) atomicAdd(&h[s], (u64)low[s]);
        if (high[s]) atomicAdd(&h[256 + s], (u64)high[s]);
    }
    if (threadIdx.x == 0 && exact) atomicAdd(&h[512], (u64)exact);
}

// residual::encode's codes and reconstruction (one block a tile of R_TILE elements): the codes'
// low bytes at planes[i] and high bytes at planes[stride + i], the reconstruction (or, for an
// exact element, its own bits) into out; *wide set when a code needs the high bytes (neither
// below 254 nor special); tile_exact[tile] counts the tile's exact elements.
extern "C" __global__ void residual_codes(const u8* x, const u8* ref, u64 n, int dtype, int mode,
                                          const double* qp, u8* planes, u64 stride, u8* out,
                                          u32* wide, u64* tile_exact) {
    u64 lo = blockIdx.x * (u64)R_TILE, hi = lo + R_TILE < n ? lo + R_TILE : n;
    u64 mine = 0;
    u32 w = 0;
    for (u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        double xi = value_of(dtype, x, i), ri = ref ? value_of(dtype, ref, i) : 0.0;
        u32 yb = 0;
        u32 c = residual_code(mode, qp, dtype, xi, ri, &yb);
        if (c == R_EXACT) {
            mine++;
            yb = dtype == DT_F32 ? load32(x, i) : load16(x, i);
        }
        w |= c >= 254 && c < R_ZERO;
        planes[i] = (u8)c;
        planes[stride + i] = (u8)(c >> 8);
        store_bits(dtype, out, i, yb);
    }
    if (w) atomicOr(wide, 1u);
    u64 total;
    block_exclusive_scan(mine, &total);
    if (threadIdx.x == 0) tile_exact[blockIdx.x] = total;
}

// Gathers the exact elements' bits, tile by tile in element order, from tile_start[tile] on
// (code bytes 255 and 255).
extern "C" __global__ void residual_exact(const u8* x, u64 n, int dtype, const u8* planes,
                                          u64 stride, const u64* tile_start, u8* values) {
    u64 lo = blockIdx.x * (u64)R_TILE, hi = lo + R_TILE < n ? lo + R_TILE : n;
    u64 per = (R_TILE + blockDim.x - 1) / blockDim.x;
    u64 a = lo + threadIdx.x * per, b = a + per < hi ? a + per : hi;
    if (a > hi) a = hi;
    u64 mine = 0;
    for (u64 i = a; i < b; i++) mine += planes[i] == 255 && planes[stride + i] == 255;
    u64 at = tile_start[blockIdx.x] + block_exclusive_scan(mine, 0);
    for (u64 i = a; i < b; i++) {
        if (planes[i] != 255 || planes[stride + i] != 255) continue;
        if (dtype == DT_F32)
            store32(values, at++, load32(x, i));
        else
            store16(values, at++, load16(x, i));
    }
}

// The code of element i as a payload stores it: the low and high bytes, or with one plane
// (high null) the low byte, 254 and 255 standing for R_ZERO and R_EXACT.
__device__ __forceinline__ u32 code_at(const u8* low, const u8* high, u64 i) {
    u32 l = low[i];
    if (high) return l | ((u32)high[i] << 8);
    return l >= 254 ? (0xff00u | l) : l;
}

// residual::decode's look at every code (one block a tile of R_TILE elements): tile_exact[tile]
// counts the tile's exact codes; *bad is set when a moment code (moment != 0) is beyond its
// mode's range.
extern "C" __global__ void residual_scan(const u8* low, const u8* high, u64 n, int moment,
                                         u64* tile_exact, u32* bad) {
    u64 lo = blockIdx.x * (u64)R_TILE, hi = lo + R_TILE < n ? lo + R_TILE : n;
    u64 mine = 0;
    u32 wide = 0;
    for (u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        u32 c = code_at(low, high, i);
        mine += c == R_EXACT;
        i64 k = ((i64)c >> 1) ^ -((i64)c & 1);
        wide |= moment && c < R_ZERO && (k > R_MAX_MOMENT || k < -R_MAX_MOMENT);
    }
    if (wide) atomicOr(bad, 1u);
    u64 total;
    block_exclusive_scan(mine, &total);
    if (threadIdx.x == 0) tile_exact[blockIdx.x] = total;
}

// residual::decode's elements (one block a tile, a run of elements a thread): each from its
// code and the reference (none: 0) as residual::Quantizer::value, rounded to the dtype, or
// for R_EXACT the next exact value, the tile's from tile_start[tile] on.
extern "C" __global__ void residual_rebuild(const u8* low, const u8* high, u64 n, int dtype,
                                            int mode, const double* qp, const u8* ref,
                                            const u8* exact, const u64* tile_start, u8* out) {
    u64 lo = blockIdx.x * (u64)R_TILE, hi = lo + R_TILE < n ? lo + R_TILE : n;
    u64 per = (R_TILE + blockDim.x - 1) / blockDim.x;
    u64 a = lo + threadIdx.x * per, b = a + per < hi ? a + per : hi;
    if (a > hi) a = hi;
    u64 mine = 0;
    for (u64 i = a; i < b; i++) mine += code_at(low, high, i) == R_EXACT;
    u64 at = tile_start[blockIdx.x] + block_exclusive_scan(mine, 0);
    for (u64 i = a; i < b; i++) {
        u32 c = code_at(low, high, i);
        if (c == R_EXACT) {
            if (dtype == DT_F32)
                store32(out, i, load32(exact, at++));
            else
                store16(out, i, load16(exact, at++));
            continue;
        }
        double r = ref ? value_of(dtype, ref, i) : 0.0;
        store_bits(dtype, out, i, rounded_bits(dtype, residual_value(mode, qp, r, c)));
    }
}

// ---------------------------------------------------------------------------------------------
// BLAKE3 (hash mode) of `prefix || data`: a tensor's id (mdl-format's TensorHasher hashes the
// header's canonical prefix, then the bytes). Chunks of 1,024 bytes are compressed one a thread
// (blake3_chunks), then each level of the tree is one launch pairing neighbours (blake3_parents);
// the node that ends a level with no partner moves up as it is, which builds BLAKE3's
// left-balanced tree. The last compression (a lone chunk, or the top parent) carries the root
// flag; the id is its first 8 words, little-endian.

#define B3_CHUNK_START 1u
#define B3_CHUNK_END 2u
#define B3_PARENT 4u
#define B3_ROOT 8u

__device__ __forceinline__ u32 b3_iv(int i) {
    switch (i) {
        case 0: return 0x6A09E667u;
        case 1: return 0xBB67AE85u;
        case 2: return 0x3C6EF372u;
        case 3: return 0xA54FF53Au;
        case 4: return 0x510E527Fu;
        case 5: return 0x9B05688Cu;
        case 6: return 0x1F83D9ABu;
        default: return 0x5BE0CD19u;
    }
}

__device__ __forceinline__ u32 b3_rotr(u32 x, int r) {
    return (x >> r) | (x << (32 - r));
}

__device__ __forceinline__ void b3_g(u32* v, int a, int b, int c, int d, u32 x, u32 y) {
    v[a] = v[a] + v[b] + x;
    v[d] = b3_rotr(v[d] ^ v[a], 16);
    v[c] = v[c] + v[d];
    v[b] = b3_rotr(v[b] ^ v[c], 12);
    v[a] = v[a] + v[b] + y;
    v[d] = b3_rotr(v[d] ^ v[a], 8);
    v[c] = v[c] + v[d];
    v[b] = b3_rotr(v[b] ^ v[c], 7);
}

// The compression function: cv (8 words) becomes the chaining value of block m (16 words).
__device__ void b3_compress(u32* cv, const u32* block, u64 counter, u32 len, u32 flags) {
    u32 v[16], m[16], t[16];
    for (int i = 0; i < 8; i++) v[i] = cv[i];
    for (int i = 0; i < 4; i++) v[8 + i] = b3_iv(i);
    v[12] = (u32)counter;
    v[13] = (u32)(counter >> 32);
    v[14] = len;
    v[15] = flags;
    for (int i = 0; i < 16; i++) m[i] = block[i];
    for (int r = 0; r < 7; r++) {
        b3_g(v, 0, 4, 8, 12, m[0], m[1]);
        b3_g(v, 1, 5, 9, 13, m[2], m[3]);
        b3_g(v, 2, 6, 10, 14, m[4], m[5]);
        b3_g(v, 3, 7, 11, 15, m[6], m[7]);
        b3_g(v, 0, 5, 10, 15, m[8], m[9]);
        b3_g(v, 1, 6, 11, 12, m[10], m[11]);
        b3_g(v, 2, 7, 8, 13, m[12], m[13]);
        b3_g(v, 3, 4, 9, 14, m[14], m[15]);
        // The message permutation between rounds.
        const int perm[16] = {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8};
        for (int i = 0; i < 16; i++) t[i] = m[perm[i]];
        for (int i = 0; i < 16; i++) m[i] = t[i];
    }
    for (int i = 0; i < 8; i++) cv[i] = v[i] ^ v[i + 8];
}

// Byte j of prefix || data.
__device__ __forceinline__ u32 b3_byte(const u8* prefix, u64 plen, const u8* data, u64 j) {
    return j < plen ? prefix[j] : data[j - plen];
}

// The chaining value of each chunk of prefix || data (total bytes, `chunks` of them, at least
// one) into cvs[8 * c]; with `root` set (a single chunk) the last block carries the root flag.
extern "C" __global__ void blake3_chunks(const u8* prefix, u64 plen, const u8* data, u64 total,
                                         u64 chunks, u32 root, u32* cvs) {
    u64 c = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (c >= chunks) return;
    u64 lo = c * 1024, hi = lo + 1024 < total ? lo + 1024 : total;
    u32 cv[8], block[16];
    for (int i = 0; i < 8; i++) cv[i] = b3_iv(i);
    // An empty input is one chunk of one empty block.
    int blocks = hi > lo ? (int)((hi - lo + 63) / 64) : 1;
    for (int b = 0; b < blocks; b++) {
        u64 at = lo + 64 * (u64)b;
        u32 len = hi - at < 64 ? (u32)(hi - at) : 64u;
        if (at >= plen && len == 64) {
            const u8* d = data + (at - plen);
            for (int i = 0; i < 16; i++) block[i] = load32(d, i);
        } else {
            for (int i = 0; i < 16; i++) {
                u32 w = 0;
                for (int k = 0; k < 4; k++) {
                    u32 o = 4 * i + k;
                    if (o < len) w |= b3_byte(prefix, plen, data, at + o) << (8 * k);
                }
                block[i] = w;
            }
        }
        u32 flags = (b == 0 ? B3_CHUNK_START : 0u) | (b == blocks - 1 ? B3_CHUNK_END : 0u);
        if (root && b == blocks - 1) flags |= B3_ROOT;
        b3_compress(cv, block, c, len, flags);
    }
    for (int i = 0; i < 8; i++) cvs[8 * c + i] = cv[i];
}

// One level of the tree: out[i] is the parent of in[2i] and in[2i + 1], or in[2i] itself when
// it has no partner (n nodes of 8 words in). With `root` set (n == 2) the parent is the root.
extern "C" __global__ void blake3_parents(const u32* in, u64 n, u32 root, u32* out) {
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i >= (n + 1) / 2) return;
    u32 cv[8];
    if (2 * i + 1 < n) {
        for (int k = 0; k < 8; k++) cv[k] = b3_iv(k);
        b3_compress(cv, in + 16 * i, 0, 64, B3_PARENT | (root ? B3_ROOT : 0u));
    } else {
        for (int k = 0; k < 8; k++) cv[k] = in[16 * i + k];
    }
    for (int k = 0; k < 8; k++) out[8 * i + k] = cv[k];
}
