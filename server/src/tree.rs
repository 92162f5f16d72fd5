//! A tree uploaded for one commit (`POST /commits` with `Content-Type: application/x-tar`):
//! a tar of regular files (and folders) under the paths they take in the commit, unpacked into a
//! folder of `.mdl/incoming/` and committed as `mdl commit FOLDER` would.

use std::collections::HashSet;
use std::fs::File;
use std::io::BufReader;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use mdl_protocol::ErrorCode;

use crate::error::ApiError;

/// The content type of a tree upload.
pub(crate) const TAR: &str = "application/x-tar";

fn bad(why: String) -> ApiError {
    ApiError::new(ErrorCode::BadInput, why)
}

/// Unpacks the tar at `tar`, which must hold `files` files, into the empty folder `into`. Every
/// entry must be a folder or a regular file under a valid tree path (`mdl_format::check_path`:
/// relative, no `..`, no control characters), each file once; an executable bit is kept.
/// Anything else is refused with a `bad_input` error naming the entry.
// Files of an upload's scratch folder (`Repository::incoming_dir`, removed with it), not of the
// repository.
#[allow(clippy::disallowed_methods)]
pub(crate) fn unpack(tar: &Path, into: &Path, files: usize) -> Result<(), ApiError> {
    let io = |what: &str, e: std::io::Error| {
        bad(format!("the uploaded tree cannot be read ({what}): {e}"))
    };
    let file =
        File::open(tar).map_err(|e| ApiError::internal(format!("cannot open the upload: {e}")))?;
    let mut archive = tar::Archive::new(BufReader::with_capacity(1 << 20, file));
    let mut seen = HashSet::new();
    for entry in archive.entries().map_err(|e| io("its entries", e))? {
        let mut entry = entry.map_err(|e| io("an entry", e))?;
        let path = entry.path().map_err(|e| io("a path", e))?.into_owned();
        let name = path
            .to_str()
            .ok_or_else(|| {
                bad(format!(
                    "a path in the uploaded tree is not UTF-8: {}",
                    path.display()
                ))
            })?
            .trim_end_matches('/');
        let name = name.strip_prefix("./").unwrap_or(name).to_string();
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            if !name.is_empty() && name != "." {
                mdl_format::check_path(&name).map_err(|e| bad(format!("{name}: {e}")))?;
                std::fs::create_dir_all(into.join(&name))
                    .map_err(|e| ApiError::internal(e.to_string()))?;
            }
            continue;
        }
        if !kind.is_file() {
            return Err(bad(format!(
                "{name} in the uploaded tree is not a regular file or folder (a tree upload holds only those)"
            )));
        }
        mdl_format::check_path(&name).map_err(|e| bad(format!("{name}: {e}")))?;
        if !seen.insert(name.clone()) {
            return Err(bad(format!("{name} is in the uploaded tree twice")));
        }
        let to = into.join(&name);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(|e| ApiError::internal(e.to_string()))?;
        }
        let mode = if entry.header().mode().map_err(|e| io("a mode", e))? & 0o111 != 0 {
            0o755
        } else {
            0o644
        };
        let mut out = File::create(&to).map_err(|e| ApiError::internal(e.to_string()))?;
        std::io::copy(&mut entry, &mut out).map_err(|e| io(&name, e))?;
        out.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|e| ApiError::internal(e.to_string()))?;
    }
    if seen.is_empty() {
        return Err(bad("the uploaded tree holds no file".to_string()));
    }
    if seen.len() != files {
        return Err(bad(format!(
            "the uploaded tree holds {} files where the upload said {files}: it was cut short",
            seen.len()
        )));
    }
    Ok(())
}
