//! How one file is cut into runs: by its content, not its name — except that a file named as
//! a checkpoint (`*.safetensors`, `*.pt`, `*.pth`, `*.ckpt`) must be one, unless it is to be
//! stored as bytes.

use std::path::Path;

use mdl_format::{bytes_header, safetensors, torch, FileFormat, TensorHeader};

use super::{safetensors_layout, BYTES_OBJECT_MAX, INLINE_MAX};
use crate::{Error, Result};

/// A run of a file as cut.
pub(super) enum Cut {
    Inline {
        start: u64,
        len: u64,
    },
    Object {
        name: String,
        header: TensorHeader,
        offset: u64,
        tensor: bool,
    },
}

/// A range of a file that is a unit of its own: `(offset, len, Some((name, header)))` for a
/// tensor, `None` for bytes.
type Marked = (u64, u64, Option<(String, TensorHeader)>);

/// A file as cut.
pub(super) struct Split {
    pub(super) format: FileFormat,
    pub(super) note: String,
    pub(super) metadata: Vec<(String, String)>,
    pub(super) runs: Vec<Cut>,
    /// The length of a safetensors file's header (its length field included); 0 otherwise.
    pub(super) header_len: u64,
}

/// The magic number a `torch.save` file of the format before 1.6 (a pickle, not a zip)
/// starts with: protocol 2, then the long 0x1950a86a20f9469cfc6c.
const LEGACY_TORCH_MAGIC: &[u8] = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19";

/// What a file that is not safetensors is, from its first bytes: the formats a checkpoint is
/// most often confused with.
pub(crate) fn what_it_is(bytes: &[u8]) -> Option<&'static str> {
    let text = bytes.trim_ascii_start();
    Some(match bytes {
        [] => "empty",
        [b'P', b'K', 3, 4, ..] | [b'P', b'K', 5, 6, ..] => {
            "a zip archive (torch.save writes these: name it .pt to commit it as one)"
        }
        [0x80, 2..=5, ..] => "a Python pickle (a legacy torch.save file: name it .pt or .bin)",
        [0x1f, 0x8b, ..] => "gzip-compressed",
        [0x93, b'N', b'U', b'M', b'P', b'Y', ..] => "a NumPy .npy array",
        [0x89, b'H', b'D', b'F', ..] => "an HDF5 file (Keras .h5?)",
        [b'G', b'G', b'U', b'F', ..] => "a GGUF model",
        _ if text.starts_with(b"{") || text.starts_with(b"[") => {
            "JSON text (a config or an index, not the weights)"
        }
        _ => return None,
    })
}

/// File names that say a file is a `torch.save` checkpoint.
const TORCH_SUFFIXES: [&str; 3] = [".pt", ".pth", ".ckpt"];

/// Whether `bytes` begin as a `torch.save` archive does: a zip whose first entry is one of the
/// archive's own (`data.pkl` in every version, or the version records).
fn starts_like_torch(bytes: &[u8]) -> bool {
    if !torch::looks_like_zip(bytes) || bytes.len() < 30 {
        return false;
    }
    let n = usize::from(u16::from_le_bytes([bytes[26], bytes[27]]));
    bytes.get(30..30 + n).is_some_and(|name| {
        ["/data.pkl", "/.format_version", "/byteorder", "/version"]
            .iter()
            .any(|own| name.ends_with(own.as_bytes()))
    })
}

