//! What a client takes from a server, and how long it waits: the largest document of each
//! kind it reads, and its deadlines (`docs/HTTP_API.md`, "What a client accepts"). A server is
//! another machine, possibly hostile: nothing it sends may make a client hold more than these,
//! or wait longer.

use std::time::Duration;

/// Largest `GET /refs` answer read: about half a million refs.
pub const MAX_REFS: u64 = 64 << 20;
/// Largest `POST /objects/plan` answer read: about two million objects.
pub const MAX_PLAN: u64 = 256 << 20;
/// Largest `GET /files/REV` answer read: a listing of about half a million files.
pub const MAX_LISTING: u64 = 64 << 20;
/// Largest other JSON answer read (a log, a diff, a commit shown).
pub const MAX_DOCUMENT: u64 = 256 << 20;
/// Bytes of an error answer read; what follows is not waited for.
pub const MAX_ERROR_BODY: u64 = 64 << 10;

/// How long a client waits for a server, and how slow a transfer may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// To resolve the server's name and connect (`remote.connect-timeout`).
    pub connect: Duration,
    /// For the next byte of an answer, or for the server to take the next byte of a request
    /// (`remote.idle-timeout`).
    pub idle: Duration,
    /// For a whole request (`remote.request-timeout`); one that moves a known number of bytes
    /// (a pack, a file, an upload) gets that many bytes at [`Self::min_speed`] more.
    pub request: Duration,
    /// Bytes a second a transfer may not fall below on average (`remote.min-speed`).
    pub min_speed: u64,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            connect: Duration::from_secs(10),
            idle: Duration::from_secs(60),
            request: Duration::from_secs(300),
            min_speed: 256 << 10,
        }
    }
}

/// The settings' keys, in `mdl config` and (upper case, `MDL_REMOTE_…`) in the environment.
pub const KEYS: [&str; 4] = [
    "remote.connect-timeout",
    "remote.idle-timeout",
    "remote.request-timeout",
    "remote.min-speed",
];

impl Deadlines {
    /// The whole-request deadline of a request that moves `bytes` (0: a document).
    pub fn for_bytes(&self, bytes: u64) -> Duration {
        let slow = bytes / self.min_speed.max(1);
        self.request.saturating_add(Duration::from_secs(slow))
    }

    /// Each setting's value as text, in [`KEYS`] order (the defaults, for `mdl config`).
    pub fn values(&self) -> [String; 4] {
        [
            format!("{}s", self.connect.as_secs()),
            format!("{}s", self.idle.as_secs()),
            format!("{}s", self.request.as_secs()),
            self.min_speed.to_string(),
        ]
    }

    /// Sets `key` (one of [`KEYS`]) from its text: a duration (`30`, `30s`, `5m`, `1h`) or a
    /// speed in bytes a second (`262144`, `256K`, `1M`). `Ok(false)` for another key; an
    /// error says what the key takes.
    pub fn set(&mut self, key: &str, value: &str) -> Result<bool, &'static str> {
        match key {
            "remote.connect-timeout" => self.connect = duration(value)?,
            "remote.idle-timeout" => self.idle = duration(value)?,
            "remote.request-timeout" => self.request = duration(value)?,
            "remote.min-speed" => self.min_speed = speed(value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// These deadlines with every setting the environment gives (`MDL_REMOTE_CONNECT_TIMEOUT`,
    /// …) in place of its value; `vars` looks a variable up. An error names the variable.
    pub fn with_env(mut self, vars: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        for key in KEYS {
            let name = env_name(key);
            if let Some(value) = vars(&name) {
                self.set(key, &value)
                    .map_err(|expected| format!("{name} = {value:?}: expected {expected}"))?;
            }
        }
        Ok(self)
    }
}

/// The environment variable of setting `key`: `remote.idle-timeout` → `MDL_REMOTE_IDLE_TIMEOUT`.
pub fn env_name(key: &str) -> String {
    format!("MDL_{}", key.replace(['.', '-'], "_").to_uppercase())
}

/// What a duration setting takes.
const A_DURATION: &str = "a whole number of seconds, at least 1 (30, 30s, 5m, 1h)";
/// What a speed setting takes.
const A_SPEED: &str = "bytes a second, at least 1 (262144, 256K, 1M)";

/// A whole number of seconds, minutes or hours, at least a second.
fn duration(text: &str) -> Result<Duration, &'static str> {
    let text = text.trim();
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => text.split_at(at),
        None => (text, "s"),
    };
    let n: u64 = digits.parse().map_err(|_| A_DURATION)?;
    let secs = match unit {
        "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        _ => None,
    }
    .filter(|&s| s > 0)
    .ok_or(A_DURATION)?;
    Ok(Duration::from_secs(secs))
}

/// Bytes a second, with an optional K, M or G (powers of 1024), at least 1.
fn speed(text: &str) -> Result<u64, &'static str> {
    let text = text.trim();
    let (digits, shift) = match text.as_bytes().last() {
        Some(b'K' | b'k') => (&text[..text.len() - 1], 10),
        Some(b'M' | b'm') => (&text[..text.len() - 1], 20),
        Some(b'G' | b'g') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let n: u64 = digits.parse().map_err(|_| A_SPEED)?;
    n.checked_shl(shift)
        .filter(|v| *v >> shift == n && *v > 0)
        .ok_or(A_SPEED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_the_environment_overrides() {
        let mut d = Deadlines::default();
        assert!(d.set("remote.idle-timeout", "5m").unwrap());
        assert_eq!(d.idle, Duration::from_secs(300));
        assert!(d.set("remote.min-speed", "1M").unwrap());
        assert_eq!(d.min_speed, 1 << 20);
        assert!(!d.set("delta.mode", "xor").unwrap());
        for (key, bad) in [
            ("remote.connect-timeout", "0"),
            ("remote.connect-timeout", "10ms"),
            ("remote.request-timeout", "-1"),
            ("remote.min-speed", "0"),
            ("remote.min-speed", "fast"),
        ] {
            assert!(d.set(key, bad).is_err(), "{key} = {bad}");
        }
        let env = Deadlines::default()
            .with_env(|name| (name == "MDL_REMOTE_REQUEST_TIMEOUT").then(|| "3".to_string()))
            .unwrap();
        assert_eq!(env.request, Duration::from_secs(3));
        assert_eq!(env.connect, Deadlines::default().connect);
        assert_eq!(env_name("remote.min-speed"), "MDL_REMOTE_MIN_SPEED");
        // A transfer gets its bytes at the minimum speed on top.
        let d = Deadlines::default();
        assert_eq!(d.for_bytes(0), d.request);
        assert_eq!(
            d.for_bytes(10 * d.min_speed),
            d.request + Duration::from_secs(10)
        );
        for (key, value) in KEYS.iter().zip(d.values()) {
            let mut again = Deadlines::default();
            again.set(key, &value).unwrap();
            assert_eq!(again, d);
        }
    }
}
