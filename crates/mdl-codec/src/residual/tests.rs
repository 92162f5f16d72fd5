//! Round trips, bounds and refusals of `quant-residual` and `quant-uniform`.

use super::quantizer::{log_code, round, Quantizer};
use super::{
    decode, distance_sq, encode, measure, measure_steps, Mode, ResidualStats, MAX_MOMENT_STEPS,
};
use crate::scalar;
use crate::tensor::Moments;
use mdl_format::Dtype;

/// splitmix64, for test data.
struct Rng(u64);
impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn enc(dtype: Dtype, v: &[f64]) -> Vec<u8> {
    let mut out = Vec::new();
    for &x in v {
        scalar::push_rounded(dtype, x, &mut out);
    }
    out
}

fn normal(r: &mut Rng) -> f64 {
    let (a, b) = (r.next_f64().max(1e-12), r.next_f64());
    (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
}

/// Round trips of every dtype: the decoder rebuilds exactly the encoder's reconstruction,
/// every element is within step/2 plus half an ulp of the original, non-finite values and
/// far outliers are exact, and the measured statistics are those of the reconstruction.
#[test]
fn round_trips_within_the_step() {
    let mut rng = Rng(3);
    for dtype in [Dtype::BF16, Dtype::F16, Dtype::F32] {
        let n = 150_000;
        let base: Vec<f64> = (0..n).map(|_| normal(&mut rng) * 0.02).collect();
        let mut cur: Vec<f64> = base.iter().map(|b| b + normal(&mut rng) * 1e-3).collect();
        cur[10] = f64::NAN;
        cur[11] = f64::INFINITY;
        cur[12] += 1e3; // beyond 32766 steps
        let (vb, rb) = (enc(dtype, &cur), enc(dtype, &base));
        for step in [1e-4, 5e-4, 2e-3] {
            let (payload, render) = encode(dtype, &vb, Some(&rb), Mode::Linear, step);
            let mut out = vec![0u8; vb.len()];
            decode(dtype, &payload, Some(&rb), &mut out).unwrap();
            assert_eq!(out, render, "{dtype:?} step {step}");
            let size = dtype.size();
            for i in [10usize, 11, 12] {
                assert_eq!(out[i * size..][..size], vb[i * size..][..size]);
            }
            let mut sq = 0.0;
            for i in 0..n {
                let (x, y) = (scalar::value(dtype, &vb, i), scalar::value(dtype, &out, i));
                if !x.is_finite() {
                    continue;
                }
                // Half a unit in the last place of the result (and of f16's subnormals).
                let (bits, tiny) = match dtype {
                    Dtype::BF16 => (8, 0.0),
                    Dtype::F16 => (11, 2f64.powi(-25)),
                    _ => (24, 0.0),
                };
                let half_ulp = y.abs() * 2f64.powi(-bits) + tiny;
                assert!(
                    (y - x).abs() <= step / 2.0 + half_ulp,
                    "{dtype:?} {i}: {x} → {y}"
                );
                sq += (y - x) * (y - x);
            }
            let m = measure(dtype, &vb, Some(&rb), None, Mode::Linear, step);
            assert_eq!(m.exact, 3);
            assert!(
                (m.err.sum_sq_err - sq).abs() <= 1e-9 * sq,
                "{} vs {sq}",
                m.err.sum_sq_err
            );
            assert_eq!(m.codes.total(), n as u64);
            assert!(m.bits(dtype) > 0.0);
        }
    }
}

/// One pass over several steps gives, at each, the statistics of what `encode` produces at
/// that step: the error sums with the moments' weights, and the exactly kept elements.
#[test]
fn one_pass_over_many_steps_measures_each_encoding() {
    let mut rng = Rng(9);
    let n = 150_000;
    let mut base: Vec<f64> = (0..n).map(|_| normal(&mut rng) * 0.05).collect();
    let mut cur: Vec<f64> = base.iter().map(|b| b + normal(&mut rng) * 1e-3).collect();
    let m: Vec<f64> = (0..n).map(|_| normal(&mut rng) * 1e-3).collect();
    let v: Vec<f64> = (0..n).map(|_| normal(&mut rng).powi(2) * 1e-6).collect();
    cur[7] = f64::NAN;
    base[70_000] = f64::INFINITY;
    let (vb, rb) = (enc(Dtype::F32, &cur), enc(Dtype::F32, &base));
    let (mb, wb) = (enc(Dtype::F32, &m), enc(Dtype::F32, &v));
    let view = |bytes| crate::tensor::FloatView {
        dtype: Dtype::F32,
        bytes,
    };
    let moments = Moments {
        m: view(&mb),
        v: view(&wb),
    };
    let steps = [0.0, 1e-2, 1e-3, 1e-4, 1e-5];
    let all = measure_steps(
        Dtype::F32,
        &vb,
        Some(&rb),
        Some(moments),
        Mode::Linear,
        &steps,
        1,
    );
    assert_eq!(
        all[0],
        ResidualStats::default(),
        "an invalid step measures nothing"
    );
    for (st, &step) in all.iter().zip(&steps).skip(1) {
        let (_, render) = encode(Dtype::F32, &vb, Some(&rb), Mode::Linear, step);
        let (mut sq, mut md, mut vd) = (0.0, 0.0, 0.0);
        for i in 0..n {
            let (x, y) = (
                scalar::value(Dtype::F32, &vb, i),
                scalar::value(Dtype::F32, &render, i),
            );
            if x.is_finite() && i != 70_000 {
                let d = y - x;
                sq += d * d;
                md += scalar::value(Dtype::F32, &mb, i) * d;
                vd += scalar::value(Dtype::F32, &wb, i) * d * d;
            }
        }
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1e-300);
        assert_eq!(st.exact, 2, "step {step}");
        assert_eq!(st.codes.total(), n as u64);
        assert!(
            close(st.err.sum_sq_err, sq),
            "{step}: {} vs {sq}",
            st.err.sum_sq_err
        );
        assert!(
            close(st.err.sum_m_delta, md),
            "{step}: {} vs {md}",
            st.err.sum_m_delta
        );
        assert!(close(st.err.sum_v_delta2, vd), "{step}");
    }
    // A sample of every eighth block, scaled, stands for the whole within a few per cent.
    let sampled = measure_steps(
        Dtype::F32,
        &vb,
        Some(&rb),
        Some(moments),
        Mode::Linear,
        &steps,
        8,
    );
    for ((st, full), step) in sampled.into_iter().zip(&all).zip(steps).skip(1) {
        let total = st.codes.total() as f64;
        assert!(total < n as f64 / 7.0, "a sample, not the whole");
        let st = st.scaled(n as f64 / total);
        let near = |a: f64, b: f64| (a / b - 1.0).abs() < 0.05;
        // The sample holds the NaN, which scaled up stands for 16 exact elements, not one.
        let (a, b) = (st.bits(Dtype::F32), full.bits(Dtype::F32));
        assert!((a - b).abs() < 0.05 * b + 16.0 * 32.0, "{step}: {a} vs {b}");
        assert!(near(st.err.sum_sq_err, full.err.sum_sq_err));
        assert!(near(st.err.sum_v_delta2, full.err.sum_v_delta2));
    }
}

