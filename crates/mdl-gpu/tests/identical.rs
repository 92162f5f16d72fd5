//! The GPU engine produces what the CPU engine produces, byte for byte: every float codec on
//! every dtype and size class (payloads, choices, decodes, damaged payloads), the lossy kernels,
//! the residual quantizer (its step search's statistics and its payloads, in every mode), and a
//! generated training series coded as a delta chain. The GPU comparisons are ignored
//! (reported as such) unless the crate is built for the emulated device (`--features emulate`,
//! as `.ci/run` does); `scripts/gpu-check.sh` runs them on a real GPU with `--include-ignored`.
//! Run, they fail without a GPU engine rather than pass without comparing anything.

use mdl_codec::engine::{CpuEngine, Engine, FloatView, Lut, Moments};
use mdl_codec::float;
use mdl_codec::planes::Transform;
use mdl_codec::residual::{self, Mode};
use mdl_format::Dtype;
use mdl_gpu::GpuEngine;

/// The GPU engine with every input sent to the device; a test that asks for it fails without
/// one.
fn gpu() -> GpuEngine {
    match mdl_gpu::probe() {
        Ok((engine, line)) => {
            println!("GPU engine: {line}");
            engine.with_min_bytes(0)
        }
        Err(why) => panic!("this test compares against a GPU engine and there is none: {why}"),
    }
}

fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

const FLOATS: [Dtype; 4] = [Dtype::BF16, Dtype::F16, Dtype::F32, Dtype::F64];
const LOSSY: [Dtype; 3] = [Dtype::BF16, Dtype::F16, Dtype::F32];

/// Element counts around the chunk sizes (the float codecs' 2^17, the lossy kernels' 2^16 and
/// the tiles), including empty and single elements.
const SIZES: [usize; 9] = [
    0,
    1,
    7,
    1000,
    (1 << 16) + 3,
    (1 << 17) - 1,
    1 << 17,
    (1 << 17) + 9,
    3 * (1 << 17) + 4097,
];

/// `n` values of `dtype` in one of several shapes: smooth weights, random bits (specials and
/// NaN payloads included), mostly zeros (sparse planes), or one constant.
fn tensor(dtype: Dtype, n: usize, shape: u64, seed: u64) -> Vec<u8> {
    let mut r = rng(seed);
    let mut out = Vec::with_capacity(n * dtype.size());
    for i in 0..n {
        let x = ((r() >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 0.2;
        let v = match shape {
            0 => x + (i as f64 * 1e-3).sin() * 0.01,
            1 => f64::from_bits(r()),
            2 if r().is_multiple_of(16) => x,
            2 => 0.0,
            _ => 0.5,
        };
        match dtype {
            Dtype::F64 if shape == 1 => out.extend_from_slice(&r().to_le_bytes()),
            Dtype::F64 => out.extend_from_slice(&v.to_le_bytes()),
            Dtype::F32 if shape == 1 => out.extend_from_slice(&(r() as u32).to_le_bytes()),
            Dtype::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            Dtype::BF16 | Dtype::F16 if shape == 1 => {
                out.extend_from_slice(&(r() as u16).to_le_bytes())
            }
            Dtype::BF16 => {
                out.extend_from_slice(&mdl_codec::scalar::f32_to_bf16(v as f32).to_le_bytes())
            }
            _ => out.extend_from_slice(&mdl_codec::scalar::f32_to_f16(v as f32).to_le_bytes()),
        }
    }
    out
}

/// `data` nudged a little (a training step): most elements move in their low bits.
fn step(dtype: Dtype, data: &[u8], seed: u64) -> Vec<u8> {
    let mut r = rng(seed);
    let mut out = data.to_vec();
    for e in out.chunks_mut(dtype.size()) {
        if !r().is_multiple_of(4) {
            e[0] ^= (r() & 0x7) as u8;
        }
    }
    out
}

/// Encodes with both engines and checks the choices and payloads are equal and that both
/// engines decode the payload back.
fn same_float_coding(gpu: &dyn Engine, dtype: Dtype, data: &[u8], base: Option<&[u8]>) {
    let cpu = float::analyze(&CpuEngine, dtype, data, base).unwrap();
    let dev = float::analyze(gpu, dtype, data, base).unwrap();
    assert_eq!(
        format!("{cpu:?}"),
        format!("{dev:?}"),
        "{dtype:?}: analyses differ"
    );
    let mut choices = vec![(&cpu.plain, None)];
    if let Some(d) = &cpu.delta {
        choices.push((d, base));
    }
    if let Some(s) = &cpu.sub {
        choices.push((s, base));
    }
    for (choice, b) in choices {
        let mut a = Vec::new();
        let mut g = Vec::new();
        float::encode(&CpuEngine, dtype, data, b, choice, &mut a).unwrap();
        float::encode(gpu, dtype, data, b, choice, &mut g).unwrap();
        assert!(a == g, "{dtype:?} n={}: payloads differ", data.len());
        let mut back = vec![0u8; data.len()];
        match choice.transform {
            Transform::Planes => float::decode(gpu, dtype, &g, b, &mut back).unwrap(),
            Transform::Sub => float::decode_sub(gpu, dtype, &g, b.unwrap(), &mut back).unwrap(),
        }
        assert!(
            back == data,
            "{dtype:?}: GPU decode differs from the original"
        );
        // A damaged payload is an error on both engines.
        if g.len() > 200 {
            let mut bad = g.clone();
            let at = bad.len() - 50;
            bad[at] ^= 0xff;
            bad.truncate(bad.len() - 1);
            if choice.transform == Transform::Planes {
                assert!(float::decode(gpu, dtype, &bad, b, &mut back).is_err());
                assert!(float::decode(&CpuEngine, dtype, &bad, b, &mut back).is_err());
            }
        }
    }
}

/// Runs `check` with the GPU engine, then makes sure the GPU did the work: a driver failure
/// sends a call to the CPU, which would make any comparison pass.
fn on_gpu(check: fn(&dyn Engine)) {
    let gpu = gpu();
    check(&gpu);
    assert_eq!(
        gpu.fallbacks(),
        0,
        "some GPU calls failed and ran on the CPU"
    );
}

#[test]
#[cfg_attr(
    not(feature = "emulate"),
    ignore = "needs a GPU (scripts/gpu-check.sh)"
)]
fn float_codecs_are_identical_on_every_dtype_and_size() {
    on_gpu(float_codecs);
}

