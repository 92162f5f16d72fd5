//! A canonical, length-limited Huffman coder over bytes, in independent chunks.
//!
//! No I/O here: callers hand in slices and get slices back. The pieces:
//!
//! - [`Histogram`]: symbol counts (summed over chunks in parallel by the callers).
//! - [`Code`]: code lengths capped at [`MAX_LEN`] bits, built from a histogram; the code is
//!   canonical, so its lengths are all that is stored. [`Code::encoded_bits`] gives the exact
//!   payload size before anything is encoded, which is how a commit compares codecs cheaply.
//! - [`Encoder`] / [`Decoder`]: one chunk at a time, as [`LANES`] independent bit streams.
//!   Bits are written least-significant first; the decoder looks up [`MAX_LEN`] bits at once in
//!   a 4096-entry table, one lookup per symbol, four lanes interleaved.
//! - [`Plan`], [`StreamWriter`], [`Stream`], [`encode_stream`] / [`decode_stream`]: the
//!   self-describing stream format of `docs/FORMAT.md` ("entropy stream"): stored, constant,
//!   Huffman, or sparse (a Huffman-coded bitmap of non-zero positions plus the non-zero symbols,
//!   for zero-heavy data), with a chunk length table so chunks are encoded and decoded in
//!   parallel and any one chunk can be decoded alone.
//!
//! Decoding untrusted bytes never panics and never allocates more than the caller's output (and
//! scratch of the same order) plus a table sized by the input's own length.

use mdl_format::FormatError;
use rayon::prelude::*;

/// Longest code, in bits. 12 bits keep the decode table at 8 KiB (in L1) while costing under
/// 0.5 % on exponent distributions (see `docs/DECISIONS.md`).
pub const MAX_LEN: u8 = 12;
/// Entries of a [`Decoder`]'s lookup table.
pub const TABLE_SIZE: usize = 1 << MAX_LEN;
const TABLE_MASK: u64 = TABLE_SIZE as u64 - 1;

/// Symbols per chunk, as a power of two (128 Ki symbols).
pub const CHUNK_LOG2: u8 = 17;
const MIN_CHUNK_LOG2: u8 = 12;
const MAX_CHUNK_LOG2: u8 = 24;

/// Stream modes (the first byte of an entropy stream).
const MODE_STORED: u8 = 0;
const MODE_CONSTANT: u8 = 1;
const MODE_HUFFMAN: u8 = 2;
const MODE_SPARSE: u8 = 3;

/// Bytes of the code length table: 256 lengths, 4 bits each.
const LENGTHS_BYTES: usize = 128;

/// Counts of each byte value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Histogram(pub [u64; 256]);

impl Default for Histogram {
    fn default() -> Self {
        Histogram([0; 256])
    }
}

impl Histogram {
    /// Counts the bytes of `data`.
    pub fn of(data: &[u8]) -> Histogram {
        // Four interleaved tables avoid the store-to-load stalls of runs of equal bytes.
        let mut t = [[0u32; 256]; 4];
        let mut quads = data.chunks_exact(4);
        for q in &mut quads {
            t[0][q[0] as usize] += 1;
            t[1][q[1] as usize] += 1;
            t[2][q[2] as usize] += 1;
            t[3][q[3] as usize] += 1;
        }
        for &b in quads.remainder() {
            t[0][b as usize] += 1;
        }
        let mut h = Histogram::default();
        for (i, c) in h.0.iter_mut().enumerate() {
            *c = t.iter().map(|row| row[i] as u64).sum();
        }
        h
    }

    /// Adds another histogram's counts.
    pub fn add(&mut self, other: &Histogram) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a += b;
        }
    }

    /// Number of symbols counted.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// The order-0 Shannon entropy of the counted symbols, in bits (total, not per symbol).
    pub fn entropy_bits(&self) -> f64 {
        let n = self.total() as f64;
        if n == 0.0 {
            return 0.0;
        }
        self.0
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| {
                let c = c as f64;
                -c * (c / n).log2()
            })
            .sum()
    }
}

/// A canonical prefix code: a length per symbol (0 = absent), at most [`MAX_LEN`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Code {
    lengths: [u8; 256],
}

