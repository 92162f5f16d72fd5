//! Context-coded residual codes (payload width 3, format 9): the one-byte code plane coded by
//! [`crate::rans`] under four classes of rows or of columns.
//!
//! How far an element moved between two checkpoints depends strongly on its row and column (a
//! neuron, an input feature): the codes of some rows are mostly zero, of others mostly not. The
//! encoder ranks the rows (or the columns) of the tensor's `rows × cols` view by their mean code
//! magnitude, splits them into quartiles, stores each one's class in two bits, and codes every
//! element under its class's frequency table. Measured on the corpus' lossy series, this takes
//! 9–12 % fewer bits than the Huffman stream (`docs/BENCHMARKS.md`); the encoder keeps whichever
//! of the three choices (no classes, rows, columns) is smallest, and the caller keeps the
//! Huffman stream when that is smaller still.
//!
//! Layout (`docs/FORMAT.md`): `u8 kind (0 none, 1 rows, 2 columns) | varint R | [classes: 2 bits
//! each of the R rows or N/R columns, four a byte, the first in the low bits] | tables (one, or
//! four) | rans`.

use mdl_format::FormatError;
use rayon::prelude::*;

use crate::rans::{self, Table};
use crate::varint;

/// Classes a kind with classes has.
const CLASSES: usize = 4;

fn bad(why: &str) -> FormatError {
    FormatError::invalid("quant-residual", why.to_string())
}

/// How elements are given their context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    None = 0,
    Rows = 1,
    Cols = 2,
}

/// Each element's class: by its row, by its column, or none.
struct Classes {
    kind: Kind,
    cols: usize,
    class: Vec<u8>,
}

impl Classes {
    /// The classes of elements `range`, appended to `out`.
    fn fill(&self, range: std::ops::Range<usize>, out: &mut Vec<u8>) {
        match self.kind {
            Kind::None => out.resize(out.len() + range.len(), 0),
            Kind::Rows => {
                let mut i = range.start;
                while i < range.end {
                    let row = i / self.cols;
                    let end = ((row + 1) * self.cols).min(range.end);
                    out.resize(out.len() + (end - i), self.class[row]);
                    i = end;
                }
            }
            Kind::Cols => {
                let mut col = range.start % self.cols;
                for _ in range {
                    out.push(self.class[col]);
                    col += 1;
                    if col == self.cols {
                        col = 0;
                    }
                }
            }
        }
    }

    /// Tables a section with these classes holds: one without classes, one a class with.
    fn tables(&self) -> usize {
        match self.kind {
            Kind::None => 1,
            _ => CLASSES,
        }
    }

    /// Appends the section's head: the kind, the view's `rows`, each line's class packed.
    fn write(&self, rows: usize, out: &mut Vec<u8>) {
        out.push(self.kind as u8);
        varint::put(out, rows as u64);
        out.extend(self.class.chunks(4).map(|four| {
            four.iter()
                .enumerate()
                .fold(0u8, |b, (k, &c)| b | c << (2 * k))
        }));
    }

    /// The classes whose head starts `section`, for `n` elements, and where the head ends.
    fn read(section: &[u8], n: usize) -> Result<(Classes, usize), FormatError> {
        let kind = match section.first() {
            Some(0) => Kind::None,
            Some(1) => Kind::Rows,
            Some(2) => Kind::Cols,
            _ => return Err(bad("unknown code classes")),
        };
        let mut at = 1;
        let rows = varint::read(section, &mut at).ok_or_else(|| bad("truncated code classes"))?;
        let rows = usize::try_from(rows)
            .ok()
            .filter(|&r| r > 0 && n.is_multiple_of(r))
            .ok_or_else(|| bad("a row count that does not divide the elements"))?;
        let cols = (n / rows).max(1);
        let lines = match kind {
            Kind::None => 0,
            Kind::Rows => rows,
            Kind::Cols => cols,
        };
        let packed = section
            .get(at..at + lines.div_ceil(4))
            .ok_or_else(|| bad("truncated code classes"))?;
        let class = (0..lines)
            .map(|k| packed[k / 4] >> (2 * (k % 4)) & 3)
            .collect();
        Ok((Classes { kind, cols, class }, at + packed.len()))
    }
}

