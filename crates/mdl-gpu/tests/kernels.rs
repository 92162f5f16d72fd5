//! The kernels compile with NVRTC (no GPU needed; ignored by default, run by `.ci/run` with
//! `--include-ignored` after it installs NVRTC from the `nvidia-cuda-nvrtc` wheel), the
//! committed PTX matches the source, and probing never panics.

use mdl_gpu::{
    compile, machine_code_resources, nvrtc_present, ptx_header, COMMITTED_PTX, KERNELS, PTX_ARCH,
};

fn entries(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        .map(|l| l.split('(').next().unwrap_or(l).trim())
        .collect()
}

/// Fails the test unless NVRTC loads.
fn need_nvrtc() {
    assert!(
        nvrtc_present(),
        "NVRTC does not load (.ci/run and scripts/regenerate-ptx.sh install it from the \
         nvidia-cuda-nvrtc wheel)"
    );
}

#[test]
#[ignore = "needs NVRTC: .ci/run installs it and runs these with --include-ignored"]
fn every_kernel_compiles_with_nvrtc() {
    need_nvrtc();
    // The committed PTX's target, and the devices the engine is measured on (Ampere, Hopper).
    for arch in [PTX_ARCH, "compute_80", "compute_90"] {
        let ptx =
            compile(arch).unwrap_or_else(|e| panic!("kernels do not compile for {arch}: {e}"));
        let src = ptx.to_src();
        let found = entries(&src);
        for k in KERNELS {
            assert!(found.contains(k), "{arch}: kernel {k} missing from the PTX");
        }
    }
}

/// Every kernel fits the largest block the engine launches (1,024 threads: at most 64
/// registers a thread in a 65,536-register file) and the static shared memory every device
/// gives a block (48 KiB), in the machine code of each architecture measured on.
#[test]
#[ignore = "needs NVRTC: .ci/run installs it and runs these with --include-ignored"]
fn every_kernel_fits_a_block_in_machine_code() {
    need_nvrtc();
    for sm in ["sm_70", "sm_80", "sm_90"] {
        let found = machine_code_resources(sm).unwrap_or_else(|e| panic!("{sm}: {e}"));
        let most = found.iter().max_by_key(|r| r.registers);
        println!("{sm}: {} kernels, most registers: {most:?}", found.len());
        for k in KERNELS {
            let r = found
                .iter()
                .find(|r| r.name == *k)
                .unwrap_or_else(|| panic!("{sm}: no report for kernel {k}"));
            // Every kernel uses some registers: a zero means the report was not read.
            assert!(r.registers > 0, "{sm}: no register count read for {k}");
            assert!(
                r.registers <= 64,
                "{sm}: {k} needs {} registers a thread; 1,024 threads would not fit",
                r.registers
            );
            assert!(
                r.shared_bytes <= 48 << 10,
                "{sm}: {k} needs {} bytes of shared memory",
                r.shared_bytes
            );
        }
    }
}

#[test]
fn committed_ptx_matches_the_source() {
    let first = COMMITTED_PTX.lines().next().unwrap_or("");
    assert_eq!(
        first,
        ptx_header(),
        "kernels/mdl.ptx is stale: run scripts/regenerate-ptx.sh"
    );
    let found = entries(COMMITTED_PTX);
    for k in KERNELS {
        assert!(
            found.contains(k),
            "kernel {k} missing from the committed PTX"
        );
    }
}

#[test]
fn probing_never_panics_and_says_why() {
    match mdl_gpu::probe() {
        Ok((engine, line)) => println!("GPU engine: {line} ({engine:?})"),
        Err(why) => {
            assert!(!why.0.is_empty());
            println!("no GPU engine: {why}");
        }
    }
    // A second probe answers the same without starting again.
    assert_eq!(mdl_gpu::probe().is_ok(), mdl_gpu::probe().is_ok());
}
