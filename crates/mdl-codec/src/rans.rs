//! A static range-ANS coder of byte symbols, each coded under one of a few contexts whose
//! frequency tables travel with the stream (`docs/FORMAT.md`, "Context-coded codes").
//!
//! Where the Huffman coder of [`crate::huffman`] spends at least one bit a symbol and rounds every
//! probability to a power of two, rANS spends close to a symbol's information content: on the
//! residual codes of lossy commits, whose zero code often has a probability of 0.6–0.9, that is
//! 5–15 % fewer bits (`docs/BENCHMARKS.md`). The coder is ours for the reasons the Huffman coder
//! is (`docs/DECISIONS.md`): its byte layout is part of the format, and it is a hundred lines.
//!
//! Layout of a coded sequence of `N` symbols: the byte length of each chunk of [`CHUNK`] symbols
//! (varints), then the chunks. A chunk is four 32-bit final states (LE), then 16-bit words (LE)
//! in the order the decoder reads them. Symbol `k` of a chunk is coded in state `k mod 4`; the
//! decoder starts from the stored states and ends, with every word read, at [`LOW`] in all four.

use mdl_format::FormatError;
use rayon::prelude::*;

use crate::varint;

/// Symbols per independently coded chunk (what one decoding thread takes).
pub const CHUNK: usize = 1 << 16;
/// Frequencies of a table sum to `1 << SCALE`.
pub const SCALE: u32 = 12;
const TOTAL: u32 = 1 << SCALE;
/// The states' lower bound; every chunk's coding starts (and its decoding ends) there.
pub const LOW: u32 = 1 << 16;
/// Interleaved states a chunk.
const LANES: usize = 4;

fn bad(why: &str) -> FormatError {
    FormatError::invalid("rans", why.to_string())
}

/// One context's symbol frequencies, summing to `1 << SCALE`.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    freq: [u32; 256],
    cum: [u32; 256],
}

impl Table {
    /// Frequencies in proportion to `counts` (every counted symbol at least 1); `None` when
    /// nothing was counted.
    pub fn from_counts(counts: &[u64; 256]) -> Option<Table> {
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let mut freq = [0u32; 256];
        for (f, &c) in freq.iter_mut().zip(counts) {
            if c > 0 {
                *f = ((c as f64 * TOTAL as f64 / total as f64).round() as u32).max(1);
            }
        }
        // Settle the rounding on the most frequent symbols: at most 256 symbols of at least 1
        // each, so a sum of TOTAL is always reachable.
        let mut sum: u32 = freq.iter().sum();
        while sum != TOTAL {
            let top = (0..256).max_by_key(|&s| (freq[s], s)).unwrap();
            if sum < TOTAL {
                freq[top] += TOTAL - sum;
                sum = TOTAL;
            } else {
                let take = (sum - TOTAL).min(freq[top] - 1);
                if take == 0 {
                    // The largest is 1: impossible while sum > TOTAL ≥ 256 symbols.
                    unreachable!("frequencies of at most 256 symbols");
                }
                freq[top] -= take;
                sum -= take;
            }
        }
        Some(Table::of(freq))
    }

    fn of(freq: [u32; 256]) -> Table {
        let mut cum = [0u32; 256];
        let mut at = 0;
        for (c, &f) in cum.iter_mut().zip(&freq) {
            *c = at;
            at += f;
        }
        Table { freq, cum }
    }

    /// Bits that coding `counts` with this table takes (the stream's words, not the table).
    pub fn cost_bits(&self, counts: &[u64; 256]) -> f64 {
        counts
            .iter()
            .zip(&self.freq)
            .filter(|(&c, _)| c > 0)
            .map(|(&c, &f)| c as f64 * (SCALE as f64 - (f as f64).log2()))
            .sum()
    }

