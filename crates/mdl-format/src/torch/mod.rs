//! `torch.save` archives: where each storage's bytes lie, with its dtype and a name, read from
//! the zip's directory and the pickle without executing anything (`docs/DECISIONS.md`).
//!
//! An archive is a zip of stored (uncompressed) entries under one folder `P/`: `P/data.pkl`,
//! the pickled object graph, whose tensors name their storages by persistent ids
//! `('storage', torch.FloatStorage, key, location, numel)`; `P/data/{key}`, each storage's
//! bytes; `P/byteorder` and a few small records. [`split`] finds the storages; everything else
//! of the file is kept as bytes by the caller, so the file is rebuilt exactly.

use std::collections::{HashMap, HashSet};

use crate::{Dtype, TensorHeader};

mod pickle;
mod zip;

use pickle::{Id, Value};

/// Largest `data.pkl` read (a checkpoint's is kilobytes to a few megabytes).
pub const MAX_PICKLE_LEN: u64 = 64 << 20;

/// Why a file could not be split as a torch archive.
#[derive(Debug, thiserror::Error)]
pub enum TorchError {
    /// Not a zip archive mdl can read.
    #[error("not a readable zip archive: {0}")]
    Zip(String),
    /// A zip, but not laid out as `torch.save` writes.
    #[error("not a torch archive: {0}")]
    NotTorch(String),
    /// An opcode outside the set torch writes.
    #[error("pickle opcode {op:#04x} at byte {at} is not one torch writes")]
    Opcode {
        /// The opcode.
        op: u8,
        /// Its offset in `data.pkl`.
        at: usize,
    },
    /// A malformed or oversized pickle.
    #[error("pickle: {0}")]
    Pickle(String),
}

/// One storage of an archive.
#[derive(Clone, Debug, PartialEq)]
pub struct Storage {
    /// The path in the object graph of the first tensor viewing it (`state.0.exp_avg`).
    pub name: String,
    /// Its dtype, and the viewing tensor's shape where that tensor covers the whole storage
    /// contiguously, else `[numel]`.
    pub header: TensorHeader,
    /// Where its bytes start in the file.
    pub offset: u64,
}

/// What [`split`] found: the storages that become tensors, and the other entries' bytes (so
/// that a caller can store each entry's bytes apart from the headers between them).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Archive {
    /// Storages with a known dtype, in file order.
    pub storages: Vec<Storage>,
    /// `(offset, len)` of every other entry's bytes, in file order.
    pub others: Vec<(u64, u64)>,
}

/// Whether `file` looks like a zip archive (so a failure to split it deserves a note).
pub fn looks_like_zip(file: &[u8]) -> bool {
    zip::looks_like_zip(file)
}

/// A `torch.save` archive's directory, the folder its entries lie in, and its parsed pickle.
struct Opened {
    entries: Vec<zip::ZipEntry>,
    prefix: String,
    graph: pickle::Pickle,
}

/// Reads a `torch.save` archive's directory and pickle.
pub fn split(file: &[u8]) -> Result<Archive, TorchError> {
    let Opened {
        entries,
        prefix,
        graph,
    } = open(file)?;
    let refs = storage_refs(&graph);

    let mut storages = Vec::new();
    let mut others = Vec::new();
    let data_dir = format!("{prefix}data/");
    for e in &entries {
        let storage = e
            .name
            .strip_prefix(&data_dir)
            .and_then(|key| refs.get(key))
            .and_then(|r| r.header(e.len));
        match storage {
            Some((name, header)) => storages.push(Storage {
                name,
                header,
                offset: e.data_offset,
            }),
            None => others.push((e.data_offset, e.len)),
        }
    }
    storages.sort_by_key(|s| s.offset);
    others.sort_unstable();
    // Entries never share bytes (a crafted directory could point two at one run).
    let mut runs: Vec<(u64, u64)> = storages
        .iter()
        .map(|s| (s.offset, s.header.data_len().unwrap_or(0)))
        .chain(others.iter().copied())
        .collect();
    runs.sort_unstable();
    if runs.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
        return Err(TorchError::Zip("entries overlap".into()));
    }
    Ok(Archive { storages, others })
}

