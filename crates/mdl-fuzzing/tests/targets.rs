//! Every fuzz target's check over its seeds, mutations of them (bit flips, overwritten bytes,
//! truncations, insertions) and random inputs: what cargo-fuzz runs for minutes
//! (`scripts/fuzz.sh`), here for a few thousand inputs on the stock toolchain.

use mdl_fuzzing::{seeds, TARGETS};
use proptest::prelude::*;

/// Deterministic mutations of `seed`.
fn mutations(seed: &[u8], count: usize, mut x: u64) -> Vec<Vec<u8>> {
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..count)
        .map(|_| {
            let mut m = seed.to_vec();
            for _ in 0..=next() % 3 {
                let len = m.len().max(1) as u64;
                match next() % 4 {
                    0 if !m.is_empty() => {
                        let at = (next() % len) as usize;
                        m[at] ^= 1 << (next() % 8);
                    }
                    1 if !m.is_empty() => {
                        let at = (next() % len) as usize;
                        m[at] = next() as u8;
                    }
                    2 => m.truncate((next() % len) as usize),
                    _ => {
                        let at = (next() % len) as usize;
                        m.insert(at.min(m.len()), next() as u8);
                    }
                }
            }
            m
        })
        .collect()
}

#[test]
fn seeds_and_mutations_of_them() {
    for (i, (name, check)) in TARGETS.iter().enumerate() {
        let seeds = seeds(name);
        assert!(!seeds.is_empty(), "{name} has no seeds");
        for (j, seed) in seeds.iter().enumerate() {
            check(seed);
            for m in mutations(seed, 300, 0x9e37_79b9 ^ ((i as u64) << 32) ^ j as u64) {
                check(&m);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn random_inputs(target in 0..TARGETS.len(), bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        (TARGETS[target].1)(&bytes);
    }
}