/// A code byte's magnitude `|q|` (the special codes, +0 and exact, count as 0).
fn magnitude(code: u8) -> u32 {
    if code >= 254 {
        0
    } else {
        (code as u32).div_ceil(2)
    }
}

/// Quartile classes of `means`: 0 for the lowest quarter … 3 for the highest.
fn quartiles(means: &[f64]) -> Vec<u8> {
    let mut sorted = means.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = |q: usize| sorted[(sorted.len() * q / CLASSES).min(sorted.len() - 1)];
    let bounds = [at(1), at(2), at(3)];
    means
        .iter()
        .map(|m| bounds.iter().filter(|&&b| b < *m).count() as u8)
        .collect()
}

/// Counts of each symbol: one histogram a class.
type Histograms = Vec<[u64; 256]>;

fn add(mut a: Histograms, b: Histograms) -> Histograms {
    for (x, y) in a.iter_mut().zip(&b) {
        x.iter_mut().zip(y).for_each(|(x, y)| *x += y);
    }
    a
}

/// Rows a parallel work item takes (about a chunk's elements).
fn rows_per_item(cols: usize) -> usize {
    (rans::CHUNK / cols.max(1)).max(1)
}

/// The sums of code magnitudes of every row and every column, in one pass.
fn line_sums(codes: &[u8], cols: usize) -> (Vec<u64>, Vec<u64>) {
    let parts: Vec<(Vec<u64>, Vec<u64>)> = codes
        .par_chunks(cols * rows_per_item(cols))
        .map(|block| {
            let mut col_sums = vec![0u64; cols];
            let row_sums = block
                .chunks(cols)
                .map(|row| {
                    let mut sum = 0u64;
                    for (c, &code) in col_sums.iter_mut().zip(row) {
                        let m = magnitude(code) as u64;
                        *c += m;
                        sum += m;
                    }
                    sum
                })
                .collect();
            (row_sums, col_sums)
        })
        .collect();
    let mut col_sums = vec![0u64; cols];
    let mut row_sums = Vec::new();
    for (rows, cols) in parts {
        row_sums.extend(rows);
        col_sums.iter_mut().zip(&cols).for_each(|(a, b)| *a += b);
    }
    (row_sums, col_sums)
}

/// The symbol counts of each row class and of each column class, in one pass.
fn class_histograms(codes: &[u8], cols: usize, rows: &[u8], columns: &[u8]) -> [Histograms; 2] {
    let per = rows_per_item(cols);
    let empty = || [vec![[0u64; 256]; CLASSES], vec![[0u64; 256]; CLASSES]];
    codes
        .par_chunks(cols * per)
        .enumerate()
        .map(|(b, block)| {
            let [mut by_row, mut by_col] = empty();
            for (r, row) in block.chunks(cols).enumerate() {
                let h = &mut by_row[rows[b * per + r] as usize];
                for (&code, &k) in row.iter().zip(columns) {
                    h[code as usize] += 1;
                    by_col[k as usize][code as usize] += 1;
                }
            }
            [by_row, by_col]
        })
        .reduce(empty, |[a, b], [c, d]| [add(a, c), add(b, d)])
}

/// The candidates for `codes` viewed as `rows × cols`, each with its histograms: no classes,
/// and where both sides have more than one line, classes by row and by column.
fn candidates(codes: &[u8], rows: usize, cols: usize) -> Vec<(Classes, Histograms)> {
    let none = |hist| {
        let classes = Classes {
            kind: Kind::None,
            cols,
            class: Vec::new(),
        };
        (classes, hist)
    };
    if rows < 2 || cols < 2 {
        let hist = codes
            .par_chunks(rans::CHUNK)
            .map(|chunk| {
                let mut h = [0u64; 256];
                chunk.iter().for_each(|&c| h[c as usize] += 1);
                vec![h]
            })
            .reduce(|| vec![[0u64; 256]], add);
        return vec![none(hist)];
    }
    let (row_sums, col_sums) = line_sums(codes, cols);
    let mean = |s: &[u64], n: usize| s.iter().map(|&x| x as f64 / n as f64).collect::<Vec<_>>();
    let by_rows = quartiles(&mean(&row_sums, cols));
    let by_cols = quartiles(&mean(&col_sums, rows));
    let [row_hist, col_hist] = class_histograms(codes, cols, &by_rows, &by_cols);
    let total = row_hist.iter().cloned().map(|h| vec![h]).reduce(add);
    vec![
        none(total.expect("four classes")),
        (
            Classes {
                kind: Kind::Rows,
                cols,
                class: by_rows,
            },
            row_hist,
        ),
        (
            Classes {
                kind: Kind::Cols,
                cols,
                class: by_cols,
            },
            col_hist,
        ),
    ]
}

