//! End-to-end journeys through the real `mdl` binary on generated safetensors files.

mod bad_input;
mod crash;
mod engine;
mod hostile;
mod interrupt;
mod journeys;
mod json_shapes;
mod maintenance;
mod repair;
mod server;
mod transfer;
mod util;
