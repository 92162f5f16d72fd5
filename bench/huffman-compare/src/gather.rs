//! A prototype beside mdl's decoder: wide chunks decoded with AVX2 gathers, a symbol a lane a
//! step, all 32 lanes of a chunk interleaved (four registers of eight lanes), then transposed
//! into the lanes' order. It answers whether the CPU should decode the warp layout with SIMD
//! the way a GPU does (docs/DECISIONS.md, "Wide chunks on the CPU: scalar rounds, not
//! gathers"); whole chunks only, and no checks of damaged input — not a decoder for mdl.

use std::arch::x86_64::*;

use mdl_codec::huffman::Lanes;

/// Lanes of a wide chunk, and the symbols of a whole chunk.
const LANES: usize = 32;

/// Decodes the whole chunk `bytes` (a wide chunk of `out.len()` symbols, a multiple of 32)
/// with `table` (mdl's lookup table: `symbol | length << 8` for the next 12 bits) into `out`, with `tmp` (as long as `out`) for the lanes' interleaved symbols.
pub fn decode_chunk(
    table: &[u32; 4096],
    bytes: &[u8],
    padded: &mut Vec<u8>,
    tmp: &mut [u8],
    out: &mut [u8],
) {
    let q = out.len() / LANES;
    let mut starts = [0u32; LANES];
    let mut at = Lanes::Wide.table_len() as u32;
    for (k, s) in starts.iter_mut().enumerate() {
        *s = at;
        if k + 1 < LANES {
            at += u16::from_le_bytes([bytes[2 * k], bytes[2 * k + 1]]) as u32;
        }
    }
    // Every gather reads 4 bytes at a lane's byte position, which stays inside its own lane
    // for a valid chunk: 8 bytes of zeros after the last lane cover the last reads.
    padded.clear();
    padded.extend_from_slice(bytes);
    padded.extend_from_slice(&[0u8; 8]);
    assert!(is_x86_feature_detected!("avx2"));
    // SAFETY: AVX2 is present (checked above); `padded` covers every read of a valid chunk
    // and `tmp` holds q * 32 symbols.
    unsafe { decode32(padded, &starts, q, table, tmp) };
    for k in 0..LANES {
        for (s, o) in out[k * q..(k + 1) * q].iter_mut().enumerate() {
            *o = tmp[s * LANES + k];
        }
    }
}

/// `q` steps of all 32 lanes: lane k's stream starts at byte `starts[k]` of `bytes`; its
/// symbol of step s goes to `tmp[s * 32 + k]`.
#[target_feature(enable = "avx2")]
unsafe fn decode32(
    bytes: &[u8],
    starts: &[u32; LANES],
    q: usize,
    table: &[u32; 4096],
    tmp: &mut [u8],
) {
    assert!(tmp.len() >= q * LANES);
    let b = bytes.as_ptr() as *const i32;
    let t = table.as_ptr() as *const i32;
    let base: [__m256i; 4] = std::array::from_fn(|g| unsafe {
        _mm256_loadu_si256(starts.as_ptr().add(8 * g) as *const __m256i)
    });
    let mut pos = [_mm256_setzero_si256(); 4];
    let mask = _mm256_set1_epi32(0xfff);
    let seven = _mm256_set1_epi32(7);
    // The low byte of each 32-bit entry, packed into the first four bytes of each half.
    let pack = _mm256_setr_epi8(
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, //
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    );
    let out = tmp.as_mut_ptr();
    for step in 0..q {
        let mut e = [_mm256_setzero_si256(); 4];
        for g in 0..4 {
            let at = _mm256_add_epi32(base[g], _mm256_srli_epi32::<3>(pos[g]));
            let word = unsafe { _mm256_i32gather_epi32::<1>(b, at) };
            let shifted = _mm256_srlv_epi32(word, _mm256_and_si256(pos[g], seven));
            let idx = _mm256_and_si256(shifted, mask);
            e[g] = unsafe { _mm256_i32gather_epi32::<4>(t, idx) };
        }
        for g in 0..4 {
            pos[g] = _mm256_add_epi32(pos[g], _mm256_srli_epi32::<8>(e[g]));
            let s = _mm256_shuffle_epi8(e[g], pack);
            let packed =
                _mm_unpacklo_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
            unsafe { _mm_storel_epi64(out.add(step * LANES + 8 * g) as *mut __m128i, packed) };
        }
    }
}
