//! A file handed over in parts: a safetensors file whose header and tensors lie in separate
//! buffers of the caller's (a training state's own tensors, committed while the caller waits),
//! read where they lie instead of first being copied into one buffer of the file's size.

use std::path::PathBuf;

use crate::{Error, Result};

/// A caller's buffer, read in place.
pub(crate) type Buffer = Box<dyn AsRef<[u8]> + Send + Sync>;

/// The parts of a file, one after another: part `k` is bytes `starts[k]..starts[k + 1]`.
pub(crate) struct Parts {
    parts: Vec<Buffer>,
    /// Where each part starts; the file's length last.
    starts: Vec<u64>,
}

impl Parts {
    /// `parts` one after another (empty ones left out).
    pub(crate) fn new(parts: Vec<Buffer>) -> Parts {
        let parts: Vec<Buffer> = parts
            .into_iter()
            .filter(|p| !(**p).as_ref().is_empty())
            .collect();
        let mut starts = Vec::with_capacity(parts.len() + 1);
        let mut at = 0u64;
        starts.push(0);
        for p in &parts {
            at += (**p).as_ref().len() as u64;
            starts.push(at);
        }
        Parts { parts, starts }
    }

    /// The file's length.
    pub(crate) fn len(&self) -> u64 {
        *self.starts.last().expect("starts holds the length")
    }

    /// The first part (a safetensors file's header, as the caller cut it); empty if none.
    pub(crate) fn head(&self) -> &[u8] {
        self.parts.first().map_or(&[], |p| (**p).as_ref())
    }

    /// Each part with where it starts.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.starts
            .iter()
            .zip(&self.parts)
            .map(|(&s, p)| (s, (**p).as_ref()))
    }

    /// Bytes `start..start + len`, if they lie within one part (an empty range always does).
    pub(crate) fn get(&self, start: u64, len: u64) -> Option<&[u8]> {
        if len == 0 {
            return Some(&[]);
        }
        let k = self
            .starts
            .partition_point(|&s| s <= start)
            .checked_sub(1)?;
        let part = (**self.parts.get(k)?).as_ref();
        let at = (start - self.starts[k]) as usize;
        part.get(at..at.checked_add(len as usize)?)
    }

    /// An error unless every range of `ranges` lies within one part: what the file is cut
    /// into (its header, its tensors) must be whole parts or within them.
    pub(crate) fn check(
        &self,
        path: &str,
        mut ranges: impl Iterator<Item = (u64, u64)>,
    ) -> Result<()> {
        match ranges.find(|&(start, len)| self.get(start, len).is_none()) {
            None => Ok(()),
            Some((start, len)) => Err(Error::Input {
                path: PathBuf::from(path),
                source: std::io::Error::other(format!(
                    "bytes {start}..{} span two of the parts the file was given in (its \
                     header and each tensor must each lie within one part)",
                    start + len
                )),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(lens: &[usize]) -> Parts {
        let mut next = 0u8;
        Parts::new(
            lens.iter()
                .map(|&n| {
                    let v: Vec<u8> = (0..n)
                        .map(|_| {
                            next = next.wrapping_add(1);
                            next
                        })
                        .collect();
                    Box::new(v) as Buffer
                })
                .collect(),
        )
    }

    #[test]
    fn a_range_is_found_within_its_part_and_refused_across_two() {
        let p = parts(&[3, 0, 4, 2]);
        assert_eq!(p.len(), 9);
        assert_eq!(p.head(), &[1, 2, 3]);
        assert_eq!(p.get(0, 3), Some(&[1u8, 2, 3][..]));
        assert_eq!(p.get(4, 2), Some(&[5u8, 6][..]));
        assert_eq!(p.get(7, 2), Some(&[8u8, 9][..]));
        assert_eq!(p.get(9, 0), Some(&[][..]));
        assert_eq!(p.get(2, 2), None, "across the first two parts");
        assert_eq!(p.get(8, 2), None, "past the end");
        let whole: Vec<u8> = p.iter().flat_map(|(_, b)| b.to_vec()).collect();
        assert_eq!(whole, (1..=9).collect::<Vec<u8>>());
        assert!(p.check("f", [(0, 3), (3, 4), (7, 2)].into_iter()).is_ok());
        let e = p.check("f", [(0, 3), (3, 5)].into_iter()).unwrap_err();
        assert!(e.to_string().contains("span two of the parts"), "{e}");
    }
}
