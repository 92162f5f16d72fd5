//! `.mdl/journal`: an append-only log of every change to what `meta.redb` holds and the object
//! records cannot tell — refs, reflogs, configuration, records of expiry and where a shallow
//! clone's history was cut. The index of
//! objects and commits is rebuilt from the records themselves; these are rebuilt from here
//! ([`crate::rebuild`]).
//!
//! A write transaction's changes are appended as one entry and made durable *before* the
//! transaction commits, so the journal never lacks a change that `meta.redb` has. A transaction
//! that then fails to commit is followed by an abort entry; one cut short by a crash between
//! the two steps is replayed as if it had committed (its records were durable before it began,
//! so what it names is whole). A torn or damaged entry is skipped: each entry starts with a
//! magic number and carries a checksum, so reading resumes at the next one.
//!
//! ```text
//! entry:  "MDLJ" | u32 len | u32 crc32(body) | body (len bytes)
//! body:   u8 version=1 | u32 n | change × n       (n = 0 and one change of tag 6: abort)
//! change: u8 tag | …
//!   1 ref          str name | u8 has | [bytes ref value]        (deleting a ref drops its reflog;
//!                                                               a deletion is followed by the
//!                                                               reflog it keeps, entry by entry)
//!   2 reflog       str name | bytes reflog entry                (appended to the ref's reflog)
//!   3 expire       str name | i64 before_ms                     (reflog entries before it go)
//!   4 config       str key | u8 has | [str value]
//!   5 expired      id | u8 has | [bytes expired entry]
//!   6 abort        (the previous entry's transaction did not commit)
//!   7 shallow      id | u8 cut                                  (a commit whose parents this
//!                                                               repository does not hold, on
//!                                                               purpose: where a shallow
//!                                                               clone's history was cut)
//! ```
//! `str`/`bytes` are a u32 length and the bytes; values use `meta.redb`'s encodings
//! (`docs/FORMAT.md`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use mdl_format::{ObjectId, Timestamp};

use crate::values::{Cursor, Expired, RefValue, ReflogEntry};
use crate::StoreError;

/// The journal file inside `.mdl`.
pub const JOURNAL_FILE: &str = "journal";

const MAGIC: &[u8; 4] = b"MDLJ";
const VERSION: u8 = 1;
/// Longest entry a reader accepts (a snapshot of a repository with very many refs).
const MAX_ENTRY: u32 = 1 << 30;

/// One change to the journaled state.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Change {
    Ref {
        name: String,
        value: Option<RefValue>,
    },
    Reflog {
        name: String,
        entry: ReflogEntry,
    },
    ExpireReflog {
        name: String,
        before: Timestamp,
    },
    Config {
        key: String,
        value: Option<String>,
    },
    Expired {
        id: ObjectId,
        value: Option<Expired>,
    },
    Shallow {
        id: ObjectId,
        cut: bool,
    },
    Abort,
}

/// What the journal says `meta.redb` holds besides the index.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JournalState {
    /// Refs by full name.
    pub refs: BTreeMap<String, RefValue>,
    /// Reflogs by ref name, oldest first.
    pub reflogs: BTreeMap<String, Vec<ReflogEntry>>,
    /// Configuration.
    pub config: BTreeMap<String, String>,
    /// Records of expiry.
    pub expired: BTreeMap<ObjectId, Expired>,
    /// Commits whose parents are not here on purpose (a shallow clone's cut).
    pub shallow: BTreeSet<ObjectId>,
}

impl JournalState {
    fn apply(&mut self, change: &Change) {
        match change {
            Change::Ref {
                name,
                value: Some(v),
            } => {
                self.refs.insert(name.clone(), v.clone());
            }
            Change::Ref { name, value: None } => {
                self.refs.remove(name);
                self.reflogs.remove(name);
            }
            Change::Reflog { name, entry } => {
                self.reflogs
                    .entry(name.clone())
                    .or_default()
                    .push(entry.clone());
            }
            Change::ExpireReflog { name, before } => {
                if let Some(log) = self.reflogs.get_mut(name) {
                    log.retain(|e| e.time >= *before);
                    if log.is_empty() {
                        self.reflogs.remove(name);
                    }
                }
            }
            Change::Config {
                key,
                value: Some(v),
            } => {
                self.config.insert(key.clone(), v.clone());
            }
            Change::Config { key, value: None } => {
                self.config.remove(key);
            }
            Change::Expired { id, value: Some(x) } => {
                self.expired.insert(*id, x.clone());
            }
            Change::Expired { id, value: None } => {
                self.expired.remove(id);
            }
            Change::Shallow { id, cut: true } => {
                self.shallow.insert(*id);
            }
            Change::Shallow { id, cut: false } => {
                self.shallow.remove(id);
            }
            Change::Abort => {}
        }
    }

