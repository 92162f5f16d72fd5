//! With the `emulate` feature, builds the CPU emulator of the kernels (`emu/emu.cpp`, which
//! includes `kernels/mdl.cu`); otherwise nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "emulate")]
    emulator();
}

#[cfg(feature = "emulate")]
fn emulator() {
    println!("cargo:rerun-if-changed=emu/emu.cpp");
    println!("cargo:rerun-if-changed=kernels/mdl.cu");
    cc::Build::new()
        .cpp(true)
        .file("emu/emu.cpp")
        .std("c++17")
        // Products rounded before they are added, as NVRTC's --fmad=false and the CPU engine.
        .flag_if_supported("-ffp-contract=off")
        .opt_level(2)
        .warnings(true)
        .extra_warnings(true)
        .compile("mdl_emu");
}
