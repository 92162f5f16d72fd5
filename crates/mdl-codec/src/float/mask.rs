//! How a masked payload (`masked.rs`) says which elements changed: the tensor's flag bytes (bit
//! `k` of byte `j` set ⇔ element `8j + k` changed), rANS-coded in one of two forms, and the
//! coded symbol sequences both forms and the delta words' planes are made of.
//!
//! - *Flag bytes* (first byte 1, format 11): every flag byte, coded. At 1 % of bf16 elements
//!   changed, 92 % of them are zero, and the coder spends its time on them.
//! - *Runs* (first byte 9, format 12): the flag bytes that are not zero (the *marks*), and before
//!   each the number of zero flag bytes since the last one, in symbols of at most [`RUN`]
//!   (a symbol `RUN` says `RUN` zeros and the run goes on). An eighth as many symbols at 1 %
//!   changed, and the same information: zero runs between marks are what an order-0 code of the
//!   flag bytes pays for anyway.
//!
//! Writers take the smaller by an estimate from the counts, which the comparing pass gives.

use mdl_format::FormatError;

use crate::{rans, varint};

/// How a masked payload codes its flag bytes; its first byte says which.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Form {
    /// Every flag byte.
    Flags,
    /// Runs of zero flag bytes and the flag bytes between them.
    Runs,
}

impl Form {
    /// The payload's first byte (a plain payload starts with its plane count, 2 to 8; a framed
    /// one with 0).
    pub(super) fn first_byte(self) -> u8 {
        match self {
            Form::Flags => 1,
            Form::Runs => 9,
        }
    }

    /// The form a payload's first byte names, if it is masked.
    pub(super) fn of(payload: &[u8]) -> Option<Form> {
        match payload.first() {
            Some(1) => Some(Form::Flags),
            Some(9) => Some(Form::Runs),
            _ => None,
        }
    }
}

/// The longest zero run one gap symbol says; the symbol `RUN` itself says the run goes on.
const RUN: u8 = 32;

/// A mask as runs, built as the comparing pass goes: the marks (non-zero flag bytes) and the
/// gap symbols before each.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Runs {
    marks: Vec<u8>,
    gaps: Vec<u8>,
    /// Zero flag bytes before the first mark, once there is one.
    lead: Option<usize>,
    /// Zero flag bytes since the last mark.
    zeros: usize,
}

impl Runs {
    /// `count` zero flag bytes follow.
    pub(super) fn zeros(&mut self, count: usize) {
        self.zeros += count;
    }

    /// The flag bytes `flags` (at most 8) follow.
    pub(super) fn flags(&mut self, flags: &[u8]) {
        let mut bytes = [0u8; 8];
        bytes[..flags.len()].copy_from_slice(flags);
        let mut word = u64::from_le_bytes(bytes);
        let mut next = 0;
        // Each non-zero byte found by the lowest set bit left.
        while word != 0 {
            let at = word.trailing_zeros() as usize / 8;
            self.mark(self.zeros + at - next, flags[at]);
            next = at + 1;
            word &= !(0xff << (8 * at));
        }
        self.zeros += flags.len() - next;
    }

    /// The mark `m` after `zeros` zero flag bytes.
    fn mark(&mut self, mut zeros: usize, m: u8) {
        self.lead.get_or_insert(zeros);
        while zeros >= RUN as usize {
            self.gaps.push(RUN);
            zeros -= RUN as usize;
        }
        self.gaps.push(zeros as u8);
        self.marks.push(m);
        self.zeros = 0;
    }

    /// The runs of the flag bytes that follow these, made from them alone: its first mark's
    /// gap counts this one's trailing zeros too.
    pub(super) fn append(&mut self, next: Runs) {
        let Some(lead) = next.lead else {
            self.zeros += next.zeros;
            return;
        };
        self.mark(self.zeros + lead, next.marks[0]);
        // The first mark's gap took ⌊lead / RUN⌋ + 1 symbols there.
        self.gaps
            .extend_from_slice(&next.gaps[lead / RUN as usize + 1..]);
        self.marks.extend_from_slice(&next.marks[1..]);
        self.zeros = next.zeros;
    }
}

/// Appends the coded mask of `flags` (whose values occur as `counts` says; `runs` the same
/// flags as runs) in the smaller form, and says which.
pub(super) fn write(flags: &[u8], counts: &[u64; 256], runs: &Runs, out: &mut Vec<u8>) -> Form {
    // Two varints of counts beside the two sequences.
    let runs_bits = coded_bits(&runs.gaps) + coded_bits(&runs.marks) + 48.0;
    let form = match runs_bits <= bits_of(counts) {
        true => Form::Runs,
        false => Form::Flags,
    };
    write_as(form, flags, counts, runs, out);
    form
}

