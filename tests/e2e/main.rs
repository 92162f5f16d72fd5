//! End-to-end journeys through the real `mdl` binary on generated safetensors files.

mod bad_input;
mod crash;
mod engine;
mod journeys;
mod maintenance;
mod transfer;
mod server;
mod util;