    /// The changes that rebuild this state from nothing.
    pub(crate) fn snapshot(&self) -> Vec<Change> {
        let mut out = Vec::new();
        for (name, value) in &self.refs {
            out.push(Change::Ref {
                name: name.clone(),
                value: Some(value.clone()),
            });
        }
        for (name, log) in &self.reflogs {
            for entry in log {
                out.push(Change::Reflog {
                    name: name.clone(),
                    entry: entry.clone(),
                });
            }
        }
        for (key, value) in &self.config {
            out.push(Change::Config {
                key: key.clone(),
                value: Some(value.clone()),
            });
        }
        for (id, x) in &self.expired {
            out.push(Change::Expired {
                id: *id,
                value: Some(x.clone()),
            });
        }
        for id in &self.shallow {
            out.push(Change::Shallow { id: *id, cut: true });
        }
        out
    }
}

/// What reading a journal found.
#[derive(Clone, Debug, Default)]
pub struct Replayed {
    /// The state after every committed entry.
    pub state: JournalState,
    /// The state without the last entry: what the database holds if a process was killed
    /// between appending that entry and committing its transaction.
    pub before_last: JournalState,
    /// Entries applied.
    pub entries: u64,
    /// Byte ranges inside the journal skipped as damaged (offset, length).
    pub skipped: Vec<(u64, u64)>,
    /// Where an entry cut short by a crash during its append begins, if the journal ends so.
    pub torn_tail: Option<u64>,
}

/// Reads the journal at `path` and replays it.
pub fn replay(path: &Path) -> Result<Replayed, StoreError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(StoreError::io("read", path))?;
    Ok(replay_bytes(&bytes))
}

fn replay_bytes(bytes: &[u8]) -> Replayed {
    let mut entries: Vec<Vec<Change>> = Vec::new();
    let mut skipped = Vec::new();
    let mut at = 0usize;
    let mut bad_from: Option<usize> = None;
    while at < bytes.len() {
        match parse_entry(&bytes[at..]) {
            Some((changes, len)) => {
                if let Some(from) = bad_from.take() {
                    skipped.push((from as u64, (at - from) as u64));
                }
                if changes == [Change::Abort] {
                    entries.pop();
                } else {
                    entries.push(changes);
                }
                at += len;
            }
            None => {
                bad_from.get_or_insert(at);
                // Resume at the next magic number.
                at += 1;
                match bytes[at..].windows(4).position(|w| w == MAGIC) {
                    Some(p) => at += p,
                    None => at = bytes.len(),
                }
            }
        }
    }
    let replay = |entries: &[Vec<Change>]| {
        let mut state = JournalState::default();
        for c in entries.iter().flatten() {
            state.apply(c);
        }
        state
    };
    Replayed {
        state: replay(&entries),
        before_last: replay(&entries[..entries.len().saturating_sub(1)]),
        entries: entries.len() as u64,
        skipped,
        torn_tail: bad_from.map(|from| from as u64),
    }
}

/// Parses the entry at the start of `b`; `None` if it is not a whole, intact entry.
fn parse_entry(b: &[u8]) -> Option<(Vec<Change>, usize)> {
    if b.len() < 12 || &b[..4] != MAGIC {
        return None;
    }
    let len = u32::from_le_bytes(b[4..8].try_into().ok()?);
    let crc = u32::from_le_bytes(b[8..12].try_into().ok()?);
    if len > MAX_ENTRY || b.len() < 12 + len as usize {
        return None;
    }
    let body = &b[12..12 + len as usize];
    if crc32fast::hash(body) != crc {
        return None;
    }
    let changes = decode_body(body)?;
    Some((changes, 12 + len as usize))
}

