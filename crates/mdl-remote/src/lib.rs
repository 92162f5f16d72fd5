//! A local repository and another one: [`clone`], [`fetch`], [`pull`] and [`push`] move history
//! between them, the other a server ([`Remote`], `mdl-client`'s) or a repository this process
//! opens itself ([`Local`]); [`commit_paths`] and [`download`] move files to and from a server. Only missing objects travel; every object received is re-hashed before it is
//! indexed ([`mdl::transfer::receive_pack`]); refs change by compare-and-swap.
//!
//! A repository's URL is `http://HOST:PORT/REPO`. Remotes are kept in the repository's
//! configuration as `remote.NAME.url`; fetched branches as `refs/remotes/NAME/BRANCH`.

mod clone;
mod error;
mod fetch;
mod files;
mod peer;
mod push;
mod remotes;

pub use clone::{clone, CloneOutcome};
pub use error::{Error, Result};
pub use fetch::{check_refs, deepen, fetch, pull, Moved, TransferOutcome};
pub use files::{commit_paths, download};
pub use mdl_client::Remote;
pub use peer::{Local, Peer, WAIT_POLL};
pub use push::push;
pub use remotes::{add_remote, remote_url, remotes, remove_remote, set_token, set_url};
