//! The HTTP protocol between `mdl serve` and its clients (`docs/HTTP_API.md`), written once for
//! both sides: the routes and headers ([`route`]), the JSON bodies of requests and responses
//! ([`body`]), the query parameters of a commit upload ([`params`]) and the error codes with
//! their HTTP statuses ([`ErrorCode`]). The server (`mdl-server`) answers with these types and
//! the client (`mdl-remote`) reads them, so a route, a field or a code cannot drift between the
//! two. Transport (axum, ureq) stays in those crates; this one only names and shapes.

pub mod body;
mod code;
pub mod params;
pub mod route;

pub use code::{ErrorCode, UnknownCode};