/// [`write`] in the form given.
fn write_as(form: Form, flags: &[u8], counts: &[u64; 256], runs: &Runs, out: &mut Vec<u8>) {
    match form {
        Form::Runs => {
            varint::put(out, runs.marks.len() as u64);
            varint::put(out, runs.gaps.len() as u64);
            code(&runs.gaps, out);
            code(&runs.marks, out);
        }
        Form::Flags => code_counted(flags, counts, out),
    }
}

/// The flag bytes of a tensor of `n` elements, `changed` of them changed, read from the mask
/// of `form` at `*at` (moved past it); a mask that says otherwise is refused.
pub(super) fn read(
    form: Form,
    payload: &[u8],
    at: &mut usize,
    n: usize,
    changed: usize,
) -> Result<Vec<u8>, FormatError> {
    let mut flags = vec![0u8; n.div_ceil(8)];
    // Set bits counted where they are: in every flag byte, or in the marks alone.
    let ones = |bytes: &[u8]| -> usize {
        let words = bytes.chunks(8).map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w).count_ones() as usize
        });
        words.sum()
    };
    let set = match form {
        Form::Flags => {
            decode_coded(payload, at, &mut flags)?;
            ones(&flags)
        }
        Form::Runs => {
            let (marks, gaps) = run_counts(payload, at, flags.len())?;
            let (mut marks, mut gaps) = (vec![0u8; marks], vec![0u8; gaps]);
            decode_coded(payload, at, &mut gaps)?;
            decode_coded(payload, at, &mut marks)?;
            place(&marks, &gaps, &mut flags)?;
            ones(&marks)
        }
    };
    if set != changed {
        return Err(bad("the mask disagrees with the count of changed elements"));
    }
    if !n.is_multiple_of(8) && flags.last().is_some_and(|&f| f >> (n % 8) != 0) {
        return Err(bad("mask bits past the last element"));
    }
    Ok(flags)
}

/// Moves `*at` past the mask of `form` of a tensor of `n` elements, checking only that its
/// parts are there.
pub(super) fn skip(
    form: Form,
    payload: &[u8],
    at: &mut usize,
    n: usize,
) -> Result<(), FormatError> {
    let flags = n.div_ceil(8);
    match form {
        Form::Flags => skip_coded(payload, at, flags),
        Form::Runs => {
            let (marks, gaps) = run_counts(payload, at, flags)?;
            skip_coded(payload, at, gaps)?;
            skip_coded(payload, at, marks)
        }
    }
}

/// A run-coded mask's counts of marks and gap symbols, bounded by what `flags` flag bytes can
/// hold (before anything is allocated for them).
fn run_counts(payload: &[u8], at: &mut usize, flags: usize) -> Result<(usize, usize), FormatError> {
    let mut count = |most: usize| {
        varint::read(payload, at)
            .filter(|&c| c <= most as u64)
            .map(|c| c as usize)
            .ok_or_else(|| bad("run counts out of range"))
    };
    let marks = count(flags)?;
    // Each mark's gap is ⌊zeros / RUN⌋ + 1 symbols, and there are fewer zeros than flag bytes.
    let gaps = count(marks + flags / RUN as usize)?;
    Ok((marks, gaps))
}

/// Writes `marks` into `flags` where the gap symbols put them.
fn place(marks: &[u8], gaps: &[u8], flags: &mut [u8]) -> Result<(), FormatError> {
    let (mut at, mut g) = (0usize, gaps.iter());
    for &m in marks {
        loop {
            let &s = g.next().ok_or_else(|| bad("fewer gaps than marks"))?;
            if s > RUN {
                return Err(bad("a gap symbol out of range"));
            }
            at += s as usize;
            if s < RUN {
                break;
            }
        }
        let slot = flags
            .get_mut(at)
            .ok_or_else(|| bad("a mark past the last flag byte"))?;
        if m == 0 {
            return Err(bad("a zero mark"));
        }
        *slot = m;
        at += 1;
    }
    if g.next().is_some() {
        return Err(bad("gaps after the last mark"));
    }
    Ok(())
}

