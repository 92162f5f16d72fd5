//! `cargo run --release -- FILE.safetensors...`: the entropy coder alone, on the exponent plane
//! of every f32 and bf16 tensor of some checkpoints (each plane coded on its own, as a commit
//! codes them; planes under 4 Ki symbols left out), one thread: mdl's chunked Huffman coder against
//! zstd's `HUF_` (huff0, through `zstd-sys`, the same library build the workspace links) and the
//! `huffman-compress` crate. Prints sizes and single-thread speeds, medians of `--repeat` runs
//! (default 5). For each coder "encode" counts the symbols, builds the code and codes them (what
//! a commit does with a plane); "code only" is the coding step alone with the code built.
//! `HUF_COMPARE_ONLY_MDL=1` prints mdl's rows alone, for timing one build against another.
//! On x86-64 with AVX2, two more rows: mdl's wide chunks decoded by mdl and by a prototype
//! decoder of AVX2 gathers (`gather.rs`), whole chunks only.

#[cfg(target_arch = "x86_64")]
mod gather;

use std::collections::HashMap;
use std::time::Instant;

use bit_vec::BitVec;
use huffman_compress::CodeBuilder;
use mdl_codec::huffman::{Code, Decoder, Encoder, Histogram, Lanes, CHUNK_LOG2};
use mdl_format::{safetensors, Dtype};

mod huf {
    //! zstd's Huffman coder (lib/common/huf.h; not in zstd-sys's bindings, but in its library).
    use std::os::raw::{c_int, c_uint, c_void};

    extern "C" {
        pub fn HUF_compress4X_repeat(
            dst: *mut c_void,
            dst_size: usize,
            src: *const c_void,
            src_size: usize,
            max_symbol_value: c_uint,
            table_log: c_uint,
            workspace: *mut c_void,
            wksp_size: usize,
            huf_table: *mut usize,
            repeat: *mut c_int,
            flags: c_int,
        ) -> usize;
        pub fn HUF_decompress4X_hufOnly_wksp(
            dctx: *mut u32,
            dst: *mut c_void,
            dst_size: usize,
            src: *const c_void,
            src_size: usize,
            workspace: *mut c_void,
            wksp_size: usize,
            flags: c_int,
        ) -> usize;
        pub fn HUF_isError(code: usize) -> c_uint;
    }

    /// `HUF_flags_bmi2` where the CPU has it (as zstd itself decides).
    pub fn flags() -> c_int {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("bmi2") {
            return 1;
        }
        0
    }

    /// One block (at most 128 KiB) compressed; `None` when HUF declines (stored or RLE).
    pub fn compress(src: &[u8], out: &mut Vec<u8>) -> Option<usize> {
        out.resize(src.len() + src.len() / 256 + 1024, 0);
        let mut wksp = vec![0u64; (8 << 10) / 8 + 64 + 512 / 8];
        let mut table = vec![0usize; 258];
        let mut repeat: c_int = 0;
        // SAFETY: the buffers are as large as huf.h asks.
        let n = unsafe {
            HUF_compress4X_repeat(
                out.as_mut_ptr().cast(),
                out.len(),
                src.as_ptr().cast(),
                src.len(),
                255,
                11,
                wksp.as_mut_ptr().cast(),
                wksp.len() * 8,
                table.as_mut_ptr(),
                &mut repeat,
                flags(),
            )
        };
        // SAFETY: a plain function of the returned code.
        if unsafe { HUF_isError(n) } != 0 || n == 0 {
            return None;
        }
        out.truncate(n);
        Some(n)
    }

    /// Decompresses a block made by [`compress`] into `dst` (its exact length).
    pub fn decompress(src: &[u8], dst: &mut [u8]) {
        let mut dtable = vec![0u32; 1 + (1 << 12)];
        dtable[0] = 12 * 0x0100_0001;
        let mut wksp = vec![0u32; ((2 << 10) + (1 << 9)) / 4];
        // SAFETY: the table and workspace are as large as huf.h asks.
        let r = unsafe {
            HUF_decompress4X_hufOnly_wksp(
                dtable.as_mut_ptr(),
                dst.as_mut_ptr().cast(),
                dst.len(),
                src.as_ptr().cast(),
                src.len(),
                wksp.as_mut_ptr().cast(),
                wksp.len() * 4,
                flags(),
            )
        };
        // SAFETY: as above.
        assert!(
            unsafe { HUF_isError(r) } == 0 && r == dst.len(),
            "HUF decode"
        );
    }
}

