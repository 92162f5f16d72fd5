//! Masked deltas on two safetensors files (B coded against A, tensor by tensor): per tensor,
//! the elements changed, the mask's order-0 bound, and the payload's mask and value bytes.
//!
//! `cargo run --release -p mdl-codec --example masked -- A.safetensors B.safetensors`

use mdl_codec::engine::CpuEngine;
use mdl_codec::float;
use mdl_format::safetensors;

fn tensors(path: &str) -> Vec<(String, mdl_format::Dtype, Vec<u8>)> {
    let file = std::fs::read(path).expect("read");
    let hl = safetensors::header_len(&file[..8], file.len() as u64).unwrap();
    let layout = safetensors::parse(&file[8..8 + hl as usize], file.len() as u64).unwrap();
    let start = layout.data_start() as usize;
    (layout.tensors.iter())
        .map(|t| {
            let at = start + t.offset as usize;
            let data = file[at..at + t.len as usize].to_vec();
            (t.name.clone(), t.header.dtype, data)
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (a, b) = (tensors(&args[0]), tensors(&args[1]));
    let (mut total, mut bound_total, mut changed_total) = (0usize, 0f64, 0usize);
    println!("| tensor | elements | changed | mask bound B | masked B | plane delta B |");
    println!("|---|---:|---:|---:|---:|---:|");
    for ((name, dtype, new), (_, _, old)) in b.iter().zip(&a) {
        if new == old || !float::supports(*dtype) {
            continue;
        }
        let w = dtype.size();
        let n = new.len() / w;
        let changed = new
            .chunks(w)
            .zip(old.chunks(w))
            .filter(|(x, y)| x != y)
            .count();
        let p = changed as f64 / n as f64;
        let h = if p > 0.0 && p < 1.0 {
            -(p * p.log2() + (1.0 - p) * (1.0 - p).log2())
        } else {
            0.0
        };
        let bound = h * n as f64 / 8.0;
        let masked = float::encode_masked(*dtype, new, old).unwrap();
        let m = masked.as_ref().map_or(0, |m| m.payload.len());
        let a = float::analyze(&CpuEngine, *dtype, new, Some(old)).unwrap();
        let planes = a.best_delta().map_or(a.plain.size, |c| c.size);
        println!("| {name} | {n} | {changed} | {bound:.0} | {m} | {planes} |");
        total += m.min(planes as usize);
        bound_total += bound;
        changed_total += changed;
    }
    println!(
        "total: {changed_total} changed, mask bound {bound_total:.0} B, smallest {total} B, TRL patches {} B",
        changed_total * 6
    );
}
