//! Which files of a tree a checkout writes, and where: the rules a local checkout and a
//! download from a server share.

use std::path::{Path, PathBuf};

use super::output;
use super::refuse_inside_repository;
use crate::{Error, Result};

/// What `--path` selects of a tree: the files' indices, each one's path relative to the
/// selection, and whether it is one file written as a file (with its name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    /// Indices into the tree's files, in tree order.
    pub files: Vec<usize>,
    /// Each selected file's path under the output folder.
    pub paths: Vec<String>,
    /// The name of the one file, when the selection is a single file written as a file (a
    /// commit of one top-level file, or `--path` naming a file).
    pub single: Option<String>,
}

/// Selects from a tree of `paths` (sorted) the file `path` names, or the files of the folder
/// it names, or everything; `commit` names the commit in the error.
pub fn select(paths: &[&str], path: Option<&str>, commit: &str) -> Result<Selection> {
    let Some(path) = path.map(|p| p.trim_matches('/')) else {
        let single = match paths {
            [only] if !only.contains('/') => Some(only.to_string()),
            _ => None,
        };
        return Ok(Selection {
            files: (0..paths.len()).collect(),
            paths: paths.iter().map(|p| p.to_string()).collect(),
            single,
        });
    };
    if let Some(i) = paths.iter().position(|p| *p == path) {
        let name = path.rsplit('/').next().unwrap_or(path).to_string();
        return Ok(Selection {
            files: vec![i],
            paths: vec![name.clone()],
            single: Some(name),
        });
    }
    let prefix = format!("{path}/");
    let (files, rel): (Vec<usize>, Vec<String>) = paths
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.strip_prefix(&prefix).map(|r| (i, r.to_string())))
        .unzip();
    if files.is_empty() {
        return Err(Error::NoSuchPath {
            path: path.to_string(),
            commit: commit.to_string(),
        });
    }
    Ok(Selection {
        files,
        paths: rel,
        single: None,
    })
}

/// Where a checkout's files go, and the folder it created (removed again if it fails).
#[derive(Debug)]
pub struct Targets {
    /// One path per selected file.
    pub paths: Vec<PathBuf>,
    /// The folder the checkout created, if it did.
    pub created: Option<PathBuf>,
    /// What the outcome names: the file, or the folder.
    pub reported: PathBuf,
}

/// The targets of `selection` under `out`. A single file goes to `out` itself, or into it
/// when it is a folder or ends in `/`; a tree goes into the folder `out` (created if missing,
/// else empty unless `force`), its folders created, never through a symlink. Nothing is
/// written but folders; an existing file is refused unless `force`. Outputs inside a
/// repository's `.mdl` are refused.
pub fn targets(out: &Path, selection: &Selection, force: bool) -> Result<Targets> {
    if let Some(name) = &selection.single {
        let folder = out.as_os_str().as_encoded_bytes().ends_with(b"/");
        let (target, created) = if folder || out.is_dir() {
            refuse_inside_repository(&out.join(name))?;
            refuse_inside_repository(out)?;
            (out.join(name), output::prepare_folder(out, true)?)
        } else {
            refuse_inside_repository(out)?;
            (out.to_path_buf(), None)
        };
        if !force && target.symlink_metadata().is_ok() {
            return Err(Error::OutputExists(target));
        }
        return Ok(Targets {
            paths: vec![target.clone()],
            created,
            reported: target,
        });
    }
    refuse_inside_repository(&out.join("x"))?;
    let created = output::prepare_folder(out, force)?;
    let paths = selection
        .paths
        .iter()
        .map(|p| output::inside(out, p))
        .collect::<Result<Vec<_>>>();
    match paths {
        Ok(paths) => Ok(Targets {
            paths,
            created,
            reported: out.to_path_buf(),
        }),
        Err(e) => {
            if let Some(c) = &created {
                output::remove_created(c);
            }
            Err(e)
        }
    }
}

/// Removes the folder a failed checkout created.
pub fn undo(targets: &Targets) {
    if let Some(c) = &targets.created {
        output::remove_created(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selections() {
        let tree = [
            "a.json",
            "ck/model.safetensors",
            "ck/optimizer.pt",
            "ckpt.bin",
        ];
        let all = select(&tree, None, "c").unwrap();
        assert_eq!(all.files, [0, 1, 2, 3]);
        assert_eq!(all.single, None);
        let one = select(&tree, Some("ck/optimizer.pt"), "c").unwrap();
        assert_eq!(
            (one.files, one.single),
            (vec![2], Some("optimizer.pt".to_string()))
        );
        let sub = select(&tree, Some("ck/"), "c").unwrap();
        assert_eq!(sub.paths, ["model.safetensors", "optimizer.pt"]);
        // `ck` selects the folder, not `ckpt.bin`.
        assert_eq!(select(&tree, Some("ck"), "c").unwrap().files, [1, 2]);
        assert!(select(&tree, Some("c"), "c").is_err());
        let lone = select(&["model.safetensors"], None, "c").unwrap();
        assert_eq!(lone.single.as_deref(), Some("model.safetensors"));
        assert_eq!(
            select(&["sub/model.safetensors"], None, "c")
                .unwrap()
                .single,
            None
        );
    }
}