#[test]
fn rounding_is_half_away_from_zero() {
    for t in [
        0.0,
        -0.0,
        0.5,
        1.5,
        2.5,
        -0.5,
        -2.5,
        0.49999999999999994,
        -0.49999999999999994,
        2.5000000000000004,
        4503599627370495.5,
        1e300,
        f64::INFINITY,
    ] {
        assert_eq!(round(t).to_bits(), t.round().to_bits(), "{t}");
    }
    assert!(round(f64::NAN).is_nan());
}

/// The error shrinks with the step and stays below the movement; a finer step costs more.
#[test]
fn finer_steps_cost_more_and_err_less() {
    let mut rng = Rng(5);
    let n = 100_000;
    let base: Vec<f64> = (0..n).map(|_| normal(&mut rng) * 0.05).collect();
    let cur: Vec<f64> = base.iter().map(|b| b + normal(&mut rng) * 1e-3).collect();
    let (vb, rb) = (enc(Dtype::F32, &cur), enc(Dtype::F32, &base));
    let mut last: Option<ResidualStats> = None;
    for step in [4e-3, 2e-3, 1e-3, 5e-4, 2.5e-4] {
        let m = measure(Dtype::F32, &vb, Some(&rb), None, Mode::Linear, step);
        // Uniform quantization: mean squared error near step²/12.
        let mse = m.err.sum_sq_err / n as f64;
        assert!(mse <= step * step / 12.0 * 1.2 + 1e-14, "{step}: {mse}");
        let moved = distance_sq(Dtype::F32, &vb, Some(&rb));
        assert!((m.err.sum_sq_err / moved).sqrt() < 1.0);
        if let Some(l) = &last {
            assert!(m.err.sum_sq_err < l.err.sum_sq_err);
            assert!(m.bits(Dtype::F32) > l.bits(Dtype::F32));
        }
        last = Some(m);
    }
}

