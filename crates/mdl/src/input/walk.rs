//! Which files a commit takes: each path given is a file (entered under its name) or a
//! directory (its files entered under their paths relative to it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// A file to commit: its path in the tree and on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Its path in the commit's tree.
    pub tree_path: String,
    /// Where it is read from.
    pub source: PathBuf,
    /// Whether it is stored as executable.
    pub executable: bool,
}

fn refuse(path: &Path, why: impl Into<String>) -> Error {
    Error::Input {
        path: path.to_path_buf(),
        source: std::io::Error::other(why.into()),
    }
}

/// The files under `paths`, sorted by tree path. A symlink inside a directory given is
/// followed when it points to a file inside that directory — or, for a Hugging Face
/// snapshot (`…/snapshots/REV`), inside the model's cache folder, whose `blobs` its links
/// point into — and refused when it points anywhere else unless `follow_links` (a
/// `config.json` linked to a credentials file must not be committed unasked). A symlink to
/// a directory, a dangling symlink, a device, socket or pipe, a name that is not UTF-8 and
/// two files entered under one tree path are refused, naming the file. `.mdl` folders
/// (repositories) are skipped. A path given by name is followed even if it is a symlink.
pub fn files(paths: &[PathBuf], follow_links: bool) -> Result<Vec<Found>> {
    if paths.is_empty() {
        return Err(refuse(Path::new("."), "no path given"));
    }
    let mut out: BTreeMap<String, Found> = BTreeMap::new();
    let mut add = |found: Found| -> Result<()> {
        mdl_format::check_path(&found.tree_path)
            .map_err(|e| refuse(&found.source, e.to_string()))?;
        if let Some(other) = out.get(&found.tree_path) {
            return Err(refuse(
                &found.source,
                format!(
                    "its path in the commit, {}, is also that of {}",
                    found.tree_path,
                    other.source.display()
                ),
            ));
        }
        out.insert(found.tree_path.clone(), found);
        Ok(())
    };
    for path in paths {
        // What the user named is followed even if it is a symlink.
        let meta = std::fs::metadata(path).map_err(|source| Error::Input {
            path: path.clone(),
            source,
        })?;
        if meta.is_dir() {
            let inside = (!follow_links).then(|| links_may_reach(path)).flatten();
            walk(path, "", inside.as_deref(), &mut add)?;
        } else {
            let name = path
                .file_name()
                .ok_or_else(|| refuse(path, "not a file name"))?;
            let name = name
                .to_str()
                .ok_or_else(|| refuse(path, "the name is not UTF-8"))?;
            add(regular(path, name.to_string(), &meta)?)?;
        }
    }
    // A file and a directory of one name (`a` from one path, `a/b` from another).
    for f in out.values() {
        for (at, _) in f.tree_path.match_indices('/') {
            if let Some(clash) = out.get(&f.tree_path[..at]) {
                return Err(refuse(
                    &clash.source,
                    format!("{} is also a directory in the commit", clash.tree_path),
                ));
            }
        }
    }
    let files: Vec<Found> = out.into_values().collect();
    Ok(files)
}

fn regular(path: &Path, tree_path: String, meta: &std::fs::Metadata) -> Result<Found> {
    use std::os::unix::fs::PermissionsExt;
    if !meta.is_file() {
        return Err(refuse(path, "not a regular file or directory"));
    }
    Ok(Found {
        tree_path,
        source: path.to_path_buf(),
        executable: meta.permissions().mode() & 0o111 != 0,
    })
}

/// Where the links of the folder `dir` may point without `--follow-links`: the folder itself,
/// or a Hugging Face snapshot's model folder (`models--ORG--NAME`, holding `blobs` beside
/// `snapshots`). `None` when the folder cannot be resolved (then walking it fails anyway).
fn links_may_reach(dir: &Path) -> Option<PathBuf> {
    let dir = std::fs::canonicalize(dir).ok()?;
    let model = dir
        .parent()
        .filter(|p| p.file_name().is_some_and(|n| n == "snapshots"))
        .and_then(Path::parent)
        .filter(|m| m.join("blobs").is_dir());
    Some(model.map_or(dir.clone(), Path::to_path_buf))
}