#[test]
#[cfg_attr(
    not(feature = "emulate"),
    ignore = "needs a GPU (scripts/gpu-check.sh)"
)]
fn lossy_kernels_are_identical() {
    on_gpu(lossy_kernels);
}

#[test]
#[cfg_attr(
    not(feature = "emulate"),
    ignore = "needs a GPU (scripts/gpu-check.sh)"
)]
fn the_residual_quantizer_is_identical_in_every_mode() {
    on_gpu(residual_quantizer);
}

#[test]
#[cfg_attr(
    not(feature = "emulate"),
    ignore = "needs a GPU (scripts/gpu-check.sh)"
)]
fn a_generated_training_series_codes_identically() {
    on_gpu(training_series);
}

#[test]
#[cfg_attr(
    not(feature = "emulate"),
    ignore = "needs a GPU (scripts/gpu-check.sh)"
)]
fn tensor_ids_are_identical_on_the_device() {
    let gpu = gpu();
    let mut r = rng(11);
    // Prefixes and lengths around BLAKE3's 64-byte blocks and 1,024-byte chunks, and trees
    // of one, two, three and many chunks (odd nodes moving up a level).
    let prefixes = [0usize, 1, 63, 64, 100, 1023, 1024, 1500];
    let lengths = [
        0usize,
        1,
        63,
        64,
        65,
        960,
        1023,
        1024,
        1025,
        2048,
        3000,
        5 << 10,
    ];
    for &p in &prefixes {
        let prefix: Vec<u8> = (0..p).map(|_| r() as u8).collect();
        for &n in &lengths {
            let data: Vec<u8> = (0..n).map(|_| r() as u8).collect();
            let mut h = mdl_format::TensorHasher::new(&prefix);
            h.update(&data);
            assert_eq!(
                gpu.tensor_id(&prefix, &data, true),
                h.finalize(),
                "prefix {p} bytes, data {n} bytes"
            );
        }
    }
    // A real header, and a tensor large enough for a deep tree.
    let data = tensor(Dtype::F32, (1 << 18) + 5, 0, 3);
    let header = mdl_format::TensorHeader::new(Dtype::F32, vec![(1 << 18) + 5]);
    assert_eq!(
        gpu.tensor_id(&header.canonical(), &data, true),
        header.object_id(&data)
    );
    assert_eq!(
        gpu.fallbacks(),
        0,
        "some GPU calls failed and ran on the CPU"
    );
}

