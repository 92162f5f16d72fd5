//! `quant-base` and `quant-delta` payloads: a quantized tensor's code table, protected elements
//! and codes — the codes entropy-coded on their own (base) or as grouped, run-length-coded
//! differences from a base object's codes (delta). Byte layouts: `docs/FORMAT.md`.
//!
//! A delta is taken against the base's *codes*, not its values, so decoding a chain never
//! compounds quantization error: every object in it decodes to exactly what was committed.

use mdl_format::{Dtype, FormatError};

use crate::engine::{Assigned, Engine};
use crate::huffman::{decode_stream, encode_stream};
use crate::quant::MAX_BINS;
use crate::varint;

/// A quantized tensor: what a quant record holds, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantTensor {
    /// Element type.
    pub dtype: Dtype,
    /// Code table: little-endian values of `dtype`, one per code.
    pub table: Vec<u8>,
    /// Indices of elements kept exactly, ascending.
    pub protected: Vec<u64>,
    /// Their values, little-endian `dtype`.
    pub protected_values: Vec<u8>,
    /// One code per element.
    pub codes: Vec<u8>,
}

fn invalid(what: &'static str, why: impl Into<String>) -> FormatError {
    FormatError::invalid(what, why.into())
}

impl QuantTensor {
    /// Builds the tensor from an assignment, taking the protected values from `original`.
    pub fn new(dtype: Dtype, table: Vec<u8>, assigned: Assigned, original: &[u8]) -> QuantTensor {
        let size = dtype.size();
        let mut protected_values = Vec::with_capacity(assigned.protected.len() * size);
        for &i in &assigned.protected {
            let i = i as usize * size;
            protected_values.extend_from_slice(&original[i..i + size]);
        }
        QuantTensor {
            dtype,
            table,
            protected: assigned.protected,
            protected_values,
            codes: assigned.codes,
        }
    }

    /// Entries in the code table.
    pub fn bins(&self) -> usize {
        self.table.len() / self.dtype.size()
    }

    /// Writes the reconstruction (`codes.len()` elements) into `out`.
    pub fn render(&self, out: &mut [u8]) {
        let size = self.dtype.size();
        for (o, &c) in out.chunks_exact_mut(size).zip(&self.codes) {
            let c = c as usize * size;
            o.copy_from_slice(&self.table[c..c + size]);
        }
        for (k, &i) in self.protected.iter().enumerate() {
            let i = i as usize * size;
            out[i..i + size].copy_from_slice(&self.protected_values[k * size..(k + 1) * size]);
        }
    }

    /// Table and protected list, shared by both record kinds.
    fn write_common(&self, out: &mut Vec<u8>) {
        out.push(self.bins() as u8);
        out.extend_from_slice(&self.table);
        varint::put(out, self.protected.len() as u64);
        let mut prev = 0u64;
        for (k, &i) in self.protected.iter().enumerate() {
            varint::put(out, if k == 0 { i } else { i - prev - 1 });
            prev = i;
        }
        out.extend_from_slice(&self.protected_values);
    }

    /// A `quant-base` payload: table, protected list, codes packed several to a byte and
    /// entropy-coded.
    pub fn encode_base(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_common(&mut out);
        let per = codes_per_symbol(self.bins());
        let packed = pack(&self.codes, self.bins(), per);
        encode_stream(&packed, &mut out);
        out
    }

    /// A `quant-delta` payload against `base_codes` (a base with `base_bins` table entries):
    /// `(base − cur) mod B`, `B` the larger table, grouped by base code, run-length coded, then
    /// entropy-coded.
    pub fn encode_delta(
        &self,
        engine: &dyn Engine,
        base_codes: &[u8],
        base_bins: usize,
    ) -> Vec<u8> {
        let modulus = self.bins().max(base_bins) as u8;
        let grouped = engine.group_delta(base_codes, &self.codes, modulus);
        let symbols = rle_encode(&grouped);
        let mut out = Vec::new();
        self.write_common(&mut out);
        out.push(modulus);
        varint::put(&mut out, symbols.len() as u64);
        encode_stream(&symbols, &mut out);
        out
    }

