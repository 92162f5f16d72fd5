//! Tokens for remotes, kept in `.mdl/remote-tokens` (JSON, remote name → token) with mode
//! 0600, like a credential file: never in the configuration, which a repository in object
//! storage shares with every machine, and never sent anywhere but to its remote.

use std::collections::BTreeMap;

use crate::{Error, Repository, Result};

/// The file in `.mdl`.
pub const FILE: &str = "remote-tokens";

fn read(repo: &Repository) -> Result<BTreeMap<String, String>> {
    let path = repo.root().join(crate::MDL_DIR).join(FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| Error::Input {
            path: path.clone(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not a tokens file ({e}); remove it and set the tokens again"),
            ),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(source) => Err(Error::Input { path, source }),
    }
}

/// The token kept for remote `name`.
pub fn get(repo: &Repository, name: &str) -> Result<Option<String>> {
    Ok(read(repo)?.remove(name))
}

/// Keeps `token` for remote `name`, or forgets it (`None`); the file is replaced atomically,
/// readable by its owner only.
pub fn set(repo: &Repository, name: &str, token: Option<&str>) -> Result<()> {
    let mut all = read(repo)?;
    match token {
        Some(t) => all.insert(name.to_string(), t.to_string()),
        None => all.remove(name),
    };
    let bytes = serde_json::to_vec_pretty(&all).expect("a map of strings serializes");
    repo.store().replace_file(FILE, &bytes, 0o600)?;
    Ok(())
}