/// Moves `*at` past [`code`]'s coded `n` symbols, checking only that they are there.
fn skip_coded(payload: &[u8], at: &mut usize, n: usize) -> Result<(), FormatError> {
    let (table, span) = coded_span(payload, at)?;
    if table.is_none() && span.len() != n {
        return Err(bad("stored symbols of the wrong length"));
    }
    Ok(())
}

/// The table (if any) and the bytes of [`code`]'s symbols at `*at`, moving `*at` past them.
fn coded_span(
    payload: &[u8],
    at: &mut usize,
) -> Result<(Option<rans::Table>, std::ops::Range<usize>), FormatError> {
    let table = rans::Table::read(payload, at)?;
    let len = varint::read(payload, at).ok_or_else(|| bad("truncated head"))?;
    let end = usize::try_from(len)
        .ok()
        .and_then(|m| at.checked_add(m))
        .filter(|&e| e <= payload.len())
        .ok_or_else(|| bad("coded symbols overrun the payload"))?;
    let span = *at..end;
    *at = end;
    Ok((table, span))
}

/// How often each byte value occurs in `symbols`.
fn counted(symbols: &[u8]) -> [u64; 256] {
    let mut counts = [0u64; 256];
    symbols.iter().for_each(|&s| counts[s as usize] += 1);
    counts
}

/// About the bits coding `symbols` under a table of their own takes, the table included.
pub(super) fn coded_bits(symbols: &[u8]) -> f64 {
    bits_of(&counted(symbols))
}

/// [`coded_bits`] of symbols that occur as `counts` says.
fn bits_of(counts: &[u64; 256]) -> f64 {
    rans::Table::from_counts(counts).map_or(0.0, |t| {
        t.cost_bits(counts) + 24.0 * counts.iter().filter(|&&c| c > 0).count() as f64
    })
}

/// Appends `symbols` rANS-coded under a table of their own (`table | varint len | coded`), or
/// as they are where that is no larger (`0 | varint len | symbols`: a few symbols, which the
/// coder's states and table would outweigh).
pub(super) fn code(symbols: &[u8], out: &mut Vec<u8>) {
    code_counted(symbols, &counted(symbols), out);
}

/// [`code`] of `symbols`, which occur as `counts` says.
fn code_counted(symbols: &[u8], counts: &[u64; 256], out: &mut Vec<u8>) {
    let (mut table, mut coded) = (Vec::new(), Vec::new());
    if let Some(t) = rans::Table::from_counts(counts) {
        rans::Table::write(Some(&t), &mut table);
        rans::encode_one(symbols, &t, &mut coded);
    }
    if table.is_empty() || table.len() + coded.len() > symbols.len() + 1 {
        out.push(0);
        varint::put(out, symbols.len() as u64);
        out.extend_from_slice(symbols);
    } else {
        out.extend_from_slice(&table);
        varint::put(out, coded.len() as u64);
        out.extend_from_slice(&coded);
    }
}

/// Decodes [`code`]'s `out.len()` symbols at `*at`, moving `*at` past them.
pub(super) fn decode_coded(
    payload: &[u8],
    at: &mut usize,
    out: &mut [u8],
) -> Result<(), FormatError> {
    let (table, span) = coded_span(payload, at)?;
    let bytes = &payload[span];
    match table {
        Some(t) => rans::decode_one(bytes, &t, out)?,
        None if bytes.len() == out.len() => out.copy_from_slice(bytes),
        None => return Err(bad("stored symbols of the wrong length")),
    }
    Ok(())
}

/// Calls `f` with each element index whose flag bit is set, in order.
pub(super) fn for_changed(flags: &[u8], n: usize, mut f: impl FnMut(usize)) {
    // Sixty-four flags at a time: where few elements changed, most words are zero.
    for (j, chunk) in flags.chunks(8).enumerate() {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        let mut bits = u64::from_le_bytes(word);
        while bits != 0 {
            let i = j * 64 + bits.trailing_zeros() as usize;
            if i < n {
                f(i);
            }
            bits &= bits - 1;
        }
    }
}

