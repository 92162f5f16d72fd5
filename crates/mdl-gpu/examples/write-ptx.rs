//! Writes `kernels/mdl.ptx`: the kernels compiled by NVRTC for [`mdl_gpu::PTX_ARCH`], under a
//! first line naming the source hash. Run by `scripts/regenerate-ptx.sh`.

// Tests, examples and benchmarks write their own files (checkpoints, outputs, damage done on
// purpose); the rule that repository writes go through mdl-store is for the library crates.
#![allow(clippy::disallowed_methods)]

fn main() {
    if !mdl_gpu::nvrtc_present() {
        eprintln!("error: NVRTC does not load (scripts/regenerate-ptx.sh puts it on the path)");
        std::process::exit(1);
    }
    let ptx = match mdl_gpu::compile(mdl_gpu::PTX_ARCH) {
        Ok(ptx) => ptx,
        Err(e) => {
            eprintln!("error: the kernels do not compile: {e}");
            std::process::exit(1);
        }
    };
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels/mdl.ptx");
    let text = format!("{}\n{}", mdl_gpu::ptx_header(), ptx.to_src());
    if let Err(e) = std::fs::write(path, text) {
        eprintln!("error: cannot write {path}: {e}");
        std::process::exit(1);
    }
    println!("wrote {path}");
}
