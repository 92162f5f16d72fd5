//! Round trips of the float codecs (every dtype, special values, every bit), their counts
//! and choices, and refusals of damaged payloads.

use super::*;
use crate::engine::CpuEngine;
use proptest::prelude::*;

const FLOATS: [Dtype; 4] = [Dtype::BF16, Dtype::F16, Dtype::F32, Dtype::F64];

/// Round-trips through float-split and, with a base, through every XOR mask; returns the
/// smallest payload size.
fn round_trip(dtype: Dtype, data: &[u8], base: Option<&[u8]>) -> usize {
    let a = analyze(&CpuEngine, dtype, data, base).unwrap();
    let planes = layout(dtype).unwrap().planes;
    let mut choices = vec![a.plain.clone()];
    choices.extend(a.delta.clone());
    if base.is_some() {
        // Every mask, not only the chosen one, must round-trip.
        let mut forced = a.plain.clone();
        forced.xor_mask = (1u16 << planes).wrapping_sub(1) as u8 & 0b1010_1011;
        if forced.xor_mask != 0 {
            // The plans were made for plain planes; force Stored so any bytes fit.
            forced.plans = vec![Plan::Stored; planes];
            choices.push(forced);
        }
    }
    let mut best = usize::MAX;
    if let Some(b) = base {
        let sub = analyze_sub(&CpuEngine, dtype, data, b).unwrap();
        let mut payload = Vec::new();
        encode(&CpuEngine, dtype, data, base, &sub, &mut payload).unwrap();
        assert!(payload.len() as u64 <= sub.size);
        let mut out = vec![0u8; data.len()];
        decode_sub(&CpuEngine, dtype, &payload, b, &mut out).unwrap();
        assert_eq!(out, data, "{dtype:?} sub-delta");
        // A sub-delta payload is not a float-split one, and the other way round.
        assert!(
            decode(&CpuEngine, dtype, &payload, None, &mut out).is_err()
                || data.is_empty()
                || out != data
        );
        best = payload.len();
    }
    for ch in &choices {
        let mut payload = Vec::new();
        encode(&CpuEngine, dtype, data, base, ch, &mut payload).unwrap();
        if ch.plans.iter().all(|p| *p != Plan::Stored) || ch.xor_mask == 0 {
            assert!(
                payload.len() as u64 <= ch.size,
                "{} > {}",
                payload.len(),
                ch.size
            );
        }
        let mut out = vec![0u8; data.len()];
        let b = (ch.xor_mask != 0).then_some(base).flatten();
        decode(&CpuEngine, dtype, &payload, b, &mut out).unwrap();
        assert_eq!(out, data, "{dtype:?} mask {}", ch.xor_mask);
        best = best.min(payload.len());
    }
    best
}

fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

fn special_values(dtype: Dtype) -> Vec<u8> {
    let width = dtype.size();
    let mut out = Vec::new();
    let mut push = |bits: u64| out.extend_from_slice(&bits.to_le_bytes()[..width]);
    let (exp_bits, man_bits) = match dtype {
        Dtype::BF16 => (8, 7),
        Dtype::F16 => (5, 10),
        Dtype::F32 => (8, 23),
        _ => (11, 52),
    };
    let sign = 1u64 << (exp_bits + man_bits);
    let exp_all = ((1u64 << exp_bits) - 1) << man_bits;
    for s in [0, sign] {
        push(s); // ±0
        push(s | 1); // smallest subnormal
        push(s | ((1 << man_bits) - 1)); // largest subnormal
        push(s | exp_all); // ±Inf
        push(s | exp_all | 1); // signalling NaN, smallest payload
        push(s | exp_all | ((1 << man_bits) - 1)); // NaN, all payload bits
        push(s | exp_all | (1 << (man_bits - 1))); // quiet NaN
        push(s | (exp_all - (1 << man_bits)) | ((1 << man_bits) - 1)); // largest finite
    }
    out
}

#[test]
fn every_bit_pattern_of_16_bit_types() {
    let data: Vec<u8> = (0..=u16::MAX).flat_map(|v| v.to_le_bytes()).collect();
    for dtype in [Dtype::BF16, Dtype::F16] {
        round_trip(dtype, &data, None);
        let base: Vec<u8> = (0..=u16::MAX).rev().flat_map(|v| v.to_le_bytes()).collect();
        round_trip(dtype, &data, Some(&base));
    }
}

