//! The DynaQuant-style quantizer: a tensor's 16-bit-key histogram ([`KeyStats`]) is partitioned
//! into protected keys (kept exactly), pruned keys (set to zero) and quantized keys, whose values
//! are clustered by weighted k-means into a few centroids. Everything after the histogram works
//! on at most 65,536 keys, so a configuration is fitted and scored without touching the tensor:
//! that is what makes a wide configuration search affordable at every commit.
//!
//! Decisions are per key: every element with the same key gets the same treatment. For bf16 and
//! f16 a key is a value; for f32 it is the value truncated to its top 16 bits (relative width
//! 2^-8), so partition fractions are met to within one key and an f32 element is assigned by
//! its truncated value.

mod config;
mod fit;
mod kmeans;
mod search;

pub use config::{
    Correction, Domain, Metric, QuantConfig, BINS, CURVATURE_FLOOR, DEFAULT_CURVATURE,
    EMBEDDING_BINS, FIRST_ORDER_SPREAD, MAX_BINS, PROTECT, PRUNE, SIGMA,
};
pub use fit::{Estimate, Fit, Prepared};
pub use kmeans::kmeans;
pub use search::{allocate, candidates};

#[cfg(test)]
mod tests {
    use mdl_format::Dtype;

    use super::kmeans::Rng;
    use super::*;
    use crate::engine::{CpuEngine, Engine, FloatView, Moments};
    use crate::qrecord::QuantTensor;
    use crate::scalar;

