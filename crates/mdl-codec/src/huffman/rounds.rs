//! The decoder's inner loop without bounds checks: rounds of four lookups in each lane of a
//! group, as many as the lanes' input and output are sure to hold whatever the table says.
//!
//! This is one of the few places `unsafe` is allowed (docs/DECISIONS.md, "The coder's inner
//! loop without bounds checks"): the bound is worked out and checked before the loop, so a
//! damaged stream only ever produces wrong symbols (caught by the lanes' length check and the
//! content id), never a read or write outside the slices. `group::tests` compares it with the
//! checked reference loop on random and damaged input; the fuzz targets and Miri run it too.

#![allow(unsafe_code)]

use super::{TABLE_MASK, TABLE_SIZE};

/// Bits a lookup may consume, at most, whatever the table holds: its length field is 4 bits.
const MAX_BITS: u64 = 15;
/// Symbols a lookup may advance by, at most: its count field is 3 bits.
const MAX_COUNT: usize = 7;
/// Lookups a round makes in each lane: 4 × 15 bits stay inside the 57 fresh bits of a window.
const LOOKUPS: usize = 4;

/// How many rounds fit in every lane of the group from where it stands: a round reads 8 bytes
/// from byte `pos / 8` and advances by at most 60 bits (so the next reads at most 8 bytes
/// further); each lookup stores 8 bytes at `done` and advances by at most 7.
#[inline(always)]
fn rounds_that_fit<const G: usize>(
    streams: &[&[u8]; G],
    outs: &[&mut [u8]; G],
    pos: &[u64; G],
    done: &[usize; G],
) -> usize {
    let mut rounds = usize::MAX;
    for k in 0..G {
        let need = (pos[k] / 8) as usize + 8;
        let fit = match streams[k].len().checked_sub(need) {
            Some(spare) => spare / 8 + 1,
            None => 0,
        };
        // Round r's last store ends at done + 28r + 21 + 8, inside the lane's output.
        let per_round = LOOKUPS * MAX_COUNT;
        let last_store = (LOOKUPS - 1) * MAX_COUNT + 8;
        let room = match outs[k].len().checked_sub(done[k] + last_store) {
            Some(spare) => spare / per_round + 1,
            None => 0,
        };
        rounds = rounds.min(fit).min(room);
    }
    rounds
}

/// Decodes `G` lanes in rounds while every lane has room for one more; returns
/// whether a lookup met a bit pattern no code starts with (count 0). `multi` entries are
/// `symbols (5 bytes) | bits << 40 | count << 48`.
#[inline(always)]
pub(super) fn decode_rounds<const G: usize>(
    multi: &[u64; TABLE_SIZE],
    streams: [&[u8]; G],
    outs: &mut [&mut [u8]; G],
    pos: &mut [u64; G],
    done: &mut [usize; G],
) -> bool {
    let mut invalid = false;
    loop {
        let rounds = rounds_that_fit(&streams, outs, pos, done);
        // A pattern no code starts with consumes nothing: stop at the first batch that met one.
        if rounds == 0 || invalid {
            return invalid;
        }
        let src: [*const u8; G] = std::array::from_fn(|k| streams[k].as_ptr());
        let dst: [*mut u8; G] = std::array::from_fn(|k| outs[k].as_mut_ptr());
        for _ in 0..rounds {
            let mut window = [0u64; G];
            for k in 0..G {
                let at = (pos[k] / 8) as usize;
                debug_assert!(at + 8 <= streams[k].len());
                // SAFETY: `rounds_that_fit` allowed this round: the 8 bytes from `at` are
                // inside `streams[k]` (each earlier round advanced `pos` by at most 60 bits).
                let word = unsafe { src[k].add(at).cast::<u64>().read_unaligned() };
                window[k] = u64::from_le(word) >> (pos[k] % 8);
            }
            let mut used = [0u64; G];
            // Lookup j of every lane, then lookup j + 1: the lookups of a step are independent.
            for _ in 0..LOOKUPS {
                for k in 0..G {
                    let e = multi[(window[k] & TABLE_MASK) as usize];
                    let l = (e >> 40) & MAX_BITS;
                    let count = ((e >> 48) as usize) & MAX_COUNT;
                    invalid |= count == 0;
                    debug_assert!(done[k] + 8 <= outs[k].len());
                    // SAFETY: `rounds_that_fit` allowed this round: every store of it, 8 bytes
                    // from `done`, ends inside `outs[k]` (each lookup advanced `done` by at
                    // most 7). Bytes past the count are overwritten by the next store or left
                    // for the lane's tail to overwrite.
                    unsafe {
                        dst[k].add(done[k]).cast::<u64>().write_unaligned(e.to_le());
                    }
                    done[k] += count;
                    window[k] >>= l;
                    used[k] += l;
                }
            }
            for k in 0..G {
                pos[k] += used[k];
            }
        }
    }
}