/// Walks `dir`, entering its files under `prefix`; a symlink must resolve under `inside` when
/// that is given.
fn walk(
    dir: &Path,
    prefix: &str,
    inside: Option<&Path>,
    add: &mut dyn FnMut(Found) -> Result<()>,
) -> Result<()> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Input { path, source }
    };
    let mut entries = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(io(dir))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        let name = e.file_name();
        let name = name
            .to_str()
            .ok_or_else(|| refuse(&path, "the name is not UTF-8"))?;
        let tree_path = if prefix.is_empty() {
            name.to_string()
        } else {
            format!("{prefix}/{name}")
        };
        let kind = e.file_type().map_err(io(&path))?;
        if kind.is_dir() {
            if name == mdl_store::MDL_DIR {
                // Never dropped without a word.
                tracing::warn!(
                    "left out {}: a repository's own folder (.mdl) is never committed",
                    crate::error::shown(&path)
                );
            } else {
                walk(&path, &tree_path, inside, add)?;
            }
        } else if kind.is_symlink() {
            let meta =
                std::fs::metadata(&path).map_err(|_| refuse(&path, "a symlink to nothing"))?;
            if meta.is_dir() {
                return Err(refuse(&path, "a symlink to a directory"));
            }
            if let Some(inside) = inside {
                let target = std::fs::canonicalize(&path).map_err(io(&path))?;
                if !target.starts_with(inside) {
                    return Err(refuse(
                        &path,
                        format!(
                            "a symlink to {}, outside the folder committed (`--follow-links` commits what it points to)",
                            crate::error::shown(&target)
                        ),
                    ));
                }
            }
            add(regular(&path, tree_path, &meta)?)?;
        } else {
            let meta = std::fs::symlink_metadata(&path).map_err(io(&path))?;
            add(regular(&path, tree_path, &meta)?)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::disallowed_methods)] // a test's own folder
    #[test]
    fn directories_files_and_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("ck/sub")).unwrap();
        std::fs::create_dir_all(d.join("ck/.mdl")).unwrap();
        std::fs::write(d.join("ck/a.json"), "{}").unwrap();
        std::fs::write(d.join("ck/sub/b.bin"), "b").unwrap();
        std::fs::write(d.join("ck/.mdl/x"), "x").unwrap();
        std::fs::write(d.join("c.txt"), "c").unwrap();
        std::os::unix::fs::symlink(d.join("ck/a.json"), d.join("ck/inner")).unwrap();
        std::os::unix::fs::symlink(d.join("c.txt"), d.join("ck/link")).unwrap();
        // A link out of the folder is refused unless asked for, naming where it points.
        let e = files(&[d.join("ck")], false).unwrap_err().to_string();
        assert!(
            e.contains("ck/link") && e.contains("c.txt, outside the folder committed"),
            "{e}"
        );
        let got = files(&[d.join("ck"), d.join("c.txt")], true).unwrap();
        let paths: Vec<&str> = got.iter().map(|f| f.tree_path.as_str()).collect();
        assert_eq!(paths, ["a.json", "c.txt", "inner", "link", "sub/b.bin"]);
        std::fs::remove_file(d.join("ck/link")).unwrap();
        let got = files(&[d.join("ck")], false).unwrap();
        let paths: Vec<&str> = got.iter().map(|f| f.tree_path.as_str()).collect();
        assert_eq!(paths, ["a.json", "inner", "sub/b.bin"]);

        // A Hugging Face snapshot's links into its model folder's blobs are followed.
        let model = d.join("hub/models--org--m");
        std::fs::create_dir_all(model.join("blobs")).unwrap();
        std::fs::create_dir_all(model.join("snapshots/abc")).unwrap();
        std::fs::write(model.join("blobs/123"), "{}").unwrap();
        std::os::unix::fs::symlink("../../blobs/123", model.join("snapshots/abc/config.json"))
            .unwrap();
        let got = files(&[model.join("snapshots/abc")], false).unwrap();
        assert_eq!(got[0].tree_path, "config.json");

        // The same tree path twice, a file clashing with a directory, a symlinked folder.
        assert!(files(&[d.join("c.txt"), d.join("c.txt")], false).is_err());
        std::fs::write(d.join("sub"), "f").unwrap();
        let e = files(&[d.join("ck"), d.join("sub")], false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("also a directory"), "{e}");
        std::os::unix::fs::symlink(d.join("ck/sub"), d.join("ck/dirlink")).unwrap();
        let e = files(&[d.join("ck")], false).unwrap_err().to_string();
        assert!(
            e.contains("dirlink") && e.contains("symlink to a directory"),
            "{e}"
        );
        std::fs::remove_file(d.join("ck/dirlink")).unwrap();
        std::os::unix::fs::symlink(d.join("gone"), d.join("ck/dangling")).unwrap();
        let e = files(&[d.join("ck")], false).unwrap_err().to_string();
        assert!(
            e.contains("dangling") && e.contains("symlink to nothing"),
            "{e}"
        );
    }
}