#[test]
fn special_values_and_every_plane_bit() {
    for dtype in FLOATS {
        round_trip(dtype, &special_values(dtype), None);
        // One bit set at every position, so each lands in some plane and comes back.
        let w = dtype.size();
        let data: Vec<u8> = (0..w * 8)
            .flat_map(|b| (1u64 << b).to_le_bytes()[..w].to_vec())
            .collect();
        round_trip(dtype, &data, None);
        round_trip(dtype, &[], None);
    }
}

#[test]
fn chunked_and_single_chunk_paths() {
    let mut r = rng(1);
    for dtype in FLOATS {
        for elements in [1, 1000, CHUNK, CHUNK + 1, 3 * CHUNK + 77] {
            let data: Vec<u8> = (0..elements)
                .flat_map(|_| {
                    let v = (r() % 2000) as f64 / 1000.0 - 1.0;
                    let bits = match dtype {
                        Dtype::F64 => v.to_bits(),
                        Dtype::F32 => (v as f32).to_bits() as u64,
                        _ => ((v as f32).to_bits() >> 16) as u64,
                    };
                    bits.to_le_bytes()[..dtype.size()].to_vec()
                })
                .collect();
            let size = round_trip(dtype, &data, None);
            assert!(elements < 1000 || size < data.len(), "{dtype:?} compresses");
        }
    }
}

#[test]
fn sub_delta_keeps_carries_small() {
    // Values that cross a binade boundary by one ulp: XOR sees 24 changed bits, the
    // difference is 1.
    let mut r = rng(5);
    let base: Vec<u8> = (0..50_000)
        .flat_map(|_| (0x3f7f_0000u32 + (r() % 0x1_0000) as u32).to_le_bytes())
        .collect();
    let data: Vec<u8> = base
        .chunks(4)
        .flat_map(|c| (u32::from_le_bytes(c.try_into().unwrap()) + (r() % 64) as u32).to_le_bytes())
        .collect();
    let a = analyze(&CpuEngine, Dtype::F32, &data, Some(&base)).unwrap();
    let sub = analyze_sub(&CpuEngine, Dtype::F32, &data, &base).unwrap();
    let xor =
        count_and_choose(&CpuEngine, Dtype::F32, Count::Masked(0b1111), &data, &base).unwrap();
    assert!(sub.size * 10 < xor.size * 8, "{} vs {}", sub.size, xor.size);
    assert_eq!(a.best_delta().unwrap().transform, Transform::Sub);
    round_trip(Dtype::F32, &data, Some(&base));
    // Wrapping differences (sign changes, extremes) come back exactly too.
    let extremes: Vec<u8> = [0u32, u32::MAX, 0x8000_0000, 0x7fff_ffff, 1]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let flipped: Vec<u8> = extremes.iter().rev().copied().collect();
    round_trip(Dtype::F32, &extremes, Some(&flipped));
}

/// The first window's sample is counted once, not twice: every plane counted in full has
/// exactly the symbol and flag counts of the whole plane, chunk by chunk, whether the
/// tensor comes in one window or several, split or not.
#[test]
fn counts_past_the_sample_are_the_whole_planes_counts() {
    let mut r = rng(3);
    let n = 3 * CHUNK + 5;
    // Mostly zeros (sparse planes that want their flags counted), some small values.
    let data: Vec<u8> = (0..n)
        .flat_map(|_| {
            match r() % 10 {
                0..=6 => 0f32,
                _ => (r() % 1000) as f32 / 512.0,
            }
            .to_le_bytes()
        })
        .collect();
    let spec = PlaneSpec::planes(Dtype::F32, 0);
    let mut planes = Vec::new();
    crate::planes::cpu_split_planes(spec, &data, None, &mut planes);
    let whole: Vec<(Histogram, Histogram)> = planes
        .iter()
        .map(|p| {
            let (mut h, mut f) = (Histogram::default(), Histogram::default());
            for chunk in p.chunks(CHUNK) {
                h.add(&Histogram::of(chunk));
                f.add(&crate::huffman::flag_histogram(chunk));
            }
            (h, f)
        })
        .collect();
    let check = |c: &PlaneCount| {
        assert!(c.want.iter().any(|w| w.1), "a plane wants its flags");
        for (p, &(symbols, flags)) in c.want.iter().enumerate() {
            if symbols {
                assert_eq!(c.totals[p].0 .0, whole[p].0 .0, "plane {p} symbols");
            }
            if flags {
                assert_eq!(c.totals[p].1 .0, whole[p].1 .0, "plane {p} flags");
            }
        }
    };
    let mut one = PlaneCount::new(Dtype::F32, Count::Plain).unwrap();
    one.add(&CpuEngine, &data, None).unwrap();
    check(&one);
    let mut windows = PlaneCount::new(Dtype::F32, Count::Plain).unwrap();
    for w in data.chunks(CHUNK * 4) {
        windows.add(&CpuEngine, w, None).unwrap();
    }
    check(&windows);
    let mut split = PlaneCount::new(Dtype::F32, Count::Plain).unwrap();
    split
        .add_splitting(&CpuEngine, &data, None, &mut Vec::new())
        .unwrap();
    check(&split);
}

