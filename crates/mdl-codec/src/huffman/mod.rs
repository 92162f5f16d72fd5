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
//!   a 4096-entry table that gives up to three whole codes a lookup, four lanes interleaved.
//! - [`Plan`], [`StreamWriter`], [`Stream`], [`encode_stream`] / [`decode_stream`]: the
//!   self-describing stream format of `docs/FORMAT.md` ("entropy stream"): stored, constant,
//!   Huffman, or sparse (a Huffman-coded bitmap of non-zero positions plus the non-zero symbols,
//!   for zero-heavy data), with a chunk length table so chunks are encoded and decoded in
//!   parallel and any one chunk can be decoded alone.
//!
//! Decoding untrusted bytes never panics and never allocates more than the caller's output (and
//! scratch of the same order) plus a table sized by the input's own length.

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
const MODE_HUFFMAN_WIDE: u8 = 4;
const MODE_SPARSE_WIDE: u8 = 5;
/// Largest chunk of a wide stream: its lanes' lengths fit in 16 bits.
const MAX_WIDE_CHUNK_LOG2: u8 = 17;

/// Bytes of the code length table: 256 lengths, 4 bits each.
const LENGTHS_BYTES: usize = 128;

mod chunk;
mod code;
mod group;
mod rounds;
mod stream;

pub use chunk::{Decoder, Encoder, Lanes, LANES};
pub use code::{Code, Histogram};
pub use stream::{
    decode_stream, encode_stream, flag_histogram, Plan, Stream, StreamBody, StreamHead,
    StreamWriter,
};

#[cfg(test)]
mod tests {
    use super::stream::nonzero_flags;
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