    fn bf16s(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|&x| scalar::f32_to_bf16(x).to_le_bytes())
            .collect()
    }

    fn normal(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut r = Rng(seed);
        (0..n)
            .map(|_| {
                let (a, b) = (r.next_f64().max(1e-12), r.next_f64());
                ((-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()) as f32 * scale
            })
            .collect()
    }

    #[test]
    fn config_text_round_trips() {
        for c in candidates(None, false, true, Domain::Linear) {
            assert_eq!(c.to_string().parse::<QuantConfig>().unwrap(), c);
        }
        assert!("bins=0 prune=0 protect=0 metric=magnitude domain=linear"
            .parse::<QuantConfig>()
            .is_err());
        assert!("bins=4".parse::<QuantConfig>().is_err());
    }

    #[test]
    fn kmeans_is_deterministic_sorted_and_bounded() {
        let pts: Vec<f64> = (0..1000).map(|i| (i as f64 / 100.0).powi(2)).collect();
        let w = vec![1.0; pts.len()];
        let a = kmeans(&pts, &w, 8);
        assert_eq!(a, kmeans(&pts, &w, 8));
        assert!(a.len() <= 8 && a.windows(2).all(|p| p[0] < p[1]));
        assert_eq!(kmeans(&pts[..3], &w[..3], 8), pts[..3].to_vec());
    }

    #[test]
    fn fit_partitions_and_estimates() {
        let w = normal(50_000, 1, 0.02);
        let m = normal(50_000, 2, 1e-3);
        let v: Vec<f32> = normal(50_000, 3, 1e-3).iter().map(|x| x * x).collect();
        let (wb, mb, vb) = (bf16s(&w), bf16s(&m), bf16s(&v));
        fn view(bytes: &[u8]) -> FloatView<'_> {
            FloatView {
                dtype: Dtype::BF16,
                bytes,
            }
        }
        let stats = CpuEngine.key_stats(
            view(&wb),
            Some(Moments {
                m: view(&mb),
                v: view(&vb),
            }),
        );
        let prep = Prepared::new(&stats, Dtype::BF16);
        let c = Correction::adam(0.9, 0.95, 100);
        let corr = Some(c);
        let mut prev_err = f64::INFINITY;
        for bins in BINS {
            let cfg = QuantConfig {
                bins,
                prune: 0.2,
                protect: 0.005,
                metric: Metric::Sensitivity,
                domain: Domain::Linear,
            };
            let fit = prep.fit(&cfg, corr);
            let e = fit.estimate;
            assert!(fit.values.len() <= bins as usize + 1);
            assert!(e.pruned as f64 <= 0.2 * 50_000.0 && e.pruned as f64 > 0.15 * 50_000.0);
            assert!(e.protected as f64 >= 0.005 * 50_000.0);
            assert!(
                e.sq_err < prev_err * 1.05,
                "{bins}: {} vs {prev_err}",
                e.sq_err
            );
            prev_err = e.sq_err;
            // The estimate's errors are the errors of the reconstruction the lookup gives.
            let a = CpuEngine.assign(view(&wb), &prep.lut(&fit));
            let q = QuantTensor::new(Dtype::BF16, prep.table_bytes(&fit.values), a, &wb);
            let mut recon = vec![0u8; wb.len()];
            q.render(&mut recon);
            let measured = CpuEngine.error_stats(
                view(&wb),
                view(&recon),
                Some(Moments {
                    m: view(&mb),
                    v: view(&vb),
                }),
            );
            assert!((measured.sum_sq_err - e.sq_err).abs() <= 1e-6 * e.sq_err.max(1e-30));
            assert_eq!(measured.max_abs, e.max_abs);
            let dl = c.loss_change(
                measured.sum_m_delta,
                measured.sum_v_delta2,
                measured.sum_sq_err,
                prep.mean_v(),
            );
            let est = e.delta_loss.unwrap();
            assert!((dl - est).abs() <= 1e-6 * est.max(1e-30), "{dl} vs {est}");
        }
    }

    /// A fit to a given table uses exactly that table; elements that did not move keep their
    /// codes, and the delta estimate counts what the code pairs say.
    #[test]
    fn a_reused_table_keeps_codes_and_prices_the_delta() {
        let w = normal(40_000, 7, 0.02);
        // The next version: 2 % of the elements move.
        let mut w2 = w.clone();
        let mut rng = Rng(9);
        for _ in 0..800 {
            let i = (rng.next_f64() * w.len() as f64) as usize;
            w2[i] += 0.01;
        }
        let (wb, wb2) = (bf16s(&w), bf16s(&w2));
        let view = |bytes| FloatView {
            dtype: Dtype::BF16,
            bytes,
        };
        let cfg = QuantConfig {
            bins: 12,
            prune: 0.1,
            protect: 0.0005,
            metric: Metric::Magnitude,
            domain: Domain::Linear,
        };
        let s1 = CpuEngine.key_stats(view(&wb), None);
        let prep1 = Prepared::new(&s1, Dtype::BF16);
        let first = prep1.fit(&cfg, None);
        let a1 = CpuEngine.assign(view(&wb), &prep1.lut(&first));
        let s2 = CpuEngine.key_stats(view(&wb2), None);
        let prep2 = Prepared::new(&s2, Dtype::BF16);
        let reused = prep2.fit_table(&cfg, Some(&first.values), None);
        assert_eq!(reused.values, first.values);
        let lut = prep2.lut(&reused);
        let a2 = CpuEngine.assign(view(&wb2), &lut);
        let same_input = (0..w.len()).filter(|&i| wb[2 * i..2 * i + 2] == wb2[2 * i..2 * i + 2]);
        let (mut kept, mut total) = (0, 0);
        for i in same_input {
            total += 1;
            kept += (a1.codes[i] == a2.codes[i]) as usize;
        }
        // Only keys at the moved partition boundaries may change code.
        assert!(kept as f64 > 0.99 * total as f64, "{kept} of {total}");
        let bins = reused.values.len();
        let pairs = CpuEngine.code_pairs(view(&wb2), &lut, bins, &a1.codes, first.values.len());
        let mut naive = vec![0u64; first.values.len() * bins];
        for i in 0..w.len() {
            naive[a1.codes[i] as usize * bins + a2.codes[i] as usize] += 1;
        }
        assert_eq!(pairs.count, naive);
        let delta = reused.estimate.as_delta(&pairs);
        assert!(delta.bits < 0.5 * reused.estimate.bits, "{delta:?}");
        assert_eq!(delta.sq_err, reused.estimate.sq_err);
        // Codes that never change cost nothing.
        let still = CpuEngine.code_pairs(
            view(&wb),
            &prep1.lut(&first),
            first.values.len(),
            &a1.codes,
            first.values.len(),
        );
        assert_eq!(still.conditional_bits(), 0.0);
    }

    /// The quantizer's invariants on random tensors of every dtype, both domains, with and
    /// without moments: protected elements exact, pruned ones +0, every other element on the
    /// table value nearest its key, tables sorted and no larger than bins + 1.
    #[test]
    fn quantizer_invariants() {
        let mut rng = Rng(42);
        for dtype in [Dtype::BF16, Dtype::F16, Dtype::F32] {
            for (case, domain) in [Domain::Linear, Domain::Log, Domain::Linear]
                .into_iter()
                .enumerate()
            {
                let n = 20_000 + case * 7_777;
                let mut w: Vec<f32> = normal(n, rng.0 ^ case as u64, 0.05);
                if domain == Domain::Log {
                    w.iter_mut().for_each(|x| *x = *x * *x * 1e-3);
                    w[7] = 0.0;
                }
                w[3] = f32::INFINITY;
                w[5] = -0.0;
                let enc = |v: &[f32]| -> Vec<u8> {
                    let mut out = Vec::new();
                    for &x in v {
                        scalar::push_rounded(dtype, x as f64, &mut out);
                    }
                    out
                };
                let wb = enc(&w);
                let mb = enc(&normal(n, 7, 1e-3));
                let vb = enc(&normal(n, 8, 1e-3).iter().map(|x| x * x).collect::<Vec<_>>());
                let view = |b| FloatView { dtype, bytes: b };
                let moments = (case == 1).then(|| Moments {
                    m: view(&mb),
                    v: view(&vb),
                });
                let stats = CpuEngine.key_stats(view(&wb), moments);
                let prep = Prepared::new(&stats, dtype);
                for _ in 0..6 {
                    let cfg = QuantConfig {
                        bins: BINS[(rng.next_f64() * 6.0) as usize],
                        prune: PRUNE[(rng.next_f64() * 6.0) as usize],
                        protect: PROTECT[(rng.next_f64() * 3.0) as usize],
                        metric: if rng.next_f64() < 0.5 {
                            Metric::Magnitude
                        } else {
                            Metric::Sensitivity
                        },
                        domain,
                    };
                    let fit = prep.fit(&cfg, None);
                    assert!(fit.values.len() <= cfg.bins as usize + 1);
                    assert!(fit.values.windows(2).all(|p| p[0] < p[1]), "{cfg}");
                    let a = CpuEngine.assign(view(&wb), &prep.lut(&fit));
                    let q = QuantTensor::new(dtype, prep.table_bytes(&fit.values), a, &wb);
                    let mut out = vec![0u8; wb.len()];
                    q.render(&mut out);
                    let size = dtype.size();
                    let protected: std::collections::HashSet<u64> =
                        q.protected.iter().copied().collect();
                    let log = domain == Domain::Log;
                    for i in 0..n {
                        let (orig, got) = (&wb[i * size..][..size], &out[i * size..][..size]);
                        let k = scalar::key(dtype, &wb, i) as usize;
                        if protected.contains(&(i as u64)) {
                            assert_eq!(orig, got, "protected element {i} changed");
                            continue;
                        }
                        let y = scalar::value(dtype, &out, i);
                        if prep.is_pruned(&fit, k as u16) {
                            assert_eq!(y.to_bits(), 0.0f64.to_bits(), "pruned {i} is {y}");
                            continue;
                        }
                        let x = scalar::key_value(dtype, k as u16);
                        let dist = |t: f64| {
                            if log {
                                if t <= 0.0 || x <= 0.0 {
                                    if t == x {
                                        0.0
                                    } else {
                                        f64::INFINITY
                                    }
                                } else {
                                    (t.ln() - x.ln()).abs()
                                }
                            } else {
                                (t - x).abs()
                            }
                        };
                        let best = fit
                            .values
                            .iter()
                            .map(|&t| dist(t))
                            .fold(f64::INFINITY, f64::min);
                        assert!(
                            dist(y) <= best * (1.0 + 1e-12),
                            "{dtype:?} {cfg}: {x} → {y}, nearest is {best} away"
                        );
                    }
                }
            }
        }
    }

    /// The loss estimate is an upper bound on a quadratic model whose loss change is known in
    /// closed form. Per-example gradients `h·(w − w*) + noise` with noise variance `h` (the
    /// Fisher equals the Hessian), Adam's moments taken over minibatches of `N` examples:
    /// `m = h·(w − w*)`, `v = m² + h/N`. A third of the elements sit at their optimum (zero
    /// gradient, curvature still there); a tenth have no curvature and no gradient at all.
    /// Errors from the quantizer at every size and from the residual codec are all covered.
    #[test]
    fn the_estimate_bounds_a_quadratic_models_loss_change() {
        let n = 60_000;
        let batch = 4096.0;
        let mut rng = Rng(11);
        let mut w = Vec::with_capacity(n);
        let (mut m, mut v, mut h, mut opt) = (vec![], vec![], vec![], vec![]);
        for i in 0..n {
            let wi = normal(1, rng.0 ^ i as u64, 0.05)[0] as f64;
            rng.next_f64();
            let hi = if i % 10 == 0 {
                0.0
            } else {
                0.5 + 4.0 * rng.next_f64()
            };
            let away = if i % 3 == 0 {
                0.0
            } else {
                0.002 * (rng.next_f64() - 0.5)
            };
            let mi = hi * away;
            w.push(wi as f32);
            opt.push(wi - away);
            h.push(hi);
            m.push(mi as f32);
            v.push((mi * mi + hi / batch) as f32);
        }
        let f32s = |x: &[f32]| -> Vec<u8> { x.iter().flat_map(|a| a.to_le_bytes()).collect() };
        let (wb, mb, vb) = (f32s(&w), f32s(&m), f32s(&v));
        let view = |b| FloatView {
            dtype: Dtype::F32,
            bytes: b,
        };
        let moments = Some(Moments {
            m: view(&mb),
            v: view(&vb),
        });
        // L(w) = ½ Σ h (w − w*)²: the change from δ, exactly.
        let true_change = |recon: &[u8]| -> f64 {
            (0..n)
                .map(|i| {
                    let y = scalar::value(Dtype::F32, recon, i);
                    let x = w[i] as f64;
                    0.5 * h[i] * ((y - opt[i]).powi(2) - (x - opt[i]).powi(2))
                })
                .sum()
        };
        let corr = Correction {
            c1: 1.0,
            c2: 1.0,
            curvature: DEFAULT_CURVATURE.max(batch),
        };
        let stats = CpuEngine.key_stats(view(&wb), moments);
        let prep = Prepared::new(&stats, Dtype::F32);
        let mut checked = 0;
        for cfg in candidates(None, false, true, Domain::Linear) {
            let fit = prep.fit(&cfg, Some(corr));
            let a = CpuEngine.assign(view(&wb), &prep.lut(&fit));
            let q = QuantTensor::new(Dtype::F32, prep.table_bytes(&fit.values), a, &wb);
            let mut recon = vec![0u8; wb.len()];
            q.render(&mut recon);
            let (est, real) = (fit.estimate.delta_loss.unwrap(), true_change(&recon));
            assert!(real <= est, "{cfg}: true {real} > estimate {est}");
            checked += 1;
        }
        // Residuals from a reference the tensor moved away from.
        let reference: Vec<f32> = w.iter().map(|x| x - 1e-3).collect();
        let rb = f32s(&reference);
        for step in [1e-4, 5e-4, 2e-3, 8e-3] {
            let linear = crate::residual::Mode::Linear;
            let st = crate::residual::measure(Dtype::F32, &wb, Some(&rb), moments, linear, step);
            let (_, recon) = crate::residual::encode(Dtype::F32, &wb, Some(&rb), linear, step);
            let est = corr.loss_change(
                st.err.sum_m_delta,
                st.err.sum_v_delta2,
                st.err.sum_sq_err,
                prep.mean_v(),
            );
            let real = true_change(&recon);
            assert!(
                real <= est,
                "residual step {step}: true {real} > estimate {est}"
            );
            checked += 1;
        }
        assert!(checked > 20);
        // The old estimate (no curvature scale, no spread) misses it: the bound is not vacuous.
        let fit = prep.fit(
            &QuantConfig {
                bins: 4,
                prune: 0.5,
                protect: 0.0005,
                metric: Metric::Magnitude,
                domain: Domain::Linear,
            },
            Some(corr),
        );
        let a = CpuEngine.assign(view(&wb), &prep.lut(&fit));
        let q = QuantTensor::new(Dtype::F32, prep.table_bytes(&fit.values), a, &wb);
        let mut recon = vec![0u8; wb.len()];
        q.render(&mut recon);
        let err = CpuEngine.error_stats(view(&wb), view(&recon), moments);
        let old = err.sum_m_delta.abs() + 0.5 * err.sum_v_delta2;
        assert!(true_change(&recon) > 10.0 * old);
    }

    #[test]
    fn allocation_meets_the_budget() {
        let cands = vec![
            vec![(100.0, 0.0), (50.0, 1.0), (20.0, 5.0)],
            vec![(100.0, 0.0), (30.0, 2.0), (10.0, 4.0)],
        ];
        let pick = allocate(&cands, 3.0);
        let cost: f64 = pick.iter().zip(&cands).map(|(&i, c)| c[i].1).sum();
        assert!(cost <= 3.0);
        assert_eq!(pick, vec![1, 1]);
        assert_eq!(allocate(&cands, 100.0), vec![2, 2]);
        assert_eq!(allocate(&cands, 0.0), vec![0, 0]);
    }
}