/// The delta the first elements choose is the one the whole tensor's counts choose when
/// the tensor moves alike throughout: sub-delta for values that move by a few ulps,
/// xor-delta with exactly the planes that gain when only the high bits change; a tensor
/// no bigger than the sample is counted in full, and one no delta helps gets none.
#[test]
fn the_sample_picks_the_delta_the_whole_count_picks() {
    let mut r = rng(9);
    let n = 4 * SAMPLE;
    let words = |f: &mut dyn FnMut(u32) -> u32, base: &[u32]| -> Vec<u8> {
        base.iter().flat_map(|&w| f(w).to_le_bytes()).collect()
    };
    let base: Vec<u32> = (0..n)
        .map(|_| 0x3f7f_0000 + (r() % 0x1_0000) as u32)
        .collect();
    let base_bytes = words(&mut |w| w, &base);
    let nudged = words(&mut |w| w + (r() % 64) as u32, &base);
    // The sign and exponent flip together (a plane that gains XORed); the low
    // mantissa is redrawn (noise either way).
    let flipped = words(
        &mut |w| (w ^ 0x8000_0000) & !0xff | (r() & 0xff) as u32,
        &base,
    );
    let noise: Vec<u8> = (0..n * 4).map(|_| r() as u8).collect();
    let to = |data: &[u8]| delta_to_count(&CpuEngine, Dtype::F32, data, &base_bytes).unwrap();
    let whole = |data: &[u8]| {
        analyze(&CpuEngine, Dtype::F32, data, Some(&base_bytes))
            .unwrap()
            .best_delta()
            .map(|c| (c.transform, c.xor_mask))
    };
    assert_eq!(to(&nudged), ToCount::Delta(Count::Sub));
    assert_eq!(whole(&nudged), Some((Transform::Sub, 0)));
    let ToCount::Delta(Count::Masked(mask)) = to(&flipped) else {
        panic!("{:?}", to(&flipped));
    };
    assert_eq!(whole(&flipped), Some((Transform::Planes, mask)));
    assert_eq!(to(&noise), ToCount::Nothing);
    // Judged from the sample alone (what a caller decodes of two stored versions), the same.
    let bytes = delta_sample_bytes(Dtype::F32, nudged.len()).unwrap();
    assert_eq!(bytes, SAMPLE * 4);
    for data in [&nudged, &flipped, &noise] {
        let on_sample =
            delta_to_count_on_sample(&CpuEngine, Dtype::F32, &data[..bytes], &base_bytes[..bytes]);
        assert_eq!(on_sample.unwrap(), to(data));
    }
    assert!(delta_to_count_on_sample(&CpuEngine, Dtype::F32, &nudged, &base_bytes).is_err());
    assert_eq!(delta_sample_bytes(Dtype::F32, bytes), None);
    let small = SAMPLE * 4;
    let few = delta_to_count(
        &CpuEngine,
        Dtype::F32,
        &nudged[..small],
        &base_bytes[..small],
    );
    assert_eq!(few.unwrap(), ToCount::Everything);
}

#[test]
fn xor_with_itself_is_tiny_and_length_mismatch_is_an_error() {
    let data: Vec<u8> = (0..100_000u32)
        .flat_map(|i| ((i as f32).sin()).to_le_bytes())
        .collect();
    assert!(round_trip(Dtype::F32, &data, Some(&data)) < 100);
    let a = analyze(&CpuEngine, Dtype::F32, &data, Some(&data)).unwrap();
    assert_eq!(a.delta.unwrap().xor_mask, 0b1111);
    assert!(analyze(&CpuEngine, Dtype::F32, &data, Some(&data[4..])).is_err());
    assert!(analyze(&CpuEngine, Dtype::F32, &data[1..], None).is_err());
    assert!(analyze(&CpuEngine, Dtype::I32, &data, None).is_err());
}