    /// Decodes a payload of `n` elements: a `quant-base` when `base_codes` is `None`, else a
    /// `quant-delta` against those codes.
    pub fn decode(
        engine: &dyn Engine,
        dtype: Dtype,
        n: usize,
        payload: &[u8],
        base_codes: Option<&[u8]>,
    ) -> Result<QuantTensor, FormatError> {
        let what = if base_codes.is_some() {
            "quant-delta"
        } else {
            "quant-base"
        };
        let size = dtype.size();
        let mut r = Cursor {
            buf: payload,
            at: 0,
        };
        let bins = r.u8(what)? as usize;
        if bins == 0 || bins > MAX_BINS as usize + 1 {
            return Err(invalid(what, format!("{bins} table entries")));
        }
        let table = r.take(bins * size, what)?.to_vec();
        let count = r.varint(what)?;
        if count > n as u64 || count > (payload.len() as u64) {
            return Err(invalid(what, "more protected elements than elements"));
        }
        let mut protected = Vec::with_capacity(count as usize);
        let mut next = 0u64;
        for _ in 0..count {
            let i = next
                .checked_add(r.varint(what)?)
                .filter(|&i| i < n as u64)
                .ok_or_else(|| invalid(what, "protected index out of range"))?;
            protected.push(i);
            next = i + 1;
        }
        let protected_values = r.take(count as usize * size, what)?.to_vec();
        let mut codes = vec![0u8; n];
        match base_codes {
            None => {
                let per = codes_per_symbol(bins);
                let mut packed = vec![0u8; n.div_ceil(per)];
                decode_stream(r.rest(), &mut packed)?;
                unpack(&packed, bins, per, &mut codes)?;
            }
            Some(base) => {
                if base.len() != n {
                    return Err(invalid(what, "base has a different element count"));
                }
                let modulus = r.u8(what)?;
                if (modulus as usize) < bins {
                    return Err(invalid(what, "modulus below the table size"));
                }
                let len = r.varint(what)?;
                if len > n as u64 {
                    return Err(invalid(what, "more run-length symbols than elements"));
                }
                let mut symbols = vec![0u8; len as usize];
                decode_stream(r.rest(), &mut symbols)?;
                let grouped = rle_decode(&symbols, n, modulus)?;
                engine.ungroup_delta(base, &grouped, modulus, &mut codes)?;
            }
        }
        if codes.iter().any(|&c| c as usize >= bins) {
            return Err(invalid(what, "a code is beyond the table"));
        }
        Ok(QuantTensor {
            dtype,
            table,
            protected,
            protected_values,
            codes,
        })
    }
}

/// How many codes of a `bins`-entry table share one entropy-coded byte (`bins^k ≤ 256`): small
/// tables would otherwise pay the Huffman coder's one-bit-per-symbol floor.
pub fn codes_per_symbol(bins: usize) -> usize {
    let mut k = 1;
    while k < 8 && bins.pow(k as u32 + 1) <= 256 {
        k += 1;
    }
    k
}

fn pack(codes: &[u8], bins: usize, per: usize) -> Vec<u8> {
    codes
        .chunks(per)
        .map(|c| {
            c.iter()
                .rev()
                .fold(0usize, |acc, &x| acc * bins + x as usize) as u8
        })
        .collect()
}

fn unpack(packed: &[u8], bins: usize, per: usize, out: &mut [u8]) -> Result<(), FormatError> {
    for (o, &p) in out.chunks_mut(per).zip(packed) {
        let mut v = p as usize;
        for x in o.iter_mut() {
            *x = (v % bins) as u8;
            v /= bins;
        }
        if v != 0 {
            return Err(invalid("quant-base", "packed codes out of range"));
        }
    }
    Ok(())
}

/// First run-length symbol of a run's length digits; values are below it.
const RUN: u8 = 128;
/// First symbol of a run's last digit.
const RUN_LAST: u8 = 192;

/// Run-length codes small values (< 128): each value is written once, and a run of `L ≥ 2`
/// equal values adds `L − 2` as base-64 digits, least significant first, in symbols
/// `128..192` (more digits follow) and `192..256` (last digit). Runs of one cost nothing extra.
pub fn rle_encode(values: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / 4 + 16);
    let mut i = 0;
    while i < values.len() {
        let v = values[i];
        debug_assert!(v < RUN);
        let mut j = i + 1;
        while j < values.len() && values[j] == v {
            j += 1;
        }
        out.push(v);
        let len = j - i;
        if len >= 2 {
            let mut r = len - 2;
            while r >= 64 {
                out.push(RUN + (r & 63) as u8);
                r >>= 6;
            }
            out.push(RUN_LAST + r as u8);
        }
        i = j;
    }
    out
}

