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

/// Elements a part of a long tensor that one thread compares (and the most of which a quarter
/// may change): a multiple of [`SAMPLE`] and of 64.
const PART: usize = 1 << 21;

/// Compares `data` with `base` (elements of `W` bytes) 64 elements at a time and takes the
/// changed elements' words while their bytes are in cache; `None` once more than `most`
/// changed (checked every [`SAMPLE`] elements, past half of those seen: a trained f32 tensor,
/// most of whose elements change, stops early). A tensor of more than two [`PART`]s is
/// compared a part at a time in parallel, each part held to a quarter of its own elements
/// changed at most (whatever the threads, the same parts and the same result).
pub(super) fn scan<const W: usize>(data: &[u8], base: &[u8], most: usize) -> Option<Scan> {
    use rayon::prelude::*;
    let n = data.len() / W;
    let mut flags = vec![0u8; n.div_ceil(8)];
    let parts: Vec<Option<Part>> = match n >= 2 * PART {
        false => vec![part::<W>(data, base, most, &mut flags)],
        true => (data.par_chunks(PART * W))
            .zip(base.par_chunks(PART * W))
            .zip(flags.par_chunks_mut(PART / 8))
            .map(|((d, b), f)| part::<W>(d, b, d.len() / W / 4, f))
            .collect(),
    };
    let mut whole = Part::new(W);
    for p in parts {
        whole.append(p?);
    }
    let Part {
        mut counts,
        runs,
        changed,
        sub,
        xor,
    } = whole;
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

/// What the comparing pass finds in a part of a tensor (its flag bytes written in place; the
/// counts only of the groups of 64 with changes).
struct Part {
    counts: [u64; 256],
    runs: Runs,
    changed: usize,
    sub: Vec<Vec<u8>>,
    xor: Vec<Vec<u8>>,
}

impl Part {
    fn new(width: usize) -> Part {
        Part {
            counts: [0; 256],
            runs: Runs::default(),
            changed: 0,
            sub: vec![Vec::new(); width],
            xor: vec![Vec::new(); width],
        }
    }

    /// What the next part found, after this one's.
    fn append(&mut self, next: Part) {
        self.counts
            .iter_mut()
            .zip(next.counts)
            .for_each(|(c, n)| *c += n);
        self.runs.append(next.runs);
        self.changed += next.changed;
        for (planes, more) in [(&mut self.sub, next.sub), (&mut self.xor, next.xor)] {
            for (p, m) in planes.iter_mut().zip(more) {
                match p.is_empty() {
                    true => *p = m,
                    false => p.extend_from_slice(&m),
                }
            }
        }
    }
}

/// [`scan`] of one part into its flag bytes `flags` (zeros).
fn part<const W: usize>(data: &[u8], base: &[u8], most: usize, flags: &mut [u8]) -> Option<Part> {
    let n = data.len() / W;
    let bits = 8 * W as u32;
    let Part {
        mut counts,
        mut runs,
        mut changed,
        mut sub,
        mut xor,
    } = Part::new(W);
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
    (changed <= most).then_some(Part {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A long tensor compared in parts on many threads gives what one pass over it gives:
    /// changes on both sides of parts' edges and at the very end.
    #[test]
    fn parts_compared_in_parallel_give_what_one_pass_gives() {
        let n = 3 * PART + 12_345;
        let base: Vec<u8> = (0..n)
            .flat_map(|i| (0x3c00 + (i % 777) as u16).to_le_bytes())
            .collect();
        let mut data = base.clone();
        let change = |data: &mut [u8], i: usize| data[2 * i] ^= 1 + (i % 5) as u8;
        (0..PART).step_by(37).for_each(|i| change(&mut data, i));
        for edge in [PART, 3 * PART] {
            (edge - 700..edge + 3).for_each(|i| change(&mut data, i));
        }
        change(&mut data, n - 1);
        let parallel = scan::<2>(&data, &base, n).unwrap();
        let mut flags = vec![0u8; n.div_ceil(8)];
        let mut one = part::<2>(&data, &base, n, &mut flags).unwrap();
        let counted: u64 = one.counts.iter().sum();
        one.counts[0] += flags.len() as u64 - counted;
        assert_eq!(parallel.flags, flags);
        assert_eq!(parallel.counts, one.counts);
        assert_eq!(parallel.runs, one.runs);
        assert_eq!(parallel.changed, one.changed);
        assert_eq!((parallel.sub, parallel.xor), (one.sub, one.xor));
        // Held to a quarter a part: a part with more changed is no masked delta.
        (2 * PART..2 * PART + PART / 3).for_each(|i| change(&mut data, i));
        assert!(scan::<2>(&data, &base, n).is_none());
    }
}
