//! The self-describing entropy stream of `docs/FORMAT.md`: stored, constant, Huffman or
//! sparse, with a chunk length table so chunks code and decode in parallel.

use std::sync::Arc;

use mdl_format::FormatError;
use rayon::prelude::*;

use super::{
    Code, Decoder, Encoder, Histogram, Lanes, CHUNK_LOG2, LENGTHS_BYTES, MAX_CHUNK_LOG2,
    MAX_WIDE_CHUNK_LOG2, MIN_CHUNK_LOG2, MODE_CONSTANT, MODE_HUFFMAN, MODE_HUFFMAN_WIDE,
    MODE_SPARSE, MODE_SPARSE_WIDE, MODE_STORED,
};

/// The lanes writers use.
const WRITTEN: Lanes = Lanes::Wide;

/// The stream modes of Huffman and of sparse streams whose chunks have `lanes`.
const fn modes(lanes: Lanes) -> (u8, u8) {
    match lanes {
        Lanes::Four => (MODE_HUFFMAN, MODE_SPARSE),
        Lanes::Wide => (MODE_HUFFMAN_WIDE, MODE_SPARSE_WIDE),
    }
}

/// Sparse mode: which symbols of 8 are non-zero, one bit each (bit `k` = symbol `k`).
#[inline]
pub(super) fn nonzero_flags(eight: &[u8]) -> u8 {
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
    /// a lane's padding byte a chunk (twice that for sparse streams) over.
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
            + (4 + WRITTEN.overhead()) * chunks
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
                + (8 + 2 * WRITTEN.overhead()) * chunks
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
            (Plan::Huffman(_), Some((enc, _))) => enc.encode_chunk(WRITTEN, symbols, out),
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
                fenc.encode_chunk(WRITTEN, &flags, out);
                let flen = (out.len() - at - 4) as u32;
                out[at..at + 4].copy_from_slice(&flen.to_le_bytes());
                venc.encode_chunk(WRITTEN, &values, out);
            }
            _ => unreachable!("coded plans have encoders"),
        }
    }

    /// The stream's header for these chunks (produced by [`Self::chunk`], in order): the
    /// stream is this header followed by the chunks' bytes (none for a constant stream).
    pub fn head(&self, chunks: &[&[u8]]) -> Vec<u8> {
        let lens: Vec<u32> = chunks.iter().map(|c| c.len() as u32).collect();
        self.head_of_lengths(&lens)
    }

    /// [`Self::head`] from the chunks' lengths alone.
    pub fn head_of_lengths(&self, lens: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        let table = |out: &mut Vec<u8>| {
            for len in lens {
                out.extend_from_slice(&len.to_le_bytes());
            }
        };
        match &self.plan {
            Plan::Stored => out.push(MODE_STORED),
            Plan::Constant(s) => out.extend_from_slice(&[MODE_CONSTANT, *s]),
            Plan::Huffman(code) => {
                out.extend_from_slice(&[modes(WRITTEN).0, CHUNK_LOG2]);
                code.write_lengths(&mut out);
                table(&mut out);
            }
            Plan::Sparse { flags, values } => {
                out.extend_from_slice(&[modes(WRITTEN).1, CHUNK_LOG2]);
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
/// It may be a window of a longer stream ([`StreamHead::window`]): chunk 0 is then the
/// window's first.
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
        /// How each chunk's symbols are split into lanes.
        lanes: Lanes,
        /// Decoder of the symbols (of the flag bytes, for sparse chunks).
        decoder: Arc<Decoder>,
        /// Decoder of the non-zero symbols of sparse chunks.
        values: Option<Arc<Decoder>>,
        /// Start of each chunk in `data`, plus the end.
        offsets: Vec<usize>,
        /// The chunks.
        data: &'a [u8],
    },
}

/// The header of an entropy stream, parsed without its chunks: how the symbols are held and
/// where each chunk lies. A reader that cannot hold the whole stream reads the bytes of a
/// window of chunks ([`Self::byte_range`]) and decodes them as a [`Stream`]
/// ([`Self::window`]).
pub struct StreamHead {
    n: u64,
    chunk_log2: u8,
    kind: HeadKind,
    /// Bytes the header takes.
    len: usize,
}

enum HeadKind {
    Stored,
    Constant(u8),
    Coded {
        lanes: Lanes,
        decoder: Arc<Decoder>,
        values: Option<Arc<Decoder>>,
        /// Start of each chunk after the header, plus the end.
        offsets: Vec<u64>,
    },
}

impl StreamHead {
    /// The most bytes the header of a stream of `n` symbols can take: what a reader reads
    /// (up to the stream's length) before [`Self::parse`].
    pub fn max_len(n: u64) -> u64 {
        2 + 2 * LENGTHS_BYTES as u64 + n.div_ceil(1 << MIN_CHUNK_LOG2) * 4
    }

    /// Parses the header of a stream of exactly `n` symbols and `stream_len` bytes, from
    /// `bytes`: its first bytes (at least the header's, or all of the stream).
    pub fn parse(bytes: &[u8], n: u64, stream_len: u64) -> Result<StreamHead, FormatError> {
        let short = |needed: usize| FormatError::Truncated {
            what: "entropy stream",
            needed,
        };
        let (&mode, rest) = bytes.split_first().ok_or(short(1))?;
        let head = |chunk_log2, kind, len| StreamHead {
            n,
            chunk_log2,
            kind,
            len,
        };
        match mode {
            MODE_STORED => {
                if stream_len.checked_sub(1) != Some(n) {
                    return Err(FormatError::invalid(
                        "entropy stream",
                        "stored length disagrees with the symbol count",
                    ));
                }
                Ok(head(CHUNK_LOG2, HeadKind::Stored, 1))
            }
            MODE_CONSTANT => match (rest.first(), stream_len) {
                (Some(&s), 2) => Ok(head(CHUNK_LOG2, HeadKind::Constant(s), 2)),
                _ => Err(FormatError::invalid(
                    "entropy stream",
                    "constant stream has the wrong length",
                )),
            },
            MODE_HUFFMAN | MODE_SPARSE | MODE_HUFFMAN_WIDE | MODE_SPARSE_WIDE => {
                let sparse = mode == MODE_SPARSE || mode == MODE_SPARSE_WIDE;
                let (lanes, max_log2) = if mode >= MODE_HUFFMAN_WIDE {
                    (Lanes::Wide, MAX_WIDE_CHUNK_LOG2)
                } else {
                    (Lanes::Four, MAX_CHUNK_LOG2)
                };
                let codes = if sparse { 2 } else { 1 };
                let fixed = 1 + codes * LENGTHS_BYTES;
                if rest.len() < fixed {
                    return Err(short(fixed - rest.len()));
                }
                let log2 = rest[0];
                if !(MIN_CHUNK_LOG2..=max_log2).contains(&log2) {
                    return Err(FormatError::invalid("entropy stream", "bad chunk size"));
                }
                let decoder = Arc::new(Decoder::new(&Code::read_lengths(&rest[1..])?));
                let values = if sparse {
                    let code = Code::read_lengths(&rest[1 + LENGTHS_BYTES..])?;
                    Some(Arc::new(Decoder::new(&code)))
                } else {
                    None
                };
                let rest = &rest[fixed..];
                let chunks = n.div_ceil(1 << log2);
                // Each chunk needs a 4-byte length: bound the table by the input first.
                if chunks.saturating_mul(4) > rest.len() as u64 {
                    return Err(short(
                        (chunks * 4).saturating_sub(rest.len() as u64) as usize
                    ));
                }
                let len = 1 + fixed + chunks as usize * 4;
                let data_len = stream_len.checked_sub(len as u64).ok_or(short(0))?;
                let mut offsets = Vec::with_capacity(chunks as usize + 1);
                let mut at = 0u64;
                offsets.push(0);
                for c in rest[..chunks as usize * 4].chunks_exact(4) {
                    at += u32::from_le_bytes(c.try_into().expect("4 bytes")) as u64;
                    if at > data_len {
                        return Err(FormatError::invalid(
                            "entropy stream",
                            "chunk table overruns the stream",
                        ));
                    }
                    offsets.push(at);
                }
                if at != data_len {
                    return Err(FormatError::invalid(
                        "entropy stream",
                        "bytes after the last chunk",
                    ));
                }
                let kind = HeadKind::Coded {
                    lanes,
                    decoder,
                    values,
                    offsets,
                };
                Ok(head(log2, kind, len))
            }
            _ => Err(FormatError::UnknownTag {
                what: "entropy stream mode",
                tag: mode,
            }),
        }
    }

    /// Symbols per chunk.
    pub fn chunk_len(&self) -> usize {
        1 << self.chunk_log2
    }

    /// Number of chunks.
    pub fn chunks(&self) -> usize {
        self.n.div_ceil(self.chunk_len() as u64) as usize
    }

    /// Symbols in chunks `first..first + count` (clamped to the stream).
    fn symbols(&self, first: usize, count: usize) -> u64 {
        let cl = self.chunk_len() as u64;
        let start = (first as u64 * cl).min(self.n);
        ((first + count) as u64 * cl).min(self.n) - start
    }

    /// Where the bytes of chunks `first..first + count` lie, from the stream's start.
    pub fn byte_range(&self, first: usize, count: usize) -> std::ops::Range<u64> {
        let at = self.len as u64;
        let last = (first + count).min(self.chunks());
        let first = first.min(last);
        match &self.kind {
            HeadKind::Stored => {
                let cl = self.chunk_len() as u64;
                at + (first as u64 * cl).min(self.n)..at + (last as u64 * cl).min(self.n)
            }
            HeadKind::Constant(_) => at..at,
            HeadKind::Coded { offsets, .. } => at + offsets[first]..at + offsets[last],
        }
    }

    /// Chunks `first..first + count` as a stream of their own, from `data`: the bytes of
    /// [`Self::byte_range`] for the same chunks.
    pub fn window<'a>(&self, first: usize, count: usize, data: &'a [u8]) -> Stream<'a> {
        let n = self.symbols(first, count);
        let last = (first + count).min(self.chunks());
        let first = first.min(last);
        let body = match &self.kind {
            HeadKind::Stored => StreamBody::Stored(data),
            HeadKind::Constant(s) => StreamBody::Constant(*s),
            HeadKind::Coded {
                lanes,
                decoder,
                values,
                offsets,
            } => StreamBody::Coded {
                lanes: *lanes,
                decoder: decoder.clone(),
                values: values.clone(),
                offsets: offsets[first..=last]
                    .iter()
                    .map(|o| (o - offsets[first]) as usize)
                    .collect(),
                data,
            },
        };
        Stream {
            n,
            chunk_log2: self.chunk_log2,
            body,
        }
    }
}

