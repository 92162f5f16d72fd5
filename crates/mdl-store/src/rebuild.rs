//! Rebuilding `meta.redb` from what is on disk, for when it is lost, overwritten or damaged:
//! the object index from the record files (every record carries its kind, codec, delta base
//! and lengths, and is checksummed), the commit index from the commit records, and refs,
//! reflogs, configuration and records of expiry from the journal ([`crate::journal`]).
//!
//! The new database is written beside the old one and renamed into place; the old one is kept
//! as `meta.redb.damaged-<ms>`. Nothing else in `.mdl/` changes except the journal, which is
//! rewritten as one entry of the rebuilt state (the old one is kept too when part of it was
//! unreadable).

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use mdl_codec::CodecTag;
use mdl_format::{record, Commit, ObjectId, ObjectKind, Ref, RefName, Timestamp};

use crate::error::db;
use crate::guard::guarded;
use crate::journal::{self, JournalState, JOURNAL_FILE};
use crate::meta::{
    dependent_key, open_err, CommitSummary, IndexEntry, Meta, Packed, RefValue, COMMITS, CONFIG,
    DEPENDENTS, EXPIRED, HEAD, INFO, META_FILE, OBJECTS, PACKS_VERSION, REFLOG, REFS, SHALLOW,
};
use crate::objects::{pack_files, read_table, record_files};
use crate::{LockMode, RepoLock, StoreError, MAX_CHAIN};

/// What a rebuild found and did.
#[derive(Clone, Debug, Default)]
pub struct Rebuilt {
    /// Objects indexed again.
    pub objects: u64,
    /// Commits among them.
    pub commits: u64,
    /// Refs restored.
    pub refs: u64,
    /// Record files that could not be used (damaged, or a delta whose base is not on disk).
    pub unusable: Vec<String>,
    /// Whether a journal was found (without one, refs are guessed: see [`rebuild`]).
    pub journal: bool,
    /// Bytes of the journal that were unreadable and skipped.
    pub journal_skipped_bytes: u64,
    /// Where the old database was moved, if there was one.
    pub moved_aside: Option<PathBuf>,
}

/// One record file, checked.
struct Scanned {
    generation: u32,
    kind: ObjectKind,
    codec: u8,
    base: Option<ObjectId>,
    stored_len: u64,
    content_len: u64,
    created: Timestamp,
    /// Where in a pack, for a record in one.
    pack: Option<Packed>,
}

/// Rebuilds the metadata database of the `.mdl` directory `dir` (waiting up to `wait` for the
/// repository's lock). Without a journal (a repository from before journals whose database
/// was lost), HEAD is `main`, `main` points at the newest commit that no other commit has as a
/// parent, and every other such commit gets a branch `recovered-<id>`.
pub fn rebuild(dir: &Path, wait: Duration) -> Result<Rebuilt, StoreError> {
    let _lock = RepoLock::acquire(dir, LockMode::Write, wait, "mdl fsck --repair")?;
    let mut out = Rebuilt::default();
    let mut disk = scan_records(dir, &mut out)?;
    let depth = chain_depths(&mut disk, &mut out);
    let OnDisk {
        records: found,
        commits: commit_bodies,
    } = disk;
    let mut objects: Vec<(ObjectId, IndexEntry)> = found
        .iter()
        .map(|(id, s)| (*id, s.entry(depth[id])))
        .collect();
    objects.sort_by_key(|(id, _)| *id);
    let commits: Vec<(ObjectId, CommitSummary)> = commit_bodies
        .iter()
        .map(|(id, c)| (*id, CommitSummary::of(c)))
        .collect();
    let mut state = journal_state(dir, &commits, &mut out)?;
    // An object on disk is not expired (it was stored again, or its deletion did not finish).
    state.expired.retain(|id, _| !found.contains_key(id));
    // A cut is kept only where its commit is.
    state.shallow.retain(|id| commit_bodies.contains_key(id));
    out.objects = objects.len() as u64;
    out.commits = commits.len() as u64;
    out.refs = state.refs.len() as u64;
    swap_in(dir, &objects, &commits, &state, &mut out)?;
    Ok(out)
}

impl Scanned {
    /// The index entry of the record, at chain depth `depth`.
    fn entry(&self, depth: u32) -> IndexEntry {
        IndexEntry {
            kind: self.kind,
            codec: self.codec,
            generation: self.generation,
            base: self.base,
            depth,
            stored_len: self.stored_len,
            content_len: self.content_len,
            created: self.created,
            pack: self.pack,
        }
    }
}

/// What the record files hold: per object, the newest generation that reads back intact, and
/// the commits' bodies.
struct OnDisk {
    records: HashMap<ObjectId, Scanned>,
    commits: HashMap<ObjectId, Commit>,
}

