//! A mixed-precision run's 16-bit weights as the cast of their fp32 master copy: codec
//! [`CodecTag::Cast`](crate::CodecTag::Cast). The record's base is the master (an `F32` tensor
//! of the same shape, twice the bytes); its payload lists the elements where the 16-bit tensor
//! is not the master rounded to nearest even, with their values:
//!
//! ```text
//! payload: count varint | count × index gap varint | count × value (2 bytes, little-endian)
//! ```
//!
//! The first gap is the first index; each later gap is at least 1. A weight copy a trainer
//! casts from its master has no exceptions, and its record is a few bytes (`docs/FORMAT.md`).

use mdl_format::{Dtype, FormatError};
use rayon::prelude::*;

use crate::scalar::{f32_to_bf16, f32_to_f16};
use crate::varint;

/// Elements cast a chunk on one core.
const CHUNK: usize = 1 << 16;

/// Whether a tensor of `dtype` can be stored as the cast of an `F32` master.
pub fn supports(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::BF16 | Dtype::F16)
}

/// `x` (an `f32`'s bits) cast to `dtype`, to nearest even.
#[inline]
fn cast_one(dtype: Dtype, x: u32) -> u16 {
    match dtype {
        Dtype::BF16 => f32_to_bf16(f32::from_bits(x)),
        _ => f32_to_f16(f32::from_bits(x)),
    }
}

fn f32_at(master: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(master[4 * i..4 * i + 4].try_into().expect("four bytes"))
}

fn u16_at(copy: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([copy[2 * i], copy[2 * i + 1]])
}

/// Whether element `i` of `copy` is not element `i` of `master` cast to `dtype`.
#[inline]
fn differs(dtype: Dtype, master: &[u8], copy: &[u8], i: usize) -> bool {
    cast_one(dtype, f32_at(master, i)) != u16_at(copy, i)
}

/// Checks that `master` (`F32`) and a `dtype` tensor of `len` bytes can be a cast pair.
fn check(dtype: Dtype, master: &[u8], len: usize) -> Result<(), FormatError> {
    if !supports(dtype) || !len.is_multiple_of(2) || master.len() != 2 * len {
        return Err(FormatError::invalid(
            "cast",
            "the base is not an F32 tensor of the same shape as a BF16 or F16 one",
        ));
    }
    Ok(())
}

/// Of `samples` elements spread evenly over `copy` (all of them in a smaller tensor), how
/// many differ from the master's cast, and how many were looked at: a commit's guess, before
/// it stores anything, at whether a copy is its master's cast.
pub fn sampled_exceptions(
    dtype: Dtype,
    master: &[u8],
    copy: &[u8],
    samples: usize,
) -> (usize, usize) {
    let n = copy.len() / 2;
    if check(dtype, master, copy.len()).is_err() || n == 0 {
        return (n, n);
    }
    let stride = n.div_ceil(samples.max(1)).max(1);
    let looked = n.div_ceil(stride);
    let differ = (0..looked)
        .map(|k| k * stride)
        .filter(|&i| differs(dtype, master, copy, i))
        .count();
    (differ, looked)
}

/// `master` (`F32`) cast to `dtype` into `out` (half its bytes).
pub fn cast_into(dtype: Dtype, master: &[u8], out: &mut [u8]) {
    assert!(check(dtype, master, out.len()).is_ok(), "a cast's sizes");
    (out.par_chunks_mut(2 * CHUNK))
        .zip(master.par_chunks(4 * CHUNK))
        .for_each(|(o, m)| {
            for (i, pair) in o.chunks_exact_mut(2).enumerate() {
                pair.copy_from_slice(&cast_one(dtype, f32_at(m, i)).to_le_bytes());
            }
        });
}

/// A copy that follows its master: `new_master` (`F32`) cast to `dtype` into `out`, except
/// where `copy` is not the cast of `old_master` (the master `copy` was made from): there
/// `copy`'s own value. What a lossy commit stores for the 16-bit copy of a master it quantized,
/// so that the two never disagree where the trainer kept them equal.
pub fn follow(dtype: Dtype, old_master: &[u8], new_master: &[u8], copy: &[u8], out: &mut [u8]) {
    assert!(
        check(dtype, old_master, copy.len()).is_ok() && new_master.len() == old_master.len(),
        "a cast's sizes"
    );
    cast_into(dtype, new_master, out);
    (out.par_chunks_mut(2 * CHUNK))
        .zip(copy.par_chunks(2 * CHUNK))
        .zip(old_master.par_chunks(4 * CHUNK))
        .for_each(|((o, c), m)| {
            for i in 0..c.len() / 2 {
                if differs(dtype, m, c, i) {
                    o[2 * i..2 * i + 2].copy_from_slice(&c[2 * i..2 * i + 2]);
                }
            }
        });
}

