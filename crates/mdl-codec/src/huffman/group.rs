//! The lanes of a group coded and decoded in lock step: the coder's hot loops, for one core.

use mdl_format::FormatError;

use super::rounds::decode_rounds;
use super::{TABLE_MASK, TABLE_SIZE};

/// Lanes a group has: a core runs the lanes of a group in lock step, so their dependency
/// chains overlap (both layouts are whole groups; eight lanes measured slower than four: the
/// eight lanes' state no longer fits the registers).
pub(super) const GROUP: usize = 4;

/// Bytes of the zero-padded copy a lane's last bytes are decoded from.
const PADDED: usize = 64;

/// Codes a lookup decodes at most.
pub(super) const MULTI: usize = 5;

/// A decoder's lookup tables (see [`super::Decoder`]).
#[derive(Clone, Copy)]
pub(super) struct Tables<'a> {
    /// `symbol | length << 8` for the code the next [`super::MAX_LEN`] bits start with.
    pub(super) single: &'a [u16; TABLE_SIZE],
    /// `symbols (5 bytes) | bits << 40 | count << 48` for the codes they hold whole.
    pub(super) multi: &'a [u64; TABLE_SIZE],
}

/// Codes a group's lanes into `bufs` (each large enough for its worst case plus 8 bytes of
/// slack): the lanes' byte lengths.
#[inline(always)]
pub(super) fn encode_group(
    codes: &[(u16, u8); 256],
    lane: [&[u8]; GROUP],
    bufs: [&mut [u8]; GROUP],
) -> [usize; GROUP] {
    let mut w = [LaneWriter::default(); GROUP];
    // Every lane has its quads up to the shortest lane's last whole quad.
    let common = lane.iter().map(|l| l.len()).min().unwrap_or(0) / 4 * 4;
    for j in (0..common).step_by(4) {
        for k in 0..GROUP {
            let q: &[u8; 4] = lane[k][j..j + 4].try_into().expect("4 symbols");
            w[k].quad(codes, q, bufs[k]);
        }
    }
    let mut lens = [0usize; GROUP];
    for k in 0..GROUP {
        lens[k] = w[k].rest(codes, &lane[k][common..], bufs[k]);
    }
    lens
}

/// One lane's bit stream being written: bits not yet written out, and where the next byte goes.
#[derive(Clone, Copy, Default)]
struct LaneWriter {
    acc: u64,
    nbits: u32,
    pos: usize,
}

impl LaneWriter {
    /// Codes four symbols: four codes of at most 12 bits fit beside the at most 7 bits left
    /// over, and the whole bytes among them are written out.
    #[inline(always)]
    fn quad(&mut self, codes: &[(u16, u8); 256], q: &[u8; 4], buf: &mut [u8]) {
        for &s in q {
            let (c, l) = codes[s as usize];
            debug_assert!(l > 0, "symbol without a code");
            self.acc |= (c as u64) << self.nbits;
            self.nbits += l as u32;
        }
        buf[self.pos..self.pos + 8].copy_from_slice(&self.acc.to_le_bytes());
        let bytes = self.nbits / 8;
        self.pos += bytes as usize;
        // At most 55 bits were held, so at most 6 bytes went out.
        self.acc >>= bytes * 8;
        self.nbits -= bytes * 8;
    }

    /// Codes the lane's last symbols and pads its last byte with zeros: the lane's length.
    fn rest(&mut self, codes: &[(u16, u8); 256], symbols: &[u8], buf: &mut [u8]) -> usize {
        let mut quads = symbols.chunks_exact(4);
        for q in &mut quads {
            self.quad(codes, q.try_into().expect("4 symbols"), buf);
        }
        for &s in quads.remainder() {
            let (c, l) = codes[s as usize];
            self.acc |= (c as u64) << self.nbits;
            self.nbits += l as u32;
        }
        while self.nbits > 0 {
            buf[self.pos] = self.acc as u8;
            self.pos += 1;
            self.acc >>= 8;
            self.nbits = self.nbits.saturating_sub(8);
        }
        self.pos
    }
}