#[test]
#[cfg_attr(
    not(feature = "emulate"),
    ignore = "needs a GPU (scripts/gpu-check.sh)"
)]
fn a_batch_of_tensors_codes_as_each_alone() {
    let gpu = gpu();
    let mut tensors = Vec::new();
    for dtype in FLOATS {
        for (k, &n) in SIZES.iter().enumerate() {
            for shape in 0..4 {
                tensors.push((dtype, tensor(dtype, n, shape, (k as u64) << 8 | shape)));
            }
        }
    }
    // Kept on the device, as a commit's tensors from CUDA memory are: hashed there too.
    let _kept: Vec<_> = tensors.iter().map(|(_, b)| gpu.keep(b)).collect();
    let headers: Vec<_> = (tensors.iter())
        .map(|(d, b)| mdl_format::TensorHeader::new(*d, vec![(b.len() / d.size()) as u64]))
        .collect();
    let prefixes: Vec<Vec<u8>> = headers.iter().map(|h| h.canonical()).collect();
    let named: Vec<(&[u8], &[u8])> = (prefixes.iter().zip(&tensors))
        .map(|(p, (_, b))| (&p[..], &b[..]))
        .collect();
    let ids = gpu.content_ids(&named);
    for ((h, (_, b)), id) in headers.iter().zip(&tensors).zip(&ids) {
        assert_eq!(*id, h.object_id(b), "{h:?}");
    }
    let items: Vec<(Dtype, &[u8])> = tensors.iter().map(|(d, b)| (*d, &b[..])).collect();
    let counts = float::count_whole(&gpu, &items).unwrap();
    let alone = float::count_whole(&CpuEngine, &items).unwrap();
    let choices: Vec<float::Choice> = counts.iter().map(float::PlaneCount::choice).collect();
    for ((c, a), (d, b)) in choices.iter().zip(&alone).zip(&items) {
        let what = format!("{d:?}, {} bytes", b.len());
        assert_eq!(format!("{c:?}"), format!("{:?}", a.choice()), "{what}");
    }
    let jobs: Vec<(Dtype, &[u8], &float::Choice)> = (items.iter().zip(&choices))
        .map(|(&(d, b), c)| (d, b, c))
        .collect();
    let coded = float::encode_whole(&gpu, &jobs).unwrap();
    for ((d, b, c), payload) in jobs.iter().zip(&coded) {
        let mut single = Vec::new();
        float::encode(&CpuEngine, *d, b, None, c, &mut single).unwrap();
        assert!(
            payload.pieces().concat() == single,
            "{d:?}, {} bytes",
            b.len()
        );
    }
    assert_eq!(
        gpu.fallbacks(),
        0,
        "some GPU calls failed and ran on the CPU"
    );
}

/// The comparisons themselves, run with the CPU against itself wherever the tests run, so
/// that what the GPU run checks is known to hold for the reference.
#[test]
fn the_comparisons_hold_for_the_reference() {
    float_codecs(&CpuEngine);
    lossy_kernels(&CpuEngine);
    residual_quantizer(&CpuEngine);
    training_series(&CpuEngine);
}

fn float_codecs(gpu: &dyn Engine) {
    for dtype in FLOATS {
        for (k, &n) in SIZES.iter().enumerate() {
            for shape in 0..4 {
                let seed = (k as u64) << 8 | shape;
                let data = tensor(dtype, n, shape, seed);
                same_float_coding(gpu, dtype, &data, None);
                let next = step(dtype, &data, seed + 1);
                same_float_coding(gpu, dtype, &next, Some(&data));
            }
        }
    }
}