/// The payload that rebuilds `copy` (a `dtype` tensor) from `master` (`F32`, same shape): the
/// elements where it is not the master's cast.
pub fn encode(dtype: Dtype, master: &[u8], copy: &[u8]) -> Result<Vec<u8>, FormatError> {
    check(dtype, master, copy.len())?;
    let differ: Vec<Vec<usize>> = (copy.par_chunks(2 * CHUNK))
        .zip(master.par_chunks(4 * CHUNK))
        .enumerate()
        .map(|(k, (c, m))| {
            (0..c.len() / 2)
                .filter(|&i| differs(dtype, m, c, i))
                .map(|i| k * CHUNK + i)
                .collect()
        })
        .collect();
    let at: Vec<usize> = differ.into_iter().flatten().collect();
    let mut out = Vec::with_capacity(8 + 4 * at.len());
    varint::put(&mut out, at.len() as u64);
    let mut last = None;
    for &i in &at {
        varint::put(&mut out, last.map_or(i, |l: usize| i - l) as u64);
        last = Some(i);
    }
    for &i in &at {
        out.extend_from_slice(&u16_at(copy, i).to_le_bytes());
    }
    Ok(out)
}

/// Rebuilds a `dtype` tensor into `out` from `master` (`F32`, twice `out`'s bytes) and a
/// payload of [`encode`]. Any payload is safe to decode: one that does not describe
/// exceptions within the tensor is refused.
pub fn decode(
    dtype: Dtype,
    master: &[u8],
    payload: &[u8],
    out: &mut [u8],
) -> Result<(), FormatError> {
    check(dtype, master, out.len())?;
    let bad = |why: &str| FormatError::invalid("cast", why.to_string());
    let n = out.len() / 2;
    let mut at = 0;
    let count = varint::read(payload, &mut at).ok_or_else(|| bad("truncated count"))?;
    if count > n as u64 {
        return Err(bad("more exceptions than elements"));
    }
    let count = count as usize;
    let mut indices = Vec::with_capacity(count);
    let mut next = 0u64;
    for k in 0..count {
        let gap = varint::read(payload, &mut at).ok_or_else(|| bad("truncated index"))?;
        if k > 0 && gap == 0 {
            return Err(bad("an index given twice"));
        }
        next = next
            .checked_add(gap)
            .filter(|&i| i < n as u64)
            .ok_or_else(|| bad("an index past the tensor's end"))?;
        indices.push(next as usize);
    }
    if payload.len() - at != 2 * count {
        return Err(bad("values disagree with the count"));
    }
    cast_into(dtype, master, out);
    for (k, &i) in indices.iter().enumerate() {
        out[2 * i..2 * i + 2].copy_from_slice(&payload[at + 2 * k..at + 2 * k + 2]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn master(n: usize, seed: u32) -> Vec<u8> {
        (0..n as u32)
            .flat_map(|i| {
                let x = (i.wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 - 0.5;
                x.to_le_bytes()
            })
            .collect()
    }

    #[test]
    fn a_cast_copy_is_a_count_of_nothing_and_exceptions_round_trip() {
        for dtype in [Dtype::BF16, Dtype::F16] {
            let n = 3 * CHUNK + 17;
            let m = master(n, 7);
            let mut copy = vec![0u8; 2 * n];
            cast_into(dtype, &m, &mut copy);
            let payload = encode(dtype, &m, &copy).unwrap();
            assert_eq!(payload, [0]);
            // Exceptions at the ends and across chunk boundaries.
            for &i in &[0, 5, CHUNK - 1, CHUNK, 2 * CHUNK + 3, n - 1] {
                copy[2 * i] ^= 1;
            }
            assert_eq!(sampled_exceptions(dtype, &m, &copy, n), (6, n));
            let (differ, looked) = sampled_exceptions(dtype, &m, &copy, 1000);
            assert!(
                differ <= 6 && (990..=1010).contains(&looked),
                "{differ} of {looked}"
            );
            let payload = encode(dtype, &m, &copy).unwrap();
            let mut out = vec![0u8; 2 * n];
            decode(dtype, &m, &payload, &mut out).unwrap();
            assert!(out == copy);
        }
    }

    #[test]
    fn a_copy_follows_its_master_but_keeps_its_exceptions() {
        let n = CHUNK + 9;
        let (old, new) = (master(n, 3), master(n, 11));
        let mut copy = vec![0u8; 2 * n];
        cast_into(Dtype::BF16, &old, &mut copy);
        copy[2 * 4] ^= 1;
        let mut out = vec![0u8; 2 * n];
        follow(Dtype::BF16, &old, &new, &copy, &mut out);
        let mut cast_new = vec![0u8; 2 * n];
        cast_into(Dtype::BF16, &new, &mut cast_new);
        assert_eq!(out[8..10], copy[8..10]);
        assert_eq!(out[..8], cast_new[..8]);
        assert_eq!(out[10..], cast_new[10..]);
    }

    #[test]
    fn payloads_that_lie_are_refused() {
        let m = master(8, 1);
        let mut out = vec![0u8; 16];
        let d = Dtype::BF16;
        for bad in [
            &[][..],
            &[9][..],                         // more exceptions than elements
            &[1, 8, 0, 0][..],                // an index past the end
            &[2, 1, 0, 0, 0, 0, 0][..],       // an index given twice
            &[1, 1, 0][..],                   // a value cut short
            &[1, 1, 0, 0, 0][..],             // a byte too many
            &[1, 0x80, 0x80, 0x80, 0x80][..], // a truncated varint
        ] {
            assert!(decode(d, &m, bad, &mut out).is_err(), "{bad:?}");
        }
        assert!(
            decode(d, &m[..12], &[0], &mut out).is_err(),
            "a base too short"
        );
        assert!(decode(Dtype::F32, &m, &[0], &mut out).is_err());
    }
}
