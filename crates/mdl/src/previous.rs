//! The parent commit's version of each tensor: the delta base and the previous lossy
//! configuration of a tensor being committed (and what `diff` matches a tensor with).

use std::collections::HashMap;

use mdl_format::{Entry, Manifest};

/// A tensor's file and name.
pub(crate) type Key<'a> = (&'a str, &'a str);

/// The parent's tensors, found by file and name — or by name alone where the name is unique in
/// the parent, so that a tensor keeps its history when shards are cut differently or a file is
/// renamed.
#[derive(Default)]
pub(crate) struct Previous<'a> {
    /// File → name → entry.
    by_path: HashMap<&'a str, HashMap<&'a str, &'a Entry>>,
    /// The file holding each name; `None` where several files hold it.
    by_name: HashMap<&'a str, Option<&'a str>>,
}

impl<'a> Previous<'a> {
    /// The tensors of `parent` (none for a first commit).
    pub(crate) fn of(parent: Option<&'a Manifest>) -> Self {
        let mut p = Previous::default();
        if let Some(m) = parent {
            for (f, e) in m.tensors() {
                let path = m.files[f].path.as_str();
                p.by_path
                    .entry(path)
                    .or_default()
                    .insert(e.name.as_str(), e);
                p.by_name
                    .entry(e.name.as_str())
                    .and_modify(|v| *v = None)
                    .or_insert(Some(path));
            }
        }
        p
    }

    /// The parent's version of the tensor `name` of the file at `path`.
    pub(crate) fn get(&self, path: &str, name: &str) -> Option<&'a Entry> {
        self.get_keyed(path, name).map(|(_, e)| e)
    }

    /// [`Self::get`], with the file and name the version has in the parent.
    pub(crate) fn get_keyed(&self, path: &str, name: &str) -> Option<(Key<'a>, &'a Entry)> {
        let in_file = |path: &str, name: &str| {
            let (&p, names) = self.by_path.get_key_value(path)?;
            let (&n, &e) = names.get_key_value(name)?;
            Some(((p, n), e))
        };
        in_file(path, name).or_else(|| {
            let p = (*self.by_name.get(name)?)?;
            in_file(p, name)
        })
    }
}
