//! A file's bytes checked against its commit as they arrive (a checkout from a server): each
//! object's run hashed to its id, each inline run compared, the length the manifest's. The
//! bytes pass through to where they are written; [`CheckedFile::finish`] says whether they
//! were the commit's, before the file is renamed into place. A lossy tensor that retention
//! coarsened decodes to other bytes than its id names: those are handed back with their hash,
//! for the caller to check against the record's own claim.

use std::io::{self, Write};

use mdl_format::{ObjectId, Region, TensorHasher, TreeFile};

/// What the next bytes of a file must be.
enum Run {
    /// Exactly these.
    Inline(Vec<u8>),
    /// An object's bytes: `len` of them, whose hash with its header in front is `id` (or, for
    /// a lossy tensor, what its record says it was coarsened to).
    Object {
        id: ObjectId,
        len: u64,
        lossy: bool,
        hasher: Box<TensorHasher>,
    },
}

/// A file being checked as it is written through (see the module's documentation).
pub struct CheckedFile<W> {
    path: String,
    inner: W,
    runs: Vec<Run>,
    /// The run being read, and bytes of it read so far.
    at: usize,
    done: u64,
    /// The first way the bytes differed from the commit's.
    wrong: Option<String>,
    /// Lossy tensors whose bytes hash to another id than theirs: (id, the hash).
    unverified: Vec<(ObjectId, ObjectId)>,
}

impl<W: Write> CheckedFile<W> {
    /// Checks what is written through it against `file` of a manifest, writing it to `inner`.
    pub fn new(file: &TreeFile, inner: W) -> Self {
        let runs = file
            .regions
            .iter()
            .filter(|r| !r.is_empty())
            .map(|r| match (r, r.object()) {
                (Region::Inline(bytes), _) => Run::Inline(bytes.clone()),
                (_, Some((id, header))) => Run::Object {
                    id,
                    len: r.len(),
                    lossy: matches!(r, Region::Tensor(e) if e.exactness.is_lossy()),
                    hasher: Box::new(TensorHasher::new(&header.canonical())),
                },
                (_, None) => unreachable!("only inline regions have no object"),
            })
            .collect();
        CheckedFile {
            path: file.path.clone(),
            inner,
            runs,
            at: 0,
            done: 0,
            wrong: None,
            unverified: Vec::new(),
        }
    }

    /// Checks `bytes`, the next of the file.
    fn check(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && self.wrong.is_none() {
            let Some(run) = self.runs.get_mut(self.at) else {
                self.wrong = Some("longer than the commit's".into());
                return;
            };
            let len = match run {
                Run::Inline(b) => b.len() as u64,
                Run::Object { len, .. } => *len,
            };
            let take = (len - self.done).min(bytes.len() as u64) as usize;
            let (now, rest) = bytes.split_at(take);
            match run {
                Run::Inline(b) => {
                    let start = self.done as usize;
                    if b[start..start + take] != *now {
                        self.wrong = Some(format!(
                            "bytes {}..{} differ from the commit's",
                            start,
                            start + take
                        ));
                    }
                }
                Run::Object { hasher, .. } => hasher.update(now),
            }
            self.done += take as u64;
            if self.done == len {
                if let Run::Object {
                    id, hasher, lossy, ..
                } = run
                {
                    let got = hasher.finalize();
                    if got != *id && *lossy {
                        self.unverified.push((*id, got));
                    } else if got != *id {
                        self.wrong =
                            Some(format!("object {} differs from the commit's", id.short(12)));
                    }
                }
                self.at += 1;
                self.done = 0;
            }
            bytes = rest;
        }
    }

    /// Whether every byte was the commit's and none is missing; gives back where they went,
    /// and the lossy tensors still to be checked against their records' claims of coarsening
    /// (id, the hash of the bytes received).
    #[allow(clippy::type_complexity)]
    pub fn finish(self) -> Result<(W, Vec<(ObjectId, ObjectId)>), String> {
        let wrong = self.wrong.or_else(|| {
            (self.at < self.runs.len()).then(|| "shorter than the commit's".to_string())
        });
        match wrong {
            Some(why) => Err(format!("{}: {why}", self.path)),
            None => Ok((self.inner, self.unverified)),
        }
    }
}

impl<W: Write> Write for CheckedFile<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.check(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mdl_format::{bytes_header, Dtype, Entry, Exactness, FileFormat, TensorHeader};

    fn file(content: &[u8]) -> TreeFile {
        let tensor = &content[4..12];
        let header = TensorHeader::new(Dtype::F32, vec![2]);
        let blob = &content[12..];
        TreeFile {
            path: "a/b.bin".into(),
            format: FileFormat::Bytes,
            executable: false,
            note: String::new(),
            metadata: Vec::new(),
            regions: vec![
                Region::Inline(content[..4].to_vec()),
                Region::Tensor(Entry {
                    name: "w".into(),
                    id: header.object_id(tensor),
                    header,
                    exactness: Exactness::Lossless,
                }),
                Region::Bytes {
                    id: bytes_header(blob.len() as u64).object_id(blob),
                    len: blob.len() as u64,
                },
            ],
        }
    }

    fn written(f: &TreeFile, pieces: &[&[u8]]) -> Result<Vec<u8>, String> {
        let mut c = CheckedFile::new(f, Vec::new());
        for p in pieces {
            c.write_all(p).unwrap();
        }
        let (bytes, unverified) = c.finish()?;
        assert!(unverified.is_empty());
        Ok(bytes)
    }

    #[test]
    fn the_commits_bytes_pass_and_any_other_is_refused() {
        let content: Vec<u8> = (0u8..40).collect();
        let f = file(&content);
        // In any pieces.
        assert_eq!(written(&f, &[&content]).unwrap(), content);
        assert_eq!(
            written(&f, &[&content[..3], &content[3..13], &content[13..]]).unwrap(),
            content
        );
        for at in [0, 5, 20, 39] {
            let mut bad = content.clone();
            bad[at] ^= 1;
            let e = written(&f, &[&bad]).unwrap_err();
            assert!(e.starts_with("a/b.bin: "), "{e}");
        }
        assert!(written(&f, &[&content[..39]])
            .unwrap_err()
            .contains("shorter"));
        let mut long = content.clone();
        long.push(0);
        assert!(written(&f, &[&long]).unwrap_err().contains("longer"));
    }

    #[test]
    fn a_lossy_tensor_of_other_bytes_is_handed_back_with_their_hash() {
        let content: Vec<u8> = (0u8..40).collect();
        let mut f = file(&content);
        let Region::Tensor(e) = &mut f.regions[1] else {
            unreachable!()
        };
        e.exactness = Exactness::Lossy(mdl_format::Lossy {
            settings: String::new(),
            max_abs_error: 0.0,
            rel_error: 0.0,
            est_delta_loss: None,
        });
        let id = e.id;
        let mut other = content.clone();
        other[6] ^= 1;
        let mut c = CheckedFile::new(&f, Vec::new());
        c.write_all(&other).unwrap();
        let (bytes, unverified) = c.finish().unwrap();
        assert_eq!(bytes, other);
        let got = TensorHeader::new(Dtype::F32, vec![2]).object_id(&other[4..12]);
        assert_eq!(unverified, [(id, got)]);
        // A byte object is never lossy: a change there is refused at once.
        let mut c = CheckedFile::new(&f, Vec::new());
        other[30] ^= 1;
        c.write_all(&other).unwrap();
        assert!(c.finish().is_err());
    }
}