fn bad(why: &str) -> FormatError {
    FormatError::invalid("masked delta", why.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `flags` written in `form` and read back, for a tensor of `n` elements.
    fn round_trip(form: Form, flags: &[u8], n: usize) -> Vec<u8> {
        let mut runs = Runs::default();
        for chunk in flags.chunks(8) {
            runs.flags(chunk);
        }
        let mut out = vec![0xee];
        write_as(form, flags, &counted(flags), &runs, &mut out);
        let changed = flags.iter().map(|f| f.count_ones() as usize).sum();
        let mut at = 1;
        let read = read(form, &out, &mut at, n, changed).unwrap();
        assert_eq!(at, out.len(), "{form:?}: read to the end");
        let mut skipped = 1;
        skip(form, &out, &mut skipped, n).unwrap();
        assert_eq!(skipped, at, "{form:?}: skipped as read");
        read
    }

    #[test]
    fn both_forms_give_back_the_flag_bytes() {
        let mut seed = 3u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut cases: Vec<Vec<u8>> = vec![vec![], vec![0; 1000], vec![0xff; 77]];
        let mut one_late = vec![0u8; 5000];
        one_late[4999] = 0x40;
        cases.push(one_late);
        // Runs longer than many gap symbols, and ones of exactly a symbol's length.
        let mut spaced = vec![0u8; 40_000];
        for at in [0, 31, 32, 33, 64, 97, 1_000, 33_000, 39_999] {
            spaced[at] = 1 << (at % 8);
        }
        cases.push(spaced);
        for density in [2, 13, 100, 3000] {
            cases.push(
                (0..100_003)
                    .map(|_| match next() % density {
                        0 => next() as u8 | 1,
                        _ => 0,
                    })
                    .collect(),
            );
        }
        for flags in cases {
            for form in [Form::Flags, Form::Runs] {
                assert_eq!(round_trip(form, &flags, flags.len() * 8), flags, "{form:?}");
            }
        }
    }

    /// Runs made of pieces of the flag bytes and appended are the runs of the whole.
    #[test]
    fn runs_of_pieces_append_to_the_runs_of_the_whole() {
        let mut flags = vec![0u8; 3000];
        for at in [5, 6, 70, 71, 500, 1_999, 2_000, 2_001, 2_999] {
            flags[at] = 0x11;
        }
        let runs_of = |bytes: &[u8]| {
            let mut r = Runs::default();
            bytes.chunks(8).for_each(|c| r.flags(c));
            r
        };
        let whole = runs_of(&flags);
        for cut in [
            (8, 16),
            (64, 72),
            (72, 1_000),
            (496, 2_000),
            (1_000, 1_992),
            (2_000, 2_008),
        ] {
            let mut r = runs_of(&flags[..cut.0]);
            r.append(runs_of(&flags[cut.0..cut.1]));
            r.append(runs_of(&flags[cut.1..]));
            assert_eq!(
                (&r.marks, &r.gaps, r.lead, r.zeros),
                (&whole.marks, &whole.gaps, whole.lead, whole.zeros),
                "{cut:?}"
            );
        }
    }

    #[test]
    fn a_run_coded_mask_that_says_otherwise_is_refused() {
        let mut flags = vec![0u8; 100];
        // Marks and gaps that place a mark past the flag bytes, a zero mark, a gap symbol out
        // of range, too few or too many gaps.
        for (marks, gaps) in [
            (&[1u8][..], &[RUN, RUN, RUN, 4][..]),
            (&[0], &[3]),
            (&[1], &[RUN + 1]),
            (&[1, 2], &[0]),
            (&[1], &[0, 0]),
            (&[1], &[RUN]),
        ] {
            assert!(
                place(marks, gaps, &mut flags).is_err(),
                "{marks:?} {gaps:?}"
            );
        }
        place(&[1, 2], &[RUN, 3, 0], &mut flags).unwrap();
        assert_eq!((flags[35], flags[36]), (1, 2));
        // Counts beyond what the flag bytes can hold are refused before anything is made of
        // them.
        let mut head = Vec::new();
        varint::put(&mut head, 101);
        varint::put(&mut head, 0);
        assert!(run_counts(&head, &mut 0, 100).is_err());
        head.clear();
        varint::put(&mut head, 2);
        varint::put(&mut head, 2 + 100 / RUN as u64 + 1);
        assert!(run_counts(&head, &mut 0, 100).is_err());
        // Mask bits past the last element, and a count of changes the mask does not have.
        let mut runs = Runs::default();
        runs.flags(&[0, 0x80]);
        let mut out = Vec::new();
        write_as(
            Form::Runs,
            &[0, 0x80],
            &counted(&[0, 0x80]),
            &runs,
            &mut out,
        );
        assert!(read(Form::Runs, &out, &mut 0, 15, 1).is_err());
        assert!(read(Form::Runs, &out, &mut 0, 16, 2).is_err());
        assert!(read(Form::Runs, &out, &mut 0, 16, 1).is_ok());
    }
}
