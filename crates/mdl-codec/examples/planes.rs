//! Explores the float codecs on safetensors files: per-file sizes against the order-0 bound and
//! codec throughput, single process, data in memory.
//!
//! `cargo run --release -p mdl-codec --example planes -- A.safetensors [B.safetensors ...]`
//! (each file after the first is also XORed with the previous one, tensor by tensor).

use std::time::Instant;

use mdl_codec::engine::CpuEngine;
use mdl_codec::float;
use mdl_format::safetensors;

fn main() {
    let paths: Vec<String> = std::env::args().skip(1).collect();
    let mut prev: Option<(Vec<u8>, usize)> = None;
    let (mut enc_s, mut dec_s, mut bytes) = (0.0, 0.0, 0u64);
    // Per dtype and plane: (elements, bytes as chosen by float-split).
    let mut planes: std::collections::BTreeMap<(String, usize), (u64, u64)> = Default::default();
    for p in &paths {
        let file = std::fs::read(p).expect("read");
        let hl = safetensors::header_len(&file[..8], file.len() as u64).unwrap();
        let layout = safetensors::parse(&file[8..8 + hl as usize], file.len() as u64).unwrap();
        let start = layout.data_start() as usize;
        let (mut split, mut best, mut bound, mut bound_x) = (0u64, 0u64, 0f64, 0f64);
        for t in &layout.tensors {
            let data = &file[start + t.offset as usize..start + (t.offset + t.len) as usize];
            if !float::supports(t.header.dtype) || data.len() < 4096 {
                split += data.len() as u64;
                best += data.len() as u64;
                bound += data.len() as f64;
                bound_x += data.len() as f64;
                continue;
            }
            let t0 = Instant::now();
            let a = float::analyze(&CpuEngine, t.header.dtype, data, None).unwrap();
            let mut out = Vec::new();
            float::encode(&CpuEngine, t.header.dtype, data, None, &a.plain, &mut out).unwrap();
            enc_s += t0.elapsed().as_secs_f64();
            let t0 = Instant::now();
            let mut back = vec![0u8; data.len()];
            float::decode(&CpuEngine, t.header.dtype, &out, None, &mut back).unwrap();
            dec_s += t0.elapsed().as_secs_f64();
            assert_eq!(back, data);
            bytes += data.len() as u64;
            split += out.len() as u64;
            // Order-0 estimate: exponent entropy, everything else raw.
            let w = t.header.dtype.size() as f64;
            let n = data.len() as f64 / w;
            for (p, &b) in a.plain.plane_bytes.iter().enumerate() {
                let e = planes
                    .entry((t.header.dtype.name().to_string(), p))
                    .or_default();
                e.0 += (data.len() / t.header.dtype.size()) as u64;
                e.1 += b;
            }
            let own = a.plain.plane_entropy_bits[0] / 8.0 + n * (w - 1.0);
            bound += own;
            let mut b = out.len() as u64;
            let mut bx = own;
            if let Some((prev, pstart)) = &prev {
                let pd = &prev[pstart + t.offset as usize..pstart + (t.offset + t.len) as usize];
                let ax = float::analyze(&CpuEngine, t.header.dtype, data, Some(pd)).unwrap();
                if let Some(d) = &ax.delta {
                    let mut dout = Vec::new();
                    float::encode(&CpuEngine, t.header.dtype, data, Some(pd), d, &mut dout)
                        .unwrap();
                    b = b.min(dout.len() as u64);
                    if std::env::var("PLANES_DEBUG").is_ok() {
                        eprintln!(
                            "{} mask {:04b} bytes {:?} entropy {:?}",
                            t.name,
                            d.xor_mask,
                            d.plane_bytes,
                            d.plane_entropy_bits
                                .iter()
                                .map(|e| (e / 8.0) as u64)
                                .collect::<Vec<_>>()
                        );
                    }
                    let xe: f64 = d.plane_entropy_bits.iter().sum::<f64>() / 8.0;
                    bx = bx.min(xe);
                }
            }
            best += b;
            bound_x += bx;
        }
        let raw = file.len() as f64;
        println!(
            "{}: split {:.4} (bound {:.4})  best-with-xor {:.4} (bound {:.4})",
            p.rsplit('/').next().unwrap(),
            raw / split as f64,
            raw / bound,
            raw / best as f64,
            raw / bound_x
        );
        prev = Some((file, start));
    }
    for ((dtype, p), (n, b)) in &planes {
        println!(
            "{dtype} plane {p}: {:.3} bits/element",
            *b as f64 * 8.0 / *n as f64
        );
    }
    println!(
        "float tensors: encode {:.0} MB/s, decode {:.0} MB/s ({} threads)",
        bytes as f64 / enc_s / 1e6,
        bytes as f64 / dec_s / 1e6,
        rayon::current_num_threads()
    );
}