fn decode_body(body: &[u8]) -> Option<Vec<Change>> {
    let mut r = Cursor(body);
    if r.u8()? != VERSION {
        return None;
    }
    let n = r.u32()?;
    if n == 0 {
        return (r.u8()? == 6 && r.is_empty()).then(|| vec![Change::Abort]);
    }
    let mut out = Vec::with_capacity(n.min(1 << 16) as usize);
    for _ in 0..n {
        let change = match r.u8()? {
            1 => Change::Ref {
                name: r.string()?,
                value: match r.u8()? {
                    0 => None,
                    _ => Some(RefValue::decode(r.bytes()?).ok()?),
                },
            },
            2 => Change::Reflog {
                name: r.string()?,
                entry: ReflogEntry::decode(r.bytes()?).ok()?,
            },
            3 => Change::ExpireReflog {
                name: r.string()?,
                before: Timestamp(r.u64()? as i64),
            },
            4 => Change::Config {
                key: r.string()?,
                value: match r.u8()? {
                    0 => None,
                    _ => Some(r.string()?),
                },
            },
            5 => Change::Expired {
                id: r.id()?,
                value: match r.u8()? {
                    0 => None,
                    _ => Some(Expired::decode(r.bytes()?).ok()?),
                },
            },
            7 => Change::Shallow {
                id: r.id()?,
                cut: match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return None,
                },
            },
            _ => return None,
        };
        out.push(change);
    }
    r.is_empty().then_some(out)
}

