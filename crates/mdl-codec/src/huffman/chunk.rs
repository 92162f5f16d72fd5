//! One chunk of symbols as [`LANES`] independent bit streams: the encoder and the
//! table-driven decoder.

use mdl_format::FormatError;

use super::{Code, MAX_LEN, TABLE_MASK, TABLE_SIZE};

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
        // Each lane is coded into a region of its own of a scratch buffer kept by the thread,
        // sized for the worst case (12 bits a symbol, plus slack for the word-at-a-time
        // writes, which overwrite whatever is there), all four in lock step so their
        // dependency chains overlap; then only the coded bytes are appended to `out` (a
        // worst-case region in `out` itself would be zeroed, and faulted in, for nothing).
        let cap = symbols.len().div_ceil(LANES) * MAX_LEN as usize / 8 + 16;
        let mut scratch = LANE_SCRATCH.take();
        if scratch.len() < LANES * cap {
            scratch.resize(LANES * cap, 0);
        }
        let mut regions = scratch.chunks_exact_mut(cap);
        let bufs: [&mut [u8]; LANES] =
            std::array::from_fn(|_| regions.next().expect("a region a lane"));
        let mut ranges = lanes(symbols.len());
        let lane: [&[u8]; LANES] =
            std::array::from_fn(|_| &symbols[ranges.next().expect("a range a lane")]);
        let mut w = [LaneWriter::default(); LANES];
        // The last lane is the shortest: every lane has its quads up to there.
        let common = lane[LANES - 1].len() / 4 * 4;
        for j in (0..common).step_by(4) {
            for k in 0..LANES {
                let q: &[u8; 4] = lane[k][j..j + 4].try_into().expect("4 symbols");
                w[k].quad(&self.codes, q, bufs[k]);
            }
        }
        let mut lens = [0usize; LANES];
        for k in 0..LANES {
            lens[k] = w[k].rest(&self.codes, &lane[k][common..], bufs[k]);
        }
        out.reserve(4 * (LANES - 1) + lens.iter().sum::<usize>());
        for &len in &lens[..LANES - 1] {
            out.extend_from_slice(&(len as u32).to_le_bytes());
        }
        for (buf, &len) in bufs.iter().zip(&lens) {
            out.extend_from_slice(&buf[..len]);
        }
        LANE_SCRATCH.set(scratch);
    }
}

thread_local! {
    /// The lanes' regions of [`Encoder::encode_chunk`], kept from chunk to chunk.
    static LANE_SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
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

/// Decodes chunks of one code: a table from the next [`MAX_LEN`] bits to `(symbol, length)`,
/// and one from the same bits to every whole code they hold, up to three.
pub struct Decoder {
    /// `symbol | length << 8`; length 0 marks bit patterns no code starts with.
    table: Box<[u16; TABLE_SIZE]>,
    /// `symbols (3 bytes) | bits << 24 | count << 28`: the codes (at most three) that the
    /// next [`MAX_LEN`] bits hold whole, their bits together and how many; count 0 marks
    /// bit patterns no code starts with.
    multi: Box<[u32; TABLE_SIZE]>,
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
        // A code of `l` bits is known from its low `l` bits: the bits left after the first
        // codes of an index find the next code in the same table if it is no longer.
        let mut multi = Box::new([0u32; TABLE_SIZE]);
        for (i, m) in multi.iter_mut().enumerate() {
            let (mut bits, mut count, mut symbols) = (0u32, 0u32, 0u32);
            while count < 3 {
                let e = table[i >> bits];
                let l = (e >> 8) as u32;
                if l == 0 || bits + l > MAX_LEN as u32 {
                    break;
                }
                symbols |= (e as u8 as u32) << (8 * count);
                bits += l;
                count += 1;
            }
            *m = symbols | bits << 24 | count << 28;
        }
        Decoder { table, multi }
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
        // Interleaved fast path: four independent streams keep four lookups in flight, each
        // lookup taking up to three codes. Each round reads one 64-bit window per lane (at
        // least 57 fresh bits) and makes four lookups of at most 12 bits from it, so it
        // advances a lane by at most 6 bytes of input and 12 symbols (each lookup stores four
        // bytes: the fourth, and any beyond its count, are overwritten by the next); the number
        // of rounds that stay in bounds is worked out first and the rounds run unchecked.
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
                // Round r stores up to symbol done + 12r + 12 (the fourth byte of its last
                // lookup's store), which must be inside the lane.
                let room = (outs[k].len() - done[k]).saturating_sub(1) / 12;
                rounds = rounds.min(fit).min(room);
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
                // Lookup j of every lane, then lookup j + 1: the four lookups of a step are
                // independent of each other.
                for _ in 0..4 {
                    for k in 0..LANES {
                        let e = self.multi[(window[k] & TABLE_MASK) as usize];
                        let (l, count) = ((e >> 24) & 0xf, (e >> 28) as usize);
                        // A zero count marks a pattern no code starts with.
                        invalid |= count == 0;
                        let d = done[k];
                        outs[k][d..d + 4].copy_from_slice(&e.to_le_bytes());
                        done[k] = d + count;
                        window[k] >>= l;
                        used[k] += l;
                    }
                }
                for k in 0..LANES {
                    pos[k] += used[k] as u64;
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
