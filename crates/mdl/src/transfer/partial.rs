//! The start of a record that a fetch was cut off inside, kept so that the next fetch goes on
//! from there (`docs/HTTP_API.md`, `resume`). A fetch writes each record it streams (over 4
//! MiB) into `.mdl/partial/ID.LEN.TAG` as it arrives — the record of `ID`, `LEN` bytes long —
//! and renames it into the store once whole; so a fetch cut off, or killed, leaves its start
//! there. Nothing trusts it: the sender goes on from it only if its own record starts with the
//! same bytes (their hash), and the record joined from it and the rest is checked like any
//! other (checksum, content hash).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use mdl_format::ObjectId;
use mdl_protocol::body::Resume;

use crate::{Error, Repository, Result};

/// The folder under `.mdl` that holds it (gc and `fsck --repair` remove what is left there, as
/// they do uploads in `incoming/`).
pub(crate) const DIR: &str = "partial";

/// Fewer bytes than this of a record cut off are not kept.
const MIN_KEPT: u64 = 1 << 20;

/// The kept start of a record.
#[derive(Clone, Debug)]
pub struct Partial {
    /// The record's object.
    pub id: ObjectId,
    /// The whole record's length.
    pub len: u64,
    /// The bytes kept (fewer than `len`).
    pub held: u64,
    path: PathBuf,
}

/// Where `repo` writes the record of `id`, `len` bytes long, as it arrives: a new file of
/// [`DIR`].
pub(super) fn path_for(repo: &Repository, id: &ObjectId, len: u64) -> Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = repo.store().dir().join(DIR);
    (repo.store().storage().create_dir_all(&dir)).map_err(|source| Error::Output {
        path: dir.clone(),
        source,
    })?;
    let tag = format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    Ok(dir.join(format!("{id}.{len}.{tag}")))
}

/// The record a file of [`DIR`] named `name` is the start of: its id and length.
fn parse(name: &str) -> Option<(ObjectId, u64)> {
    let mut parts = name.split('.');
    let id = parts.next()?.parse().ok()?;
    let len = parts.next()?.parse().ok()?;
    Some((id, len))
}

impl Partial {
    /// The record start `repo` keeps, if any: the longest of the record written last (a fetch
    /// writes one record at a time; a record gone on from and cut again leaves two starts). The
    /// others, and a file whose name or length does not fit, are removed.
    pub fn find(repo: &Repository) -> Result<Option<Partial>> {
        let dir = repo.store().dir().join(DIR);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(None);
        };
        let mut found: Vec<(std::time::SystemTime, Partial)> = Vec::new();
        for e in entries.flatten() {
            let path = e.path();
            let meta = e.metadata().ok();
            match (e.file_name().to_str().and_then(parse), meta) {
                (Some((id, len)), Some(m)) if m.is_file() && m.len() < len => {
                    let time = m.modified().unwrap_or(std::time::UNIX_EPOCH);
                    let held = m.len();
                    found.push((
                        time,
                        Partial {
                            id,
                            len,
                            held,
                            path,
                        },
                    ));
                }
                _ => remove(repo, &path),
            }
        }
        let last = found
            .iter()
            .max_by_key(|(time, _)| *time)
            .map(|(_, p)| p.id);
        let best = (found.iter().enumerate())
            .filter(|(_, (_, p))| Some(p.id) == last)
            .max_by_key(|(_, (_, p))| p.held)
            .map(|(i, _)| i);
        let mut kept = None;
        for (i, (_, p)) in found.into_iter().enumerate() {
            match Some(i) == best {
                true => kept = Some(p),
                false => p.remove(repo),
            }
        }
        Ok(kept)
    }

    /// What a fetch asks the sender to go on from: the bytes held, hashed.
    pub fn resume(&self) -> Result<Resume> {
        let digest =
            ObjectId::hash_reader(&mut self.open()?).map_err(|source| self.unreadable(source))?;
        Ok(Resume {
            id: self.id,
            len: self.len,
            held: self.held,
            digest,
        })
    }

    /// The bytes held, to be read first.
    pub(super) fn open(&self) -> Result<std::io::Take<std::fs::File>> {
        let file = std::fs::File::open(&self.path).map_err(|source| self.unreadable(source))?;
        Ok(file.take(self.held))
    }

    fn unreadable(&self, source: std::io::Error) -> Error {
        Error::Input {
            path: self.path.clone(),
            source,
        }
    }

    /// Removes it from `repo` (it was used, or no longer fits).
    pub fn remove(&self, repo: &Repository) {
        remove(repo, &self.path);
    }
}

/// Removes the kept start at `path`.
pub(super) fn remove(repo: &Repository, path: &Path) {
    if !repo.store().remove_leftover(path) {
        tracing::debug!("cannot remove {}", path.display());
    }
}

/// Keeps what arrived of a record that `w` was writing into `path` ([`path_for`]) when the
/// pack was cut off, for the next fetch to go on from, if it is enough to be worth it: whether
/// it is kept. The receiver removes it again unless the pack was cut off.
pub(super) fn keep(repo: &Repository, w: mdl_store::RecordWriter<'_, '_>, path: &Path) -> bool {
    match w.keep() {
        Ok(kept) if kept >= MIN_KEPT => {
            tracing::info!(kept, "kept the start of a record cut off");
            true
        }
        Ok(_) => {
            remove(repo, path);
            false
        }
        Err(e) => {
            tracing::debug!("cannot keep the start of a record: {e}");
            false
        }
    }
}