impl Code {
    /// The length-limited Huffman code for `hist`. With fewer than two distinct symbols the
    /// code gives each present symbol length 1 (streams use the constant mode instead).
    pub fn build(hist: &Histogram) -> Code {
        let mut syms: Vec<(u64, u8)> = (0..256)
            .filter(|&s| hist.0[s] > 0)
            .map(|s| (hist.0[s], s as u8))
            .collect();
        let mut lengths = [0u8; 256];
        if syms.len() <= 1 {
            for &(_, s) in &syms {
                lengths[s as usize] = 1;
            }
            return Code { lengths };
        }
        // Ascending by count, ties by symbol, so the result is deterministic.
        syms.sort_unstable();
        let depths = huffman_depths(&syms);
        for (&(_, s), &d) in syms.iter().zip(&depths) {
            lengths[s as usize] = d;
        }
        limit_lengths(&mut lengths, &syms);
        Code { lengths }
    }

    /// The code with the given lengths, if they form a valid prefix code (Kraft sum ≤ 1, every
    /// length ≤ [`MAX_LEN`]) with at least one symbol.
    pub fn from_lengths(lengths: [u8; 256]) -> Result<Code, FormatError> {
        let mut kraft = 0u64;
        for &l in &lengths {
            if l > MAX_LEN {
                return Err(FormatError::invalid(
                    "huffman code",
                    "length over the limit",
                ));
            }
            if l > 0 {
                kraft += 1 << (MAX_LEN - l);
            }
        }
        if kraft == 0 || kraft > TABLE_SIZE as u64 {
            return Err(FormatError::invalid(
                "huffman code",
                "lengths do not form a prefix code",
            ));
        }
        Ok(Code { lengths })
    }

    /// Code length of each symbol.
    pub fn lengths(&self) -> &[u8; 256] {
        &self.lengths
    }

    /// Exact number of bits needed to code the symbols counted in `hist` (which must only
    /// contain symbols of this code).
    pub fn encoded_bits(&self, hist: &Histogram) -> u64 {
        hist.0
            .iter()
            .zip(self.lengths.iter())
            .map(|(&c, &l)| c * l as u64)
            .sum()
    }

    /// Canonical codes, bit-reversed for least-significant-first output: `(code, length)`.
    fn codes(&self) -> [(u16, u8); 256] {
        let mut out = [(0u16, 0u8); 256];
        let mut count = [0u16; MAX_LEN as usize + 1];
        for &l in &self.lengths {
            count[l as usize] += 1;
        }
        count[0] = 0;
        let mut next = [0u16; MAX_LEN as usize + 2];
        let mut code = 0u16;
        for len in 1..=MAX_LEN as usize {
            code = (code + count[len - 1]) << 1;
            next[len] = code;
        }
        for (slot, &l) in out.iter_mut().zip(&self.lengths) {
            if l > 0 {
                let c = next[l as usize];
                next[l as usize] += 1;
                *slot = (c.reverse_bits() >> (16 - l as u32), l);
            }
        }
        out
    }

    fn write_lengths(&self, out: &mut Vec<u8>) {
        for pair in self.lengths.chunks_exact(2) {
            out.push(pair[0] | (pair[1] << 4));
        }
    }

    fn read_lengths(bytes: &[u8]) -> Result<Code, FormatError> {
        let mut lengths = [0u8; 256];
        for (i, &b) in bytes[..LENGTHS_BYTES].iter().enumerate() {
            lengths[2 * i] = b & 15;
            lengths[2 * i + 1] = b >> 4;
        }
        Code::from_lengths(lengths)
    }
}

/// Huffman depths for `syms` sorted ascending by count (two-queue construction).
fn huffman_depths(syms: &[(u64, u8)]) -> Vec<u8> {
    let n = syms.len();
    // Nodes 0..n are leaves, n.. internal; parent links give depths.
    let mut weight: Vec<u64> = syms.iter().map(|&(c, _)| c).collect();
    weight.reserve(n);
    let mut parent = vec![0usize; 2 * n - 1];
    let (mut leaf, mut inner) = (0usize, n);
    let take = |weight: &Vec<u64>, leaf: &mut usize, inner: &mut usize| -> usize {
        let inner_ok = *inner < weight.len();
        if *leaf < n && (!inner_ok || weight[*leaf] <= weight[*inner]) {
            *leaf += 1;
            *leaf - 1
        } else {
            *inner += 1;
            *inner - 1
        }
    };
    for _ in 0..n - 1 {
        let a = take(&weight, &mut leaf, &mut inner);
        let b = take(&weight, &mut leaf, &mut inner);
        let node = weight.len();
        weight.push(weight[a] + weight[b]);
        parent[a] = node;
        parent[b] = node;
    }
    let root = 2 * n - 2;
    let mut depth = vec![0u32; 2 * n - 1];
    for i in (0..root).rev() {
        depth[i] = depth[parent[i]] + 1;
    }
    depth[..n].iter().map(|&d| d.min(255) as u8).collect()
}

