//! mdl's HTTP client: a [`Remote`] speaks a server's `/v1` API (`docs/HTTP_API.md`) in the
//! protocol's types alone. It links no codec, store or GPU engine: what a local repository
//! does with a server (clone, fetch, push, a checkout written as `mdl checkout` writes it) is
//! `mdl-remote`'s, on top of this.
//!
//! A repository's URL is `http://HOST:PORT/REPO`.

mod admin;
mod error;
mod remote;
mod tree;

pub use error::{Error, Result};
pub use remote::{env_deadlines, error_answer, parse_url, Failure, PackStream, Remote};
pub use tree::TreeFile;
