//! One chunk of symbols as independent bit streams (lanes): the encoder and the table-driven
//! decoder, for both lane layouts ([`Lanes`]).

use mdl_format::FormatError;

use super::group::{Tables, GROUP, MULTI};
use super::{Code, MAX_LEN, TABLE_SIZE};

/// Lanes a [`Lanes::Four`] chunk has (the layout of formats 1–9).
pub const LANES: usize = 4;

/// How a chunk's symbols are split into lanes: contiguous ranges of ⌈m / lanes⌉ symbols (the
/// last lanes take what remains, possibly nothing), each its own bit stream padded to a whole
/// byte, after a table of every lane's byte length but the last's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lanes {
    /// 4 lanes, `u32` lengths: streams of modes 2 and 3, written by formats 1–9.
    Four,
    /// 32 lanes, `u16` lengths: modes 4 and 5, written from format 10 on. A GPU decodes a lane a
    /// thread (a chunk of 128 Ki symbols is 32 threads of 4 Ki, where `Four` gave 4 of 32 Ki);
    /// a CPU core decodes four at a time, as it decodes a `Four` chunk.
    Wide,
}

impl Lanes {
    /// Lanes a chunk has.
    pub const fn count(self) -> usize {
        match self {
            Lanes::Four => LANES,
            Lanes::Wide => 32,
        }
    }

    /// Bytes of each entry of the lane table.
    pub const fn len_bytes(self) -> usize {
        match self {
            Lanes::Four => 4,
            Lanes::Wide => 2,
        }
    }

    /// Bytes of a chunk's lane table.
    pub const fn table_len(self) -> usize {
        self.len_bytes() * (self.count() - 1)
    }

    /// Bytes a chunk adds beyond its bits, at most: the lane table and lane padding.
    pub const fn overhead(self) -> u64 {
        (self.table_len() + self.count()) as u64
    }

    /// The symbol range of lane `k` of an `n`-symbol chunk.
    pub fn range(self, n: usize, k: usize) -> std::ops::Range<usize> {
        let q = n.div_ceil(self.count());
        (k * q).min(n)..((k + 1) * q).min(n)
    }
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

    /// Appends a coded chunk to `out`: the symbols split into `lanes`, each its own bit
    /// stream, after the table of lane byte lengths. Every symbol must have a code.
    pub fn encode_chunk(&self, lanes: Lanes, symbols: &[u8], out: &mut Vec<u8>) {
        // Each lane is coded into a region of its own of a scratch buffer kept by the thread,
        // sized for the worst case (12 bits a symbol, plus slack for the word-at-a-time
        // writes, which overwrite whatever is there), a group of lanes in lock step; then only
        // the coded bytes are appended to `out` (a worst-case region in `out` itself would be
        // zeroed, and faulted in, for nothing).
        let count = lanes.count();
        let n = symbols.len();
        let cap = n.div_ceil(count) * MAX_LEN as usize / 8 + 16;
        let mut scratch = LANE_SCRATCH.take();
        if scratch.len() < count * cap {
            scratch.resize(count * cap, 0);
        }
        let mut lens = [0usize; 32];
        let regions = &mut scratch[..count * cap];
        self.encode_groups(lanes, symbols, regions, cap, &mut lens);
        out.reserve(lanes.table_len() + lens.iter().sum::<usize>());
        for &len in &lens[..count - 1] {
            out.extend_from_slice(&(len as u32).to_le_bytes()[..lanes.len_bytes()]);
        }
        for (k, &len) in lens[..count].iter().enumerate() {
            out.extend_from_slice(&scratch[k * cap..k * cap + len]);
        }
        LANE_SCRATCH.set(scratch);
    }

    /// Codes the lanes [`GROUP`] at a time, lane `k` into region `k` (of `cap` bytes) of `regions`,
    /// its byte length into `lens[k]`.
    fn encode_groups(
        &self,
        lanes: Lanes,
        symbols: &[u8],
        regions: &mut [u8],
        cap: usize,
        lens: &mut [usize; 32],
    ) {
        let n = symbols.len();
        for (g, region) in regions.chunks_exact_mut(GROUP * cap).enumerate() {
            let mut regions = region.chunks_exact_mut(cap);
            let bufs: [&mut [u8]; GROUP] =
                std::array::from_fn(|_| regions.next().expect("a region a lane"));
            let lane: [&[u8]; GROUP] =
                std::array::from_fn(|j| &symbols[lanes.range(n, g * GROUP + j)]);
            let group_lens = super::group::encode_group(&self.codes, lane, bufs);
            lens[g * GROUP..(g + 1) * GROUP].copy_from_slice(&group_lens);
        }
    }
}