/// Caps lengths at [`MAX_LEN`] and restores the Kraft inequality by lengthening the least
/// costly codes, then spends any slack on the most frequent symbols.
fn limit_lengths(lengths: &mut [u8; 256], syms_ascending: &[(u64, u8)]) {
    let max = MAX_LEN as u32;
    if syms_ascending
        .iter()
        .all(|&(_, s)| lengths[s as usize] <= MAX_LEN)
    {
        return;
    }
    let unit = |l: u8| 1u64 << (max - l as u32);
    for &(_, s) in syms_ascending {
        lengths[s as usize] = lengths[s as usize].min(MAX_LEN);
    }
    let budget = 1u64 << max;
    let mut kraft: u64 = syms_ascending
        .iter()
        .map(|&(_, s)| unit(lengths[s as usize]))
        .sum();
    // Over budget: lengthen codes, rarest first among those below the cap.
    while kraft > budget {
        let mut changed = false;
        for &(_, s) in syms_ascending {
            let l = lengths[s as usize];
            if l < MAX_LEN {
                kraft -= unit(l + 1);
                lengths[s as usize] = l + 1;
                changed = true;
                if kraft <= budget {
                    break;
                }
            }
        }
        debug_assert!(changed, "256 symbols always fit in 12-bit codes");
        if !changed {
            break;
        }
    }
    // Slack left: shorten codes, most frequent first, while the sum stays within budget.
    for &(_, s) in syms_ascending.iter().rev() {
        while lengths[s as usize] > 1 && kraft + unit(lengths[s as usize]) <= budget {
            kraft += unit(lengths[s as usize]);
            lengths[s as usize] -= 1;
        }
    }
}

/// Independent bit streams per chunk (see [`Encoder::encode_chunk`]).
pub const LANES: usize = 4;

/// Bytes a Huffman chunk adds beyond its bits, at most: the lane table and lane padding.
const CHUNK_OVERHEAD: u64 = 4 * (LANES as u64 - 1) + LANES as u64;

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

/// Sparse mode: which symbols of 8 are non-zero, one bit each (bit `k` = symbol `k`).
#[inline]
fn nonzero_flags(eight: &[u8]) -> u8 {
    let mut w = [0u8; 8];
    w[..eight.len()].copy_from_slice(eight);
    let x = u64::from_le_bytes(w);
    // High bit of each byte set where the byte is non-zero, then gathered into one byte.
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    let nz = (((x & LOW7) + LOW7) | x) & !LOW7;
    ((nz >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56) as u8
}

/// Histogram of the sparse-mode flag bytes of `symbols` (taken 8 at a time from the start).
pub fn flag_histogram(symbols: &[u8]) -> Histogram {
    let mut t = [[0u32; 256]; 2];
    let mut pairs = symbols.chunks_exact(16);
    for p in &mut pairs {
        t[0][nonzero_flags(&p[..8]) as usize] += 1;
        t[1][nonzero_flags(&p[8..]) as usize] += 1;
    }
    for e in pairs.remainder().chunks(8) {
        t[0][nonzero_flags(e) as usize] += 1;
    }
    let mut h = Histogram::default();
    for (i, c) in h.0.iter_mut().enumerate() {
        *c = t[0][i] as u64 + t[1][i] as u64;
    }
    h
}

/// How a stream holds its symbols (decided from histograms before encoding).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// The bytes as they are.
    Stored,
    /// Every symbol is this one.
    Constant(u8),
    /// Huffman-coded with this code.
    Huffman(Box<Code>),
    /// Mostly zeros: a bitmap of the non-zero positions (8 to a byte, Huffman-coded with
    /// `flags`), then the non-zero symbols alone (Huffman-coded with `values`). Where zeros
    /// dominate this gets below Huffman's floor of one bit a symbol, close to the entropy.
    Sparse {
        /// Code of the flag bytes.
        flags: Box<Code>,
        /// Code of the non-zero symbols.
        values: Box<Code>,
    },
}

