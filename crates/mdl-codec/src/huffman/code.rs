//! Symbol counts and the canonical, length-limited code built from them.

use mdl_format::FormatError;

use super::{LENGTHS_BYTES, MAX_LEN, TABLE_SIZE};

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
        let mut h = Histogram::default();
        // Pieces small enough that no `u32` counter can overflow.
        for piece in data.chunks(1 << 31) {
            // Eight bytes a load, each into its own table: runs of equal bytes (the common
            // case in exponent planes) would otherwise wait on the same counter's last store.
            let mut t = [[0u32; 256]; 8];
            let mut words = piece.chunks_exact(8);
            for w in &mut words {
                let x = u64::from_le_bytes(w.try_into().expect("8 bytes"));
                for (k, table) in t.iter_mut().enumerate() {
                    table[(x >> (8 * k)) as u8 as usize] += 1;
                }
            }
            for &b in words.remainder() {
                t[0][b as usize] += 1;
            }
            for (i, c) in h.0.iter_mut().enumerate() {
                *c += t.iter().map(|row| row[i] as u64).sum::<u64>();
            }
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
    pub(super) fn codes(&self) -> [(u16, u8); 256] {
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

    pub(super) fn write_lengths(&self, out: &mut Vec<u8>) {
        for pair in self.lengths.chunks_exact(2) {
            out.push(pair[0] | (pair[1] << 4));
        }
    }

    pub(super) fn read_lengths(bytes: &[u8]) -> Result<Code, FormatError> {
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