fn encode_entry(changes: &[Change]) -> Vec<u8> {
    let mut body = vec![VERSION];
    let put_bytes = |v: &mut Vec<u8>, b: &[u8]| {
        v.extend_from_slice(&(b.len() as u32).to_le_bytes());
        v.extend_from_slice(b);
    };
    if changes == [Change::Abort] {
        body.extend_from_slice(&0u32.to_le_bytes());
        body.push(6);
    } else {
        body.extend_from_slice(&(changes.len() as u32).to_le_bytes());
        for c in changes {
            match c {
                Change::Ref { name, value } => {
                    body.push(1);
                    put_bytes(&mut body, name.as_bytes());
                    match value {
                        None => body.push(0),
                        Some(v) => {
                            body.push(1);
                            put_bytes(&mut body, &v.encode());
                        }
                    }
                }
                Change::Reflog { name, entry } => {
                    body.push(2);
                    put_bytes(&mut body, name.as_bytes());
                    put_bytes(&mut body, &entry.encode());
                }
                Change::ExpireReflog { name, before } => {
                    body.push(3);
                    put_bytes(&mut body, name.as_bytes());
                    body.extend_from_slice(&before.0.to_le_bytes());
                }
                Change::Config { key, value } => {
                    body.push(4);
                    put_bytes(&mut body, key.as_bytes());
                    match value {
                        None => body.push(0),
                        Some(v) => {
                            body.push(1);
                            put_bytes(&mut body, v.as_bytes());
                        }
                    }
                }
                Change::Expired { id, value } => {
                    body.push(5);
                    body.extend_from_slice(id.as_bytes());
                    match value {
                        None => body.push(0),
                        Some(x) => {
                            body.push(1);
                            put_bytes(&mut body, &x.encode());
                        }
                    }
                }
                Change::Shallow { id, cut } => {
                    body.push(7);
                    body.extend_from_slice(id.as_bytes());
                    body.push(u8::from(*cut));
                }
                Change::Abort => unreachable!("an abort is an entry of its own"),
            }
        }
    }
    let mut out = Vec::with_capacity(12 + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// The journal of a repository opened for writing.
#[derive(Debug)]
pub(crate) struct Journal {
    path: PathBuf,
    file: Mutex<File>,
}

impl Journal {
    /// Opens the journal in `dir` (the `.mdl` directory) for appending, given the database's
    /// current state. When there is none yet (a repository made before journals) it starts as
    /// a snapshot of that state. What a writer killed mid-way left is cleared up: an entry cut
    /// short is cut off, and an entry whose transaction never committed (the journal is one
    /// entry ahead of the database) is followed by an abort.
    pub(crate) fn open(dir: &Path, current: &JournalState) -> Result<Journal, StoreError> {
        let path = dir.join(JOURNAL_FILE);
        if !path.exists() {
            write_fresh(&path, &current.snapshot())?;
        }
        let replayed = replay(&path)?;
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(StoreError::io("open", &path))?;
        if let Some(end) = replayed.torn_tail {
            file.set_len(end)
                .and_then(|_| file.sync_all())
                .map_err(StoreError::io("truncate", &path))?;
        }
        let journal = Journal {
            path,
            file: Mutex::new(file),
        };
        if replayed.state != *current && replayed.before_last == *current {
            journal.append(&[Change::Abort])?;
        }
        Ok(journal)
    }

    /// Appends one transaction's changes and makes them durable.
    pub(crate) fn append(&self, changes: &[Change]) -> Result<(), StoreError> {
        let entry = encode_entry(changes);
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        f.write_all(&entry)
            .and_then(|_| f.sync_data())
            .map_err(StoreError::io("append to", &self.path))
    }

    /// Replaces the journal with one entry holding `changes` (a snapshot of the current state),
    /// atomically: a crash leaves the old journal or the new one.
    pub(crate) fn rewrite(&self, changes: &[Change]) -> Result<(), StoreError> {
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        write_fresh(&self.path, changes)?;
        *f = OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(StoreError::io("open", &self.path))?;
        Ok(())
    }
}

/// Writes a journal holding `changes` as one entry at `path`, through a temporary file that is
/// made durable and renamed into place.
pub(crate) fn write_fresh(path: &Path, changes: &[Change]) -> Result<(), StoreError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".{JOURNAL_FILE}-{}", std::process::id()));
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(&encode_entry(changes))?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(StoreError::io("write", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Vec<Change>> {
        let c = |b: &[u8]| ObjectId::hash(b);
        vec![
            vec![
                Change::Ref {
                    name: "refs/heads/main".into(),
                    value: Some(RefValue::Direct(c(b"a"))),
                },
                Change::Reflog {
                    name: "refs/heads/main".into(),
                    entry: ReflogEntry {
                        old: None,
                        new: Some(c(b"a")),
                        time: Timestamp(10),
                        message: "commit".into(),
                    },
                },
                Change::Config {
                    key: "delta.mode".into(),
                    value: Some("reverse".into()),
                },
                Change::Shallow {
                    id: c(b"a"),
                    cut: true,
                },
            ],
            vec![Change::Expired {
                id: c(b"x"),
                value: Some(Expired {
                    kind: mdl_format::ObjectKind::Tensor,
                    content_len: 4,
                    time: Timestamp(3),
                    rule: "retention.keep_last=1".into(),
                }),
            }],
            vec![
                Change::Ref {
                    name: "refs/heads/main".into(),
                    value: Some(RefValue::Direct(c(b"b"))),
                },
                Change::Shallow {
                    id: c(b"b"),
                    cut: true,
                },
            ],
            vec![Change::Abort],
            vec![Change::ExpireReflog {
                name: "refs/heads/main".into(),
                before: Timestamp(5),
            }],
        ]
    }

    #[test]
    fn replay_applies_committed_entries_and_skips_aborted_and_damaged_ones() {
        let entries: Vec<Vec<u8>> = sample().iter().map(|c| encode_entry(c)).collect();
        let all = entries.concat();
        let r = replay_bytes(&all);
        assert!(r.skipped.is_empty());
        assert_eq!(r.entries, 3, "the aborted entry is not counted");
        // The aborted move of main did not happen; the reflog entry at 10 survives the expiry.
        assert_eq!(
            r.state.refs["refs/heads/main"],
            RefValue::Direct(ObjectId::hash(b"a"))
        );
        assert_eq!(r.state.reflogs["refs/heads/main"].len(), 1);
        assert_eq!(r.state.config["delta.mode"], "reverse");
        assert_eq!(r.state.expired.len(), 1);
        let cut: Vec<ObjectId> = r.state.shallow.iter().copied().collect();
        assert_eq!(
            cut,
            [ObjectId::hash(b"a")],
            "the aborted entry's cut is not kept"
        );
        // A snapshot replays to the same state.
        let snap = encode_entry(&r.state.snapshot());
        assert_eq!(replay_bytes(&snap).state, r.state);

        // Any flipped bit loses at most the entry it falls in; a torn tail loses only itself.
        for i in 0..all.len() {
            let mut bad = all.clone();
            bad[i] ^= 0x08;
            let got = replay_bytes(&bad);
            let noticed = !got.skipped.is_empty() || got.torn_tail.is_some();
            assert!(noticed || got.state == r.state, "flip at {i}");
            assert!(got.entries >= 2, "flip at {i} lost more than one entry");
        }
        // Cut anywhere: exactly the whole entries before the cut are replayed.
        for cut in 0..all.len() {
            let mut whole = 0;
            let mut end = 0;
            while whole < entries.len() && end + entries[whole].len() <= cut {
                end += entries[whole].len();
                whole += 1;
            }
            let want = replay_bytes(&entries[..whole].concat()).state;
            assert_eq!(replay_bytes(&all[..cut]).state, want, "cut at {cut}");
        }
    }
}
