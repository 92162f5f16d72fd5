//! The parent commit's version of each tensor: the delta base and the previous lossy
//! configuration of a tensor being committed (and what `diff` matches a tensor with).

use std::collections::HashSet;

use mdl_format::{Entry, EntryView, Manifest, ManifestView, ObjectId};

/// The parent's tensors, found by file and name — or by name alone where the name is unique in
/// the parent, so that a tensor keeps its history when shards are cut differently or a file is
/// renamed. `E` is what is kept of each: a decoded entry, or a manifest view's with its number
/// ([`Previous::of_view`], for a comparison of two large commits). Kept as sorted lists, not
/// maps: about 80 bytes a tensor, where two hash maps took about 180.
pub(crate) struct Previous<'a, E = &'a Entry> {
    /// (file, name, entry), sorted by file then name.
    by_path: Vec<(&'a str, &'a str, E)>,
    /// Places in `by_path`, sorted by name.
    by_name: Vec<u32>,
}

impl<'a> Previous<'a> {
    /// The tensors of `parent` (none for a first commit).
    pub(crate) fn of(parent: Option<&'a Manifest>) -> Self {
        let tensors = parent.into_iter().flat_map(|m| {
            m.tensors()
                .map(|(f, e)| (m.files[f].path.as_str(), e.name.as_str(), e))
        });
        Previous::sorted(tensors.collect())
    }

    /// The objects the parent names more than once (tied or equal tensors): a version another
    /// tensor's delta may still be taken against.
    pub(crate) fn repeated(&self) -> HashSet<ObjectId> {
        let mut seen = HashSet::with_capacity(self.by_path.len());
        self.by_path
            .iter()
            .filter(|(_, _, e)| !seen.insert(e.id))
            .map(|(_, _, e)| e.id)
            .collect()
    }
}

impl<'a> Previous<'a, (usize, EntryView<'a>)> {
    /// The tensors of the manifest `m` reads in place, each with its number in tree order.
    pub(crate) fn of_view(m: &ManifestView<'a>) -> Self {
        let mut tensors = Vec::with_capacity(m.tensor_count() as usize);
        for (n, (f, e)) in m.tensors().enumerate() {
            tensors.push((m.files()[f].path, e.name, (n, e)));
        }
        Previous::sorted(tensors)
    }
}

impl<'a, E: Copy> Previous<'a, E> {
    fn sorted(mut by_path: Vec<(&'a str, &'a str, E)>) -> Self {
        by_path.sort_by(|x, y| (x.0, x.1).cmp(&(y.0, y.1)));
        let mut by_name: Vec<u32> = (0..by_path.len() as u32).collect();
        by_name.sort_by_key(|&i| by_path[i as usize].1);
        Previous { by_path, by_name }
    }

    /// The parent's version of the tensor `name` of the file at `path`.
    pub(crate) fn get(&self, path: &str, name: &str) -> Option<E> {
        // The last of repeats, as a map would keep.
        let at = self
            .by_path
            .partition_point(|&(p, n, _)| (p, n) <= (path, name));
        if let Some(&(p, n, e)) = at.checked_sub(1).map(|i| &self.by_path[i]) {
            if (p, n) == (path, name) {
                return Some(e);
            }
        }
        let name_of = |i: &u32| self.by_path[*i as usize].1;
        let first = self.by_name.partition_point(|i| name_of(i) < name);
        match &self.by_name[first..] {
            [only, rest @ ..]
                if name_of(only) == name && rest.first().map(name_of) != Some(name) =>
            {
                Some(self.by_path[*only as usize].2)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn found_by_file_and_name_or_by_a_name_the_parent_has_once() {
        let p = Previous::sorted(vec![
            ("b.st", "w", 1),
            ("a.st", "w", 2),
            ("a.st", "x", 3),
            ("c.st", "y", 4),
            ("a.st", "x", 5),
        ]);
        assert_eq!(p.get("a.st", "w"), Some(2));
        assert_eq!(p.get("b.st", "w"), Some(1));
        assert_eq!(p.get("a.st", "x"), Some(5), "the last of repeats");
        // Not in that file: by name alone, only where the parent has it once.
        assert_eq!(p.get("d.st", "y"), Some(4));
        assert_eq!(p.get("d.st", "w"), None);
        assert_eq!(p.get("d.st", "x"), None);
        assert_eq!(p.get("a.st", "z"), None);
        let empty: Previous<'_, u8> = Previous::sorted(vec![]);
        assert_eq!(empty.get("a", "b"), None);
    }
}