impl Plan {
    /// The cheapest way to hold symbols with histogram `hist` (and, when given, the histogram
    /// of their sparse-mode flag bytes), with its stream size in bytes: exact, or at most
    /// [`LANES`] bytes a chunk (twice that for sparse streams) over.
    pub fn choose(hist: &Histogram, flags: Option<&Histogram>) -> (Plan, u64) {
        let n = hist.total();
        let stored = 1 + n;
        let distinct = hist.0.iter().filter(|&&c| c > 0).count();
        if distinct <= 1 {
            let s = hist.0.iter().position(|&c| c > 0).unwrap_or(0) as u8;
            return (Plan::Constant(s), 2);
        }
        let chunks = n.div_ceil(1 << CHUNK_LOG2);
        let code = Code::build(hist);
        let coded = 2
            + LENGTHS_BYTES as u64
            + (4 + CHUNK_OVERHEAD) * chunks
            + code.encoded_bits(hist).div_ceil(8);
        let mut best = if coded < stored {
            (Plan::Huffman(Box::new(code)), coded)
        } else {
            (Plan::Stored, stored)
        };
        if let Some(fh) = flags.filter(|_| hist.0[0] > 0) {
            let mut values = hist.clone();
            values.0[0] = 0;
            let (fcode, vcode) = (Code::build(fh), Code::build(&values));
            let sparse = 2
                + 2 * LENGTHS_BYTES as u64
                + (8 + 2 * CHUNK_OVERHEAD) * chunks
                + fcode.encoded_bits(fh).div_ceil(8)
                + vcode.encoded_bits(&values).div_ceil(8);
            if sparse < best.1 {
                best = (
                    Plan::Sparse {
                        flags: Box::new(fcode),
                        values: Box::new(vcode),
                    },
                    sparse,
                );
            }
        }
        best
    }

    /// Whether choosing a plan for these symbols benefits from their flag histogram (there
    /// are zeros to skip): callers count flags only where this holds.
    pub fn wants_flags(hist: &Histogram) -> bool {
        let n = hist.total();
        n > 0 && hist.0[0] * 5 >= n * 2
    }
}

/// A stream being written chunk by chunk (so callers can produce chunks in parallel).
pub struct StreamWriter {
    plan: Plan,
    encoders: Option<(Encoder, Option<Encoder>)>,
}

impl StreamWriter {
    /// A writer following `plan`.
    pub fn new(plan: Plan) -> StreamWriter {
        let encoders = match &plan {
            Plan::Huffman(code) => Some((Encoder::new(code), None)),
            Plan::Sparse { flags, values } => {
                Some((Encoder::new(flags), Some(Encoder::new(values))))
            }
            Plan::Stored | Plan::Constant(_) => None,
        };
        StreamWriter { plan, encoders }
    }

    /// The plan this writer follows.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The encoders of a coded plan: the symbols' (the flag bytes' for a sparse plan) and,
    /// for a sparse plan, the non-zero values'.
    pub fn encoders(&self) -> Option<(&Encoder, Option<&Encoder>)> {
        self.encoders.as_ref().map(|(a, b)| (a, b.as_ref()))
    }

    /// Encodes one chunk's symbols (all chunks but the last hold exactly `1 << CHUNK_LOG2`).
    pub fn chunk(&self, symbols: &[u8], out: &mut Vec<u8>) {
        match (&self.plan, &self.encoders) {
            (Plan::Stored, _) => out.extend_from_slice(symbols),
            (Plan::Constant(_), _) => {}
            (Plan::Huffman(_), Some((enc, _))) => enc.encode_chunk(symbols, out),
            (Plan::Sparse { .. }, Some((fenc, Some(venc)))) => {
                let flags: Vec<u8> = symbols.chunks(8).map(nonzero_flags).collect();
                // Branch-free compaction of the non-zero symbols.
                let mut values = vec![0u8; symbols.len()];
                let mut k = 0usize;
                for &s in symbols {
                    values[k] = s;
                    k += (s != 0) as usize;
                }
                values.truncate(k);
                let at = out.len();
                out.extend_from_slice(&[0; 4]);
                fenc.encode_chunk(&flags, out);
                let flen = (out.len() - at - 4) as u32;
                out[at..at + 4].copy_from_slice(&flen.to_le_bytes());
                venc.encode_chunk(&values, out);
            }
            _ => unreachable!("coded plans have encoders"),
        }
    }