/// Without a reference (`quant-uniform`), fine steps need two-byte codes: they round trip,
/// and every element is within half a step (plus rounding).
#[test]
fn uniform_codes_are_wide_when_the_steps_are_fine() {
    let mut rng = Rng(4);
    let w: Vec<f64> = (0..70_000).map(|_| normal(&mut rng) * 0.02).collect();
    let vb = enc(Dtype::F32, &w);
    for (step, width) in [(1e-2, 1u8), (2e-5, 2)] {
        let (payload, render) = encode(Dtype::F32, &vb, None, Mode::Linear, step);
        assert_eq!(payload[1 + 8 + 1], width, "step {step}");
        let mut out = vec![0u8; vb.len()];
        decode(Dtype::F32, &payload, None, &mut out).unwrap();
        assert_eq!(out, render);
        for (i, &x) in w.iter().enumerate() {
            let (x, y) = (x as f32 as f64, scalar::value(Dtype::F32, &out, i));
            assert!((y - x).abs() <= step / 2.0 + y.abs() * 1e-7, "{i}");
        }
        let m = measure(Dtype::F32, &vb, None, None, Mode::Linear, step);
        assert_eq!(m.exact, 0);
        assert_eq!(m.high.entropy_bits() > 0.0, width == 2);
    }
    let (payload, _) = encode(Dtype::F32, &vb, Some(&vb), Mode::Log, 0.5);
    let mut bad = payload.clone();
    bad[0] = 1;
    let mut out = vec![0u8; vb.len()];
    assert!(decode(Dtype::F32, &bad, None, &mut out).is_err());
}

/// Codes of exactly 127 and −128 steps are the one-byte forms of the special codes: a
/// tensor that has them (and nothing wider) takes two-byte codes, and decodes to itself.
#[test]
fn codes_next_to_the_special_ones_round_trip() {
    let n = 1000;
    let reference = vec![0.0f64; n];
    let values: Vec<f64> = (0..n)
        .map(|i| match i % 4 {
            0 => 127.0,
            1 => -128.0,
            2 => 3.0,
            _ => -1.0,
        })
        .collect();
    let (vb, rb) = (enc(Dtype::F32, &values), enc(Dtype::F32, &reference));
    let (payload, render) = encode(Dtype::F32, &vb, Some(&rb), Mode::Linear, 1.0);
    assert_eq!(payload[1 + 8 + 1], 2);
    assert_eq!(render, vb);
    let mut out = vec![0u8; vb.len()];
    decode(Dtype::F32, &payload, Some(&rb), &mut out).unwrap();
    assert_eq!(out, vb);
}

/// The moment modes: a second moment against its previous version in the log domain
/// (relative error within half a step of octaves), a first moment in units of the square
/// root of a second moment; zeros stay zeros, what cannot be coded is exact, and the
/// decoder rebuilds exactly the encoder's reconstruction.
#[test]
fn moment_modes_round_trip_within_their_steps() {
    let mut rng = Rng(9);
    let n = 120_000;
    let v0: Vec<f64> = (0..n)
        .map(|_| 1e-8 * (normal(&mut rng) * 3.0).exp2())
        .collect();
    let mut v1: Vec<f64> = v0
        .iter()
        .map(|v| v * (normal(&mut rng) * 0.5).exp2())
        .collect();
    v1[3] = 0.0;
    let mut m1: Vec<f64> = v1
        .iter()
        .map(|v| v.sqrt() * normal(&mut rng) * 0.3)
        .collect();
    m1[5] = 0.0;
    let mut v0b = v0.clone();
    v0b[7] = 0.0; // no scale for element 7: its first moment is exact
    for dtype in [Dtype::F32, Dtype::BF16] {
        let (r, x) = (enc(dtype, &v0), enc(dtype, &v1));
        let (payload, render) = encode(dtype, &x, Some(&r), Mode::Log, 0.5);
        let mut out = vec![0u8; x.len()];
        decode(dtype, &payload, Some(&r), &mut out).unwrap();
        assert_eq!(out, render);
        // Rounding to the dtype, in octaves (bf16 keeps 8 significant bits).
        let slack = if dtype == Dtype::BF16 {
            2f64.powi(-7)
        } else {
            1e-6
        };
        for i in 0..n {
            let (a, b) = (scalar::value(dtype, &x, i), scalar::value(dtype, &out, i));
            if a == 0.0 {
                assert_eq!(b, 0.0);
                continue;
            }
            let ratio = (b / a).log2().abs();
            let r = scalar::value(dtype, &r, i);
            assert!(
                ratio <= 0.25 + slack,
                "{dtype:?} {i}: {a} → {b} (reference {r})"
            );
        }
        let (s, x) = (enc(dtype, &v0b), enc(dtype, &m1));
        let (payload, render) = encode(dtype, &x, Some(&s), Mode::Scaled, 0.25);
        decode(dtype, &payload, Some(&s), &mut out).unwrap();
        assert_eq!(out, render);
        let size = dtype.size();
        assert_eq!(out[7 * size..8 * size], x[7 * size..8 * size]);
        for i in 0..n {
            let (a, b) = (scalar::value(dtype, &x, i), scalar::value(dtype, &out, i));
            let unit = scalar::value(dtype, &s, i).sqrt();
            if i == 7 || unit == 0.0 {
                continue;
            }
            assert!(
                (a - b).abs() <= 0.125 * unit + b.abs() * slack,
                "{i}: {a} → {b}"
            );
        }
        assert_eq!(scalar::value(dtype, &out, 5), 0.0);
    }
}