/// Adam's `(β1, β2)` as a `torch.save` archive records them: an optimizer state dict's
/// `param_groups` (`"betas": (β1, β2)`), or Hugging Face `TrainingArguments` (`adam_beta1`,
/// `adam_beta2`). Where several groups record different values, the largest of each: a larger
/// β makes the bias-corrected moments larger, which is the quality estimate's safe side.
/// `None` when the archive records none (values outside `[0, 1)` are not betas).
pub fn adam_betas(file: &[u8]) -> Result<Option<(f64, f64)>, TorchError> {
    let g = open(file)?.graph;
    let number = |id: Id| {
        match g.values[id] {
            Value::Float(x) => Some(x),
            Value::Int(i) => Some(i as f64),
            _ => None,
        }
        .filter(|x| (0.0..1.0).contains(x))
    };
    let mut found: Option<(f64, f64)> = None;
    for v in &g.values {
        let items = match v {
            Value::Dict(items) | Value::Object { items, .. } => items,
            _ => continue,
        };
        let get = |name: &str| {
            items
                .iter()
                .find(|(k, _)| matches!(&g.values[*k], Value::Str(s) if s == name))
                .map(|&(_, v)| v)
        };
        let pair = match get("betas").map(|b| &g.values[b]) {
            Some(Value::Tuple(b) | Value::List(b)) if b.len() == 2 => {
                number(b[0]).zip(number(b[1]))
            }
            _ => get("adam_beta1")
                .and_then(number)
                .zip(get("adam_beta2").and_then(number)),
        };
        if let Some((b1, b2)) = pair {
            found = Some(found.map_or((b1, b2), |(a1, a2)| (a1.max(b1), a2.max(b2))));
        }
    }
    Ok(found)
}

/// Reads an archive's directory and parses its pickle.
fn open(file: &[u8]) -> Result<Opened, TorchError> {
    let entries = zip::entries(file)?;
    let not_torch = |why: String| TorchError::NotTorch(why);
    let pkl = entries
        .iter()
        .find(|e| e.name.ends_with("/data.pkl") && e.name.matches('/').count() == 1)
        .ok_or_else(|| not_torch("no data.pkl".into()))?;
    let prefix = &pkl.name[..pkl.name.len() - "data.pkl".len()];
    if let Some(e) = entries.iter().find(|e| !e.name.starts_with(prefix)) {
        return Err(not_torch(format!("entry {:?} outside {prefix}", e.name)));
    }
    if let Some(e) = entries
        .iter()
        .find(|e| e.method != 0 || e.len != e.uncompressed_len)
    {
        return Err(not_torch(format!("entry {:?} is compressed", e.name)));
    }
    let byteorder = entries
        .iter()
        .find(|e| e.name == format!("{prefix}byteorder"))
        .map(|e| &file[e.data_offset as usize..(e.data_offset + e.len) as usize]);
    if byteorder.is_some_and(|b| b != b"little") {
        return Err(not_torch("big-endian storages".into()));
    }
    if pkl.len > MAX_PICKLE_LEN {
        return Err(TorchError::Pickle(format!("data.pkl of {} bytes", pkl.len)));
    }
    let graph =
        pickle::parse(&file[pkl.data_offset as usize..(pkl.data_offset + pkl.len) as usize])?;
    let prefix = prefix.to_string();
    Ok(Opened {
        entries,
        prefix,
        graph,
    })
}

/// A tensor's view of its storage: offset, size and stride, in elements.
type View = (i64, Vec<i64>, Vec<i64>);

/// What the pickle says of one storage.
struct StorageRef {
    dtype: Option<Dtype>,
    numel: u64,
    /// The first tensor viewing it: its path, offset, size and stride.
    name: String,
    view: Option<View>,
}

impl StorageRef {
    /// Its name and header, when its dtype is known and its bytes are exactly its elements.
    fn header(&self, len: u64) -> Option<(String, TensorHeader)> {
        let dtype = self.dtype?;
        if self.numel.checked_mul(dtype.size() as u64) != Some(len) {
            return None;
        }
        let whole = match &self.view {
            Some((0, size, stride)) => {
                let numel = size.iter().try_fold(1i64, |a, &d| a.checked_mul(d));
                let mut expect = 1i64;
                let contiguous = size.iter().zip(stride).rev().all(|(&d, &s)| {
                    let ok = d == 1 || s == expect;
                    expect = expect.saturating_mul(d);
                    ok
                });
                (numel == Some(self.numel as i64) && contiguous && size.iter().all(|&d| d >= 0))
                    .then(|| size.iter().map(|&d| d as u64).collect::<Vec<_>>())
            }
            _ => None,
        };
        let shape = whole.unwrap_or_else(|| vec![self.numel]);
        (shape.len() <= TensorHeader::MAX_RANK)
            .then(|| (self.name.clone(), TensorHeader::new(dtype, shape)))
    }
}

