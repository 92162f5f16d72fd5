//! mdl's HTTP client: a [`Remote`] speaks the server's `/v1` API (`docs/HTTP_API.md`), and
//! [`clone`], [`fetch`], [`pull`] and [`push`] move history between a local repository and a
//! server. Only missing objects travel; every object received is re-hashed before it is
//! indexed ([`mdl::transfer::receive_pack`]); refs change by compare-and-swap.
//!
//! A repository's URL is `http://HOST:PORT/REPO`. Remotes are kept in the repository's
//! configuration as `remote.NAME.url`; fetched branches as `refs/remotes/NAME/BRANCH`.

mod client;
mod clone;
mod error;
mod fetch;
mod peer;
mod push;
mod remotes;
mod tree;

pub use client::{Remote, IDS_PER_REQUEST};
pub use clone::{clone, CloneOutcome};
pub use error::{Error, Result};
pub use fetch::{fetch, pull, Moved, TransferOutcome};
pub use peer::{Local, Peer};
pub use push::push;
pub use remotes::{add_remote, remote_url, remotes, remove_remote, set_token, set_url};