#[test]
fn corrupt_payloads_are_errors() {
    let rb = enc(Dtype::F32, &[0.5; 1000]);
    let vb = enc(Dtype::F32, &[0.6; 1000]);
    let (payload, _) = encode(Dtype::F32, &vb, Some(&rb), Mode::Linear, 0.01);
    let mut out = vec![0u8; vb.len()];
    for cut in [0, 1, 4, 9, 10, payload.len() - 1] {
        assert!(decode(Dtype::F32, &payload[..cut], Some(&rb), &mut out).is_err());
    }
    let mut bad = payload.clone();
    bad[1..9].copy_from_slice(&(-1.0f64).to_le_bytes());
    assert!(decode(Dtype::F32, &bad, Some(&rb), &mut out).is_err());
    let mut bad = payload.clone();
    bad[0] = 7;
    assert!(decode(Dtype::F32, &bad, Some(&rb), &mut out).is_err());
    assert!(decode(Dtype::F32, &payload, Some(&rb[4..]), &mut out).is_err());
    assert!(decode(Dtype::I32, &payload, Some(&rb), &mut out).is_err());
}

/// The search's estimates are the same on every machine: sums are not grouped by thread.
#[test]
fn measuring_does_not_depend_on_the_thread_count() {
    let n = 5 * super::CHUNK + 1234;
    let f32s =
        |f: &dyn Fn(usize) -> f32| -> Vec<u8> { (0..n).flat_map(|i| f(i).to_le_bytes()).collect() };
    let x = f32s(&|i| ((i as f32) * 0.37).sin() * 0.02 + (i % 7) as f32 * 1e-5);
    let r = f32s(&|i| ((i as f32) * 0.37).sin() * 0.02);
    let m = f32s(&|i| ((i as f32) * 0.11).cos() * 1e-3);
    let v = f32s(&|i| 1e-7 + ((i as f32) * 0.05).sin().powi(2) * 1e-6);
    let view = |bytes| crate::tensor::FloatView {
        dtype: Dtype::F32,
        bytes,
    };
    let steps = [1e-5, 3e-5, 1e-4, 4e-4];
    let run = |threads| {
        crate::on_threads(threads, || {
            let moments = Moments {
                m: view(&m),
                v: view(&v),
            };
            // Every element, and the search's sample.
            let [st, sampled] = [1, 8].map(|every| {
                let m = Some(moments);
                measure_steps(Dtype::F32, &x, Some(&r), m, Mode::Linear, &steps, every)
            });
            (st, sampled, distance_sq(Dtype::F32, &x, Some(&r)))
        })
    };
    let one = run(1);
    for threads in [2, 3, 7] {
        assert!(run(threads) == one, "{threads} threads");
    }
    assert!(one
        .0
        .iter()
        .all(|s| s.err.sum_sq_err > 0.0 && s.codes.total() == n as u64));
}