/// Cuts `bytes`, the file at `path` (in the tree at `tree_path`). A file whose name or first
/// bytes say it is a checkpoint (`*.safetensors`; `*.pt`, `*.pth`, `*.ckpt` or a zip that
/// begins as `torch.save` writes one) and that is damaged (does not parse as safetensors, a
/// zip that does not hold together, a `.pt` or `.ckpt` that is neither zip nor pickle) is refused,
/// unless `as_bytes`: then it is stored as bytes, with a note saying why.
///
/// `bytes` is the whole file of `len` bytes, or, for a file given in parts, its first part: such
/// a file must be safetensors, whose header that part holds.
pub(super) fn cut(
    path: &Path,
    tree_path: &str,
    bytes: &[u8],
    len: u64,
    as_bytes: bool,
) -> Result<Split> {
    let lower = tree_path.to_ascii_lowercase();
    let named_safetensors = lower.ends_with(".safetensors");
    let in_parts = (bytes.len() as u64) < len;
    if in_parts {
        let need = match safetensors::header_len(bytes, len) {
            Ok(n) => 8 + n,
            Err(_) => 8.min(len),
        };
        if (bytes.len() as u64) < need {
            return Err(Error::Input {
                path: path.to_path_buf(),
                source: std::io::Error::other(format!(
                    "its {need}-byte safetensors header does not lie within its first part ({} \
                     bytes): the header and each tensor must each lie within one part",
                    bytes.len()
                )),
            });
        }
    }
    if named_safetensors || looks_like_safetensors(bytes) || in_parts {
        match safetensors_layout(bytes, len) {
            Ok(layout) => {
                let data_start = layout.data_start();
                let mut marked: Vec<Marked> = layout
                    .tensors
                    .into_iter()
                    .map(|t| (data_start + t.offset, t.len, Some((t.name, t.header))))
                    .collect();
                // The header is bytes of its own, so an unchanged header is one object.
                marked.push((0, data_start, None));
                let mut metadata = layout.metadata;
                metadata.sort();
                return Ok(Split {
                    format: FileFormat::Safetensors,
                    note: String::new(),
                    metadata,
                    runs: runs(tree_path, len, marked),
                    header_len: data_start,
                });
            }
            // Named safetensors, or starting as one whatever its name (a damaged `x.st`):
            // refused, naming the fault, unless stored as bytes on purpose.
            Err(source) if !as_bytes || in_parts => {
                // What the first bytes say it is instead, unless they start as safetensors
                // does (its header's length can read as `{` or as blanks).
                let found = (!looks_like_safetensors(bytes))
                    .then(|| what_it_is(bytes))
                    .flatten();
                return Err(Error::InvalidInput {
                    path: path.to_path_buf(),
                    source,
                    found,
                });
            }
            Err(e) => {
                let why = format!("stored as bytes: it starts like a safetensors file, but {e}");
                return Ok(as_stored_bytes(tree_path, bytes, why));
            }
        }
    }
    let named_torch = TORCH_SUFFIXES.iter().any(|s| lower.ends_with(s));
    let damaged = |why: String| Error::DamagedCheckpoint {
        path: path.to_path_buf(),
        why: format!(
            "not a readable torch.save checkpoint: {why} (`--as-bytes` stores it as bytes)"
        ),
    };
    if torch::looks_like_zip(bytes) {
        return match torch::split(bytes) {
            Ok(archive) => {
                let mut marked: Vec<_> = archive
                    .storages
                    .into_iter()
                    .map(|s| {
                        let len = s.header.data_len().expect("checked by the reader");
                        (s.offset, len, Some((s.name, s.header)))
                    })
                    .collect();
                marked.extend(archive.others.into_iter().map(|(at, len)| (at, len, None)));
                Ok(Split {
                    format: FileFormat::Torch,
                    note: String::new(),
                    metadata: Vec::new(),
                    runs: runs(tree_path, bytes.len() as u64, marked),
                    header_len: 0,
                })
            }
            // A zip that does not hold together (cut short: no central directory) is damage;
            // a readable archive mdl cannot split (an opcode its reader does not take, a
            // TorchScript module) is stored whole, with a note.
            Err(e @ torch::TorchError::Zip(_))
                if (named_torch || starts_like_torch(bytes)) && !as_bytes =>
            {
                Err(damaged(e.to_string()))
            }
            Err(e) => Ok(as_stored_bytes(
                tree_path,
                bytes,
                format!("stored as bytes: {e}"),
            )),
        };
    }
    let note = if bytes.starts_with(LEGACY_TORCH_MAGIC) {
        "stored as bytes: a torch file of the format before PyTorch 1.6 (not a zip)".into()
    } else if named_torch && !matches!(bytes, [] | [0x80, 2..=5, ..]) {
        let what = what_it_is(bytes).unwrap_or("neither a zip archive nor a pickle");
        // `.pth` is also Python's path-configuration file: only its zip must hold together.
        if !as_bytes && !lower.ends_with(".pth") {
            return Err(damaged(format!("it is {what}")));
        }
        format!("stored as bytes: named as a torch.save file, but it is {what}")
    } else {
        String::new()
    };
    Ok(as_stored_bytes(tree_path, bytes, note))
}

/// A file stored as bytes, with the note that says why.
fn as_stored_bytes(tree_path: &str, bytes: &[u8], note: String) -> Split {
    Split {
        format: FileFormat::Bytes,
        note,
        metadata: Vec::new(),
        runs: runs(tree_path, bytes.len() as u64, Vec::new()),
        header_len: 0,
    }
}

/// Whether `bytes` starts as a safetensors file does: a header length that fits, then `{`.
fn looks_like_safetensors(bytes: &[u8]) -> bool {
    bytes.len() > 8
        && u64::from_le_bytes(bytes[..8].try_into().unwrap()) < bytes.len() as u64 - 8
        && bytes[8] == b'{'
}

/// The runs of a file of `len` bytes: the `marked` ranges (tensors, or bytes that are a unit
/// of their own), and the bytes around them; bytes runs of at most [`INLINE_MAX`] are kept
/// inline, longer ones are objects of at most [`BYTES_OBJECT_MAX`].
fn runs(tree_path: &str, len: u64, mut marked: Vec<Marked>) -> Vec<Cut> {
    marked.sort_by_key(|m| m.0);
    let mut out = Vec::new();
    let mut at = 0;
    let bytes = |out: &mut Vec<Cut>, start: u64, end: u64| {
        if end - start <= INLINE_MAX {
            if end > start {
                out.push(Cut::Inline {
                    start,
                    len: end - start,
                });
            }
            return;
        }
        let mut s = start;
        while s < end {
            let n = (end - s).min(BYTES_OBJECT_MAX);
            out.push(Cut::Object {
                name: format!("{tree_path}@{s}"),
                header: bytes_header(n),
                offset: s,
                tensor: false,
            });
            s += n;
        }
    };
    for (start, n, tensor) in marked {
        debug_assert!(start >= at, "runs overlap");
        bytes(&mut out, at, start);
        match tensor {
            Some((name, header)) => out.push(Cut::Object {
                name,
                header,
                offset: start,
                tensor: true,
            }),
            None => bytes(&mut out, start, start + n),
        }
        at = start + n;
    }
    bytes(&mut out, at, len);
    out
}

#[cfg(test)]
mod tests {
    use super::what_it_is;

    #[test]
    fn files_mistaken_for_safetensors_are_named() {
        assert!(what_it_is(b"PK\x03\x04rest")
            .unwrap()
            .starts_with("a zip archive"));
        assert!(what_it_is(b"\x80\x04\x95")
            .unwrap()
            .starts_with("a Python pickle"));
        assert!(what_it_is(b"  {\"a\": 1}")
            .unwrap()
            .starts_with("JSON text"));
        assert_eq!(what_it_is(b""), Some("empty"));
        // An 8-byte length and a JSON header is safetensors' own start: not named.
        assert_eq!(what_it_is(b"\x10\0\0\0\0\0\0\0{\"a\":{}}"), None);
    }
}