/// The width-3 section for the one-byte `codes` of a tensor viewed as `rows × cols`: the
/// smallest of its candidates.
pub(super) fn encode(codes: &[u8], rows: usize) -> Vec<u8> {
    let n = codes.len();
    let rows = if rows > 0 && n.is_multiple_of(rows) {
        rows
    } else {
        1
    };
    let cols = (n / rows).max(1);
    let best = candidates(codes, rows, cols)
        .into_iter()
        .map(|(classes, hist)| {
            let tables: Vec<Option<Table>> = hist.iter().map(Table::from_counts).collect();
            let mut head = Vec::new();
            classes.write(rows, &mut head);
            for t in &tables {
                Table::write(t.as_ref(), &mut head);
            }
            let bits: f64 = tables
                .iter()
                .zip(&hist)
                .filter_map(|(t, h)| t.as_ref().map(|t| t.cost_bits(h)))
                .sum();
            (head.len() as f64 + bits / 8.0, head, classes, tables)
        })
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .expect("the candidate without classes");
    let (_, mut out, classes, tables) = best;
    rans::encode(codes, |r, ctx| classes.fill(r, ctx), &tables, &mut out);
    out
}

/// Decodes a width-3 section into `out` (one code byte an element).
pub(super) fn decode(section: &[u8], out: &mut [u8]) -> Result<(), FormatError> {
    let (classes, mut at) = Classes::read(section, out.len())?;
    let tables = (0..classes.tables())
        .map(|_| Table::read(section, &mut at))
        .collect::<Result<Vec<_>, _>>()?;
    rans::decode(&section[at..], |r, ctx| classes.fill(r, ctx), &tables, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Codes of a `rows × cols` view whose rows (or columns) differ in how often they move.
    fn banded(rows: usize, cols: usize, by_row: bool) -> Vec<u8> {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        (0..rows * cols)
            .map(|i| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let line = if by_row { i / cols } else { i % cols };
                let busy = line % 4;
                match seed % 16 {
                    r if r < 12 - 3 * busy as u64 => 0,
                    r => (1 + r % 5) as u8,
                }
            })
            .collect()
    }

    #[test]
    fn sections_round_trip_and_pick_the_lines_that_differ() {
        for (rows, cols, by_row) in [(300, 257, true), (64, 1024, false), (1, 5000, true)] {
            let codes = banded(rows, cols, by_row);
            let section = encode(&codes, rows);
            let expected = match (rows, by_row) {
                (1, _) => Kind::None,
                (_, true) => Kind::Rows,
                (_, false) => Kind::Cols,
            };
            assert_eq!(section[0], expected as u8);
            let mut back = vec![0u8; codes.len()];
            decode(&section, &mut back).unwrap();
            assert_eq!(back, codes);
        }
    }

    #[test]
    fn special_codes_and_a_row_count_that_does_not_divide_round_trip() {
        let codes: Vec<u8> = (0..10_007u32)
            .map(|i| match i % 97 {
                0 => 255,
                1 => 254,
                k => (k % 3) as u8,
            })
            .collect();
        // 7 does not divide 10,007: coded as one row.
        let section = encode(&codes, 7);
        let mut back = vec![0u8; codes.len()];
        decode(&section, &mut back).unwrap();
        assert_eq!(back, codes);
    }

    #[test]
    fn damaged_sections_are_errors() {
        let codes = banded(128, 128, true);
        let section = encode(&codes, 128);
        let mut out = vec![0u8; codes.len()];
        for cut in 0..16.min(section.len()) {
            assert!(decode(&section[..cut], &mut out).is_err(), "cut at {cut}");
        }
        let mut kind = section.clone();
        kind[0] = 3;
        assert!(decode(&kind, &mut out).is_err());
        // A row count that does not divide the elements.
        let mut rows = section.clone();
        rows[1] = 3;
        assert!(decode(&rows, &mut out).is_err());
    }
}
