//! One chunk of symbols as [`LANES`] independent bit streams: the encoder and the
//! table-driven decoder.

use super::*;

/// Independent bit streams per chunk (see [`Encoder::encode_chunk`]).
pub const LANES: usize = 4;

/// Bytes a Huffman chunk adds beyond its bits, at most: the lane table and lane padding.
pub(super) const CHUNK_OVERHEAD: u64 = 4 * (LANES as u64 - 1) + LANES as u64;

/// The symbol ranges of the lanes of an `n`-symbol chunk: contiguous, the first ones a
/// quarter each (rounded up), the last what remains (possibly empty).
fn lanes(n: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let q = n.div_ceil(LANES);
    (0..LANES).map(move |k| (k * q).min(n)..((k + 1) * q).min(n))
}

/// Encodes chunks with one code.
pub struct Encoder {
    codes: [(u16, u8); 256],
}

impl Encoder {
    /// An encoder for `code`.
    pub fn new(code: &Code) -> Encoder {
        Encoder {
            codes: code.codes(),
        }
    }

    /// The bit-reversed canonical code of each symbol, `(code, length)` (length 0: no code):
    /// what a lane holds for a symbol, least significant bit first.
    pub fn codes(&self) -> &[(u16, u8); 256] {
        &self.codes
    }

    /// Appends a coded chunk to `out`: the symbols split into [`LANES`] contiguous lanes, each
    /// its own bit stream, after a table of the first three lanes' byte lengths (`u32` each).
    /// Every symbol must have a code.
    pub fn encode_chunk(&self, symbols: &[u8], out: &mut Vec<u8>) {
        let table = out.len();
        out.resize(table + 4 * (LANES - 1), 0);
        for (k, lane) in lanes(symbols.len()).enumerate() {
            let start = out.len();
            self.encode_lane(&symbols[lane], out);
            if k < LANES - 1 {
                let len = (out.len() - start) as u32;
                out[table + 4 * k..table + 4 * k + 4].copy_from_slice(&len.to_le_bytes());
            }
        }
    }

    /// Appends the coded `symbols` as one bit stream (whole bytes; the last one zero-padded).
    fn encode_lane(&self, symbols: &[u8], out: &mut Vec<u8>) {
        let start = out.len();
        // Worst case 12 bits a symbol, plus 8 bytes of slack for the word-at-a-time writes.
        out.resize(start + symbols.len() * MAX_LEN as usize / 8 + 16, 0);
        let buf = &mut out[start..];
        let mut pos = 0usize;
        let mut acc = 0u64;
        let mut nbits = 0u32;
        let mut quads = symbols.chunks_exact(4);
        for q in &mut quads {
            // Four codes of at most 12 bits fit beside the at most 7 bits left over.
            for &s in q {
                let (c, l) = self.codes[s as usize];
                debug_assert!(l > 0, "symbol without a code");
                acc |= (c as u64) << nbits;
                nbits += l as u32;
            }
            buf[pos..pos + 8].copy_from_slice(&acc.to_le_bytes());
            let bytes = (nbits / 8) as usize;
            pos += bytes;
            acc = if bytes == 8 { 0 } else { acc >> (bytes * 8) };
            nbits -= bytes as u32 * 8;
        }
        for &s in quads.remainder() {
            let (c, l) = self.codes[s as usize];
            acc |= (c as u64) << nbits;
            nbits += l as u32;
        }
        while nbits > 0 {
            buf[pos] = acc as u8;
            pos += 1;
            acc >>= 8;
            nbits = nbits.saturating_sub(8);
        }
        out.truncate(start + pos);
    }
}

/// Decodes chunks of one code: a table from the next [`MAX_LEN`] bits to `(symbol, length)`.
pub struct Decoder {
    /// `symbol | length << 8`; length 0 marks bit patterns no code starts with.
    table: Box<[u16; TABLE_SIZE]>,
}

impl Decoder {
    /// A decoder for `code`.
    pub fn new(code: &Code) -> Decoder {
        let mut table = Box::new([0u16; TABLE_SIZE]);
        for (s, &(c, l)) in code.codes().iter().enumerate() {
            if l == 0 {
                continue;
            }
            let step = 1usize << l;
            let mut i = c as usize;
            while i < TABLE_SIZE {
                table[i] = s as u16 | (l as u16) << 8;
                i += step;
            }
        }
        Decoder { table }
    }