/// A record in a pack: the pack's path, where, and the record's length.
type InPack = (PathBuf, Packed, u64);

/// Scans the record files and the packs' records; those that do not read back go to
/// `out.unusable`. Of an object's records, the newest generation that reads back is taken (a
/// loose file before a packed record of the same generation).
fn scan_records(dir: &Path, out: &mut Rebuilt) -> Result<OnDisk, StoreError> {
    let mut candidates: Vec<(ObjectId, u32, Option<InPack>)> = record_files(dir)?
        .into_iter()
        .map(|(id, g)| (id, g, None))
        .collect();
    for (pack, path) in pack_files(dir)? {
        let table = std::fs::File::open(&path)
            .map_err(StoreError::io("open", &path))
            .and_then(|f| read_table(&f, &path));
        match table {
            Ok(table) => candidates.extend(table.into_iter().map(|e| {
                let at = Packed {
                    pack,
                    offset: e.offset,
                };
                (e.id, e.generation, Some((path.clone(), at, e.len)))
            })),
            Err(e) => out.unusable.push(e.to_string()),
        }
    }
    candidates.sort_by_key(|(id, g, packed)| (*id, std::cmp::Reverse(*g), packed.is_some()));
    let mut found: HashMap<ObjectId, Scanned> = HashMap::new();
    let mut commit_bodies: HashMap<ObjectId, Commit> = HashMap::new();
    for (id, generation, packed) in candidates {
        if found.contains_key(&id) {
            continue;
        }
        let (path, read) = match &packed {
            None => {
                let path = record_path(dir, &id, generation);
                let read = read_file(&path, 0, None);
                (path, read)
            }
            Some((path, at, len)) => (path.clone(), read_file(path, at.offset, Some(*len))),
        };
        let scanned = read.and_then(|(bytes, created)| {
            scan(
                &bytes,
                created,
                &id,
                generation,
                packed.map(|(_, at, _)| at),
            )
        });
        match scanned {
            Ok((s, commit)) => {
                if let Some(c) = commit {
                    commit_bodies.insert(id, c);
                }
                found.insert(id, s);
            }
            Err(why) => out
                .unusable
                .push(format!("{} ({id}): {why}", path.display())),
        }
    }
    Ok(OnDisk {
        records: found,
        commits: commit_bodies,
    })
}

/// `len` bytes of the file at `path` from `offset` (the whole file for `None`), and its
/// modification time.
fn read_file(path: &Path, offset: u64, len: Option<u64>) -> Result<(Vec<u8>, Timestamp), String> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let md = file.metadata().map_err(|e| e.to_string())?;
    let created = md
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(Timestamp::now(), |d| Timestamp(d.as_millis() as i64));
    let len = len.unwrap_or(md.len());
    let mut bytes = vec![0u8; usize::try_from(len).map_err(|e| e.to_string())?];
    file.read_exact_at(&mut bytes, offset)
        .map_err(|e| e.to_string())?;
    Ok((bytes, created))
}

/// Each object's chain depth. A delta whose base is not on disk (or is not a tensor, or
/// whose chain loops or is too long) cannot be read: it leaves `disk` for `out.unusable`,
/// with whatever decodes through it.
fn chain_depths(disk: &mut OnDisk, out: &mut Rebuilt) -> HashMap<ObjectId, u32> {
    let OnDisk {
        records: found,
        commits: commit_bodies,
    } = disk;
    let mut depth: HashMap<ObjectId, u32> = HashMap::new();
    let ids: Vec<ObjectId> = found.keys().copied().collect();
    for id in ids {
        let mut chain = vec![id];
        let resolved = loop {
            let at = *chain.last().expect("non-empty");
            if let Some(&d) = depth.get(&at) {
                break Some(d);
            }
            match found.get(&at).map(|s| s.base) {
                None => break None,
                Some(None) => {
                    depth.insert(at, 0);
                    break Some(0);
                }
                Some(Some(base)) => {
                    let base_ok = found
                        .get(&base)
                        .is_some_and(|b| b.kind == ObjectKind::Tensor);
                    if !base_ok || chain.contains(&base) || chain.len() > MAX_CHAIN as usize {
                        break None;
                    }
                    chain.push(base);
                }
            }
        };
        match resolved {
            Some(mut d) => {
                // Everything on the walked chain above the resolved object.
                for at in chain.iter().rev() {
                    if let Some(&known) = depth.get(at) {
                        d = known;
                        continue;
                    }
                    d += 1;
                    depth.insert(*at, d);
                }
            }
            None => {
                for at in chain {
                    if depth.contains_key(&at) {
                        break;
                    }
                    if let Some(s) = found.remove(&at) {
                        out.unusable.push(format!(
                            "{at}: delta base {} is not on disk",
                            s.base.map(|b| b.to_string()).unwrap_or_default()
                        ));
                    }
                    commit_bodies.remove(&at);
                }
            }
        }
    }
    depth
}

