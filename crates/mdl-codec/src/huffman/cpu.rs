//! The coder's hot loops compiled for the processor at hand: the same safe code, built a second
//! time with BMI2 (variable shifts in one instruction, which every lookup and every code
//! written needs) and chosen at run time where the processor has it.

// The only unsafe here is calling a function compiled for BMI2, after checking the CPU has it.
#![allow(unsafe_code)]

use mdl_format::FormatError;

use super::group::{self, Tables, GROUP};

/// Whether this processor runs the BMI2 builds (checked once).
#[cfg(target_arch = "x86_64")]
fn has_bmi2() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        std::is_x86_feature_detected!("bmi2") && std::env::var_os("TMP_NO_BMI2").is_none()
    })
}

/// [`group::encode_group`], built for BMI2 where the processor has it.
pub(super) fn encode_group(
    codes: &[(u16, u8); 256],
    lane: [&[u8]; GROUP],
    bufs: [&mut [u8]; GROUP],
) -> [usize; GROUP] {
    #[cfg(target_arch = "x86_64")]
    if has_bmi2() {
        // SAFETY: the processor has BMI2 (checked above), all the function asks for.
        return unsafe { encode_group_bmi2(codes, lane, bufs) };
    }
    group::encode_group(codes, lane, bufs)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "bmi1,bmi2")]
fn encode_group_bmi2(
    codes: &[(u16, u8); 256],
    lane: [&[u8]; GROUP],
    bufs: [&mut [u8]; GROUP],
) -> [usize; GROUP] {
    group::encode_group(codes, lane, bufs)
}

/// [`group::decode_group`], built for BMI2 where the processor has it.
pub(super) fn decode_group(
    tables: Tables<'_>,
    streams: [&[u8]; GROUP],
    outs: [&mut [u8]; GROUP],
) -> Result<(), FormatError> {
    #[cfg(target_arch = "x86_64")]
    if has_bmi2() {
        // SAFETY: the processor has BMI2 (checked above), all the function asks for.
        return unsafe { decode_group_bmi2(tables, streams, outs) };
    }
    group::decode_group(tables, streams, outs)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "bmi1,bmi2")]
fn decode_group_bmi2(
    tables: Tables<'_>,
    streams: [&[u8]; GROUP],
    outs: [&mut [u8]; GROUP],
) -> Result<(), FormatError> {
    group::decode_group(tables, streams, outs)
}