    /// The lookup table: entry `i` is `symbol | length << 8` for the code that the low
    /// [`MAX_LEN`] bits `i` of a lane start with (length 0: none does).
    pub fn table(&self) -> &[u16; TABLE_SIZE] {
        &self.table
    }

    /// Decodes exactly `out.len()` symbols from a chunk written by [`Encoder::encode_chunk`];
    /// `bytes` must be exactly the chunk.
    pub fn decode_chunk(&self, bytes: &[u8], out: &mut [u8]) -> Result<(), FormatError> {
        let table_len = 4 * (LANES - 1);
        if bytes.len() < table_len {
            return Err(FormatError::Truncated {
                what: "huffman chunk",
                needed: table_len - bytes.len(),
            });
        }
        let (table, mut rest) = bytes.split_at(table_len);
        let mut streams: [&[u8]; LANES] = [&[]; LANES];
        for (k, len) in table.chunks_exact(4).enumerate() {
            let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
            if len > rest.len() {
                return Err(FormatError::invalid(
                    "huffman chunk",
                    "lane overruns the chunk",
                ));
            }
            (streams[k], rest) = rest.split_at(len);
        }
        streams[LANES - 1] = rest;
        let n = out.len();
        let mut outs: [&mut [u8]; LANES] = Default::default();
        let mut tail = out;
        for (k, lane) in lanes(n).enumerate() {
            let (head, t) = tail.split_at_mut(lane.len());
            outs[k] = head;
            tail = t;
        }
        // Interleaved fast path: four independent streams keep four lookups in flight. Each
        // round reads one 64-bit window per lane (at least 57 fresh bits) and takes four codes
        // of at most 12 bits from it, so it advances a lane by at most 6 bytes; the number of
        // rounds that stay in bounds is worked out first and the rounds run unchecked.
        let mut pos = [0u64; LANES];
        let mut done = [0usize; LANES];
        let bad = || FormatError::invalid("huffman chunk", "invalid code");
        loop {
            let mut rounds = usize::MAX;
            for k in 0..LANES {
                // Round r reads bytes from floor(pos/8) + 6r on, 8 of them.
                let need = (pos[k] / 8) as usize + 8;
                let fit = match streams[k].len().checked_sub(need) {
                    Some(spare) => spare / 6 + 1,
                    None => 0,
                };
                rounds = rounds.min(fit).min((outs[k].len() - done[k]) / 4);
            }
            if rounds == 0 {
                break;
            }
            let mut invalid = false;
            for _ in 0..rounds {
                let mut window = [0u64; LANES];
                for k in 0..LANES {
                    let at = (pos[k] / 8) as usize;
                    let word =
                        u64::from_le_bytes(streams[k][at..at + 8].try_into().expect("8 bytes"));
                    window[k] = word >> (pos[k] % 8);
                }
                let mut used = [0u32; LANES];
                // Symbol j of every lane, then symbol j + 1: the four lookups of a step are
                // independent of each other.
                for j in 0..4 {
                    for k in 0..LANES {
                        let e = self.table[(window[k] & TABLE_MASK) as usize];
                        let l = (e >> 8) as u32;
                        // A zero length marks a pattern no code starts with.
                        invalid |= l == 0;
                        outs[k][done[k] + j] = e as u8;
                        window[k] >>= l;
                        used[k] += l;
                    }
                }
                for k in 0..LANES {
                    pos[k] += used[k] as u64;
                    done[k] += 4;
                }
            }
            if invalid {
                return Err(bad());
            }
        }
        for k in 0..LANES {
            self.decode_lane(streams[k], outs[k], pos[k], done[k])?;
        }
        Ok(())
    }

    /// Decodes the rest of one lane, from bit `bitpos` and symbol `i` on.
    fn decode_lane(
        &self,
        bytes: &[u8],
        out: &mut [u8],
        mut bitpos: u64,
        mut i: usize,
    ) -> Result<(), FormatError> {
        let total_bits = bytes.len() as u64 * 8;
        let n = out.len();
        let bad = || FormatError::invalid("huffman chunk", "invalid code");
        // What the interleaved rounds left: assemble the window byte by byte, zero past the end.
        while i < n {
            let at = (bitpos / 8) as usize;
            let mut word = 0u64;
            for (k, &b) in bytes.iter().skip(at).take(8).enumerate() {
                word |= (b as u64) << (8 * k);
            }
            let e = self.table[((word >> (bitpos % 8)) & TABLE_MASK) as usize];
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
}