impl<'a> Stream<'a> {
    /// Parses a stream of exactly `n` symbols occupying all of `bytes`.
    pub fn parse(bytes: &'a [u8], n: u64) -> Result<Stream<'a>, FormatError> {
        let head = StreamHead::parse(bytes, n, bytes.len() as u64)?;
        Ok(head.window(0, head.chunks(), &bytes[head.len..]))
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

    /// Chunk `i`'s `n` symbols where the stream stores them as they are: the bytes
    /// [`Self::decode_chunk`] would copy out.
    pub fn stored_chunk(&self, i: usize, n: usize) -> Option<&'a [u8]> {
        match self.body {
            StreamBody::Stored(b) => {
                let start = i * self.chunk_len();
                Some(&b[start..start + n])
            }
            _ => None,
        }
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
                lanes,
                decoder,
                values: None,
                offsets,
                data,
            } => decoder.decode_chunk(*lanes, &data[offsets[i]..offsets[i + 1]], out)?,
            StreamBody::Coded {
                lanes,
                decoder,
                values: Some(values),
                offsets,
                data,
            } => decode_sparse(
                *lanes,
                decoder,
                values,
                &data[offsets[i]..offsets[i + 1]],
                out,
            )?,
        }
        Ok(())
    }
}

/// Decodes one sparse chunk: flag bytes, then the non-zero symbols they place.
fn decode_sparse(
    lanes: Lanes,
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
    flags.decode_chunk(lanes, fbytes, &mut f)?;
    let count: usize = f.iter().map(|b| b.count_ones() as usize).sum();
    if count > out.len() {
        return Err(bad("more flags than symbols"));
    }
    let mut v = vec![0u8; count];
    values.decode_chunk(lanes, vbytes, &mut v)?;
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
