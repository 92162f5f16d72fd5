//! mdl repositories in S3-compatible object storage (`s3://BUCKET/PREFIX`), through the
//! `object_store` crate: no server and no lock service, only what every such store offers —
//! objects written whole, conditional writes (`If-None-Match: *` to create, `If-Match` on the
//! ETag read to replace), listings and multipart uploads.
//!
//! - [`location`]: `s3://` locations and the client built from the `AWS_*` environment.
//! - [`client`]: [`Bucket`], the calls a repository makes, blocking, retried, counted.
//! - [`layout`]: the keys (marker, refs, settings, packs) and what each holds.
//! - [`replica`]: [`Replica`], a machine's copy in its cache that commands run on, brought up
//!   to date from the bucket before and published to it after.
//! - `records`: where each record is in the bucket (the packs' tables of contents), and
//!   fetching those a replica lacks by byte range.
//! - [`BucketPeer`]: the bucket as the other side of a clone, fetch, pull or push.
//! - `evict`: [`Replica::trim`], keeping the replica's record files within the cache's size.
//! - `gc`: [`Replica::gc`], deleting packs no ref needs in two steps a grace period apart.
//!
//! How writers on different machines stay consistent: `docs/ARCHITECTURE.md`, "Repositories
//! in object storage".

pub mod client;
mod error;
mod evict;
mod gc;
pub mod layout;
pub mod location;
mod peer;
mod records;
pub mod replica;

pub use client::Bucket;
pub use error::{Error, Result};
pub use evict::{cache_size, DEFAULT_CACHE_SIZE};
pub use location::{Location, RETRY_FOR};
pub use mdl_protocol::body::BucketGc;
pub use peer::BucketPeer;
pub use replica::{cache_root, init, Publish, Published, Replica};
