//! The HTTP protocol between `mdl serve` and its clients (`docs/HTTP_API.md`), written once for
//! both sides: the routes and headers ([`route`]), what operations report ([`history`],
//! [`outcome`], [`transfer`] — also the stable `mdl --json` shapes), the other JSON bodies of
//! requests and responses ([`body`]), the query parameters of a commit upload ([`params`]) and
//! the error codes with their HTTP statuses ([`ErrorCode`]), and what a client takes from a server
//! ([`limits`]: the largest documents, the deadlines). The server (`mdl-server`) answers
//! with these types and the client (`mdl-client`) reads them, so a route, a field or a code
//! cannot drift between the two. Transport (axum, ureq) stays in those crates; this one only
//! names and shapes.
//!
//! It sits below the library: it needs only `mdl-format` (ids, ref names, times) and serde. The
//! library builds these types from what it computes, so a change of the wire is a change here.

pub mod body;
mod code;
pub mod history;
pub mod limits;
pub mod outcome;
pub mod params;
pub mod route;
pub mod transfer;

pub use code::{ErrorCode, UnknownCode};