/// Inverts [`rle_encode`], producing exactly `n` values, each below `modulus`.
pub fn rle_decode(symbols: &[u8], n: usize, modulus: u8) -> Result<Vec<u8>, FormatError> {
    let bad = |why: &str| invalid("quant-delta", format!("run-length stream: {why}"));
    let mut out = Vec::with_capacity(n);
    let mut i = 0;
    while i < symbols.len() {
        let v = symbols[i];
        i += 1;
        if v >= RUN || v >= modulus {
            return Err(bad("value out of range"));
        }
        let mut extra = 0usize;
        if i < symbols.len() && symbols[i] >= RUN {
            let mut shift = 0u32;
            loop {
                let s = *symbols.get(i).ok_or_else(|| bad("unfinished run"))?;
                if s < RUN || shift > 48 {
                    return Err(bad("malformed run"));
                }
                i += 1;
                extra |= ((s & 63) as usize) << shift;
                shift += 6;
                if s >= RUN_LAST {
                    break;
                }
            }
            extra += 1;
        }
        if out.len() + 1 + extra > n {
            return Err(bad("more values than elements"));
        }
        out.resize(out.len() + 1 + extra, v);
    }
    if out.len() != n {
        return Err(bad("fewer values than elements"));
    }
    Ok(out)
}

struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], FormatError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| invalid(what, "truncated"))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, FormatError> {
        Ok(self.take(1, what)?[0])
    }
    fn varint(&mut self, what: &'static str) -> Result<u64, FormatError> {
        varint::read(self.buf, &mut self.at).ok_or_else(|| {
            let why = if self.at >= self.buf.len() {
                "truncated"
            } else {
                "varint too long"
            };
            invalid(what, why)
        })
    }
    fn rest(&self) -> &'a [u8] {
        &self.buf[self.at..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::CpuEngine;

    fn tensor(n: usize, bins: usize, seed: u32) -> QuantTensor {
        let table: Vec<u8> = (0..bins)
            .flat_map(|b| (b as f32 - 2.0).to_le_bytes())
            .collect();
        let codes: Vec<u8> = (0..n as u32)
            .map(|i| ((i.wrapping_mul(2654435761) ^ seed) >> 7) as u8 % bins as u8)
            .collect();
        let protected: Vec<u64> = (0..n as u64).filter(|i| i % 97 == 3).collect();
        let protected_values = protected
            .iter()
            .flat_map(|&i| (i as f32 * 1e3).to_le_bytes())
            .collect();
        QuantTensor {
            dtype: Dtype::F32,
            table,
            protected,
            protected_values,
            codes,
        }
    }

    #[test]
    fn base_round_trips_for_every_table_size() {
        for bins in [1, 2, 3, 4, 5, 6, 7, 9, 16, 17, 33, 65] {
            let q = tensor(10_001, bins, 5);
            let p = q.encode_base();
            assert_eq!(
                QuantTensor::decode(&CpuEngine, Dtype::F32, 10_001, &p, None).unwrap(),
                q,
                "{bins}"
            );
        }
    }

    #[test]
    fn delta_round_trips_across_table_sizes() {
        for (bb, cb) in [(8, 8), (4, 16), (33, 5), (1, 2)] {
            let base = tensor(20_000, bb, 1);
            let mut cur = tensor(20_000, cb, 1);
            // Mostly the base's codes, so runs form.
            for (i, c) in cur.codes.iter_mut().enumerate() {
                if i % 11 != 0 {
                    *c = base.codes[i] % cb as u8;
                }
            }
            let p = cur.encode_delta(&CpuEngine, &base.codes, bb);
            let back =
                QuantTensor::decode(&CpuEngine, Dtype::F32, 20_000, &p, Some(&base.codes)).unwrap();
            assert_eq!(back, cur, "{bb} → {cb}");
            assert!(p.len() < cur.encode_base().len() || bb != cb);
        }
    }

    #[test]
    fn run_lengths_round_trip_and_reject_garbage() {
        let mut v = vec![0u8; 5000];
        v.extend([1, 1, 2, 3, 3, 3]);
        v.extend(vec![7u8; 300_000]);
        let s = rle_encode(&v);
        assert!(s.len() < 20);
        assert_eq!(rle_decode(&s, v.len(), 8).unwrap(), v);
        assert!(rle_decode(&s, v.len() - 1, 8).is_err());
        assert!(rle_decode(&s, v.len() + 1, 8).is_err());
        assert!(rle_decode(&s, v.len(), 7).is_err());
        assert!(rle_decode(&[200], 1, 8).is_err());
        assert!(rle_decode(&[1, 130], 10, 8).is_err());
    }

    #[test]
    fn garbage_payloads_are_errors() {
        let q = tensor(3000, 6, 2);
        let p = q.encode_base();
        for cut in [0, 1, 10, p.len() / 2, p.len() - 1] {
            assert!(QuantTensor::decode(&CpuEngine, Dtype::F32, 3000, &p[..cut], None).is_err());
        }
        let mut bad = p.clone();
        bad[0] = 0;
        assert!(QuantTensor::decode(&CpuEngine, Dtype::F32, 3000, &bad, None).is_err());
    }
}