/// A log-mode code is the number of thresholds its ratio reaches, whatever the logarithm's
/// guess (a GPU's `log2` may differ from the CPU's in its last bits): ratios on, just beside
/// and far from the thresholds get the counted code even from a guess that is off by several
/// steps, and away from the thresholds it is the rounded logarithm.
#[test]
fn log_codes_are_decided_by_the_thresholds() {
    let mut rng = Rng(11);
    for step in [0.05, 0.37, 1.0, 3.5] {
        let quant = Quantizer::with_step(Mode::Log, step).unwrap();
        let t = &quant.thresholds;
        assert!(t.windows(2).all(|w| w[0] < w[1]), "thresholds ascend");
        let mut ratios: Vec<f64> = t
            .iter()
            .flat_map(|&x| [x, x.next_up(), x.next_down()])
            .collect();
        ratios.extend((0..2000).map(|_| (normal(&mut rng) * 200.0 * step).exp2()));
        ratios.extend([f64::MIN_POSITIVE, 1e-300, 1.0, 1e300]);
        let top = MAX_MOMENT_STEPS + 1;
        for ratio in ratios {
            let counted = -top + t.iter().filter(|&&x| ratio >= x).count() as i64;
            for off in [1.0, 1.04, 0.9] {
                let log_param = quant.param.log2() * off;
                assert_eq!(
                    log_code(ratio, log_param, t) as i64,
                    counted,
                    "ratio {ratio}"
                );
            }
            let exact = ratio.log2() / step;
            if (exact - exact.round()).abs() < 0.49 && exact.abs() < 126.0 {
                assert_eq!(counted as f64, round(exact), "ratio {ratio}");
            }
        }
    }
}

/// A payload whose codes are coded by classes decodes to the very reconstruction its Huffman
/// form does, is smaller where rows differ in how far they moved, and leaves payloads it
/// cannot improve (two-plane codes, tiny tensors) as they were; predicted payloads keep their
/// header.
#[test]
fn codes_by_classes_decode_to_the_same_reconstruction() {
    let mut rng = Rng(11);
    let (rows, cols) = (384, 256);
    let n = rows * cols;
    let base: Vec<f64> = (0..n).map(|_| normal(&mut rng) * 0.02).collect();
    // Rows that move 1, 2, 4 or 8 times as far: the classes' case.
    let cur: Vec<f64> = base
        .iter()
        .enumerate()
        .map(|(i, b)| b + normal(&mut rng) * 1e-4 * (1 << (i / cols % 4)) as f64)
        .collect();
    let dtype = Dtype::F32;
    let (vb, rb) = (enc(dtype, &cur), enc(dtype, &base));
    let (payload, render) = encode(dtype, &vb, Some(&rb), Mode::Linear, 2e-4);
    let classed = super::context_code(dtype, payload.clone(), (rows, cols));
    assert!(
        classed.len() * 100 < payload.len() * 95,
        "{} against {} bytes",
        classed.len(),
        payload.len()
    );
    let mut out = vec![0u8; vb.len()];
    decode(dtype, &classed, Some(&rb), &mut out).unwrap();
    assert_eq!(out, render);
    // Damage anywhere in the classed section is an error or other content, never a panic.
    for at in (9..classed.len()).step_by(13) {
        let mut bad = classed.clone();
        bad[at] ^= 0x21;
        let _ = decode(dtype, &bad, Some(&rb), &mut out);
    }
    assert!(decode(dtype, &classed[..classed.len() - 1], Some(&rb), &mut out).is_err());

    // Wide codes stay Huffman-coded: fine steps against zeros.
    let (wide, _) = encode(dtype, &vb, None, Mode::Linear, 1e-6);
    assert_eq!(super::context_code(dtype, wide.clone(), (rows, cols)), wide);

    // A predicted second moment: the header is kept, the inner payload recoded.
    let v: Vec<f64> = (0..n)
        .map(|i| (1e-8 * (1 << (i / cols % 4)) as f64) * (1.0 + rng.next_f64()))
        .collect();
    let vb = enc(dtype, &v);
    let p = super::Predictor::fit(dtype, &vb, None, (rows, cols));
    let prediction = p.predict(dtype, None).unwrap();
    let (inner, render) = encode(dtype, &vb, Some(&prediction), Mode::Log, 1.0);
    let wrapped = p.wrap(&inner);
    let classed = super::context_code(dtype, wrapped.clone(), (rows, cols));
    assert!(classed.len() <= wrapped.len());
    assert_eq!(
        classed[..wrapped.len() - inner.len()],
        wrapped[..wrapped.len() - inner.len()]
    );
    decode(dtype, &classed, None, &mut out).unwrap();
    assert_eq!(out, render);
}