fn lossy_kernels(gpu: &dyn Engine) {
    for dtype in LOSSY {
        for (k, &n) in SIZES.iter().enumerate() {
            let w = tensor(dtype, n, 0, k as u64);
            let m = tensor(dtype, n, 0, k as u64 + 100);
            let v: Vec<u8> = tensor(dtype, n, 0, k as u64 + 200);
            let view = |b| FloatView { dtype, bytes: b };
            let moments = Moments {
                m: view(&m),
                v: view(&v),
            };
            for mv in [None, Some(moments)] {
                assert_eq!(
                    CpuEngine.key_stats(view(&w), mv),
                    gpu.key_stats(view(&w), mv),
                    "{dtype:?} n={n}: key stats differ"
                );
            }
            let mut r = rng(k as u64 + 7);
            let bins = 12usize;
            let lut = Lut {
                code: (0..1 << 16).map(|_| (r() % bins as u64) as u8).collect(),
                protect: (0..1 << 16).map(|_| r().is_multiple_of(50)).collect(),
            };
            let a = CpuEngine.assign(view(&w), &lut);
            assert_eq!(
                a,
                gpu.assign(view(&w), &lut),
                "{dtype:?} n={n}: assign differs"
            );
            let base: Vec<u8> = (0..n).map(|_| (r() % 9) as u8).collect();
            assert_eq!(
                CpuEngine.code_pairs(view(&w), &lut, bins, &base, 9),
                gpu.code_pairs(view(&w), &lut, bins, &base, 9),
            );
            let d = CpuEngine.group_delta(&base, &a.codes, bins as u8);
            assert_eq!(d, gpu.group_delta(&base, &a.codes, bins as u8));
            let mut back = vec![0u8; n];
            gpu.ungroup_delta(&base, &d, bins as u8, &mut back).unwrap();
            assert_eq!(back, a.codes);
            if n > 0 {
                assert!(gpu.ungroup_delta(&base, &d, 5, &mut back).is_err());
            }
            let recon = step(dtype, &w, 3);
            for mv in [None, Some(moments)] {
                let c = CpuEngine.error_stats(view(&w), view(&recon), mv);
                let g = gpu.error_stats(view(&w), view(&recon), mv);
                // Bit for bit: the same sums in the same order.
                assert_eq!(format!("{c:?}"), format!("{g:?}"), "{dtype:?} n={n}");
            }
        }
    }
}

fn training_series(gpu: &dyn Engine) {
    for dtype in [Dtype::BF16, Dtype::F32] {
        let n = 5 * (1 << 17) + 123;
        let mut prev = tensor(dtype, n, 0, 42);
        for t in 0..6u64 {
            let next = step(dtype, &prev, 1000 + t);
            {
                // Kept on the device the way a commit keeps them (the borrow ends with them).
                let _k = (gpu.keep(&next), gpu.keep(&prev));
                same_float_coding(gpu, dtype, &next, Some(&prev));
                let c = float::analyze(&CpuEngine, dtype, &prev, Some(&next)).unwrap();
                let g = float::analyze(gpu, dtype, &prev, Some(&next)).unwrap();
                assert_eq!(
                    format!("{c:?}"),
                    format!("{g:?}"),
                    "reverse analysis, step {t}"
                );
            }
            prev = next;
        }
    }
}

/// `data` with every element's sign cleared (a second moment, a positive reference).
fn positive(dtype: Dtype, data: &[u8]) -> Vec<u8> {
    let mut out = data.to_vec();
    for e in out.chunks_mut(dtype.size()) {
        *e.last_mut().unwrap() &= 0x7f;
    }
    out
}

/// `data` with one element in `every` replaced by random bits (NaN, infinities, outliers: the
/// elements a residual keeps exactly or codes wide).
fn with_outliers(dtype: Dtype, data: &[u8], every: usize, seed: u64) -> Vec<u8> {
    let size = dtype.size();
    let noise = tensor(dtype, data.len() / size, 1, seed);
    let mut out = data.to_vec();
    for (i, e) in out.chunks_mut(size).enumerate() {
        if i % every == 3 {
            e.copy_from_slice(&noise[i * size..(i + 1) * size]);
        }
    }
    out
}

/// A residual case: mode, values, reference, steps.
type Case<'a> = (Mode, &'a [u8], Option<&'a [u8]>, Vec<f64>);

