//! Where a checkout writes: never inside a repository, never through a symlink it did not
//! make, always through a temporary file; and the folder a tree checkout creates.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// Refuses an output path inside any repository's `.mdl` directory (its directory resolved
/// through symlinks): a file written there could replace the database or a record.
pub fn refuse_inside_repository(out: &Path) -> Result<()> {
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let Ok(dir) = parent.canonicalize() else {
        return Ok(()); // A directory that does not exist fails when the file is created.
    };
    let inside = dir.ancestors().any(|a| {
        a.file_name() == Some(std::ffi::OsStr::new(mdl_store::MDL_DIR))
            && (a.join(mdl_store::meta::META_FILE).exists() || a.join("objects").is_dir())
    });
    if inside {
        return Err(Error::OutputInRepository(out.to_path_buf()));
    }
    Ok(())
}

/// The temporary file an output is written to before it is renamed to `out`: beside it, of an
/// unpredictable name, created exclusively (a planted file or symlink is never written
/// through), with the permissions of any new file (0666 less the umask, not a temporary
/// file's 0600). Removed when dropped unless persisted.
// The output is the user's file, never inside a repository (`refuse_inside_repository`).
#[allow(clippy::disallowed_methods)]
pub fn temporary_output(out: &Path) -> Result<tempfile::NamedTempFile> {
    use std::os::unix::fs::PermissionsExt;
    let err = |source| Error::Output {
        path: out.to_path_buf(),
        source,
    };
    let name = out
        .file_name()
        .ok_or_else(|| err(std::io::Error::other("not a file name")))?;
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    tempfile::Builder::new()
        .prefix(&format!(".{}.", name.to_string_lossy()))
        .suffix(".mdl-tmp")
        .permissions(std::fs::Permissions::from_mode(0o666))
        .tempfile_in(dir)
        .map_err(err)
}

/// Gets the folder `out` ready for a tree: created when missing (returned, so that a failed
/// checkout removes it), else it must be a folder, and empty unless `force`.
// The output is the user's folder, never inside a repository (`refuse_inside_repository`).
#[allow(clippy::disallowed_methods)]
pub(super) fn prepare_folder(out: &Path, force: bool) -> Result<Option<PathBuf>> {
    let err = |source| Error::Output {
        path: out.to_path_buf(),
        source,
    };
    match out.symlink_metadata() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir(out).map_err(err)?;
            Ok(Some(out.to_path_buf()))
        }
        Err(e) => Err(err(e)),
        Ok(_) if !out.is_dir() => Err(err(std::io::Error::other(
            "the commit holds a tree of files; give a folder",
        ))),
        Ok(_) => {
            let empty = std::fs::read_dir(out).map_err(err)?.next().is_none();
            if !empty && !force {
                return Err(Error::OutputExists(out.to_path_buf()));
            }
            Ok(None)
        }
    }
}

/// The place of the tree path `rel` inside `out`, its folders created; refuses a folder on
/// the way that is a symlink or not a folder (a checkout with `force` into an existing folder
/// never writes outside it).
// The output is the user's folder, never inside a repository (`refuse_inside_repository`).
#[allow(clippy::disallowed_methods)]
pub(super) fn inside(out: &Path, rel: &str) -> Result<PathBuf> {
    let mut at = out.to_path_buf();
    let mut parts = rel.split('/').peekable();
    while let Some(part) = parts.next() {
        at.push(part);
        if parts.peek().is_none() {
            break;
        }
        let err = |source| Error::Output {
            path: at.clone(),
            source,
        };
        match at.symlink_metadata() {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(err(std::io::Error::other(
                    "in the way of a folder of the tree (a file or a symlink)",
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&at).map_err(err)?;
            }
            Err(e) => return Err(err(e)),
        }
    }
    Ok(at)
}

/// Removes a folder a failed checkout created, with what was written into it.
// The folder is one this checkout created for the user's output.
#[allow(clippy::disallowed_methods)]
pub(super) fn remove_created(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}

/// Refuses to write `bytes` (a download from a server) at `out` when the disk it goes to
/// (that of its nearest existing folder) has no room for them: what a server says a commit
/// holds bounds what it may send, and this bounds that.
pub fn check_room(out: &Path, bytes: u64) -> Result<()> {
    let absolute = std::path::absolute(out).unwrap_or_else(|_| out.to_path_buf());
    let dir = absolute
        .ancestors()
        .find(|a| a.is_dir())
        .unwrap_or(Path::new("/"));
    match mdl_store::free_bytes(dir) {
        Some(free) if bytes > free => Err(Error::Output {
            path: dir.to_path_buf(),
            source: std::io::Error::other(format!(
                "the commit's files take {bytes} bytes; the disk has {free} free"
            )),
        }),
        _ => Ok(()),
    }
}

/// Adds execute permission wherever the file has read permission.
pub fn make_executable(file: &std::fs::File) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = file.metadata()?.permissions().mode();
    file.set_permissions(std::fs::Permissions::from_mode(
        mode | ((mode & 0o444) >> 2),
    ))
}
