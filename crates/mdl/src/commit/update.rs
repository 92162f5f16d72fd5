//! Trees made of other trees without reading their files again: a commit that changes some
//! files of the branch's tree (the Hugging Face API's uploads — `create_commit`,
//! `upload_file`, `upload_folder` — each adding or replacing files and deleting others,
//! everything else staying as it was), and the union of trees `assemble` also makes.

use std::collections::{HashMap, HashSet};

use mdl_format::{Manifest, MomentPair};

use crate::{Error, Result};

/// The tree of `parent` (none: an empty one) with the files of `changed` added or replacing
/// theirs, and each path of `deleted` removed (a file, or a folder with everything under it).
/// A deleted path that the parent's tree does not hold is refused, naming it.
pub(crate) fn overlay(
    changed: Manifest,
    parent: Option<&Manifest>,
    parent_name: &str,
    deleted: &[String],
) -> Result<Manifest> {
    let empty = Manifest::new(Vec::new(), Vec::new()).expect("an empty tree");
    let parent = parent.unwrap_or(&empty);
    let under = |path: &str, d: &str| {
        let d = d.trim_end_matches('/');
        path == d
            || path
                .strip_prefix(d)
                .is_some_and(|rest| rest.starts_with('/'))
    };
    for d in deleted {
        if !parent.files.iter().any(|f| under(&f.path, d)) {
            return Err(Error::NoSuchPath {
                path: d.clone(),
                commit: parent_name.to_string(),
            });
        }
    }
    let replaced: HashSet<&str> = changed.files.iter().map(|f| f.path.as_str()).collect();
    let keep = |path: &str| !replaced.contains(path) && !deleted.iter().any(|d| under(path, d));
    let files: Vec<_> = parent
        .files
        .iter()
        .filter(|f| keep(&f.path))
        .cloned()
        .collect();
    // The parent's moment pairs among the kept files, renumbered by name into their tree.
    let names: Vec<(&str, &str)> = parent
        .tensors()
        .map(|(f, e)| (parent.files[f].path.as_str(), e.name.as_str()))
        .collect();
    let kept = Manifest::new(files, Vec::new()).map_err(|e| Error::Assemble(e.to_string()))?;
    let index: HashMap<(&str, &str), u32> = kept
        .tensors()
        .enumerate()
        .map(|(i, (f, e))| ((kept.files[f].path.as_str(), e.name.as_str()), i as u32))
        .collect();
    let at = |i: u32| index.get(&names[i as usize]).copied();
    let pairs: Vec<MomentPair> = parent
        .pairs
        .iter()
        .filter_map(|p| {
            Some(MomentPair {
                param: at(p.param)?,
                exp_avg: at(p.exp_avg)?,
                exp_avg_sq: at(p.exp_avg_sq)?,
                source: p.source,
            })
        })
        .collect();
    let kept =
        Manifest::new(kept.files.clone(), pairs).map_err(|e| Error::Assemble(e.to_string()))?;
    union(vec![kept, changed]).map_err(Error::Assemble)
}

/// One tree of the files of `manifests` (their paths distinct), each one's moment pairs
/// renumbered into the combined tree's tensors.
pub(crate) fn union(manifests: Vec<Manifest>) -> std::result::Result<Manifest, String> {
    let mut files = Vec::new();
    let mut moved = Vec::new();
    for m in manifests {
        moved.push((tensor_names(&m), m.pairs));
        files.extend(m.files);
    }
    let manifest = Manifest::new(files, Vec::new()).map_err(|e| e.to_string())?;
    let index: HashMap<(&str, &str), u32> = manifest
        .tensors()
        .enumerate()
        .map(|(i, (f, e))| ((manifest.files[f].path.as_str(), e.name.as_str()), i as u32))
        .collect();
    let mut pairs = Vec::new();
    for (names, part_pairs) in &moved {
        let at = |i: u32| index[&(names[i as usize].0.as_str(), names[i as usize].1.as_str())];
        pairs.extend(part_pairs.iter().map(|p| MomentPair {
            param: at(p.param),
            exp_avg: at(p.exp_avg),
            exp_avg_sq: at(p.exp_avg_sq),
            source: p.source,
        }));
    }
    Ok(Manifest::new(manifest.files, pairs).expect("the files were just checked"))
}

/// Each tensor of `manifest`, in order, as `(file path, name)`.
fn tensor_names(manifest: &Manifest) -> Vec<(String, String)> {
    manifest
        .tensors()
        .map(|(f, e)| (manifest.files[f].path.clone(), e.name.clone()))
        .collect()
}
