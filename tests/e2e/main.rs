//! End-to-end journeys through the real `mdl` binary on generated safetensors files.

// Tests, examples and benchmarks write their own files (checkpoints, outputs, damage done on
// purpose); the rule that repository writes go through mdl-store is for the library crates.
#![allow(clippy::disallowed_methods)]

mod backends;
mod bad_input;
mod crash;
mod decode_budget;
mod deltas;
mod engine;
mod hostile;
mod hostile_modes;
mod hostile_peer;
mod hub_upload;
mod interrupt;
mod journeys;
mod json_shapes;
mod maintenance;
mod merge;
mod newcomer;
mod peer_proxy;
mod remotes;
mod repair;
mod resume;
mod s3;
mod s3_availability;
mod s3_upkeep;
mod serve_http;
mod served_folder;
mod server;
mod shallow;
mod tips;
mod transfer;
mod trees;
mod util;
mod web;
mod written_in_place;