/// The storage behind each key, named by the first tensor that views it, walking the graph
/// depth first in the order it was pickled.
fn storage_refs(g: &pickle::Pickle) -> HashMap<String, StorageRef> {
    let mut out: HashMap<String, StorageRef> = HashMap::new();
    let mut seen = HashSet::new();
    // (value, its path, the tensor view it is the storage of)
    let mut todo: Vec<(Id, String, Option<View>)> = vec![(g.root, String::new(), None)];
    let join = |path: &str, key: &str| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    };
    while let Some((id, path, view)) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        let mut children: Vec<(Id, String, Option<View>)> = Vec::new();
        match &g.values[id] {
            Value::PersistentId(pid) => {
                if let Some((key, r)) = storage_ref(g, *pid, &path, view) {
                    out.entry(key).or_insert(r);
                }
            }
            Value::Tuple(items) | Value::List(items) | Value::Set(items) => {
                for (i, &v) in items.iter().enumerate() {
                    children.push((v, join(&path, &i.to_string()), None));
                }
            }
            Value::Dict(items) => {
                for &(k, v) in items {
                    children.push((v, join(&path, &key_name(g, k)), None));
                }
            }
            Value::Object {
                callable,
                args,
                items,
                list,
                state,
            } => {
                // A tensor: `_rebuild_tensor_v2(storage, offset, size, stride, …)`; its
                // storage is named by the tensor's path.
                let rebuild = matches!(&g.values[*callable], Value::Global(n)
                    if n.starts_with("torch._utils._rebuild_tensor"));
                match (&g.values[*args], rebuild) {
                    (Value::Tuple(a), true) if a.len() >= 4 => {
                        let view = (|| {
                            let Value::Int(offset) = g.values[a[1]] else {
                                return None;
                            };
                            Some((offset, ints(g, a[2])?, ints(g, a[3])?))
                        })();
                        children.push((a[0], path.clone(), view));
                    }
                    // Any other call's arguments and state belong to the object at `path`.
                    _ => children.push((*args, path.clone(), None)),
                }
                for &(k, v) in items {
                    children.push((v, join(&path, &key_name(g, k)), None));
                }
                for (i, &v) in list.iter().enumerate() {
                    children.push((v, join(&path, &i.to_string()), None));
                }
                if let Some(s) = state {
                    children.push((*s, path.clone(), None));
                }
            }
            _ => {}
        }
        todo.extend(children.into_iter().rev());
    }
    out
}

/// A persistent id `('storage', type, key, location, numel)` as a storage reference.
fn storage_ref(
    g: &pickle::Pickle,
    pid: Id,
    path: &str,
    view: Option<View>,
) -> Option<(String, StorageRef)> {
    let Value::Tuple(t) = &g.values[pid] else {
        return None;
    };
    let [tag, ty, key, _location, numel] = t.as_slice() else {
        return None;
    };
    match (
        &g.values[*tag],
        &g.values[*ty],
        &g.values[*key],
        &g.values[*numel],
    ) {
        (Value::Str(tag), Value::Global(ty), Value::Str(key), &Value::Int(numel))
            if tag == "storage" && numel >= 0 =>
        {
            let dtype = ty.strip_prefix("torch.").and_then(storage_dtype);
            Some((
                key.clone(),
                StorageRef {
                    dtype,
                    numel: numel as u64,
                    name: if path.is_empty() {
                        key.clone()
                    } else {
                        path.to_string()
                    },
                    view,
                },
            ))
        }
        _ => None,
    }
}

/// The dtype of a torch storage class.
fn storage_dtype(class: &str) -> Option<Dtype> {
    Some(match class {
        "FloatStorage" => Dtype::F32,
        "DoubleStorage" => Dtype::F64,
        "HalfStorage" => Dtype::F16,
        "BFloat16Storage" => Dtype::BF16,
        "LongStorage" => Dtype::I64,
        "IntStorage" => Dtype::I32,
        "ShortStorage" => Dtype::I16,
        "CharStorage" => Dtype::I8,
        "ByteStorage" | "UntypedStorage" => Dtype::U8,
        "BoolStorage" => Dtype::Bool,
        "ComplexFloatStorage" => Dtype::C64,
        "Float8_e4m3fnStorage" => Dtype::F8E4M3,
        "Float8_e5m2Storage" => Dtype::F8E5M2,
        "UInt16Storage" => Dtype::U16,
        "UInt32Storage" => Dtype::U32,
        "UInt64Storage" => Dtype::U64,
        _ => return None,
    })
}

/// A dict key as a name component.
fn key_name(g: &pickle::Pickle, k: Id) -> String {
    match &g.values[k] {
        Value::Str(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::None => "None".into(),
        _ => "?".into(),
    }
}

/// A tuple of integers.
fn ints(g: &pickle::Pickle, id: Id) -> Option<Vec<i64>> {
    match &g.values[id] {
        Value::Tuple(items) => items
            .iter()
            .map(|&i| match g.values[i] {
                Value::Int(v) => Some(v),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
