//! Bearer tokens with `read`, `write` and `admin` scopes, from a file of `name scope token`
//! lines.

use mdl_protocol::ErrorCode;
use std::path::Path;

use axum::http::HeaderMap;

use crate::error::ApiError;

/// What a request may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Read refs, history and checkpoints.
    Read,
    /// Also commit, push and move refs.
    Write,
    /// Also create repositories (on a server of a folder of them).
    Admin,
}

impl Scope {
    fn name(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
            Scope::Admin => "admin",
        }
    }
}

/// The accepted tokens.
#[derive(Clone, Debug, Default)]
pub struct Tokens {
    entries: Vec<(String, Scope, String)>,
}

impl Tokens {
    /// Parses a tokens file: one `name scope token` per line (`#` comments and blank lines
    /// ignored); scope is `read`, `write` or `admin`.
    pub fn parse(text: &str) -> Result<Tokens, String> {
        let mut entries = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            let [name, scope, token] = words[..] else {
                return Err(format!(
                    "line {}: expected `name scope token`, found {} words",
                    n + 1,
                    words.len()
                ));
            };
            let scope = match scope {
                "read" => Scope::Read,
                "write" => Scope::Write,
                "admin" => Scope::Admin,
                other => {
                    return Err(format!(
                        "line {}: scope {other:?} is not read, write or admin",
                        n + 1
                    ))
                }
            };
            if token.len() < 16 {
                return Err(format!(
                    "line {}: token of {name} is shorter than 16 characters",
                    n + 1
                ));
            }
            entries.push((name.to_string(), scope, token.to_string()));
        }
        Ok(Tokens { entries })
    }

    /// Reads a tokens file.
    pub fn load(path: &Path) -> Result<Tokens, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Tokens::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Adds a token.
    pub fn add(&mut self, name: &str, scope: Scope, token: String) {
        self.entries.push((name.to_string(), scope, token));
    }

    /// The scope of a presented token, if it is one of ours.
    pub(crate) fn scope_of(&self, presented: &str) -> Option<Scope> {
        // Every entry is compared in full, so timing says nothing about which one matched.
        let mut found = None;
        for (_, scope, token) in &self.entries {
            if constant_time_eq(token.as_bytes(), presented.as_bytes()) {
                found = found.max(Some(*scope));
            }
        }
        found
    }

    /// The name the tokens file gives the token a request presents (`Authorization: Bearer`),
    /// if it is one of ours: who a commit over the Hub's API is by.
    pub(crate) fn holder(&self, headers: &HeaderMap) -> Option<String> {
        self.name_of(bearer(headers)?)
    }

    /// The name the tokens file gives `presented`, if it is one of ours (of the widest scope
    /// where it is listed twice).
    pub(crate) fn name_of(&self, presented: &str) -> Option<String> {
        let presented = presented.trim();
        let mut found = None;
        for (name, scope, token) in &self.entries {
            if constant_time_eq(token.as_bytes(), presented.as_bytes()) {
                found = found.max(Some((*scope, name)));
            }
        }
        found.map(|(_, name)| name.clone())
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token a request presents (`Authorization: Bearer TOKEN`), trimmed.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

/// Checks that a request carries a token of at least `needed` scope (reads pass without one
/// when `read_public`).
pub fn check(
    tokens: &Tokens,
    read_public: bool,
    headers: &HeaderMap,
    needed: Scope,
) -> Result<(), ApiError> {
    if needed == Scope::Read && read_public {
        return Ok(());
    }
    let Some(presented) = bearer(headers) else {
        return Err(ApiError::new(
            ErrorCode::Unauthorized,
            "this request needs a bearer token (--token or MDL_TOKEN)",
        ));
    };
    match tokens.scope_of(presented) {
        None => Err(ApiError::new(
            ErrorCode::Unauthorized,
            "the token is not valid for this server",
        )),
        Some(scope) if scope < needed => Err(ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "the token has {} scope; this request needs {}",
                scope.name(),
                needed.name()
            ),
        )),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_scopes() {
        let t =
            Tokens::parse("# team\nalice write aaaaaaaaaaaaaaaa\n\nbob read bbbbbbbbbbbbbbbb\ncarol admin cccccccccccccccc\n")
                .unwrap();
        assert_eq!(t.scope_of("aaaaaaaaaaaaaaaa"), Some(Scope::Write));
        assert_eq!(t.scope_of("bbbbbbbbbbbbbbbb"), Some(Scope::Read));
        assert_eq!(t.scope_of("cccccccccccccccc"), Some(Scope::Admin));
        assert_eq!(t.scope_of("bbbbbbbbbbbbbbb"), None);
        assert!(Tokens::parse("alice owner aaaaaaaaaaaaaaaa").is_err());
        assert!(Tokens::parse("alice write short").is_err());
        assert!(Tokens::parse("alice write").is_err());
    }
}