    /// The stream's header for these chunks (produced by [`Self::chunk`], in order): the
    /// stream is this header followed by the chunks' bytes (none for a constant stream).
    pub fn head(&self, chunks: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        let table = |out: &mut Vec<u8>| {
            for c in chunks {
                out.extend_from_slice(&(c.len() as u32).to_le_bytes());
            }
        };
        match &self.plan {
            Plan::Stored => out.push(MODE_STORED),
            Plan::Constant(s) => out.extend_from_slice(&[MODE_CONSTANT, *s]),
            Plan::Huffman(code) => {
                out.extend_from_slice(&[MODE_HUFFMAN, CHUNK_LOG2]);
                code.write_lengths(&mut out);
                table(&mut out);
            }
            Plan::Sparse { flags, values } => {
                out.extend_from_slice(&[MODE_SPARSE, CHUNK_LOG2]);
                flags.write_lengths(&mut out);
                values.write_lengths(&mut out);
                table(&mut out);
            }
        }
        out
    }

    /// Appends the stream (header and chunks, produced by [`Self::chunk`] in order) to `out`.
    pub fn assemble(&self, chunks: &[&[u8]], out: &mut Vec<u8>) {
        out.extend_from_slice(&self.head(chunks));
        for c in chunks {
            out.extend_from_slice(c);
        }
    }
}

/// Encodes `symbols` as one entropy stream, chunks in parallel.
pub fn encode_stream(symbols: &[u8], out: &mut Vec<u8>) {
    let (hist, flags) = symbols
        .par_chunks(1 << CHUNK_LOG2)
        .map(|c| (Histogram::of(c), flag_histogram(c)))
        .reduce(
            || (Histogram::default(), Histogram::default()),
            |(mut a, mut b), (c, d)| {
                a.add(&c);
                b.add(&d);
                (a, b)
            },
        );
    let writer = StreamWriter::new(Plan::choose(&hist, Some(&flags)).0);
    let chunks: Vec<Vec<u8>> = symbols
        .par_chunks(1 << CHUNK_LOG2)
        .map(|c| {
            let mut v = Vec::new();
            writer.chunk(c, &mut v);
            v
        })
        .collect();
    let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
    writer.assemble(&refs, out);
}

/// A parsed entropy stream: where each chunk lies, for decoding chunks alone or in parallel.
pub struct Stream<'a> {
    n: u64,
    chunk_log2: u8,
    body: StreamBody<'a>,
}

/// A parsed stream's contents (see [`Stream::body`]).
pub enum StreamBody<'a> {
    /// The symbols themselves.
    Stored(&'a [u8]),
    /// Every symbol is this one.
    Constant(u8),
    /// Huffman chunks ([`Decoder::decode_chunk`]), or sparse chunks when `values` is given: a
    /// `u32` length of the flag chunk, the flag bytes' chunk (coded with `decoder`), then the
    /// non-zero symbols' chunk (coded with `values`).
    Coded {
        /// Decoder of the symbols (of the flag bytes, for sparse chunks).
        decoder: Box<Decoder>,
        /// Decoder of the non-zero symbols of sparse chunks.
        values: Option<Box<Decoder>>,
        /// Start of each chunk in `data`, plus the end.
        offsets: Vec<usize>,
        /// The chunks.
        data: &'a [u8],
    },
}

