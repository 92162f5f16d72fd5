//! Browser sessions of the web view: a token (read scope suffices) signed in once through the
//! form, or a one-time sign-in code in a link, then a random session id in an `HttpOnly`,
//! `SameSite=Strict` cookie. A token never goes into a URL or the cookie; a code is good once,
//! for [`CODE_LIFETIME`], so a link kept in a history or a log is worth nothing. Sessions and
//! codes live only in this process (a restarted server asks again).
//!
//! Each belongs to the token it was made with (by the name the tokens file gives it; a code
//! `mdl serve` prints, and the sessions it starts, to the server itself), and each owner keeps
//! at most [`SESSIONS_PER_OWNER`] sessions and [`CODES_PER_OWNER`] codes: past that its own
//! oldest goes, never another's. So a token signing in again and again evicts nobody else,
//! and the memory held is bounded by the tokens file.

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

/// Sessions one owner keeps at most; its oldest goes first (each is 64 bytes of id, the
/// owner's name and an instant).
const SESSIONS_PER_OWNER: usize = 100;

/// How long a sign-in code is good for, once.
pub(crate) const CODE_LIFETIME: Duration = Duration::from_secs(600);

/// Sign-in codes one owner keeps unused at most; its oldest goes first.
const CODES_PER_OWNER: usize = 20;

/// The owner of the codes `mdl serve` prints and of the sessions they start (no token's name:
/// a tokens file's names are single words, this is not).
pub(crate) const SERVER_OWNER: &str = "mdl serve";

/// Keys (session ids, codes) with their owner and when they were made.
type Entries = Mutex<HashMap<String, (String, Instant)>>;

/// The signed-in sessions by id, and the sign-in codes not yet used.
#[derive(Default)]
pub(crate) struct Sessions {
    by_id: Entries,
    codes: Entries,
}

impl Sessions {
    /// Starts a session of `owner`'s; returns its id.
    pub(crate) fn start(&self, owner: &str) -> Result<String, String> {
        admit(&self.by_id, owner, LIFETIME, SESSIONS_PER_OWNER)
    }

    /// A new one-time sign-in code of `owner`'s.
    pub(crate) fn issue_code(&self, owner: &str) -> Result<String, String> {
        admit(&self.codes, owner, CODE_LIFETIME, CODES_PER_OWNER)
    }

    /// Uses up `code`: its owner, where it was issued, unused, less than [`CODE_LIFETIME`] ago.
    pub(crate) fn redeem(&self, code: &str) -> Option<String> {
        let mut codes = self.codes.lock().unwrap_or_else(|p| p.into_inner());
        codes
            .remove(code)
            .filter(|(_, issued)| issued.elapsed() < CODE_LIFETIME)
            .map(|(owner, _)| owner)
    }

    fn valid(&self, id: &str) -> bool {
        let map = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        map.get(id)
            .is_some_and(|(_, started)| started.elapsed() < LIFETIME)
    }
}

/// A new random key of `owner`'s entered in `map` now: entries older than `lifetime` are
/// forgotten first, and when `owner` has `max` left, its oldest.
fn admit(map: &Entries, owner: &str, lifetime: Duration, max: usize) -> Result<String, String> {
    let key = crate::random_token()?;
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    let now = Instant::now();
    map.retain(|_, (_, entered)| now.duration_since(*entered) < lifetime);
    let owned = || map.iter().filter(|(_, (o, _))| o == owner);
    if owned().count() >= max {
        if let Some(oldest) = owned().min_by_key(|(_, (_, t))| *t).map(|(k, _)| k.clone()) {
            map.remove(&oldest);
        }
    }
    map.insert(key.clone(), (owner.to_string(), now));
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

/// The name of `token` where it is one of the server's (any scope: read suffices to look).
pub(crate) fn token_owner(state: &State, token: &str) -> Option<String> {
    state.config.tokens.name_of(token)
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
        let id = s.start("alice").unwrap();
        assert!(s.valid(&id));
        assert!(!s.valid("not-a-session"));
        assert_ne!(s.start("alice").unwrap(), id);
    }

    #[test]
    fn a_sign_in_code_is_good_once() {
        let s = Sessions::default();
        let code = s.issue_code("alice").unwrap();
        assert_eq!(s.redeem("not-a-code"), None);
        assert_eq!(s.redeem(&code).as_deref(), Some("alice"));
        assert_eq!(s.redeem(&code), None);
    }

    /// One token signing in or asking for codes again and again evicts only its own: another's
    /// session and the code the server printed stay good.
    #[test]
    fn one_owner_cannot_evict_another() {
        let s = Sessions::default();
        let alice = s.start("alice").unwrap();
        let printed = s.issue_code(SERVER_OWNER).unwrap();
        let first = s.start("mallory").unwrap();
        for _ in 0..10 * SESSIONS_PER_OWNER {
            s.start("mallory").unwrap();
            s.issue_code("mallory").unwrap();
        }
        assert!(s.valid(&alice));
        assert!(!s.valid(&first), "mallory's own oldest went");
        let held = |e: &Entries| e.lock().unwrap().len();
        assert_eq!(held(&s.by_id), SESSIONS_PER_OWNER + 1);
        assert_eq!(held(&s.codes), CODES_PER_OWNER + 1);
        assert_eq!(s.redeem(&printed).as_deref(), Some(SERVER_OWNER));
    }
}