/// Refs, reflogs, configuration and expiry from the journal; without one, refs guessed from
/// `commits`.
fn journal_state(
    dir: &Path,
    commits: &[(ObjectId, CommitSummary)],
    out: &mut Rebuilt,
) -> Result<JournalState, StoreError> {
    let journal_path = dir.join(JOURNAL_FILE);
    if !journal_path.exists() {
        return Ok(guess_refs(commits));
    }
    let replayed = journal::replay(&journal_path)?;
    out.journal = true;
    out.journal_skipped_bytes = replayed.skipped.iter().map(|(_, n)| n).sum();
    Ok(replayed.state)
}

/// Writes the new database beside the old, then swaps them: the old one is moved aside (and
/// a journal with unreadable parts kept beside it), and the journal starts afresh from the
/// rebuilt state.
fn swap_in(
    dir: &Path,
    objects: &[(ObjectId, IndexEntry)],
    commits: &[(ObjectId, CommitSummary)],
    state: &JournalState,
    out: &mut Rebuilt,
) -> Result<(), StoreError> {
    let journal_path = dir.join(JOURNAL_FILE);
    let meta_path = dir.join(META_FILE);
    let fresh = dir.join(format!("{META_FILE}.rebuild"));
    let _ = std::fs::remove_file(&fresh);
    write_rebuilt(&fresh, objects, commits, state)?;
    let stamp = Timestamp::now().0;
    if meta_path.exists() {
        let aside = dir.join(format!("{META_FILE}.damaged-{stamp}"));
        std::fs::rename(&meta_path, &aside).map_err(StoreError::io("rename", &meta_path))?;
        out.moved_aside = Some(aside);
    }
    std::fs::rename(&fresh, &meta_path).map_err(StoreError::io("rename", &fresh))?;
    sync_dir(dir)?;
    if out.journal_skipped_bytes > 0 {
        let keep = dir.join(format!("{JOURNAL_FILE}.damaged-{stamp}"));
        std::fs::copy(&journal_path, &keep).map_err(StoreError::io("copy", &journal_path))?;
    }
    journal::write_fresh(&journal_path, &state.snapshot())?;
    Ok(())
}

/// Runs redb's integrity check (every page's checksum, the trees' structure) on a copy of the
/// database file at `path`, so the file itself is never modified. Returns what is wrong, or
/// `None` when it is sound.
pub fn check_file(path: &Path) -> Result<Option<String>, StoreError> {
    // In the system's temporary directory: the repository may be read-only.
    let copy = std::env::temp_dir().join(format!(
        "mdl-{META_FILE}-check-{}-{}",
        std::process::id(),
        Timestamp::now().0
    ));
    std::fs::copy(path, &copy).map_err(StoreError::io("copy", path))?;
    let result = guarded(|| {
        let mut database = redb::Database::open(&copy).map_err(open_err)?;
        database.check_integrity().map_err(db)
    });
    let _ = std::fs::remove_file(&copy);
    match result {
        Ok(true) => Ok(None),
        Ok(false) => Ok(Some("its checksums or structure do not hold".into())),
        Err(StoreError::Damaged(why)) => Ok(Some(why)),
        Err(e) => Err(e),
    }
}