proptest! {
    #[test]
    fn random_bits_round_trip(words in proptest::collection::vec(any::<u64>(), 0..3000), d in 0usize..4, with_base in any::<bool>()) {
        let dtype = FLOATS[d];
        let data: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()[..dtype.size()].to_vec()).collect();
        let base: Vec<u8> = data.iter().rev().copied().collect();
        round_trip(dtype, &data, with_base.then_some(&base[..]));
    }

    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400), d in 0usize..4, n in 0usize..3000) {
        let dtype = FLOATS[d];
        let mut out = vec![0u8; n * dtype.size()];
        let _ = decode(&CpuEngine, dtype, &bytes, None, &mut out);
    }
}

/// Tensors of every float dtype, smaller and larger than the sample, noisy, smooth and mostly
/// zero, with a partial last chunk.
fn batch_tensors() -> Vec<(Dtype, Vec<u8>)> {
    let mut rng = 7u64;
    let mut next = move || {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (rng >> 33) as u32
    };
    let mut out = Vec::new();
    for (k, dtype) in FLOATS.into_iter().enumerate() {
        let w = dtype.size();
        for n in [1usize, 1000, SAMPLE, SAMPLE + 1, 3 * CHUNK + 77] {
            let mut bytes = vec![0u8; n * w];
            for (i, e) in bytes.chunks_mut(w).enumerate() {
                let v = next();
                // Mostly zero for some, small smooth values for others, noise for the rest.
                let x: u64 = match (k + i) % 3 {
                    0 if n > 1000 => 0,
                    1 => (0x3f80_0000u64 + (v as u64 % 4096)) << (8 * w.saturating_sub(4)),
                    _ => (v as u64) << 32 | next() as u64,
                };
                e.copy_from_slice(&x.to_le_bytes()[..w]);
            }
            out.push((dtype, bytes));
        }
    }
    out
}

/// A batch's counts and payloads ([`count_whole`], [`encode_whole`]) are each tensor's own
/// ([`PlaneCount::add`], [`encode_pieces`]), byte for byte.
#[test]
fn a_batch_counts_and_codes_as_each_tensor_alone() {
    let tensors = batch_tensors();
    let items: Vec<(Dtype, &[u8])> = tensors.iter().map(|(d, b)| (*d, &b[..])).collect();
    let counts = count_whole(&CpuEngine, &items).unwrap();
    let choices: Vec<Choice> = counts.iter().map(PlaneCount::choice).collect();
    let jobs: Vec<(Dtype, &[u8], &Choice)> = (items.iter().zip(&choices))
        .map(|(&(d, b), c)| (d, b, c))
        .collect();
    let payloads = encode_whole(&CpuEngine, &jobs).unwrap();
    for ((&(dtype, data), choice), payload) in items.iter().zip(&choices).zip(&payloads) {
        let mut alone = PlaneCount::new(dtype, Count::Plain).unwrap();
        alone.add(&CpuEngine, data, None).unwrap();
        let what = format!("{dtype:?}, {} bytes", data.len());
        assert_eq!(
            format!("{:?}", alone.choice()),
            format!("{choice:?}"),
            "{what}"
        );
        let mut single = Vec::new();
        encode(&CpuEngine, dtype, data, None, choice, &mut single).unwrap();
        assert_eq!(payload.pieces().concat(), single, "{what}");
        let mut out = vec![0u8; data.len()];
        decode(&CpuEngine, dtype, &single, None, &mut out).unwrap();
        assert_eq!(out, data, "{what}");
    }
}

/// A base of slowly varying floats and a new version with `every`-th element moved by a few
/// units in the last place (either way), special values among the changes.
fn sparse_step(dtype: Dtype, n: usize, every: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let w = dtype.size();
    let mut next = rng(seed);
    let mut base = Vec::with_capacity(n * w);
    for i in 0..n {
        let v = ((i as f64) * 0.001).sin() * 0.05 + (next() % 1000) as f64 * 1e-6;
        let bits = match dtype {
            Dtype::BF16 => ((v as f32).to_bits() >> 16) as u64,
            Dtype::F16 => half_bits(v as f32),
            Dtype::F32 => (v as f32).to_bits() as u64,
            _ => v.to_bits(),
        };
        base.extend_from_slice(&bits.to_le_bytes()[..w]);
    }
    let mut data = base.clone();
    let specials = special_values(dtype);
    let picked: Vec<usize> = (0..n)
        .filter(|i| (next() as usize).is_multiple_of(every) || i % 997 == 3)
        .collect();
    for (k, i) in picked.into_iter().enumerate() {
        let el = &mut data[i * w..(i + 1) * w];
        if k % 50 == 7 {
            let s = (k / 50) % (specials.len() / w);
            el.copy_from_slice(&specials[s * w..(s + 1) * w]);
            continue;
        }
        let mut b = [0u8; 8];
        b[..w].copy_from_slice(el);
        let step = (next() % 4 + 1) as i64 * if next().is_multiple_of(2) { 1 } else { -1 };
        let moved = (u64::from_le_bytes(b) as i64).wrapping_add(step) as u64;
        el.copy_from_slice(&moved.to_le_bytes()[..w]);
    }
    (data, base)
}