    pub(super) fn skewed(n: usize, seed: u64) -> Vec<u8> {
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
    fn encodings_are_pinned() {
        // Stored bytes never change for the same input: a faster encoder must write exactly
        // what the first one wrote (these bytes hash to what the format-10 encoder produced,
        // wide chunks; the four-lane chunks of formats 1–9 hashed to 09643425…).
        let mut all = Vec::new();
        for (n, seed) in [(13, 1), (4097, 2), (3 * (1 << CHUNK_LOG2) + 1234, 3)] {
            encode_stream(&skewed(n, seed), &mut all);
            let sparse: Vec<u8> = skewed(n, seed + 10)
                .iter()
                .map(|&s| if s > 101 { s } else { 0 })
                .collect();
            encode_stream(&sparse, &mut all);
        }
        assert_eq!(
            mdl_format::ObjectId::hash(&all).to_hex(),
            "7721a32eeb60f0c2e308d17ffdab86c5e29845c727a13fd1bd9e2cf128de2cf7",
            "{} bytes",
            all.len()
        );
    }

    /// A stream of formats 1–9 (mode 2: four lanes a chunk, `u32` lane lengths), put together
    /// by hand from the pieces the format describes.
    fn four_lane_stream(symbols: &[u8], log2: u8) -> Vec<u8> {
        let code = Code::build(&Histogram::of(symbols));
        let enc = Encoder::new(&code);
        let chunks: Vec<Vec<u8>> = symbols
            .chunks(1 << log2)
            .map(|c| {
                let mut v = Vec::new();
                enc.encode_chunk(Lanes::Four, c, &mut v);
                v
            })
            .collect();
        let mut out = vec![MODE_HUFFMAN, log2];
        code.write_lengths(&mut out);
        for c in &chunks {
            out.extend_from_slice(&(c.len() as u32).to_le_bytes());
        }
        for c in &chunks {
            out.extend_from_slice(c);
        }
        out
    }

    #[test]
    fn a_wide_chunk_byte_for_byte() {
        // Known answer, worked out from docs/FORMAT.md: lengths 1, 2, 2 for symbols 0, 1, 2
        // give the canonical codes 0, 10, 11, written bit-reversed, least significant bit
        // first. 70 symbols in 32 lanes are lanes of ⌈70/32⌉ = 3: lanes 0–22 hold 0, 1, 2 (bits
        // 0 | 1 0 | 1 1 = 0x1a), lane 23 holds one 0 (one zero bit: 0x00), lanes 24–31 nothing.
        let mut lengths = [0u8; 256];
        lengths[..3].copy_from_slice(&[1, 2, 2]);
        let code = Code::from_lengths(lengths).unwrap();
        let symbols: Vec<u8> = (0..70).map(|i| (i % 3) as u8).collect();
        let mut expected = Vec::new();
        for k in 0..31 {
            expected.extend_from_slice(&[(k < 24) as u8, 0]);
        }
        expected.extend_from_slice(&[0x1a; 23]);
        expected.push(0);
        let mut out = Vec::new();
        Encoder::new(&code).encode_chunk(Lanes::Wide, &symbols, &mut out);
        assert_eq!(out, expected);
        let mut back = vec![0u8; 70];
        Decoder::new(&code)
            .decode_chunk(Lanes::Wide, &expected, &mut back)
            .unwrap();
        assert_eq!(back, symbols);
        // The same symbols in four lanes of 18, 18, 18 and 16 (formats 1–9): each lane of 18
        // is six times 0x1a's five bits, 30 bits in 4 bytes; the last, 16 symbols, 26 bits.
        let mut four = Vec::new();
        Encoder::new(&code).encode_chunk(Lanes::Four, &symbols, &mut four);
        assert_eq!(&four[..12], &[4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0]);
        assert_eq!(four.len(), 12 + 16);
    }

    #[test]
    fn four_lane_streams_still_decode() {
        for (n, log2) in [
            (13, 17),
            (5000, 12),
            (3 * (1 << CHUNK_LOG2) + 7, 17),
            (300_000, 24),
        ] {
            let symbols = skewed(n, n as u64);
            let four = four_lane_stream(&symbols, log2);
            let mut back = vec![0u8; n];
            decode_stream(&four, &mut back).unwrap();
            assert_eq!(back, symbols, "{n}");
            // A wide stream of the same symbols: the same codes, 50 bytes more a chunk of
            // lane table, and (in chunks of 128 Ki) at most 28 more of lane padding.
            let mut wide = Vec::new();
            encode_stream(&symbols, &mut wide);
            assert_eq!(
                wide[0],
                if n < 100 {
                    MODE_STORED
                } else {
                    MODE_HUFFMAN_WIDE
                }
            );
            let chunks = n.div_ceil(1 << CHUNK_LOG2);
            if log2 == CHUNK_LOG2 {
                assert!(wide.len() <= four.len() + chunks * (50 + 28), "{n}");
            }
        }
        // A wide stream's chunks are at most 2^17 symbols (lane lengths fit 16 bits).
        let mut wide = Vec::new();
        encode_stream(&skewed(1000, 1), &mut wide);
        wide[1] = 18;
        assert!(decode_stream(&wide, &mut [0u8; 1000]).is_err());
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
        let expected = 2 + LENGTHS_BYTES + (4 + Lanes::Wide.table_len()) * chunks;
        assert!(enc.len() >= expected + (bits / 8.0) as usize);
        assert!(enc.len() <= expected + (bits / 8.0) as usize + 32 * chunks + 1);
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
            for lanes in [Lanes::Four, Lanes::Wide] {
                let mut out = Vec::new();
                Encoder::new(&code).encode_chunk(lanes, &symbols, &mut out);
                let bits = code.encoded_bits(&hist);
                prop_assert!(out.len() as u64 <= bits.div_ceil(8) + lanes.overhead());
                let mut back = vec![0u8; symbols.len()];
                if symbols.iter().any(|&s| s != symbols[0]) {
                    Decoder::new(&code).decode_chunk(lanes, &out, &mut back).unwrap();
                    prop_assert_eq!(&back, &symbols);
                }
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