/// The exponent plane of each f32 and bf16 tensor of a safetensors file.
fn exponents(path: &str, out: &mut Vec<Vec<u8>>) {
    let file = std::fs::read(path).expect("read");
    let hl = safetensors::header_len(&file[..8], file.len() as u64).expect("header");
    let layout = safetensors::parse(&file[8..8 + hl as usize], file.len() as u64).expect("parse");
    let start = layout.data_start() as usize;
    for t in &layout.tensors {
        let d = &file[start + t.offset as usize..start + (t.offset + t.len) as usize];
        match t.header.dtype {
            Dtype::F32 => out.push(
                d.chunks_exact(4)
                    .map(|w| (u32::from_le_bytes(w.try_into().unwrap()) >> 23) as u8)
                    .collect(),
            ),
            Dtype::BF16 => out.push(
                d.chunks_exact(2)
                    .map(|w| (u16::from_le_bytes(w.try_into().unwrap()) >> 7) as u8)
                    .collect(),
            ),
            _ => {}
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median seconds of `repeat` runs of `f`.
fn time(repeat: usize, mut f: impl FnMut()) -> f64 {
    median(
        (0..repeat)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

fn main() {
    let mut paths = Vec::new();
    let mut repeat = 5;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--repeat" {
            repeat = args
                .next()
                .and_then(|r| r.parse().ok())
                .expect("--repeat N");
        } else {
            paths.push(a);
        }
    }
    assert!(
        !paths.is_empty(),
        "usage: huffman-compare [--repeat N] FILE.safetensors..."
    );
    // One plane a tensor, as a commit codes them.
    let mut planes: Vec<Vec<u8>> = Vec::new();
    for p in &paths {
        exponents(p, &mut planes);
    }
    planes.retain(|p| p.len() >= 4096);
    let n: usize = planes.iter().map(Vec::len).sum();
    let entropy: f64 = planes.iter().map(|p| Histogram::of(p).entropy_bits()).sum();
    println!(
        "{n} exponent symbols in {} planes of {} file(s), order-0 entropy {:.4} bits/symbol (each plane its own); one thread, median of {repeat}",
        planes.len(),
        paths.len(),
        entropy / n as f64
    );
    println!("| coder | bits/symbol | encode MB/s | code only MB/s | decode MB/s |");
    println!("|---|---:|---:|---:|---:|");
    let mbs = |s: f64| n as f64 / s / 1e6;
    let chunk = 1usize << CHUNK_LOG2;

    // mdl: a code a plane, chunks of 128 Ki symbols.
    let coders: Vec<(Encoder, Decoder, usize)> = planes
        .iter()
        .map(|p| {
            let code = Code::build(&Histogram::of(p));
            (Encoder::new(&code), Decoder::new(&code), 128)
        })
        .collect();
    let mut wide: Vec<Vec<Vec<u8>>> = Vec::new();
    for lanes in [Lanes::Four, Lanes::Wide] {
        let full = time(repeat, || {
            let mut out = Vec::new();
            for p in &planes {
                let code = Code::build(&Histogram::of(p));
                let encoder = Encoder::new(&code);
                for c in p.chunks(chunk) {
                    out.clear();
                    encoder.encode_chunk(lanes, c, &mut out);
                    std::hint::black_box(&out);
                }
            }
        });
        let mut coded: Vec<Vec<Vec<u8>>> = Vec::new();
        let mut back: Vec<Vec<u8>> = planes.iter().map(|p| vec![0u8; p.len()]).collect();
        let code_only = time(repeat, || {
            coded = planes
                .iter()
                .zip(&coders)
                .map(|(p, (e, _, _))| {
                    p.chunks(chunk)
                        .map(|c| {
                            let mut v = Vec::new();
                            e.encode_chunk(lanes, c, &mut v);
                            v
                        })
                        .collect()
                })
                .collect();
        });
        let dec = time(repeat, || {
            for ((chunks, (_, d, _)), out) in coded.iter().zip(&coders).zip(&mut back) {
                for (c, o) in chunks.iter().zip(out.chunks_mut(chunk)) {
                    d.decode_chunk(lanes, c, o).unwrap();
                }
            }
        });
        assert!(back == planes);
        if lanes == Lanes::Wide {
            wide = coded.clone();
        }
        let size: usize = coded
            .iter()
            .zip(&coders)
            .map(|(chunks, (_, _, head))| head + chunks.iter().map(|c| c.len() + 4).sum::<usize>())
            .sum();
        println!(
        "| mdl (a code a plane, chunks of 128 Ki, 12-bit codes, {:?} lanes) | {:.4} | {:.0} | {:.0} | {:.0} |",
        lanes,
        size as f64 * 8.0 / n as f64,
        mbs(full),
        mbs(code_only),
        mbs(dec)
    );
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        gathers(repeat, chunk, &planes, &coders, &wide);
    }
    let mut back: Vec<Vec<u8>> = planes.iter().map(|p| vec![0u8; p.len()]).collect();
    // `HUF_COMPARE_ONLY_MDL=1`: mdl's rows alone (for timing one build against another).
    if std::env::var_os("HUF_COMPARE_ONLY_MDL").is_some() {
        return;
    }
    // zstd's HUF: blocks of 128 KiB (its limit), each counted, given its own code and coded.
    let block = 128 << 10;
    let mut blocks: Vec<Vec<Vec<u8>>> = Vec::new();
    let enc = time(repeat, || {
        blocks = planes
            .iter()
            .map(|p| {
                p.chunks(block)
                    .map(|b| {
                        let mut v = Vec::new();
                        huf::compress(b, &mut v).expect("HUF codes every block of exponents");
                        v
                    })
                    .collect()
            })
            .collect();
    });
    for b in &mut back {
        b.fill(0);
    }
    let dec = time(repeat, || {
        for (bs, out) in blocks.iter().zip(&mut back) {
            for (b, o) in bs.iter().zip(out.chunks_mut(block)) {
                huf::decompress(b, o);
            }
        }
    });
    assert!(back == planes);
    let size: usize = blocks.iter().flatten().map(|b| b.len() + 3).sum();
    println!(
        "| zstd 1.5.7 HUF_compress4X (a code a block of 128 KiB, 11-bit codes) | {:.4} | {:.0} | — | {:.0} |",
        size as f64 * 8.0 / n as f64,
        mbs(enc),
        mbs(dec)
    );

    // huffman-compress: a code a plane, one bit vector, decoded by walking the tree (one run).
    let t = Instant::now();
    let mut trees = Vec::new();
    let mut bits_total = 0usize;
    for p in &planes {
        let hist = Histogram::of(p);
        let weights: HashMap<u8, u64> = (0..=255u8)
            .filter(|&s| hist.0[s as usize] > 0)
            .map(|s| (s, hist.0[s as usize]))
            .collect();
        let (book, tree) = CodeBuilder::from_iter(weights).finish();
        let mut bits = BitVec::new();
        for s in p {
            book.encode(&mut bits, s).unwrap();
        }
        bits_total += bits.len();
        trees.push((tree, bits));
    }
    let enc_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for ((tree, bits), p) in trees.iter().zip(&planes) {
        let back: Vec<u8> = tree.decoder(bits, p.len()).collect();
        assert!(back == *p);
    }
    let dec_s = t.elapsed().as_secs_f64();
    println!(
        "| huffman-compress 0.7.0 (bit-by-bit tree walk, one run) | {:.4} | {:.0} | — | {:.0} |",
        bits_total as f64 / n as f64,
        mbs(enc_s),
        mbs(dec_s)
    );
}

/// The wide chunks' whole chunks decoded by mdl and by the AVX2-gather prototype
/// (`gather.rs`), same chunks, same run: a row each.
#[cfg(target_arch = "x86_64")]
fn gathers(
    repeat: usize,
    chunk: usize,
    planes: &[Vec<u8>],
    coders: &[(Encoder, Decoder, usize)],
    wide: &[Vec<Vec<u8>>],
) {
    let whole = |p: &Vec<u8>| p.len() / chunk;
    let n: usize = planes.iter().map(|p| whole(p) * chunk).sum();
    let tables: Vec<Box<[u32; 4096]>> = coders
        .iter()
        .map(|(_, d, _)| Box::new(std::array::from_fn(|i| d.table()[i] as u32)))
        .collect();
    let mut out = vec![0u8; chunk];
    let mut tmp = vec![0u8; chunk];
    let mut padded = Vec::new();
    let mbs = |s: f64| n as f64 / s / 1e6;
    let scalar = time(repeat, || {
        for ((chunks, (_, d, _)), p) in wide.iter().zip(coders).zip(planes) {
            for c in &chunks[..whole(p)] {
                d.decode_chunk(Lanes::Wide, c, &mut out).unwrap();
            }
        }
    });
    for ((chunks, p), t) in wide.iter().zip(planes).zip(&tables) {
        for (c, want) in chunks[..whole(p)].iter().zip(p.chunks_exact(chunk)) {
            gather::decode_chunk(t, c, &mut padded, &mut tmp, &mut out);
            assert!(out == want, "the prototype decodes what was coded");
        }
    }
    let simd = time(repeat, || {
        for ((chunks, p), t) in wide.iter().zip(planes).zip(&tables) {
            for c in &chunks[..whole(p)] {
                gather::decode_chunk(t, c, &mut padded, &mut tmp, &mut out);
            }
        }
    });
    println!(
        "| mdl, Wide lanes, whole chunks only (decode) | — | — | — | {:.0} |",
        mbs(scalar)
    );
    println!(
        "| AVX2 gathers, Wide lanes, whole chunks only (prototype: a symbol a lane a step) | — | — | — | {:.0} |",
        mbs(simd)
    );
}
