//! Kernel throughput against the device's copy bandwidth, measured in the same run.
//!
//! `cargo run --release -p mdl-gpu --example kernel-bench -- [MIB] [RUNS]` (default 1024 MiB of
//! f32 weights, 20 runs). Prints a table; the byte-moving kernels' target is at least half the
//! copy's GB/s.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mib: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(1024);
    let runs: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(20);
    let (engine, line) = match mdl_gpu::probe() {
        Ok(e) => e,
        Err(why) => {
            eprintln!("no GPU engine: {why}");
            std::process::exit(2);
        }
    };
    println!("device: {line}");
    // Trained-weight-like f32 values: a smooth pattern with small noise.
    let n = mib << 18;
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..n)
        .flat_map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let x = ((i as f32) * 1e-4).sin() * 0.02 + (s >> 40) as f32 * 1e-10;
            x.to_le_bytes()
        })
        .collect();
    let rows = engine.kernel_bench(&data, runs).expect("benchmark ran");
    let copy = rows[0].bytes as f64 / rows[0].seconds / 1e9;
    println!("| kernel | GB moved | median ms | GB/s | of copy |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for r in &rows {
        let gbs = r.bytes as f64 / r.seconds / 1e9;
        println!(
            "| {} | {:.2} | {:.3} | {:.1} | {:.0} % |",
            r.name,
            r.bytes as f64 / 1e9,
            r.seconds * 1e3,
            gbs,
            100.0 * gbs / copy
        );
    }
}
