//! Writes every fuzz target's seeds into `DIR/<target>/seed-<n>` (cargo-fuzz's corpus layout):
//! `cargo run -p mdl-fuzzing --example write_seeds -- fuzz/corpus`.

// Tests, examples and benchmarks write their own files (checkpoints, outputs, damage done on
// purpose); the rule that repository writes go through mdl-store is for the library crates.
#![allow(clippy::disallowed_methods)]

fn main() -> std::io::Result<()> {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).unwrap_or("fuzz/corpus".into()));
    for (name, _) in mdl_fuzzing::TARGETS {
        let target = dir.join(name);
        std::fs::create_dir_all(&target)?;
        for (i, seed) in mdl_fuzzing::seeds(name).iter().enumerate() {
            std::fs::write(target.join(format!("seed-{i}")), seed)?;
        }
    }
    Ok(())
}
