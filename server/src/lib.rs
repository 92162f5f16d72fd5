//! The HTTP server of mdl: `app(state) -> Router` over the `mdl` library.
//!
//! A placeholder: the HTTP API (design section 7, `docs/HTTP_API.md`) lands with the server
//! issue. The crate exists now so the workspace layout is the final one.