fn half_bits(v: f32) -> u64 {
    // Near enough for test data: the top bits of the f32 exponent and mantissa.
    let b = v.to_bits();
    let (s, e, m) = (
        b >> 31,
        ((b >> 23) & 0xff) as i32 - 127 + 15,
        (b >> 13) & 0x3ff,
    );
    (if e <= 0 {
        s << 15
    } else {
        s << 15 | (e.min(30) as u32) << 10 | m
    }) as u64
}

#[test]
fn masked_deltas_round_trip_and_beat_plane_deltas_where_little_changed() {
    for dtype in FLOATS {
        for (n, every) in [
            (0, 100),
            (1, 1),
            (7, 3),
            (100_003, 100),
            (300_000, 20),
            (CHUNK * 2 + 5, 1000),
        ] {
            let (data, base) = sparse_step(dtype, n, every, n as u64 + every as u64);
            let Some(m) = encode_masked(dtype, &data, &base).unwrap() else {
                assert!(
                    n < 8,
                    "{dtype:?} {n}: a quarter at most changed, so a mask is made"
                );
                continue;
            };
            let mut out = vec![0u8; data.len()];
            let spec = match m.transform {
                Transform::Sub => decode_sub(&CpuEngine, dtype, &m.payload, &base, &mut out),
                Transform::Planes => decode(&CpuEngine, dtype, &m.payload, Some(&base), &mut out),
            };
            spec.unwrap();
            assert_eq!(out, data, "{dtype:?} n {n} every {every}");
            // Window by window, as a store reads a large record: the same bytes.
            let spec = match m.transform {
                Transform::Sub => PlaneSpec::sub(dtype),
                Transform::Planes => PlaneSpec::planes(dtype, 0),
            };
            let mut windows = MaskedDelta::open(spec, data.len() as u64, &m.payload).unwrap();
            let step = 8 * 1000 * dtype.size();
            let mut out = vec![0u8; data.len()];
            for (o, b) in out.chunks_mut(step).zip(base.chunks(step)) {
                windows.apply_next(b, o).unwrap();
            }
            windows.finish().unwrap();
            assert_eq!(out, data, "{dtype:?} n {n} windows");
            // The whole tensor patched where it lies, only its changed elements written.
            let mut live = base.clone();
            windows.patch(&mut live).unwrap();
            assert_eq!(live, data, "{dtype:?} n {n} patched in place");
            assert!(windows.patch(&mut [0u8; 3]).is_err(), "a wrong length");
            // Turned round: the same mask codes the base against the tensor.
            let back = crate::float::invert_masked(spec, data.len() as u64, &m.payload).unwrap();
            let mut other = MaskedDelta::open(spec, data.len() as u64, &back).unwrap();
            let mut was = vec![0u8; data.len()];
            other.apply_next(&data, &mut was).unwrap();
            assert_eq!(was, base, "{dtype:?} n {n} inverted");
            // Undone exactly: the whole tensor, or its first windows patched.
            windows.unpatch(&mut live).unwrap();
            assert_eq!(live, base, "{dtype:?} n {n} unpatched");
            let head =
                (8 * 1000 * dtype.size()).min(data.len() / (8 * dtype.size()) * 8 * dtype.size());
            windows.patch(&mut live).unwrap();
            windows.unpatch(&mut live[..head]).unwrap();
            assert_eq!(live[..head], base[..head], "{dtype:?} n {n} head unpatched");
            assert_eq!(
                live[head..],
                data[head..],
                "{dtype:?} n {n} tail still patched"
            );
            if n >= 100_000 && every == 100 {
                let a = analyze(&CpuEngine, dtype, &data, Some(&base)).unwrap();
                let planes = a.best_delta().unwrap().size;
                assert!(
                    (m.payload.len() as u64) * 2 < planes,
                    "{dtype:?}: masked {} against plane deltas {planes}",
                    m.payload.len()
                );
            }
        }
    }
}

