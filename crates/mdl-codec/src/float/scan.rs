//! The comparing pass of a masked delta (`masked.rs`): which elements of a tensor differ from
//! its base, 64 at a time, and each changed element's delta words, taken while its bytes are in
//! cache. One read of the tensor and its base; where few elements changed (an RL step), a
//! group of 64 is compared with a handful of vector instructions.

use super::mask::Runs;
use crate::planes::SAMPLE;

/// What one pass over a tensor and its base finds: which elements changed (the flag bytes, how
/// often each flag byte value occurs, the same as runs), how many, and each changed element's
/// delta words in byte planes (byte `k` of every word in plane `k`), in element order.
pub(super) struct Scan {
    pub(super) flags: Vec<u8>,
    pub(super) counts: [u64; 256],
    pub(super) runs: Runs,
    pub(super) changed: usize,
    /// Planes of the zigzagged differences.
    pub(super) sub: Vec<Vec<u8>>,
    /// Planes of the XORs.
    pub(super) xor: Vec<Vec<u8>>,
}

/// Compares `data` with `base` (elements of `W` bytes) 64 elements at a time and takes the
/// changed elements' words while their bytes are in cache; `None` once more than `most`
/// changed (checked every [`SAMPLE`] elements, past half of those seen: a trained f32 tensor,
/// most of whose elements change, stops early).
pub(super) fn scan<const W: usize>(data: &[u8], base: &[u8], most: usize) -> Option<Scan> {
    let n = data.len() / W;
    let bits = 8 * W as u32;
    let mut flags = vec![0u8; n.div_ceil(8)];
    let mut runs = Runs::default();
    let (mut sub, mut xor) = (vec![Vec::new(); W], vec![Vec::new(); W]);
    let mut changed = 0usize;
    let mut counts = [0u64; 256];
    let group = 64 * W;
    let mut take = |mut mask: u64, d: &[u8], b: &[u8]| {
        while mask != 0 {
            let e = mask.trailing_zeros() as usize;
            let (v, u) = (word(&d[e * W..(e + 1) * W]), word(&b[e * W..(e + 1) * W]));
            let (z, x) = (zigzag(v.wrapping_sub(u), bits), v ^ u);
            for k in 0..W {
                sub[k].push((z >> (8 * k)) as u8);
                xor[k].push((x >> (8 * k)) as u8);
            }
            mask &= mask - 1;
        }
    };
    let whole = n / 64;
    for (g, ((d, b), f)) in data
        .chunks_exact(group)
        .zip(base.chunks_exact(group))
        .zip(flags.chunks_exact_mut(8))
        .enumerate()
    {
        let mask = differ::<W>(d, b);
        if mask == 0 {
            runs.zeros(8);
        } else {
            f.copy_from_slice(&mask.to_le_bytes());
            f.iter().for_each(|&x| counts[x as usize] += 1);
            runs.flags(f);
            changed += mask.count_ones() as usize;
            take(mask, d, b);
        }
        let seen = (g + 1) * 64;
        if seen % SAMPLE == 0 && changed > most.max(seen / 2) {
            return None;
        }
    }
    // The last elements, fewer than 64.
    let (d, b) = (&data[whole * group..], &base[whole * group..]);
    let mut mask = 0u64;
    for (e, (x, y)) in d.chunks_exact(W).zip(b.chunks_exact(W)).enumerate() {
        mask |= u64::from(x != y) << e;
    }
    let tail = &mut flags[whole * 8..];
    for (k, f) in tail.iter_mut().enumerate() {
        *f = (mask >> (8 * k)) as u8;
        counts[*f as usize] += 1;
    }
    runs.flags(tail);
    changed += mask.count_ones() as usize;
    take(mask, d, b);
    // Every flag byte of a group without changes is zero: counted at once.
    let counted: u64 = counts.iter().sum();
    counts[0] += flags.len() as u64 - counted;
    (changed <= most).then_some(Scan {
        flags,
        counts,
        runs,
        changed,
        sub,
        xor,
    })
}

/// Which of the 64 elements of `W` bytes in `d` differ from those in `b` (bit `e` for element
/// `e`; each slice 64·`W` bytes).
pub(super) fn differ<const W: usize>(d: &[u8], b: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if W == 2 {
        // SAFETY: SSE2 is part of the x86_64 baseline, so the function's one target feature is
        // present wherever this code runs; it reads its input through slices only.
        #[allow(unsafe_code)]
        return unsafe { differ_sse2(d, b) };
    }
    differ_words::<W>(d, b)
}

/// [`differ`] without vector instructions (and its reference in tests). Two-byte elements are
/// compared four to a word: a lane's high bit is set where any of its bits is, and a multiply
/// gathers the four high bits (its other products land on bits below 48, apart, so nothing
/// carries into them).
pub(super) fn differ_words<const W: usize>(d: &[u8], b: &[u8]) -> u64 {
    let mut mask = 0u64;
    if W == 2 {
        const LOW: u64 = 0x7fff_7fff_7fff_7fff;
        const GATHER: u64 = (1 << 48) | (1 << 33) | (1 << 18) | (1 << 3);
        for (k, (x, y)) in d.chunks_exact(8).zip(b.chunks_exact(8)).enumerate() {
            let v = word(x) ^ word(y);
            let high = (((v & LOW) + LOW) | v) & !LOW;
            mask |= (((high >> 15).wrapping_mul(GATHER) >> 48) & 0xf) << (4 * k);
        }
    } else {
        for (e, (x, y)) in d.chunks_exact(W).zip(b.chunks_exact(W)).enumerate() {
            mask |= u64::from(word(x) != word(y)) << e;
        }
    }
    mask
}

/// [`differ`] of two-byte elements (64 of them, 128 bytes), sixteen at a time: compared lane
/// by lane, the lanes' results packed to bytes and their high bits gathered.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn differ_sse2(d: &[u8], b: &[u8]) -> u64 {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi16, _mm_movemask_epi8, _mm_packs_epi16, _mm_set_epi64x,
    };
    let load =
        |x: &[u8]| -> __m128i { _mm_set_epi64x(word(&x[8..16]) as i64, word(&x[..8]) as i64) };
    let mut mask = 0u64;
    for (k, (x, y)) in d.chunks_exact(32).zip(b.chunks_exact(32)).enumerate() {
        let low = _mm_cmpeq_epi16(load(&x[..16]), load(&y[..16]));
        let high = _mm_cmpeq_epi16(load(&x[16..]), load(&y[16..]));
        let equal = _mm_movemask_epi8(_mm_packs_epi16(low, high)) as u32 as u64;
        mask |= (!equal & 0xffff) << (16 * k);
    }
    mask
}

/// The little-endian word of an element of up to 8 bytes.
pub(super) fn word(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(b)
}

/// `d` (a difference modulo `2^bits`, read as signed) zigzag-mapped: 0, −1, 1, −2 … to 0, 1, 2,
/// 3 …, within `bits`.
pub(super) fn zigzag(d: u64, bits: u32) -> u64 {
    let signed = ((d << (64 - bits)) as i64) >> (64 - bits);
    ((signed << 1) ^ (signed >> 63)) as u64 & low_bits(bits)
}

/// The difference (modulo `2^64`; the caller keeps the word's bits) of a zigzag-mapped `z`.
pub(super) fn unzigzag(z: u64) -> u64 {
    (z >> 1) ^ (z & 1).wrapping_neg()
}

pub(super) fn low_bits(bits: u32) -> u64 {
    u64::MAX >> (64 - bits)
}
