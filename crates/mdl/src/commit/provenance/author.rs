//! Who a commit is by when it names nobody: the default author, looked up while the commit
//! is being made.

use super::Soon;
use crate::commit::CommitOptions;

/// The author of a commit that names none: `$MDL_AUTHOR`; else git's `user.name` and
/// `user.email` (`Name <email>`, as `git config` reads them here); else the login name
/// (`$USER`, `$LOGNAME`); else "unknown", with a warning saying how to set it.
pub fn default_author() -> String {
    let env = |k: &str| std::env::var(k).ok().filter(|s| !s.trim().is_empty());
    if let Some(a) = env("MDL_AUTHOR") {
        return a;
    }
    // Both keys in one process; where a key is set more than once, the last value counts, as
    // for `git config --get`.
    let (mut name, mut email) = (None, None);
    if let Ok(out) = std::process::Command::new("git")
        .args(["config", "--get-regexp", r"^user\.(name|email)$"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
    {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let (key, value) = line.split_once(' ').unwrap_or((line, ""));
            let value = Some(value.trim().to_string()).filter(|v| !v.is_empty());
            match key {
                "user.name" => name = value,
                "user.email" => email = value,
                _ => {}
            }
        }
    }
    match (name, email) {
        (Some(name), Some(email)) => return format!("{name} <{email}>"),
        (Some(name), None) => return name,
        _ => {}
    }
    if let Some(login) = env("USER").or_else(|| env("LOGNAME")) {
        return login;
    }
    tracing::warn!("no author known: set MDL_AUTHOR, git's user.name, or pass --author");
    "unknown".into()
}

/// The author `opts` names, or the default looked up meanwhile: [`AuthorSoon::get`] when
/// the commit is made.
pub(crate) fn author_soon(opts: &CommitOptions) -> AuthorSoon {
    let named = opts.author.clone();
    let lookup = match named {
        Some(_) => Soon::none(),
        None => Soon::spawn(default_author),
    };
    AuthorSoon { named, lookup }
}

/// The author of a commit being made (see [`author_soon`]).
pub(crate) struct AuthorSoon {
    named: Option<String>,
    lookup: Soon<String>,
}

impl AuthorSoon {
    pub(crate) fn get(self) -> String {
        self.named
            .or_else(|| self.lookup.get())
            .unwrap_or_else(default_author)
    }
}