/// Decodes a group's lanes, each `streams[k]` into all of `outs[k]`: in rounds of up to
/// [`MULTI`] codes a lookup, four lookups a lane, the lanes interleaved so that four lookups are
/// in flight ([`super::rounds`]), then each lane on its own, and its last symbols checked
/// ([`decode_tail`]).
#[inline(always)]
pub(super) fn decode_group(
    tables: Tables<'_>,
    streams: [&[u8]; GROUP],
    mut outs: [&mut [u8]; GROUP],
) -> Result<(), FormatError> {
    let mut pos = [0u64; GROUP];
    let mut done = [0usize; GROUP];
    let invalid = || FormatError::invalid("huffman chunk", "invalid code");
    if decode_rounds(tables.multi, streams, &mut outs, &mut pos, &mut done) {
        return Err(invalid());
    }
    // The group stops with its first lane to run short; the others go on alone (lanes of a
    // group hold the same number of symbols in a few more or fewer bytes).
    for k in 0..GROUP {
        let (mut p, mut d) = ([pos[k]], [done[k]]);
        if decode_rounds(
            tables.multi,
            [streams[k]],
            &mut [&mut *outs[k]],
            &mut p,
            &mut d,
        ) {
            return Err(invalid());
        }
        // The lane's last bytes, padded with zeros (as the tail reads past the end), let the
        // rounds go on until the output has no room for one more.
        let at = (p[0] / 8) as usize;
        let rest = &streams[k][at.min(streams[k].len())..];
        if rest.len() <= PADDED - 16 {
            let mut padded = [0u8; PADDED];
            padded[..rest.len()].copy_from_slice(rest);
            let mut q = [p[0] % 8];
            if decode_rounds(
                tables.multi,
                [&padded[..]],
                &mut [&mut *outs[k]],
                &mut q,
                &mut d,
            ) {
                return Err(invalid());
            }
            p[0] = at as u64 * 8 + q[0];
        }
        decode_tail(tables, streams[k], outs[k], p[0], d[0])?;
    }
    Ok(())
}

/// Decodes the rest of one lane from bit `bitpos` and symbol `i` on: up to [`MULTI`] codes a
/// lookup while a whole window and room for them remain, then [`decode_lane`].
fn decode_tail(
    tables: Tables<'_>,
    bytes: &[u8],
    out: &mut [u8],
    mut bitpos: u64,
    mut i: usize,
) -> Result<(), FormatError> {
    while i + MULTI <= out.len() {
        let at = (bitpos / 8) as usize;
        let Some(w) = bytes.get(at..at + 8) else {
            break;
        };
        let word = u64::from_le_bytes(w.try_into().expect("8 bytes")) >> (bitpos % 8);
        let e = tables.multi[(word & TABLE_MASK) as usize];
        let count = (e >> 48) as usize;
        if count == 0 {
            return Err(FormatError::invalid("huffman chunk", "invalid code"));
        }
        out[i..i + count].copy_from_slice(&e.to_le_bytes()[..count]);
        i += count;
        bitpos += (e >> 40) & 0xf;
    }
    decode_lane(tables.single, bytes, out, bitpos, i)
}