fn residual_quantizer(gpu: &dyn Engine) {
    let sizes = [1usize, 7, 1000, (1 << 16) + 3, 3 * (1 << 17) + 4097];
    for dtype in LOSSY {
        for (k, &n) in sizes.iter().enumerate() {
            let seed = 500 + k as u64;
            let view = |b| FloatView { dtype, bytes: b };
            let reference = tensor(dtype, n, 0, seed);
            let moved = with_outliers(dtype, &step(dtype, &reference, seed + 1), 97, seed + 2);
            let m = tensor(dtype, n, 0, seed + 3);
            let v = positive(dtype, &tensor(dtype, n, 0, seed + 4));
            let moments = Moments {
                m: view(&m),
                v: view(&v),
            };
            let with_nan = with_outliers(dtype, &v, 13, seed + 7);
            for v in [&v, &with_nan] {
                let mv = Moments {
                    m: view(&m),
                    v: view(v),
                };
                assert_eq!(
                    CpuEngine.mean_second_moment(view(&reference), mv).to_bits(),
                    gpu.mean_second_moment(view(&reference), mv).to_bits(),
                    "{dtype:?} n={n}: mean second moment"
                );
            }
            // Weights against their previous version and against zeros, at steps around their
            // movement (fine ones code wide, finer ones go beyond the codes' range), and a
            // second moment (some zeros, some negative) in the log and scaled modes against a
            // positive reference.
            let sq = CpuEngine.residual_distance(view(&moved), Some(&reference));
            let rms = (sq / n as f64).sqrt().max(1e-30);
            let linear: Vec<f64> = [-40, -20, -8, 0, 3]
                .iter()
                .map(|&e| rms * 2f64.powf(e as f64 / 2.0))
                .chain([0.0, f64::NAN])
                .collect();
            let second = positive(dtype, &step(dtype, &v, seed + 5));
            let second = with_outliers(dtype, &second, 31, seed + 6);
            let cases: [Case<'_>; 4] = [
                (Mode::Linear, &moved, Some(&reference), linear.clone()),
                (Mode::Linear, &moved, None, linear),
                (
                    Mode::Log,
                    &second,
                    Some(&v),
                    vec![0.001, 0.05, 0.5, 3.0, -1.0],
                ),
                (Mode::Scaled, &moved, Some(&v), vec![1e-4, 0.01, 0.3, 0.0]),
            ];
            for (mode, values, against, steps) in cases {
                let what = format!("{dtype:?} n={n} {mode:?} reference={}", against.is_some());
                assert_eq!(
                    CpuEngine.residual_distance(view(values), against).to_bits(),
                    gpu.residual_distance(view(values), against).to_bits(),
                    "{what}: distance"
                );
                for (mv, every) in [(None, 1), (Some(moments), 1), (None, 3), (Some(moments), 8)] {
                    let c = CpuEngine.residual_measure(
                        view(values),
                        against,
                        mv,
                        mode,
                        None,
                        &steps,
                        every,
                    );
                    let g =
                        gpu.residual_measure(view(values), against, mv, mode, None, &steps, every);
                    // Bit for bit: the same counts, and the same sums in the same order.
                    assert_eq!(format!("{c:?}"), format!("{g:?}"), "{what} every={every}");
                }
                for &s in steps
                    .iter()
                    .filter(|&&s| mdl_codec::residual::valid_step(mode, s))
                {
                    let c = CpuEngine.residual_encode(view(values), against, mode, None, s);
                    let g = gpu.residual_encode(view(values), against, mode, None, s);
                    assert!(c.0 == g.0, "{what} step {s}: payloads differ");
                    assert!(c.1 == g.1, "{what} step {s}: reconstructions differ");
                    // Decoding gives the reconstruction back; a damaged payload fails alike.
                    let mut out = vec![0u8; values.len()];
                    gpu.residual_decode(dtype, &c.0, against, &mut out)
                        .unwrap_or_else(|e| panic!("{what} step {s}: decode failed: {e}"));
                    assert!(out == c.1, "{what} step {s}: decoded bytes differ");
                    // Codes by classes (recoded on the host) decode alike.
                    let rows = if n % 8 == 0 { 8 } else { 1 };
                    let classed = residual::context_code(dtype, c.0.clone(), (rows, n / rows));
                    gpu.residual_decode(dtype, &classed, against, &mut out)
                        .unwrap_or_else(|e| panic!("{what} step {s}: classed decode: {e}"));
                    assert!(out == c.1, "{what} step {s}: classed decoded bytes differ");
                    let cut = &c.0[..c.0.len() - 1];
                    let fault = |e: &dyn Engine| {
                        let mut out = vec![0u8; values.len()];
                        e.residual_decode(dtype, cut, against, &mut out)
                            .map_err(|e| e.to_string())
                    };
                    assert_eq!(
                        fault(&CpuEngine),
                        fault(gpu),
                        "{what} step {s}: cut payload"
                    );
                }
                // Steps by row and column (no kernel: the host's on both) decode alike.
                if mode == Mode::Linear && n % 8 == 0 {
                    let v = &moments.v;
                    let f = residual::Steps::fit(v.dtype, v.bytes, (8, n / 8), 0.1).unwrap();
                    let s = steps[2];
                    let c = CpuEngine.residual_encode(view(values), against, mode, Some(&f), s);
                    let g = gpu.residual_encode(view(values), against, mode, Some(&f), s);
                    assert!(c == g, "{what}: stepped payloads differ");
                    let mut out = vec![0u8; values.len()];
                    gpu.residual_decode(dtype, &c.0, against, &mut out)
                        .unwrap_or_else(|e| panic!("{what}: stepped decode failed: {e}"));
                    assert!(out == c.1, "{what}: stepped decoded bytes differ");
                }
            }
        }
    }
}