impl<'a> Stream<'a> {
    /// Parses a stream of exactly `n` symbols occupying all of `bytes`.
    pub fn parse(bytes: &'a [u8], n: u64) -> Result<Stream<'a>, FormatError> {
        let short = |needed: usize| FormatError::Truncated {
            what: "entropy stream",
            needed,
        };
        let (&mode, rest) = bytes.split_first().ok_or(short(1))?;
        let (chunk_log2, body) = match mode {
            MODE_STORED => {
                if rest.len() as u64 != n {
                    return Err(FormatError::invalid(
                        "entropy stream",
                        "stored length disagrees with the symbol count",
                    ));
                }
                (CHUNK_LOG2, StreamBody::Stored(rest))
            }
            MODE_CONSTANT => match rest {
                [s] => (CHUNK_LOG2, StreamBody::Constant(*s)),
                _ => {
                    return Err(FormatError::invalid(
                        "entropy stream",
                        "constant stream has the wrong length",
                    ))
                }
            },
            MODE_HUFFMAN | MODE_SPARSE => {
                let codes = if mode == MODE_SPARSE { 2 } else { 1 };
                let head = 1 + codes * LENGTHS_BYTES;
                if rest.len() < head {
                    return Err(short(head - rest.len()));
                }
                let log2 = rest[0];
                if !(MIN_CHUNK_LOG2..=MAX_CHUNK_LOG2).contains(&log2) {
                    return Err(FormatError::invalid("entropy stream", "bad chunk size"));
                }
                let decoder = Box::new(Decoder::new(&Code::read_lengths(&rest[1..])?));
                let values = if mode == MODE_SPARSE {
                    let code = Code::read_lengths(&rest[1 + LENGTHS_BYTES..])?;
                    Some(Box::new(Decoder::new(&code)))
                } else {
                    None
                };
                let rest = &rest[head..];
                let chunks = n.div_ceil(1 << log2);
                // Each chunk needs a 4-byte length: bound the table by the input first.
                if chunks.saturating_mul(4) > rest.len() as u64 {
                    return Err(short(
                        (chunks * 4).saturating_sub(rest.len() as u64) as usize
                    ));
                }
                let (table, data) = rest.split_at(chunks as usize * 4);
                let mut offsets = Vec::with_capacity(chunks as usize + 1);
                let mut at = 0usize;
                offsets.push(0);
                for len in table.chunks_exact(4) {
                    let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
                    at = at.checked_add(len).filter(|&e| e <= data.len()).ok_or(
                        FormatError::invalid("entropy stream", "chunk table overruns the stream"),
                    )?;
                    offsets.push(at);
                }
                if at != data.len() {
                    return Err(FormatError::invalid(
                        "entropy stream",
                        "bytes after the last chunk",
                    ));
                }
                (
                    log2,
                    StreamBody::Coded {
                        decoder,
                        values,
                        offsets,
                        data,
                    },
                )
            }
            _ => {
                return Err(FormatError::UnknownTag {
                    what: "entropy stream mode",
                    tag: mode,
                })
            }
        };
        Ok(Stream {
            n,
            chunk_log2,
            body,
        })
    }

    /// How the stream holds its symbols, for engines that decode chunks elsewhere.
    pub fn body(&self) -> &StreamBody<'a> {
        &self.body
    }

    /// Symbols per chunk.
    pub fn chunk_len(&self) -> usize {
        1 << self.chunk_log2
    }

    /// Number of chunks.
    pub fn chunks(&self) -> usize {
        self.n.div_ceil(self.chunk_len() as u64) as usize
    }

    /// Decodes chunk `i` into `out`, whose length must be that chunk's symbol count.
    pub fn decode_chunk(&self, i: usize, out: &mut [u8]) -> Result<(), FormatError> {
        let start = i * self.chunk_len();
        debug_assert_eq!(
            out.len() as u64,
            (self.n - start as u64).min(self.chunk_len() as u64)
        );
        match &self.body {
            StreamBody::Stored(b) => out.copy_from_slice(&b[start..start + out.len()]),
            StreamBody::Constant(s) => out.fill(*s),
            StreamBody::Coded {
                decoder,
                values: None,
                offsets,
                data,
            } => decoder.decode_chunk(&data[offsets[i]..offsets[i + 1]], out)?,
            StreamBody::Coded {
                decoder,
                values: Some(values),
                offsets,
                data,
            } => decode_sparse(decoder, values, &data[offsets[i]..offsets[i + 1]], out)?,
        }
        Ok(())
    }
}

