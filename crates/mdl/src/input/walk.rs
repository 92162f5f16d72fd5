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

/// The files under `paths`, sorted by tree path. Symlinks to files are followed (a Hugging
/// Face snapshot is a folder of them); a symlink to a directory inside a directory given, a
/// dangling symlink, a device, socket or pipe, a name that is not UTF-8 and two files entered
/// under one tree path are refused, naming the file. `.mdl` folders (repositories) are skipped.
pub fn files(paths: &[PathBuf]) -> Result<Vec<Found>> {
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
            walk(path, "", &mut add)?;
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

fn walk(dir: &Path, prefix: &str, add: &mut dyn FnMut(Found) -> Result<()>) -> Result<()> {
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
            if name != mdl_store::MDL_DIR {
                walk(&path, &tree_path, add)?;
            }
        } else if kind.is_symlink() {
            let meta =
                std::fs::metadata(&path).map_err(|_| refuse(&path, "a symlink to nothing"))?;
            if meta.is_dir() {
                return Err(refuse(&path, "a symlink to a directory"));
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
        std::os::unix::fs::symlink(d.join("c.txt"), d.join("ck/link")).unwrap();
        let got = files(&[d.join("ck"), d.join("c.txt")]).unwrap();
        let paths: Vec<&str> = got.iter().map(|f| f.tree_path.as_str()).collect();
        assert_eq!(paths, ["a.json", "c.txt", "link", "sub/b.bin"]);

        // The same tree path twice, a file clashing with a directory, a symlinked folder.
        assert!(files(&[d.join("c.txt"), d.join("c.txt")]).is_err());
        std::fs::write(d.join("sub"), "f").unwrap();
        let e = files(&[d.join("ck"), d.join("sub")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("also a directory"), "{e}");
        std::os::unix::fs::symlink(d.join("ck/sub"), d.join("ck/dirlink")).unwrap();
        let e = files(&[d.join("ck")]).unwrap_err().to_string();
        assert!(
            e.contains("dirlink") && e.contains("symlink to a directory"),
            "{e}"
        );
        std::fs::remove_file(d.join("ck/dirlink")).unwrap();
        std::os::unix::fs::symlink(d.join("gone"), d.join("ck/dangling")).unwrap();
        let e = files(&[d.join("ck")]).unwrap_err().to_string();
        assert!(
            e.contains("dangling") && e.contains("symlink to nothing"),
            "{e}"
        );
    }
}