    /// Appends the table: `varint S | S × (u8 symbol, varint frequency)`, symbols increasing.
    pub fn write(table: Option<&Table>, out: &mut Vec<u8>) {
        let Some(t) = table else {
            out.push(0);
            return;
        };
        let symbols = t.freq.iter().filter(|&&f| f > 0).count();
        varint::put(out, symbols as u64);
        for (s, &f) in t.freq.iter().enumerate().filter(|(_, &f)| f > 0) {
            out.push(s as u8);
            varint::put(out, f as u64);
        }
    }

    /// The table at `*at` (`None`: a context no symbol has), moving `*at` past it.
    pub fn read(buf: &[u8], at: &mut usize) -> Result<Option<Table>, FormatError> {
        let symbols = varint::read(buf, at).ok_or_else(|| bad("truncated table"))?;
        if symbols == 0 {
            return Ok(None);
        }
        if symbols > 256 {
            return Err(bad("more than 256 symbols in a table"));
        }
        let mut freq = [0u32; 256];
        let mut last: Option<u8> = None;
        let mut sum = 0u64;
        for _ in 0..symbols {
            let s = *buf.get(*at).ok_or_else(|| bad("truncated table"))?;
            *at += 1;
            if last.is_some_and(|l| s <= l) {
                return Err(bad("table symbols out of order"));
            }
            last = Some(s);
            let f = varint::read(buf, at).ok_or_else(|| bad("truncated table"))?;
            if f == 0 || f > TOTAL as u64 {
                return Err(bad("a frequency out of range"));
            }
            freq[s as usize] = f as u32;
            sum += f;
        }
        if sum != TOTAL as u64 {
            return Err(bad("frequencies do not sum to the scale"));
        }
        Ok(Some(Table::of(freq)))
    }
}

/// What each slot of a table decodes to: the symbol, its frequency, and the slot's offset
/// within the symbol's range.
struct Lookup(Vec<Slot>);

#[derive(Clone, Copy, Default)]
struct Slot {
    freq: u16,
    offset: u16,
    symbol: u8,
}

impl Lookup {
    fn new(table: &Table) -> Lookup {
        let mut slots = vec![Slot::default(); TOTAL as usize];
        for s in 0..256 {
            let (c, f) = (table.cum[s] as usize, table.freq[s] as usize);
            for (k, slot) in slots[c..c + f].iter_mut().enumerate() {
                *slot = Slot {
                    freq: f as u16,
                    offset: k as u16,
                    symbol: s as u8,
                };
            }
        }
        Lookup(slots)
    }
}

/// Codes `symbols`, symbol `i` under the table of context `contexts(range)[i − start]`
/// (`contexts` fills a chunk's contexts), and appends the coded sequence to `out`. Every
/// symbol must have a non-zero frequency in its context's table.
pub fn encode(
    symbols: &[u8],
    contexts: impl Fn(std::ops::Range<usize>, &mut Vec<u8>) + Sync,
    tables: &[Option<Table>],
    out: &mut Vec<u8>,
) {
    encode_chunks(symbols, out, |start, chunk| {
        let mut ctx = Vec::with_capacity(chunk.len());
        contexts(start..start + chunk.len(), &mut ctx);
        encode_chunk(chunk, |k| {
            tables[ctx[k] as usize]
                .as_ref()
                .expect("a table for every context coded")
        })
    });
}

/// [`encode`] with every symbol under `table`: the same bytes as one context would give, but
/// no context is looked up a symbol.
pub fn encode_one(symbols: &[u8], table: &Table, out: &mut Vec<u8>) {
    encode_chunks(symbols, out, |_, chunk| encode_chunk(chunk, |_| table));
}

/// Codes the chunks of `symbols` in parallel (`chunk(first symbol, its symbols)`) and appends
/// their lengths, then their bytes.
fn encode_chunks(
    symbols: &[u8],
    out: &mut Vec<u8>,
    chunk: impl Fn(usize, &[u8]) -> Vec<u8> + Sync,
) {
    let chunks: Vec<Vec<u8>> = symbols
        .par_chunks(CHUNK)
        .enumerate()
        .map(|(c, symbols)| chunk(c * CHUNK, symbols))
        .collect();
    for c in &chunks {
        varint::put(out, c.len() as u64);
    }
    for c in &chunks {
        out.extend_from_slice(c);
    }
}