/// Decodes the rest of one lane, from bit `bitpos` and symbol `i` on, a lookup a symbol (from
/// the start, the checked reference the fast rounds are tested against).
pub(super) fn decode_lane(
    table: &[u16; TABLE_SIZE],
    bytes: &[u8],
    out: &mut [u8],
    mut bitpos: u64,
    mut i: usize,
) -> Result<(), FormatError> {
    let total_bits = bytes.len() as u64 * 8;
    let n = out.len();
    let bad = || FormatError::invalid("huffman chunk", "invalid code");
    // What the interleaved rounds left: 8 bytes at a time, the last ones assembled byte by
    // byte with zeros past the end.
    while i < n {
        let at = (bitpos / 8) as usize;
        let word = match bytes.get(at..at + 8) {
            Some(w) => u64::from_le_bytes(w.try_into().expect("8 bytes")),
            None => {
                let mut word = 0u64;
                for (k, &b) in bytes.iter().skip(at).take(8).enumerate() {
                    word |= (b as u64) << (8 * k);
                }
                word
            }
        };
        let e = table[((word >> (bitpos % 8)) & TABLE_MASK) as usize];
        let l = (e >> 8) as u64;
        if l == 0 || bitpos + l > total_bits {
            return Err(bad());
        }
        out[i] = e as u8;
        bitpos += l;
        i += 1;
    }
    if bitpos > total_bits || bitpos.div_ceil(8) != bytes.len() as u64 {
        return Err(FormatError::invalid(
            "huffman chunk",
            "length disagrees with its symbols",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{Code, Decoder, Encoder, Histogram, Lanes};
    use proptest::prelude::*;

    /// Skewed symbols from `seed` folded onto `alphabet` values.
    fn symbols(n: usize, alphabet: u8, seed: u64) -> Vec<u8> {
        let s = super::super::tests::skewed(n, seed);
        s.iter().map(|&x| (x - 100) % alphabet).collect()
    }

    /// The fast decoder and the checked reference agree: both accept or both refuse, and
    /// what they accept they decode alike.
    fn agree(decoder: &Decoder, lanes: Lanes, bytes: &[u8], n: usize) -> Option<Vec<u8>> {
        let (mut fast, mut slow) = (vec![0u8; n], vec![0u8; n]);
        let a = decoder.decode_chunk(lanes, bytes, &mut fast);
        let b = decoder.decode_chunk_checked(lanes, bytes, &mut slow);
        assert_eq!(a.is_ok(), b.is_ok(), "fast {a:?}, checked {b:?}");
        a.ok().map(|()| {
            assert_eq!(fast, slow);
            fast
        })
    }

    /// Symbols coded in both layouts decode alike by both decoders, and so do the chunks
    /// with a byte flipped at each of `flips(chunk length, lane table length)`, cut short by
    /// `cut` bytes, and decoded for 40 symbols more than they hold.
    fn check(cases: &[(usize, u8, u64)], flips: impl Fn(usize, usize) -> Vec<usize>, cut: usize) {
        for &(n, alphabet, seed) in cases {
            let s = symbols(n, alphabet, seed);
            let code = Code::build(&Histogram::of(&s));
            let (enc, dec) = (Encoder::new(&code), Decoder::new(&code));
            for lanes in [Lanes::Four, Lanes::Wide] {
                let mut bytes = Vec::new();
                enc.encode_chunk(lanes, &s, &mut bytes);
                assert_eq!(agree(&dec, lanes, &bytes, n).as_deref(), Some(&s[..]));
                for at in flips(bytes.len(), lanes.table_len()) {
                    let mut bad = bytes.clone();
                    bad[at] ^= 0x5a;
                    agree(&dec, lanes, &bad, n);
                }
                agree(&dec, lanes, &bytes[..bytes.len() - cut], n);
                agree(&dec, lanes, &bytes, n + 40);
            }
        }
    }

    #[test]
    fn the_fast_rounds_match_the_checked_reference() {
        let cases = [
            (1 << 17, 40, 1),
            (100_000, 3, 2),
            (70_001, 200, 3),
            (999, 9, 4),
        ];
        // About 200 bytes of the lanes flipped in turn.
        check(
            &cases,
            |len, table| (table..len).step_by(len / 200 + 1).collect(),
            1,
        );
    }

    /// Small enough for Miri (`cargo +nightly miri test -p mdl-codec --lib small_chunks`),
    /// which checks every unchecked access of the fast rounds on valid and damaged lanes.
    #[test]
    fn small_chunks_decode_alike() {
        check(
            &[(2500, 30, 5), (700, 3, 6)],
            |len, table| vec![table, len / 2, len - 1],
            3,
        );
    }

    proptest! {
        #[test]
        fn garbage_decodes_alike(lengths in proptest::collection::vec(1u8..=12, 2..40), bytes in proptest::collection::vec(any::<u8>(), 0..3000), n in 0usize..6000, wide: bool) {
            // Any prefix code: the lengths made to satisfy Kraft by lengthening.
            let mut l = [0u8; 256];
            l[..lengths.len()].copy_from_slice(&lengths);
            while l.iter().filter(|&&x| x > 0).map(|&x| 1u32 << (12 - x)).sum::<u32>() > 4096 {
                let short = l.iter_mut().filter(|x| **x > 0 && **x < 12).min_by_key(|x| **x);
                match short { Some(x) => *x += 1, None => break }
            }
            if let Ok(code) = Code::from_lengths(l) {
                let lanes = if wide { Lanes::Wide } else { Lanes::Four };
                agree(&Decoder::new(&code), lanes, &bytes, n);
            }
        }
    }
}
