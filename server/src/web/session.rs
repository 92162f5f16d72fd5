//! Browser sessions of the web view: a token (read scope suffices) signed in once through the
//! form, or a one-time sign-in code in a link, then a random session id in an `HttpOnly`,
//! `SameSite=Strict` cookie. A token never goes into a URL or the cookie; a code is good once,
//! for [`CODE_LIFETIME`], so a link kept in a history or a log is worth nothing. Sessions and
//! codes live only in this process (a restarted server asks again).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap};

use crate::auth::{check, Scope};
use crate::State;

/// The session cookie's name.
pub(crate) const COOKIE: &str = "mdl_session";

/// How long a session lasts after sign-in.
const LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// Sessions kept at most; the oldest go first (each is 64 bytes of id and an instant).
const MAX_SESSIONS: usize = 10_000;

/// How long a sign-in code is good for, once.
pub(crate) const CODE_LIFETIME: Duration = Duration::from_secs(600);

/// Sign-in codes kept at most; the oldest go first.
const MAX_CODES: usize = 1_000;

/// The signed-in sessions by id, and the sign-in codes not yet used.
#[derive(Default)]
pub(crate) struct Sessions {
    by_id: Mutex<HashMap<String, Instant>>,
    codes: Mutex<HashMap<String, Instant>>,
}

impl Sessions {
    /// Starts a session; returns its id.
    pub(crate) fn start(&self) -> Result<String, String> {
        admit(&self.by_id, LIFETIME, MAX_SESSIONS)
    }

    /// A new one-time sign-in code.
    pub(crate) fn issue_code(&self) -> Result<String, String> {
        admit(&self.codes, CODE_LIFETIME, MAX_CODES)
    }

    /// Uses up `code`: whether it was issued, unused, less than [`CODE_LIFETIME`] ago.
    pub(crate) fn redeem(&self, code: &str) -> bool {
        let mut codes = self.codes.lock().unwrap_or_else(|p| p.into_inner());
        codes
            .remove(code)
            .is_some_and(|issued| issued.elapsed() < CODE_LIFETIME)
    }

    fn valid(&self, id: &str) -> bool {
        let map = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        map.get(id)
            .is_some_and(|started| started.elapsed() < LIFETIME)
    }
}

/// A new random key entered in `map` now: entries older than `lifetime` are forgotten first,
/// and when `max` are left, the oldest of them.
fn admit(
    map: &Mutex<HashMap<String, Instant>>,
    lifetime: Duration,
    max: usize,
) -> Result<String, String> {
    let key = crate::random_token()?;
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    let now = Instant::now();
    map.retain(|_, entered| now.duration_since(*entered) < lifetime);
    if map.len() >= max {
        if let Some(oldest) = map.iter().min_by_key(|(_, t)| **t).map(|(k, _)| k.clone()) {
            map.remove(&oldest);
        }
    }
    map.insert(key.clone(), now);
    Ok(key)
}

/// The value of cookie `name` in a request's headers.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Whether a request may read: the server is read-public, or it carries a bearer token of
/// read scope, or a live session cookie.
pub(crate) fn may_read(state: &State, headers: &HeaderMap) -> bool {
    if check(
        &state.config.tokens,
        state.config.read_public,
        headers,
        Scope::Read,
    )
    .is_ok()
    {
        return true;
    }
    cookie(headers, COOKIE).is_some_and(|id| state.sessions.valid(id))
}

/// Whether `token` is one of the server's (any scope: read suffices to look).
pub(crate) fn token_is_valid(state: &State, token: &str) -> bool {
    state.config.tokens.scope_of(token.trim()).is_some()
}

/// The `Set-Cookie` value for session `id`.
pub(crate) fn set_cookie(id: &str) -> String {
    format!(
        "{COOKIE}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}",
        LIFETIME.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn cookies_are_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; mdl_session=abc; b=2"),
        );
        assert_eq!(cookie(&h, COOKIE), Some("abc"));
        assert_eq!(cookie(&h, "c"), None);
    }

    #[test]
    fn sessions_are_recognised_until_forgotten() {
        let s = Sessions::default();
        let id = s.start().unwrap();
        assert!(s.valid(&id));
        assert!(!s.valid("not-a-session"));
        assert_ne!(s.start().unwrap(), id);
    }

    #[test]
    fn a_sign_in_code_is_good_once() {
        let s = Sessions::default();
        let code = s.issue_code().unwrap();
        assert!(!s.redeem("not-a-code"));
        assert!(s.redeem(&code));
        assert!(!s.redeem(&code));
    }
}