fn encode_chunk<'t>(symbols: &[u8], table: impl Fn(usize) -> &'t Table) -> Vec<u8> {
    let mut state = [LOW; LANES];
    let mut words: Vec<u16> = Vec::with_capacity(symbols.len() / 8);
    for k in (0..symbols.len()).rev() {
        let t = table(k);
        let s = symbols[k] as usize;
        let (f, c) = (t.freq[s], t.cum[s]);
        assert!(f > 0, "a symbol its table does not have");
        let x = &mut state[k % LANES];
        // Keep the next state below 2^32: renormalize while x ≥ (LOW >> SCALE) << 16 · f.
        if u64::from(*x) >= u64::from((LOW >> SCALE) << 16) * u64::from(f) {
            words.push(*x as u16);
            *x >>= 16;
        }
        *x = ((*x / f) << SCALE) + (*x % f) + c;
    }
    let mut out = Vec::with_capacity(LANES * 4 + words.len() * 2);
    for s in state {
        out.extend_from_slice(&s.to_le_bytes());
    }
    for w in words.iter().rev() {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out
}

/// Decodes [`encode`]'s output of `out.len()` symbols from `bytes` (the whole of it) into
/// `out`, with the same contexts; a damaged or inconsistent stream is an error.
pub fn decode(
    bytes: &[u8],
    contexts: impl Fn(std::ops::Range<usize>, &mut Vec<u8>) + Sync,
    tables: &[Option<Table>],
    out: &mut [u8],
) -> Result<(), FormatError> {
    let lookups: Vec<Option<Lookup>> = tables.iter().map(|t| t.as_ref().map(Lookup::new)).collect();
    decode_chunks(bytes, out, |start, bytes, out| {
        let mut ctx = Vec::with_capacity(out.len());
        contexts(start..start + out.len(), &mut ctx);
        // Every context used must have a table: checked once, so the loop indexes freely.
        let mut used = [false; 256];
        ctx.iter().for_each(|&k| used[k as usize] = true);
        let mut slots: Vec<&[Slot]> = Vec::with_capacity(lookups.len());
        for (k, l) in lookups.iter().enumerate() {
            match l {
                Some(l) => slots.push(&l.0),
                None if used[k] => return Err(bad("a context without a table")),
                None => slots.push(&[]),
            }
        }
        if used[lookups.len().min(256)..].iter().any(|&u| u) {
            return Err(bad("a context without a table"));
        }
        decode_chunk(bytes, out, |k| slots[ctx[k] as usize])
    })
}

/// [`decode`] of symbols all coded under one table (one context).
pub fn decode_one(bytes: &[u8], table: &Table, out: &mut [u8]) -> Result<(), FormatError> {
    let lookup = Lookup::new(table);
    decode_chunks(bytes, out, |_, bytes, out| {
        decode_chunk(bytes, out, |_| &lookup.0)
    })
}

/// Reads the chunk lengths of a coded sequence of `out.len()` symbols, then decodes its chunks
/// in parallel: `chunk(first symbol, chunk bytes, chunk's symbols)`.
fn decode_chunks(
    bytes: &[u8],
    out: &mut [u8],
    chunk: impl Fn(usize, &[u8], &mut [u8]) -> Result<(), FormatError> + Sync,
) -> Result<(), FormatError> {
    let n = out.len();
    let chunks = n.div_ceil(CHUNK);
    let mut at = 0;
    let mut spans = Vec::with_capacity(chunks);
    for _ in 0..chunks {
        let len = varint::read(bytes, &mut at).ok_or_else(|| bad("truncated chunk lengths"))?;
        spans.push(usize::try_from(len).map_err(|_| bad("chunk too long"))?);
    }
    let mut starts = Vec::with_capacity(chunks);
    for &len in &spans {
        starts.push(at);
        at = at
            .checked_add(len)
            .filter(|&e| e <= bytes.len())
            .ok_or_else(|| bad("truncated chunk"))?;
    }
    if at != bytes.len() {
        return Err(bad("bytes after the last chunk"));
    }
    out.par_chunks_mut(CHUNK)
        .enumerate()
        .try_for_each(|(c, out)| chunk(c * CHUNK, &bytes[starts[c]..starts[c] + spans[c]], out))
}

/// Decodes one chunk's symbols into `out`, symbol `k` under the lookup `table(k)` (every one
/// a full table: the caller checked).
fn decode_chunk<'t>(
    bytes: &[u8],
    out: &mut [u8],
    table: impl Fn(usize) -> &'t [Slot],
) -> Result<(), FormatError> {
    if bytes.len() < LANES * 4 || !(bytes.len() - LANES * 4).is_multiple_of(2) {
        return Err(bad("a chunk of the wrong length"));
    }
    let mut state = [0u32; LANES];
    for (l, s) in state.iter_mut().enumerate() {
        *s = u32::from_le_bytes(bytes[l * 4..l * 4 + 4].try_into().unwrap());
        if *s < LOW {
            return Err(bad("a state below its bound"));
        }
    }
    let words = &bytes[LANES * 4..];
    let mut w = 0;
    // Reading past the words gives zeros and is caught by the end check.
    let mut step = |x: &mut u32, table: &[Slot]| -> u8 {
        let slot = table[(*x & (TOTAL - 1)) as usize];
        *x = slot.freq as u32 * (*x >> SCALE) + slot.offset as u32;
        if *x < LOW {
            let word = match words.get(w..w + 2) {
                Some(b) => u16::from_le_bytes([b[0], b[1]]),
                None => 0,
            };
            *x = (*x << 16) | u32::from(word);
            w += 2;
        }
        slot.symbol
    };
    let [mut x0, mut x1, mut x2, mut x3] = state;
    let mut quads = out.chunks_exact_mut(LANES);
    let mut k = 0;
    for quad in &mut quads {
        quad[0] = step(&mut x0, table(k));
        quad[1] = step(&mut x1, table(k + 1));
        quad[2] = step(&mut x2, table(k + 2));
        quad[3] = step(&mut x3, table(k + 3));
        k += LANES;
    }
    let mut state = [x0, x1, x2, x3];
    for (l, o) in quads.into_remainder().iter_mut().enumerate() {
        *o = step(&mut state[l], table(k + l));
    }
    if w != words.len() || state.iter().any(|&s| s != LOW) {
        return Err(bad("a chunk that does not end where it began"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(symbols: &[u8]) -> [u64; 256] {
        let mut c = [0u64; 256];
        for &s in symbols {
            c[s as usize] += 1;
        }
        c
    }

    fn one_context(range: std::ops::Range<usize>, ctx: &mut Vec<u8>) {
        ctx.resize(range.len(), 0);
    }

    #[test]
    fn round_trips_skewed_and_flat_symbols_over_chunk_boundaries() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for (n, spread) in [
            (1usize, 1u64),
            (5, 3),
            (CHUNK, 2),
            (CHUNK * 2 + 7, 40),
            (3000, 256),
        ] {
            let symbols: Vec<u8> = (0..n)
                .map(|_| {
                    let r = next();
                    if r % 4 != 0 {
                        0
                    } else {
                        ((r >> 8) % spread) as u8
                    }
                })
                .collect();
            let tables = [Table::from_counts(&counts(&symbols))];
            let mut coded = Vec::new();
            encode(&symbols, one_context, &tables, &mut coded);
            let mut back = vec![0u8; n];
            decode(&coded, one_context, &tables, &mut back).unwrap();
            assert_eq!(back, symbols, "n = {n}");
        }
    }

    #[test]
    fn contexts_pick_their_tables_and_a_skewed_stream_is_near_its_entropy() {
        // Even elements are mostly 0, odd ones mostly 9: two contexts.
        let symbols: Vec<u8> = (0..100_000usize)
            .map(|i| match (i % 2, i % 13) {
                (0, 0) => 1,
                (0, _) => 0,
                (_, 0) => 8,
                _ => 9,
            })
            .collect();
        let parity = |r: std::ops::Range<usize>, ctx: &mut Vec<u8>| {
            ctx.extend(r.map(|i| (i % 2) as u8));
        };
        let even: Vec<u8> = symbols.iter().step_by(2).copied().collect();
        let odd: Vec<u8> = symbols.iter().skip(1).step_by(2).copied().collect();
        let tables = [
            Table::from_counts(&counts(&even)),
            Table::from_counts(&counts(&odd)),
        ];
        let mut coded = Vec::new();
        encode(&symbols, parity, &tables, &mut coded);
        let mut back = vec![0u8; symbols.len()];
        decode(&coded, parity, &tables, &mut back).unwrap();
        assert_eq!(back, symbols);
        // Entropy of a 1/13 event: 0.391 bits a symbol; allow 2 % and the states.
        let entropy = 0.391 * symbols.len() as f64 / 8.0;
        assert!(
            (coded.len() as f64) < entropy * 1.02 + 64.0,
            "{} bytes",
            coded.len()
        );
        let predicted: f64 = tables[0].as_ref().unwrap().cost_bits(&counts(&even))
            + tables[1].as_ref().unwrap().cost_bits(&counts(&odd));
        assert!((coded.len() as f64 * 8.0 - predicted).abs() < 64.0 * 8.0);
    }

    #[test]
    fn tables_round_trip_and_bad_ones_are_refused() {
        let mut c = [0u64; 256];
        c[0] = 1_000_000;
        c[3] = 1;
        c[255] = 7;
        let t = Table::from_counts(&c).unwrap();
        assert_eq!(t.freq.iter().sum::<u32>(), TOTAL);
        assert!(t.freq[3] >= 1 && t.freq[255] >= 1);
        let mut bytes = Vec::new();
        Table::write(Some(&t), &mut bytes);
        Table::write(None, &mut bytes);
        let mut at = 0;
        assert_eq!(Table::read(&bytes, &mut at).unwrap(), Some(t));
        assert_eq!(Table::read(&bytes, &mut at).unwrap(), None);
        assert_eq!(at, bytes.len());
        // Out of order, a zero frequency, a sum off the scale.
        for bad in [
            vec![2u8, 5, 0x80, 0x10, 4, 0x80, 0x10],
            vec![2u8, 4, 0, 5, 0x80, 0x20],
            vec![1u8, 4, 0x80, 0x10 + 1],
        ] {
            assert!(Table::read(&bad, &mut 0).is_err());
        }
    }

    #[test]
    fn damage_is_an_error_not_a_panic() {
        let symbols: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 11 == 0) as u8).collect();
        let tables = [Table::from_counts(&counts(&symbols))];
        let mut coded = Vec::new();
        encode(&symbols, one_context, &tables, &mut coded);
        let mut out = vec![0u8; symbols.len()];
        for cut in [0, 1, coded.len() / 2, coded.len() - 1] {
            assert!(decode(&coded[..cut], one_context, &tables, &mut out).is_err());
        }
        let mut flipped = coded.clone();
        let last = flipped.len() - 3;
        flipped[last] ^= 0x40;
        // A flipped word either decodes to other symbols or fails the end check; never panics.
        let _ = decode(&flipped, one_context, &tables, &mut out);
        // A context with no table.
        let two = |r: std::ops::Range<usize>, ctx: &mut Vec<u8>| ctx.resize(r.len(), 1);
        assert!(decode(&coded, two, &tables, &mut out).is_err());
    }
}
