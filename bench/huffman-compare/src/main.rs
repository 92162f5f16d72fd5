//! `cargo run --release -- FILE.safetensors`: codes the exponent bytes of every f32 tensor of a
//! checkpoint with mdl's chunked Huffman coder and with the `huffman-compress` crate, and
//! prints sizes and single-thread speeds.

use std::collections::HashMap;
use std::time::Instant;

use bit_vec::BitVec;
use huffman_compress::CodeBuilder;
use mdl_codec::huffman;
use mdl_format::safetensors;

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("usage: huffman-compare FILE.safetensors");
    let file = std::fs::read(&path).expect("read");
    let hl = safetensors::header_len(&file[..8], file.len() as u64).expect("header");
    let layout = safetensors::parse(&file[8..8 + hl as usize], file.len() as u64).expect("parse");
    let start = layout.data_start() as usize;
    let mut exps = Vec::new();
    for t in &layout.tensors {
        if t.header.dtype == mdl_format::Dtype::F32 {
            let d = &file[start + t.offset as usize..start + (t.offset + t.len) as usize];
            exps.extend(
                d.chunks_exact(4)
                    .map(|w| (u32::from_le_bytes(w.try_into().unwrap()) >> 23) as u8),
            );
        }
    }
    let n = exps.len();
    let hist = huffman::Histogram::of(&exps);
    println!(
        "{n} exponent symbols, entropy {:.4} bits/symbol",
        hist.entropy_bits() / n as f64
    );
    println!("| coder | bits/symbol | encode M sym/s | decode M sym/s |");
    println!("|---|---:|---:|---:|");

    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let (ours, enc_s, dec_s) = pool.install(|| {
        let t = Instant::now();
        let mut enc = Vec::new();
        huffman::encode_stream(&exps, &mut enc);
        let enc_s = t.elapsed().as_secs_f64();
        let mut back = vec![0u8; n];
        let t = Instant::now();
        huffman::decode_stream(&enc, &mut back).unwrap();
        let dec_s = t.elapsed().as_secs_f64();
        assert_eq!(back, exps);
        (enc.len(), enc_s, dec_s)
    });
    println!(
        "| mdl (chunked, 12-bit table, 1 thread) | {:.4} | {:.0} | {:.0} |",
        ours as f64 * 8.0 / n as f64,
        n as f64 / enc_s / 1e6,
        n as f64 / dec_s / 1e6
    );

    let t = Instant::now();
    let weights: HashMap<u8, u64> = (0..=255u8)
        .filter(|&s| hist.0[s as usize] > 0)
        .map(|s| (s, hist.0[s as usize]))
        .collect();
    let (book, tree) = CodeBuilder::from_iter(weights).finish();
    let mut bits = BitVec::new();
    for s in &exps {
        book.encode(&mut bits, s).unwrap();
    }
    let enc_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let back: Vec<u8> = tree.decoder(&bits, n).collect();
    let dec_s = t.elapsed().as_secs_f64();
    assert_eq!(back, exps);
    println!(
        "| huffman-compress 0.7.0 (bit-by-bit tree walk) | {:.4} | {:.0} | {:.0} |",
        bits.len() as f64 / n as f64,
        n as f64 / enc_s / 1e6,
        n as f64 / dec_s / 1e6
    );
}
