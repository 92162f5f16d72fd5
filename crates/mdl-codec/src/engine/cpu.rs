//! The reference engine: every kernel on the CPU, rayon over fixed-size chunks.

use mdl_format::{Dtype, FormatError};
use rayon::prelude::*;

use super::stats::max_abs;
use super::{
    scales, sum, Assigned, CodePairs, Engine, ErrorStats, FloatView, KeyStats, Lut, Moments, CHUNK,
};
use crate::huffman::{Histogram, Stream, StreamWriter};
use crate::planes::PlaneSpec;
use crate::residual::{self, ResidualStats};
use crate::scalar::{self, KEYS};

/// The reference engine: rayon over fixed-size chunks.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuEngine;

thread_local! {
    /// A dense per-key table for [`Engine::key_stats`], kept zeroed between uses.
    static STATS_SCRATCH: std::cell::RefCell<(Vec<u64>, Vec<[i64; sum::N]>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Elements per partial histogram of [`Engine::key_stats`].
const STATS_PART: usize = 1 << 18;

impl Engine for CpuEngine {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn plane_histograms(
        &self,
        spec: PlaneSpec,
        data: &[u8],
        base: Option<&[u8]>,
        want: &[(bool, bool)],
    ) -> Vec<(Histogram, Histogram)> {
        crate::planes::cpu_plane_histograms(spec, data, base, want)
    }

    fn sample_histograms(
        &self,
        spec: PlaneSpec,
        data: &[u8],
        base: Option<&[u8]>,
    ) -> Vec<(Histogram, Histogram)> {
        crate::planes::cpu_sample_histograms(spec, data, base)
    }

    fn encode_planes(
        &self,
        spec: PlaneSpec,
        data: &[u8],
        base: Option<&[u8]>,
        writers: &[StreamWriter],
    ) -> Vec<Vec<Vec<u8>>> {
        crate::planes::cpu_encode_planes(spec, data, base, writers)
    }

    fn decode_planes(
        &self,
        spec: PlaneSpec,
        streams: &[Stream<'_>],
        base: Option<&[u8]>,
        out: &mut [u8],
    ) -> Result<(), FormatError> {
        crate::planes::cpu_decode_planes(spec, streams, base, out)
    }

    fn key_stats(&self, w: FloatView<'_>, moments: Option<Moments<'_>>) -> KeyStats {
        let n = w.len();
        let wmax = max_abs(w);
        let (mmax, vmax) = moments.map_or((0.0, 0.0), |mv| (max_abs(mv.m), max_abs(mv.v)));
        let sc = scales(n, wmax, mmax, vmax);
        let parts = n
            .div_ceil(STATS_PART)
            .clamp(1, rayon::current_num_threads().max(1));
        let per = n.div_ceil(parts).max(1);
        // Each part accumulates into a dense per-thread table (reused across calls, so no
        // 4.7 MB allocation per tensor) and hands back its touched keys, resetting them.
        let partials: Vec<Vec<(u16, u64, [i64; sum::N])>> = (0..parts)
            .into_par_iter()
            .map(|p| {
                STATS_SCRATCH.with(|cell| {
                    let mut scratch = cell.borrow_mut();
                    let (count, acc) = &mut *scratch;
                    if count.is_empty() {
                        *count = vec![0u64; KEYS];
                        *acc = vec![[0i64; sum::N]; KEYS];
                    }
                    // Truncation toward zero: one instruction, and as order-independent as
                    // rounding.
                    let fix = |x: f64, j: usize| (x * sc[j]) as i64;
                    for i in p * per..((p + 1) * per).min(n) {
                        let k = scalar::key(w.dtype, w.bytes, i) as usize;
                        count[k] += 1;
                        let x = w.value(i);
                        if !x.is_finite() {
                            continue;
                        }
                        let a = &mut acc[k];
                        a[sum::W] += fix(x, sum::W);
                        a[sum::W2] += fix(x * x, sum::W2);
                        if let Some(mv) = moments {
                            let (m, v) = (mv.m.value(i), mv.v.value(i));
                            if m.is_finite() && v.is_finite() {
                                a[sum::M] += fix(m, sum::M);
                                a[sum::MW] += fix(m * x, sum::MW);
                                a[sum::V] += fix(v, sum::V);
                                a[sum::VW] += fix(v * x, sum::VW);
                                a[sum::VW2] += fix(v * x * x, sum::VW2);
                                a[sum::SENS] += fix((m * x).abs(), sum::SENS);
                            }
                        }
                    }
                    let mut touched = Vec::new();
                    for k in 0..KEYS {
                        if count[k] > 0 {
                            touched.push((k as u16, count[k], acc[k]));
                            count[k] = 0;
                            acc[k] = [0; sum::N];
                        }
                    }
                    touched
                })
            })
            .collect();
        let mut all: Vec<(u16, u64, [i64; sum::N])> = partials.concat();
        all.sort_by_key(|e| e.0);
        let mut merged: Vec<(u16, u64, [i64; sum::N])> = Vec::with_capacity(all.len());
        for (k, c, a) in all {
            match merged.last_mut() {
                Some(last) if last.0 == k => {
                    last.1 += c;
                    for (x, y) in last.2.iter_mut().zip(a) {
                        *x = x.wrapping_add(y);
                    }
                }
                _ => merged.push((k, c, a)),
            }
        }
        KeyStats::from_fixed_point(n as u64, merged, &sc, moments.is_some())
    }

    fn assign(&self, w: FloatView<'_>, lut: &Lut) -> Assigned {
        let n = w.len();
        let mut codes = vec![0u8; n];
        let protected: Vec<Vec<u64>> = codes
            .par_chunks_mut(CHUNK)
            .enumerate()
            .map(|(c, out)| {
                let mut prot = Vec::new();
                for (j, o) in out.iter_mut().enumerate() {
                    let i = c * CHUNK + j;
                    let k = scalar::key(w.dtype, w.bytes, i) as usize;
                    *o = lut.code[k];
                    if lut.protect[k] {
                        prot.push(i as u64);
                    }
                }
                prot
            })
            .collect();
        Assigned {
            codes,
            protected: protected.concat(),
        }
    }

    fn code_pairs(
        &self,
        w: FloatView<'_>,
        lut: &Lut,
        bins: usize,
        base: &[u8],
        base_bins: usize,
    ) -> CodePairs {
        debug_assert_eq!(w.len(), base.len());
        let cells = base_bins * bins;
        let count = base
            .par_chunks(STATS_PART)
            .enumerate()
            .map(|(c, part)| {
                let mut count = vec![0u64; cells];
                for (j, &b) in part.iter().enumerate() {
                    let k = scalar::key(w.dtype, w.bytes, c * STATS_PART + j) as usize;
                    count[b as usize * bins + lut.code[k] as usize] += 1;
                }
                count
            })
            .reduce(
                || vec![0u64; cells],
                |mut a, b| {
                    a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                    a
                },
            );
        CodePairs { bins, count }
    }

    fn group_delta(&self, base: &[u8], cur: &[u8], modulus: u8) -> Vec<u8> {
        debug_assert_eq!(base.len(), cur.len());
        let mut start = group_starts(base);
        let mut out = vec![0u8; base.len()];
        let m = modulus as u16;
        for (&b, &c) in base.iter().zip(cur) {
            let slot = &mut start[b as usize];
            out[*slot] = ((b as u16 + m - c as u16) % m) as u8;
            *slot += 1;
        }
        out
    }

    fn ungroup_delta(
        &self,
        base: &[u8],
        deltas: &[u8],
        modulus: u8,
        out: &mut [u8],
    ) -> Result<(), FormatError> {
        check_ungroup(base, deltas, modulus, out.len())?;
        let mut start = group_starts(base);
        let m = modulus as u16;
        for (&b, o) in base.iter().zip(out.iter_mut()) {
            let slot = &mut start[b as usize];
            let d = deltas[*slot] as u16 % m;
            *slot += 1;
            *o = ((b as u16 + m - d) % m) as u8;
        }
        Ok(())
    }

    fn mean_second_moment(&self, w: FloatView<'_>, moments: Moments<'_>) -> f64 {
        super::mean_second_moment(w, moments)
    }

    fn residual_distance(&self, values: FloatView<'_>, reference: Option<&[u8]>) -> f64 {
        residual::distance_sq(values.dtype, values.bytes, reference)
    }

    fn residual_measure(
        &self,
        values: FloatView<'_>,
        reference: Option<&[u8]>,
        moments: Option<Moments<'_>>,
        mode: residual::Mode,
        factors: Option<&residual::Steps>,
        steps: &[f64],
        every: usize,
    ) -> Vec<ResidualStats> {
        let (dtype, bytes) = (values.dtype, values.bytes);
        match factors {
            Some(f) => {
                assert_eq!(mode, residual::Mode::Linear, "stepped codes are linear");
                residual::measure_stepped(dtype, bytes, reference, moments, f, steps, every)
            }
            None => residual::measure_steps(dtype, bytes, reference, moments, mode, steps, every),
        }
    }

    fn residual_encode(
        &self,
        values: FloatView<'_>,
        reference: Option<&[u8]>,
        mode: residual::Mode,
        factors: Option<&residual::Steps>,
        step: f64,
    ) -> (Vec<u8>, Vec<u8>) {
        let (dtype, bytes) = (values.dtype, values.bytes);
        match factors {
            Some(f) => {
                assert_eq!(mode, residual::Mode::Linear, "stepped codes are linear");
                residual::encode_stepped(dtype, bytes, reference, f, step)
            }
            None => residual::encode(dtype, bytes, reference, mode, step),
        }
    }

    fn residual_decode(
        &self,
        dtype: Dtype,
        payload: &[u8],
        reference: Option<&[u8]>,
        out: &mut [u8],
    ) -> Result<(), FormatError> {
        residual::decode(dtype, payload, reference, out)
    }

    fn error_stats(
        &self,
        orig: FloatView<'_>,
        recon: FloatView<'_>,
        moments: Option<Moments<'_>>,
    ) -> ErrorStats {
        let n = orig.len().min(recon.len());
        let chunks: Vec<ErrorStats> = (0..n.div_ceil(CHUNK))
            .into_par_iter()
            .map(|c| {
                let mut e = ErrorStats::default();
                for i in c * CHUNK..((c + 1) * CHUNK).min(n) {
                    let (x, y) = (orig.value(i), recon.value(i));
                    if !x.is_finite() || !y.is_finite() {
                        continue;
                    }
                    let d = y - x;
                    e.max_abs = e.max_abs.max(d.abs());
                    e.sum_sq_err += d * d;
                    e.sum_sq += x * x;
                    if let Some(mv) = moments {
                        let (m, v) = (mv.m.value(i), mv.v.value(i));
                        if m.is_finite() && v.is_finite() {
                            e.sum_m_delta += m * d;
                            e.sum_v_delta2 += v * d * d;
                        }
                    }
                }
                e
            })
            .collect();
        // Chunk results are combined in chunk order: the same sums on any thread count.
        ErrorStats::fold(&chunks)
    }
}

/// Checks the inputs of [`Engine::ungroup_delta`] (every engine does, with this one message):
/// one delta and one output per base code, and every base code below the modulus.
pub fn check_ungroup(
    base: &[u8],
    deltas: &[u8],
    modulus: u8,
    out_len: usize,
) -> Result<(), FormatError> {
    if base.len() != deltas.len() || base.len() != out_len {
        return Err(FormatError::invalid("quant-delta", "code counts differ"));
    }
    if modulus == 0 || base.par_iter().any(|&b| b >= modulus) {
        return Err(FormatError::invalid(
            "quant-delta",
            "a base code is not below the modulus",
        ));
    }
    Ok(())
}

/// Where each base code's group starts in the grouped order.
fn group_starts(base: &[u8]) -> [usize; 256] {
    let mut count = [0usize; 256];
    for &b in base {
        count[b as usize] += 1;
    }
    let mut start = [0usize; 256];
    let mut at = 0;
    for g in 0..256 {
        start[g] = at;
        at += count[g];
    }
    start
}

#[cfg(test)]
mod tests {
    use mdl_format::Dtype;

    use crate::engine::{mean_second_moment, sum, CpuEngine, Engine, FloatView, Moments};

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn key_stats_sum_exactly_and_ignore_thread_count() {
        let w: Vec<f32> = (0..700_000)
            .map(|i| ((i as f32) * 0.37).sin() * 0.1)
            .collect();
        let m: Vec<f32> = (0..700_000)
            .map(|i| ((i as f32) * 0.11).cos() * 1e-3)
            .collect();
        let v: Vec<f32> = m.iter().map(|x| x * x + 1e-9).collect();
        let (wb, mb, vb) = (f32s(&w), f32s(&m), f32s(&v));
        fn view(bytes: &[u8]) -> FloatView<'_> {
            FloatView {
                dtype: Dtype::F32,
                bytes,
            }
        }
        let run = |threads| {
            crate::on_threads(threads, || {
                CpuEngine.key_stats(
                    view(&wb),
                    Some(Moments {
                        m: view(&mb),
                        v: view(&vb),
                    }),
                )
            })
        };
        let one = run(1);
        assert_eq!(one, run(3));
        assert_eq!(one.count.iter().sum::<u64>(), 700_000);
        let total_w: f64 = one.sums.iter().map(|s| s[sum::W]).sum();
        let exact: f64 = w.iter().map(|&x| x as f64).sum();
        assert!((total_w - exact).abs() < 1e-6, "{total_w} vs {exact}");
        let total_mw: f64 = one.sums.iter().map(|s| s[sum::MW]).sum();
        let exact: f64 = w.iter().zip(&m).map(|(&x, &y)| x as f64 * y as f64).sum();
        assert!((total_mw - exact).abs() < 1e-9);
    }

    #[test]
    fn the_mean_second_moment_alone_equals_the_key_stats_one() {
        let n = 300_000;
        let mut w: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin()).collect();
        let m: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.11).cos() * 1e-3).collect();
        let mut v: Vec<f32> = m.iter().map(|x| x * x * 7.0 + 1e-12).collect();
        // Elements whose weight or moment is not finite add nothing to either.
        w[5] = f32::NAN;
        v[9] = f32::INFINITY;
        w[70_000] = f32::NEG_INFINITY;
        let (wb, mb, vb) = (f32s(&w), f32s(&m), f32s(&v));
        let view = |bytes| FloatView {
            dtype: Dtype::F32,
            bytes,
        };
        let moments = Moments {
            m: view(&mb),
            v: view(&vb),
        };
        let stats = CpuEngine.key_stats(view(&wb), Some(moments));
        let alone = mean_second_moment(view(&wb), moments);
        assert_eq!(alone.to_bits(), stats.mean_v().to_bits());
        let direct: f64 = (0..n)
            .filter(|&i| i != 5 && i != 9 && i != 70_000)
            .map(|i| v[i] as f64)
            .sum::<f64>()
            / n as f64;
        assert!(
            (alone - direct).abs() <= direct * 1e-9,
            "{alone} vs {direct}"
        );
        assert_eq!(CpuEngine.key_stats(view(&wb), None).mean_v(), 0.0);
    }

    #[test]
    fn grouped_deltas_invert() {
        let base: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 13) as u8).collect();
        let cur: Vec<u8> = (0..10_000u32).map(|i| (i * 5 % 17) as u8).collect();
        let d = CpuEngine.group_delta(&base, &cur, 17);
        // Grouped by base code: the first group holds the elements whose base code is 0.
        let zeros: Vec<u8> = base
            .iter()
            .zip(&cur)
            .filter(|(b, _)| **b == 0)
            .map(|(_, c)| ((17 - *c as u16) % 17) as u8)
            .collect();
        assert_eq!(&d[..zeros.len()], &zeros[..]);
        let mut out = vec![0u8; cur.len()];
        CpuEngine.ungroup_delta(&base, &d, 17, &mut out).unwrap();
        assert_eq!(out, cur);
        assert!(CpuEngine.ungroup_delta(&base, &d, 12, &mut out).is_err());
    }

    #[test]
    fn error_stats_match_a_direct_computation() {
        let a: Vec<f32> = (0..200_000).map(|i| (i as f32 * 0.01).sin()).collect();
        let b: Vec<f32> = a.iter().map(|x| (x * 8.0).round() / 8.0).collect();
        let (ab, bb) = (f32s(&a), f32s(&b));
        let e = CpuEngine.error_stats(
            FloatView {
                dtype: Dtype::F32,
                bytes: &ab,
            },
            FloatView {
                dtype: Dtype::F32,
                bytes: &bb,
            },
            None,
        );
        let max = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (*y as f64 - *x as f64).abs())
            .fold(0.0, f64::max);
        assert_eq!(e.max_abs, max);
        assert!(e.max_abs <= 1.0 / 16.0 + 1e-7);
        assert!(e.rel_l2() > 0.0 && e.rel_l2() < 0.1);
    }
}