/// Writes a new database at `path` holding `objects` (with their dependents links), `commits`
/// and the journaled `state`, made durable before this returns. Used to rebuild a lost or
/// damaged `meta.redb`; the journal is left alone.
fn write_rebuilt(
    path: &Path,
    objects: &[(ObjectId, IndexEntry)],
    commits: &[(ObjectId, CommitSummary)],
    state: &JournalState,
) -> Result<(), StoreError> {
    guarded(|| {
        Meta::create_tables(path)?;
        let database = redb::Database::open(path).map_err(db)?;
        let txn = database.begin_write().map_err(db)?;
        {
            let mut t = txn.open_table(OBJECTS).map_err(db)?;
            let mut deps = txn.open_table(DEPENDENTS).map_err(db)?;
            if objects.iter().any(|(_, e)| e.pack.is_some()) {
                txn.open_table(INFO)
                    .map_err(db)?
                    .insert("repo_version", PACKS_VERSION)
                    .map_err(db)?;
            }
            for (id, e) in objects {
                t.insert(id.as_bytes().as_slice(), e.encode().as_slice())
                    .map_err(db)?;
                if let Some(base) = &e.base {
                    deps.insert(dependent_key(base, id).as_slice(), ())
                        .map_err(db)?;
                }
            }
            let mut t = txn.open_table(COMMITS).map_err(db)?;
            for (id, c) in commits {
                t.insert(id.as_bytes().as_slice(), c.encode().as_slice())
                    .map_err(db)?;
            }
            let mut t = txn.open_table(REFS).map_err(db)?;
            for (name, v) in &state.refs {
                t.insert(name.as_str(), v.encode().as_slice()).map_err(db)?;
            }
            let mut t = txn.open_table(REFLOG).map_err(db)?;
            for (name, log) in &state.reflogs {
                for (seq, e) in log.iter().enumerate() {
                    t.insert((name.as_str(), seq as u64), e.encode().as_slice())
                        .map_err(db)?;
                }
            }
            let mut t = txn.open_table(CONFIG).map_err(db)?;
            for (k, v) in &state.config {
                t.insert(k.as_str(), v.as_str()).map_err(db)?;
            }
            let mut t = txn.open_table(EXPIRED).map_err(db)?;
            for (id, x) in &state.expired {
                t.insert(id.as_bytes().as_slice(), x.encode().as_slice())
                    .map_err(db)?;
            }
            let mut t = txn.open_table(SHALLOW).map_err(db)?;
            for id in &state.shallow {
                t.insert(id.as_bytes().as_slice(), ()).map_err(db)?;
            }
        }
        txn.commit().map_err(db)
    })
}

fn record_path(dir: &Path, id: &ObjectId, generation: u32) -> PathBuf {
    let hex = id.to_hex();
    dir.join("objects")
        .join(&hex[..2])
        .join(format!("{}.{generation}", &hex[2..]))
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(StoreError::io("sync", dir))
}

/// Checks a record's bytes: checksum and lengths for every record; for manifests and commits
/// (small) also the content hash, and a commit is parsed.
fn scan(
    bytes: &[u8],
    created: Timestamp,
    id: &ObjectId,
    generation: u32,
    pack: Option<Packed>,
) -> Result<(Scanned, Option<Commit>), String> {
    let (header, payload, trailer) = record::decode(bytes).map_err(|e| e.to_string())?;
    record::check_content_len(&header, payload.len() as u64, trailer.content_len)
        .map_err(|e| e.to_string())?;
    if header.base.is_some() && header.kind != ObjectKind::Tensor {
        return Err("only tensors may be deltas".into());
    }
    let mut commit = None;
    if header.kind != ObjectKind::Tensor {
        let codec = CodecTag::try_from(header.codec).map_err(|e| e.to_string())?;
        if !codec.is_streaming() || header.base.is_some() {
            return Err(format!("a {} in codec {codec:?}", header.kind.name()));
        }
        let mut data = Vec::new();
        mdl_codec::decoder(codec, Box::new(payload), trailer.content_len)
            .and_then(|mut d| d.read_to_end(&mut data))
            .map_err(|e| e.to_string())?;
        let mut h = mdl_format::TensorHasher::new(&header.prefix);
        h.update(&data);
        if h.finalize() != *id {
            return Err("content does not hash to its id".into());
        }
        if header.kind == ObjectKind::Commit {
            commit = Some(Commit::decode(&data).map_err(|e| e.to_string())?);
        }
    }
    Ok((
        Scanned {
            generation,
            kind: header.kind,
            codec: header.codec,
            base: header.base,
            stored_len: bytes.len() as u64,
            content_len: trailer.content_len,
            created,
            pack,
        },
        commit,
    ))
}

/// Refs for a repository whose journal is gone too: `main` on the newest commit no other
/// commit descends from, `recovered-<id>` on every other such commit.
fn guess_refs(commits: &[(ObjectId, CommitSummary)]) -> JournalState {
    let parents: HashSet<ObjectId> = commits
        .iter()
        .flat_map(|(_, c)| c.parents.iter().copied())
        .collect();
    let mut heads: Vec<&(ObjectId, CommitSummary)> = commits
        .iter()
        .filter(|(id, _)| !parents.contains(id))
        .collect();
    heads.sort_by_key(|(id, c)| (std::cmp::Reverse(c.time), *id));
    let mut state = JournalState::default();
    state
        .refs
        .insert(HEAD.into(), RefValue::Symbolic(Ref::main().full()));
    for (i, (id, _)) in heads.iter().enumerate() {
        let name = if i == 0 {
            Ref::main()
        } else {
            let short = RefName::new(&format!("recovered-{}", id.short(12)));
            Ref::Branch(short.expect("a valid branch name"))
        }
        .full();
        state.refs.insert(name, RefValue::Direct(*id));
    }
    state
}