/// Decodes one sparse chunk: flag bytes, then the non-zero symbols they place.
fn decode_sparse(
    flags: &Decoder,
    values: &Decoder,
    bytes: &[u8],
    out: &mut [u8],
) -> Result<(), FormatError> {
    let bad = |detail: &str| FormatError::invalid("sparse chunk", detail.to_string());
    if bytes.len() < 4 {
        return Err(bad("too short"));
    }
    let flen = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
    if flen > bytes.len() - 4 {
        return Err(bad("flags overrun the chunk"));
    }
    let (fbytes, vbytes) = bytes[4..].split_at(flen);
    let mut f = vec![0u8; out.len().div_ceil(8)];
    flags.decode_chunk(fbytes, &mut f)?;
    let count: usize = f.iter().map(|b| b.count_ones() as usize).sum();
    if count > out.len() {
        return Err(bad("more flags than symbols"));
    }
    let mut v = vec![0u8; count];
    values.decode_chunk(vbytes, &mut v)?;
    out.fill(0);
    let mut k = 0usize;
    for (j, &fl) in f.iter().enumerate() {
        let mut bits = fl;
        while bits != 0 {
            let at = 8 * j + bits.trailing_zeros() as usize;
            // A flag past the end, or a zero among the values, is not what an encoder writes.
            if at >= out.len() || v[k] == 0 {
                return Err(bad("flags or values disagree with the symbols"));
            }
            out[at] = v[k];
            k += 1;
            bits &= bits - 1;
        }
    }
    Ok(())
}

