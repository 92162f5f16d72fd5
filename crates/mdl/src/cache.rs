//! The user's cache folder, outside every repository: `MDL_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/mdl`, else `~/.cache/mdl`. It holds what can always be made again: the
//! replicas of repositories in object storage (`s3/`) and the engines' calibration
//! (`engines.json`, see [`crate::engine`]).

use std::path::PathBuf;

/// The cache folder (see the module docs); nothing is created here.
pub fn user_cache_dir() -> PathBuf {
    std::env::var_os("MDL_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("mdl")))
        .or_else(|| std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache/mdl")))
        .unwrap_or_else(|| std::env::temp_dir().join("mdl-cache"))
}