thread_local! {
    /// The lanes' regions of [`Encoder::encode_chunk`], kept from chunk to chunk.
    static LANE_SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Decodes chunks of one code: a table from the next [`MAX_LEN`] bits to `(symbol, length)`,
/// and one from the same bits to every whole code they hold, up to [`MULTI`].
pub struct Decoder {
    /// `symbol | length << 8`; length 0 marks bit patterns no code starts with.
    table: Box<[u16; TABLE_SIZE]>,
    /// `symbols (5 bytes) | bits << 40 | count << 48`: the codes (at most [`MULTI`]) that
    /// the next [`MAX_LEN`] bits hold whole, their bits together and how many; count 0 marks
    /// bit patterns no code starts with.
    multi: Box<[u64; TABLE_SIZE]>,
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
        let mut multi = Box::new([0u64; TABLE_SIZE]);
        for (i, m) in multi.iter_mut().enumerate() {
            let (mut bits, mut count, mut symbols) = (0u64, 0u64, 0u64);
            while count < MULTI as u64 {
                let e = table[i >> bits];
                let l = (e >> 8) as u64;
                if l == 0 || bits + l > MAX_LEN as u64 {
                    break;
                }
                symbols |= (e as u8 as u64) << (8 * count);
                bits += l;
                count += 1;
            }
            *m = symbols | bits << 40 | count << 48;
        }
        Decoder { table, multi }
    }

    fn tables(&self) -> Tables<'_> {
        Tables {
            single: &self.table,
            multi: &self.multi,
        }
    }

    /// The lookup table: entry `i` is `symbol | length << 8` for the code that the low
    /// [`MAX_LEN`] bits `i` of a lane start with (length 0: none does).
    pub fn table(&self) -> &[u16; TABLE_SIZE] {
        &self.table
    }

    /// Decodes exactly `out.len()` symbols from a chunk written by [`Encoder::encode_chunk`]
    /// with `lanes`; `bytes` must be exactly the chunk.
    pub fn decode_chunk(
        &self,
        lanes: Lanes,
        bytes: &[u8],
        out: &mut [u8],
    ) -> Result<(), FormatError> {
        let streams = lane_streams(lanes, bytes)?;
        self.decode_groups(lanes, &streams, out)
    }

    /// [`Self::decode_chunk`] one lookup a symbol, every index checked: the reference the
    /// fast path (whose inner loop reads and writes without bounds checks) is tested and
    /// fuzzed against. It accepts exactly the chunks `decode_chunk` accepts, with the same
    /// symbols.
    pub fn decode_chunk_checked(
        &self,
        lanes: Lanes,
        bytes: &[u8],
        out: &mut [u8],
    ) -> Result<(), FormatError> {
        let streams = lane_streams(lanes, bytes)?;
        let n = out.len();
        let mut tail = out;
        for (k, stream) in streams[..lanes.count()].iter().enumerate() {
            let (head, t) = std::mem::take(&mut tail).split_at_mut(lanes.range(n, k).len());
            tail = t;
            super::group::decode_lane(&self.table, stream, head, 0, 0)?;
        }
        Ok(())
    }

    /// Decodes the lanes [`GROUP`] at a time, lane `k` from `streams[k]`.
    fn decode_groups(
        &self,
        lanes: Lanes,
        streams: &[&[u8]; 32],
        out: &mut [u8],
    ) -> Result<(), FormatError> {
        let n = out.len();
        let mut tail = out;
        for g in 0..lanes.count() / GROUP {
            let mut outs: [&mut [u8]; GROUP] = std::array::from_fn(|_| Default::default());
            for (j, o) in outs.iter_mut().enumerate() {
                let (head, t) =
                    std::mem::take(&mut tail).split_at_mut(lanes.range(n, g * GROUP + j).len());
                *o = head;
                tail = t;
            }
            let group: [&[u8]; GROUP] = std::array::from_fn(|j| streams[g * GROUP + j]);
            super::group::decode_group(self.tables(), group, outs)?;
        }
        Ok(())
    }
}

/// The lanes of a chunk: its table of lane lengths read and checked against its length.
fn lane_streams(lanes: Lanes, bytes: &[u8]) -> Result<[&[u8]; 32], FormatError> {
    let table_len = lanes.table_len();
    if bytes.len() < table_len {
        return Err(FormatError::Truncated {
            what: "huffman chunk",
            needed: table_len - bytes.len(),
        });
    }
    let (table, mut rest) = bytes.split_at(table_len);
    let mut streams: [&[u8]; 32] = [&[]; 32];
    for (k, len) in table.chunks_exact(lanes.len_bytes()).enumerate() {
        let mut le = [0u8; 4];
        le[..len.len()].copy_from_slice(len);
        let len = u32::from_le_bytes(le) as usize;
        if len > rest.len() {
            return Err(FormatError::invalid(
                "huffman chunk",
                "lane overruns the chunk",
            ));
        }
        (streams[k], rest) = rest.split_at(len);
    }
    streams[lanes.count() - 1] = rest;
    Ok(streams)
}