/// Decodes a whole entropy stream of `out.len()` symbols, chunks in parallel.
pub fn decode_stream(bytes: &[u8], out: &mut [u8]) -> Result<(), FormatError> {
    let stream = Stream::parse(bytes, out.len() as u64)?;
    out.par_chunks_mut(stream.chunk_len())
        .enumerate()
        .try_for_each(|(i, c)| stream.decode_chunk(i, c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(symbols: &[u8]) -> Vec<u8> {
        let mut enc = Vec::new();
        encode_stream(symbols, &mut enc);
        let mut dec = vec![0u8; symbols.len()];
        decode_stream(&enc, &mut dec).unwrap();
        assert_eq!(dec, symbols);
        enc
    }

    fn skewed(n: usize, seed: u64) -> Vec<u8> {
        // Geometric-ish: symbol k with probability about 2^-(k+1).
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x.trailing_zeros() as u8).min(63) + 100
            })
            .collect()
    }

    #[test]
    fn degenerate_inputs() {
        assert_eq!(round_trip(&[]).len(), 2, "empty is a constant stream");
        assert_eq!(round_trip(&[7; 1_000_000]).len(), 2);
        let all: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
        let enc = round_trip(&all);
        assert_eq!(enc[0], MODE_STORED, "uniform bytes are stored");
        round_trip(&[1, 2]);
        round_trip(&[0, 0, 0, 255]);
    }

    #[test]
    fn maximal_skew_is_length_limited() {
        // Fibonacci-like counts force a Huffman tree far deeper than 12 levels.
        let mut hist = Histogram::default();
        let (mut a, mut b) = (1u64, 1u64);
        for s in 0..40 {
            hist.0[s] = a;
            (a, b) = (b, a + b);
        }
        let code = Code::build(&hist);
        assert!(code.lengths().iter().all(|&l| l <= MAX_LEN));
        Code::from_lengths(*code.lengths()).unwrap();
        let mut symbols = Vec::new();
        for (s, &c) in hist.0.iter().enumerate() {
            symbols.extend(std::iter::repeat_n(s as u8, c.min(5000) as usize));
        }
        round_trip(&symbols);
        // All 256 symbols with very unequal counts.
        let mut symbols = skewed(400_000, 9);
        symbols.extend(0..=255u8);
        round_trip(&symbols);
    }

    #[test]
    fn near_entropy_and_exact_size() {
        let symbols = skewed(1 << 20, 3);
        let hist = Histogram::of(&symbols);
        let (plan, _) = Plan::choose(&hist, None);
        let Plan::Huffman(code) = plan else {
            panic!("skewed data is coded")
        };
        let bits = code.encoded_bits(&hist) as f64;
        let h = hist.entropy_bits();
        assert!(bits >= h && bits < h * 1.03 + 64.0, "{bits} vs {h}");
        let enc = round_trip(&symbols);
        let chunks = symbols.len().div_ceil(1 << CHUNK_LOG2);
        let expected = 2 + LENGTHS_BYTES + (4 + 12) * chunks;
        assert!(enc.len() >= expected + (bits / 8.0) as usize);
        assert!(enc.len() <= expected + (bits / 8.0) as usize + 4 * chunks + 1);
    }

    #[test]
    fn sparse_mode_beats_one_bit_a_symbol() {
        // 95 % zeros: Huffman needs at least 1 bit a symbol, the entropy is about 0.35.
        let mut x = 7u64;
        let symbols: Vec<u8> = (0..1_000_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if x % 100 < 95 {
                    0
                } else {
                    1 + (x >> 32) as u8 % 7
                }
            })
            .collect();
        let hist = Histogram::of(&symbols);
        let (plan, size) = Plan::choose(&hist, Some(&flag_histogram(&symbols)));
        assert!(matches!(plan, Plan::Sparse { .. }), "{plan:?}");
        let entropy_bytes = hist.entropy_bits() / 8.0;
        assert!(
            (size as f64) < entropy_bytes * 1.12,
            "{size} vs {entropy_bytes}"
        );
        let enc = round_trip(&symbols);
        assert!(enc.len() as u64 <= size);
        // Sparse chunks end anywhere: lengths not a multiple of 8, single chunks, all zeros
        // but one.
        for n in [1usize, 7, 9, 1000, (1 << CHUNK_LOG2) + 3] {
            let mut s = vec![0u8; n];
            s[n / 2] = 5;
            s[0] = 0;
            round_trip(&s);
            let mut s: Vec<u8> = symbols[..n].to_vec();
            s[n - 1] = 3;
            round_trip(&s);
        }
    }

    #[test]
    fn flag_bytes_mark_nonzero_symbols() {
        assert_eq!(nonzero_flags(&[0, 1, 0, 0, 0, 0, 0, 200]), 0b1000_0010);
        assert_eq!(nonzero_flags(&[0x80; 8]), 0xff);
        assert_eq!(nonzero_flags(&[0; 8]), 0);
        assert_eq!(nonzero_flags(&[1, 0, 1]), 0b101);
        for b in 0..=255u8 {
            assert_eq!(nonzero_flags(&[b]), (b != 0) as u8);
        }
    }

    #[test]
    fn chunks_decode_alone() {
        let symbols = skewed(3 * (1 << CHUNK_LOG2) + 1234, 5);
        let mut enc = Vec::new();
        encode_stream(&symbols, &mut enc);
        let s = Stream::parse(&enc, symbols.len() as u64).unwrap();
        assert_eq!(s.chunks(), 4);
        let mut out = vec![0u8; 1234];
        s.decode_chunk(3, &mut out).unwrap();
        assert_eq!(out, symbols[3 << CHUNK_LOG2..]);
    }

    #[test]
    fn truncation_is_detected() {
        let symbols = skewed(200_000, 11);
        let mut enc = Vec::new();
        encode_stream(&symbols, &mut enc);
        // Truncation is always an error. (A wrong symbol count may not be: padding bits can
        // spell a short code. The count comes from the record, and the content hash catches
        // the rest.)
        let mut out = vec![0u8; symbols.len()];
        assert!(decode_stream(&enc[..enc.len() - 1], &mut out).is_err());
        let mut many = vec![0u8; symbols.len() + 1000];
        assert!(decode_stream(&enc, &mut many).is_err());
    }

    proptest! {
        #[test]
        fn round_trips(symbols in proptest::collection::vec(0u8..6, 0..5000), extra in proptest::collection::vec(any::<u8>(), 0..40)) {
            let mut s = symbols;
            s.extend(extra);
            round_trip(&s);
        }

        #[test]
        fn single_chunk_matches_stream(symbols in proptest::collection::vec(0u8..20, 1..3000)) {
            let hist = Histogram::of(&symbols);
            let code = Code::build(&hist);
            prop_assert!(code.lengths().iter().all(|&l| l <= MAX_LEN));
            let mut out = Vec::new();
            Encoder::new(&code).encode_chunk(&symbols, &mut out);
            let mut back = vec![0u8; symbols.len()];
            if symbols.iter().any(|&s| s != symbols[0]) {
                Decoder::new(&code).decode_chunk(&out, &mut back).unwrap();
                prop_assert_eq!(back, symbols);
            }
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600), n in 0usize..5000) {
            let mut out = vec![0u8; n];
            let _ = decode_stream(&bytes, &mut out);
        }

        #[test]
        fn mutated_streams_never_panic(symbols in proptest::collection::vec(0u8..9, 1..4000), flips in proptest::collection::vec((any::<usize>(), 0u8..8), 1..4)) {
            let mut enc = Vec::new();
            encode_stream(&symbols, &mut enc);
            for (at, bit) in flips {
                let at = at % enc.len();
                enc[at] ^= 1 << bit;
            }
            let mut out = vec![0u8; symbols.len()];
            let _ = decode_stream(&enc, &mut out);
        }
    }
}