#[test]
fn masked_deltas_are_not_made_where_much_changed() {
    let (data, base) = sparse_step(Dtype::F32, 10_000, 2, 1);
    assert!(encode_masked(Dtype::F32, &data, &base).unwrap().is_none());
}

#[test]
fn damaged_masked_payloads_are_refused_or_differ_never_panic() {
    let dtype = Dtype::BF16;
    let (data, base) = sparse_step(dtype, 50_000, 100, 9);
    let m = encode_masked(dtype, &data, &base).unwrap().unwrap();
    let run = |p: &[u8]| {
        let mut out = vec![0u8; data.len()];
        let r = match m.transform {
            Transform::Sub => decode_sub(&CpuEngine, dtype, p, &base, &mut out),
            Transform::Planes => decode(&CpuEngine, dtype, p, Some(&base), &mut out),
        };
        r.is_err() || out != data
    };
    for cut in [1, 2, 5, m.payload.len() / 2, m.payload.len() - 1] {
        assert!(run(&m.payload[..cut]), "cut at {cut} decoded to the tensor");
    }
    let mut next = rng(3);
    for _ in 0..300 {
        let mut p = m.payload.clone();
        let at = next() as usize % p.len();
        p[at] ^= 1 << (next() % 8);
        // Never a panic; a flip the decoder cannot see (a lane's padding bit) may still give
        // the tensor, which the record's content id is there to catch.
        run(&p);
    }
    // Without a base, or with a window out of step, a clear error.
    let mut out = vec![0u8; data.len()];
    assert!(decode(&CpuEngine, dtype, &m.payload, None, &mut out).is_err());
    let spec = match m.transform {
        Transform::Sub => PlaneSpec::sub(dtype),
        Transform::Planes => PlaneSpec::planes(dtype, 0),
    };
    let mut d = MaskedDelta::open(spec, data.len() as u64, &m.payload).unwrap();
    assert!(d.apply_next(&base[..6], &mut out[..6]).is_ok());
    assert!(d.apply_next(&base[6..20], &mut out[6..20]).is_err());
    assert!(d.finish().is_err());
}

/// The comparisons of a masked delta's scan (vector and word-at-a-time) say of each element
/// what comparing it alone says: every two-byte pattern of difference in every lane, and
/// random groups of two-, four- and eight-byte elements.
#[test]
fn a_scan_flags_exactly_the_elements_that_differ() {
    fn reference(w: usize, d: &[u8], b: &[u8]) -> u64 {
        (0..64).fold(0, |m, e| {
            m | (u64::from(d[e * w..(e + 1) * w] != b[e * w..(e + 1) * w]) << e)
        })
    }
    let base: Vec<u8> = (0..64 * 8).map(|i| (i * 37 % 251) as u8).collect();
    for pattern in 0..=u16::MAX {
        let lane = pattern as usize % 64;
        let mut d = base[..128].to_vec();
        for (k, x) in pattern.to_le_bytes().iter().enumerate() {
            d[2 * lane + k] ^= x;
        }
        let expected = reference(2, &d, &base[..128]);
        assert_eq!(
            scan::differ::<2>(&d, &base[..128]),
            expected,
            "{pattern:#06x} in {lane}"
        );
        assert_eq!(
            scan::differ_words::<2>(&d, &base[..128]),
            expected,
            "{pattern:#06x}"
        );
    }
    let mut seed = 7u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..2000 {
        for w in [2usize, 4, 8] {
            let b = &base[..64 * w];
            let mut d = b.to_vec();
            for e in 0..64 {
                if next() % 3 == 0 {
                    let bit = next() as usize % (8 * w);
                    d[e * w + bit / 8] ^= 1 << (bit % 8);
                }
            }
            let got = match w {
                2 => [scan::differ::<2>(&d, b), scan::differ_words::<2>(&d, b)],
                4 => [scan::differ::<4>(&d, b), scan::differ_words::<4>(&d, b)],
                _ => [scan::differ::<8>(&d, b), scan::differ_words::<8>(&d, b)],
            };
            assert_eq!(got, [reference(w, &d, b); 2], "width {w}");
        }
    }
}
