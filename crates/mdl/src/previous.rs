//! The parent commit's version of each tensor: the delta base and the previous lossy
//! configuration of a tensor being committed (and what `diff` matches a tensor with).

use std::collections::HashMap;

use mdl_format::{Entry, EntryView, Manifest, ManifestView};

/// The parent's tensors, found by file and name — or by name alone where the name is unique in
/// the parent, so that a tensor keeps its history when shards are cut differently or a file is
/// renamed. `E` is what is kept of each: a decoded entry, or a manifest view's
/// ([`Previous::of_view`], for a comparison of two large commits).
pub(crate) struct Previous<'a, E = &'a Entry> {
    /// File → name → entry.
    by_path: HashMap<&'a str, HashMap<&'a str, E>>,
    /// The file holding each name; `None` where several files hold it.
    by_name: HashMap<&'a str, Option<&'a str>>,
}

impl<E> Default for Previous<'_, E> {
    fn default() -> Self {
        Previous {
            by_path: HashMap::new(),
            by_name: HashMap::new(),
        }
    }
}

impl<'a> Previous<'a> {
    /// The tensors of `parent` (none for a first commit).
    pub(crate) fn of(parent: Option<&'a Manifest>) -> Self {
        let mut p = Previous::default();
        if let Some(m) = parent {
            for (f, e) in m.tensors() {
                p.add(m.files[f].path.as_str(), e.name.as_str(), e);
            }
        }
        p
    }
}

impl<'a> Previous<'a, (usize, EntryView<'a>)> {
    /// The tensors of the manifest `m` reads in place, each with its number in tree order.
    pub(crate) fn of_view(m: &ManifestView<'a>) -> Self {
        let mut p = Previous::default();
        for (n, (f, e)) in m.tensors().enumerate() {
            p.add(m.files()[f].path, e.name, (n, e));
        }
        p
    }
}

impl<'a, E: Copy> Previous<'a, E> {
    fn add(&mut self, path: &'a str, name: &'a str, e: E) {
        self.by_path.entry(path).or_default().insert(name, e);
        self.by_name
            .entry(name)
            .and_modify(|v| *v = None)
            .or_insert(Some(path));
    }

    /// The parent's version of the tensor `name` of the file at `path`.
    pub(crate) fn get(&self, path: &str, name: &str) -> Option<E> {
        let in_file = |path: &str| self.by_path.get(path)?.get(name).copied();
        in_file(path).or_else(|| in_file((*self.by_name.get(name)?)?))
    }
}
