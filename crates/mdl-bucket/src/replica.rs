//! [`Replica`]: a machine's copy of a repository in object storage, in its cache. Commands run
//! on the copy: [`Replica::open`] brings it up to date with the bucket (packs it has not
//! applied, then every ref and the settings), and [`Replica::publish`] sends what a command
//! changed (one pack of the new records, then each changed ref by a conditional write against
//! the version read). The bucket is the truth: a replica can be deleted at any time, and the
//! next command makes it again.

// The cache folder around the replica (its lock, the list of applied packs) is this crate's,
// not a repository's `.mdl`, which only the store writes.
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, HashSet};
use std::io::{BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mdl::transfer::{self, Frame, PackWriter, Toc};
use mdl::{ObjectId, OpenOptions, Ref, RefValue, Repository};

use crate::client::{Bucket, Version};
use crate::layout::{self, Marker};
use crate::location::Location;
use crate::records::Records;
use crate::{Error, Result};

/// The replica's work folder inside its cache folder.
const REPO_DIR: &str = "repo";
/// A pack up to this size is read whole; of a larger one, its last bytes this long are read
/// first: its table of contents, and usually its manifests and commits.
const TAIL_READ: u64 = 64 << 10;
/// Held by the process using the replica.
const LOCK: &str = "lock";
/// How often a commit that lost the race for its branch is replayed on the winner's.
const REPLAYS: usize = 8;
/// How often a sync lists packs again for a ref that names a commit no applied pack holds
/// (its pack was published after the listing).
const SYNC_ROUNDS: usize = 4;

/// The folder that holds the replicas of repositories in object storage: `s3/` in the user's
/// cache folder ([`mdl::user_cache_dir`]).
pub fn cache_root() -> PathBuf {
    mdl::user_cache_dir().join("s3")
}

/// A failure of the cache folder around the replica (not of the bucket or the replica).
fn cache_err(path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Cache { path, source }
}

/// An object in the bucket that no mdl writer wrote (`why` names it).
fn not_ours(url: String, why: String) -> Error {
    Error::Storage { url, why }
}

/// What the replica last read from the bucket.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// Every ref object (a deleted ref as `None`), with the version read.
    pub(crate) refs: BTreeMap<String, (Option<RefValue>, Version)>,
    /// The settings object, if there is one.
    config: Option<(BTreeMap<String, String>, Version)>,
    /// Objects (commits included) the bucket holds, as far as the packs applied and sent tell,
    /// less those only packs a gc marked hold: what a publish need not send.
    objects: HashSet<ObjectId>,
    /// Commits this replica made and sent since: the only ones a lost race replays.
    sent: HashSet<ObjectId>,
    /// The packs in the bucket when the sync listed them.
    pub(crate) packs: Vec<String>,
    /// The packs a gc marked for deletion, with the version read.
    pub(crate) pending: Option<(layout::Pending, Version)>,
}

impl Seen {
    /// Whether the bucket holds `id` in a pack no gc marked, as far as the last sync tells.
    pub(crate) fn holds(&self, id: &ObjectId) -> bool {
        self.objects.contains(id)
    }
}

/// How what ran on a replica reaches the bucket ([`Replica::finish`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Publish {
    /// Commits made here are replayed onto another writer's newer tip ([`Replica::publish`]).
    Replaying,
    /// History brought from elsewhere keeps its ids: a lost race is refused, never replayed
    /// ([`Replica::publish_exact`]).
    Exactly,
    /// A read: nothing is sent.
    Nothing,
}

/// What [`Replica::publish`] sent.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Published {
    /// The pack uploaded, if the command added records.
    pub pack: Option<String>,
    /// Objects in it.
    pub objects: u64,
    /// Its bytes.
    pub bytes: u64,
    /// Refs changed in the bucket, by full name.
    pub refs: Vec<String>,
    /// Commits replayed onto another writer's (old id, new id).
    pub replayed: Vec<(ObjectId, ObjectId)>,
}

/// A machine's copy of a repository in object storage.
#[derive(Debug)]
pub struct Replica {
    pub(crate) bucket: Arc<Bucket>,
    /// Where the records of the packs applied and sent are in the bucket.
    pub(crate) records: Arc<Records>,
    dir: PathBuf,
    pub(crate) seen: Seen,
    _lock: std::fs::File,
}

/// Creates the repository at `loc`: its marker, written only if absent.
pub fn init(loc: &Location) -> Result<()> {
    let bucket = Bucket::open(loc)?;
    let marker = Marker {
        format: layout::FORMAT,
        head: Ref::main().full(),
    };
    let bytes = serde_json::to_vec_pretty(&marker).expect("the marker serializes");
    match bucket.create(layout::MARKER, bytes)? {
        Some(_) => Ok(()),
        None => Err(Error::AlreadyExists(loc.url())),
    }
}

impl Replica {
    /// Opens this machine's replica of `loc` under `cache` (made on first use), waiting up to
    /// `wait` for another process of this machine that uses it, and brings it up to date.
    pub fn open(loc: &Location, cache: &Path, wait: Duration) -> Result<Replica> {
        let bucket = Arc::new(Bucket::open(loc)?);
        let marker = match bucket.get(layout::MARKER)? {
            Some((bytes, _)) => serde_json::from_slice::<Marker>(&bytes).map_err(|e| {
                not_ours(
                    loc.url(),
                    format!("{} is not one mdl wrote: {e}", layout::MARKER),
                )
            })?,
            None => return Err(Error::NotARepository(loc.url())),
        };
        if marker.format > layout::FORMAT {
            return Err(Error::Unsupported(format!(
                "{} has layout version {}; this mdl reads up to {}: upgrade mdl",
                loc.url(),
                marker.format,
                layout::FORMAT
            )));
        }
        let dir = Self::dir_of(loc, cache);
        std::fs::create_dir_all(&dir).map_err(cache_err(&dir))?;
        let lock_path = dir.join(LOCK);
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(cache_err(&lock_path))?;
        let started = Instant::now();
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if started.elapsed() < wait => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(Error::Conflict(format!(
                    "another mdl process on this machine is using its copy of {} ({}); waited {} s",
                    loc.url(),
                    dir.display(),
                    wait.as_secs()
                )))
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(cache_err(&lock_path)(e)),
            }
        }
        let _ = std::fs::write(dir.join("location"), format!("{}\n", loc.url()));
        let root = dir.join(REPO_DIR);
        if !root.join(mdl::MDL_DIR).exists() {
            let repo = Repository::init(&root)?;
            if marker.head != Ref::main().full() {
                let name = marker.head.trim_start_matches(Ref::BRANCHES);
                mdl::refs::switch(&repo, name)?;
            }
        }
        // Every store opened on the replica in this process fetches the records it lacks.
        let records = Arc::new(Records::new(bucket.clone(), &dir));
        mdl::source::register(&root.join(mdl::MDL_DIR), records.clone());
        let mut replica = Replica {
            bucket,
            records,
            dir,
            seen: Seen::default(),
            _lock: lock,
        };
        let repo = replica.repository(wait)?;
        replica.sync(&repo)?;
        Ok(replica)
    }

    /// The folder under `cache` of the replica of `loc` (one per endpoint, bucket and prefix).
    fn dir_of(loc: &Location, cache: &Path) -> PathBuf {
        let key = blake3::hash(
            format!(
                "{}\n{}\n{}",
                Location::endpoint().unwrap_or_default(),
                loc.bucket,
                loc.prefix
            )
            .as_bytes(),
        );
        cache.join(&key.to_hex()[..24])
    }

    /// The work folder of the replica of `loc` under `cache` ([`Self::root`]), made or not.
    pub fn root_of(loc: &Location, cache: &Path) -> PathBuf {
        Self::dir_of(loc, cache).join(REPO_DIR)
    }

    /// The client, with its request counts.
    pub fn bucket(&self) -> &Bucket {
        &self.bucket
    }

    /// The replica's work folder: commands open it as a local repository.
    pub fn root(&self) -> PathBuf {
        self.dir.join(REPO_DIR)
    }

    /// Opens the replica for writing.
    pub fn repository(&self, wait: Duration) -> Result<Repository> {
        let opts = OpenOptions {
            wait,
            purpose: format!("mdl replica of {}", self.bucket.url()),
            ..OpenOptions::default()
        };
        Ok(Repository::open(&self.root(), &opts)?)
    }

    /// Brings the replica up to date: every pack not applied yet, then the refs (moved,
    /// created and deleted as in the bucket) and the settings.
    pub fn sync(&mut self, repo: &Repository) -> Result<()> {
        let mut round = 0;
        let (refs, objects, packs, pending) = loop {
            round += 1;
            let packs = self.apply_packs(repo)?;
            let refs = self.read_refs()?;
            let pending: Option<(layout::Pending, Version)> = self.read_json(layout::GC_PENDING)?;
            let marked = pending.as_ref().map(|(p, _)| p.packs.as_slice());
            let (objects, in_marked) = self.in_bucket(&packs, marked.unwrap_or_default())?;
            let unknown = refs
                .iter()
                .filter_map(|(name, (v, _))| Some((name, v.as_ref()?.target()?)))
                .find(|(_, id)| !objects.contains(id) && !in_marked.contains(id));
            match unknown {
                None => break (refs, objects, packs, pending),
                Some((name, id)) if round >= SYNC_ROUNDS => {
                    return Err(Error::Storage {
                        url: self.bucket.url().to_string(),
                        why: format!("{name} names commit {id}, which no pack holds"),
                    })
                }
                Some(_) => continue,
            }
        };
        let ours: BTreeMap<String, RefValue> = mdl::refs::all(repo)?.into_iter().collect();
        let message = format!("sync {}", self.bucket.url());
        for (name, (value, _)) in &refs {
            let mine = ours.get(name);
            if mine != value.as_ref() {
                mdl::refs::replace(repo, name, mine, value.as_ref(), &message)?;
            }
        }
        for (name, mine) in &ours {
            if !refs.contains_key(name) {
                mdl::refs::replace(repo, name, Some(mine), None, &message)?;
            }
        }
        let config: Option<(BTreeMap<String, String>, Version)> = self.read_json(layout::CONFIG)?;
        if let Some((settings, _)) = &config {
            for (k, v) in settings {
                if mdl::config::get(repo, k)?.as_ref() != Some(v) {
                    mdl::config::set_copied(repo, k, v)?;
                }
            }
            // A setting another machine removed (a remote): every setting is published, so
            // one the bucket lacks is gone.
            for (k, _) in mdl::config::with_prefix(repo, "")? {
                if !settings.contains_key(&k) {
                    mdl::config::remove(repo, &k)?;
                }
            }
        }
        self.seen = Seen {
            refs,
            config,
            objects,
            sent: std::mem::take(&mut self.seen.sent),
            packs,
            pending,
        };
        Ok(())
    }

    /// What the bucket holds, from the tables of contents of `packs` (those listed) that this
    /// replica applied or sent, read once: the objects of packs a gc did not mark, and apart from them
    /// those only `marked` packs hold (they may be gone by the time a ref names them, so a
    /// publish sends them again).
    fn in_bucket(
        &self,
        packs: &[String],
        marked: &[String],
    ) -> Result<(HashSet<ObjectId>, HashSet<ObjectId>)> {
        let marked: HashSet<&String> = marked.iter().collect();
        let (mut held, mut in_marked) = (HashSet::new(), HashSet::new());
        for key in packs {
            let ids = self.records.toc(key)?.unwrap_or_default();
            let ids = ids.into_iter().map(|f| f.id);
            if marked.contains(key) {
                in_marked.extend(ids);
            } else {
                held.extend(ids);
            }
        }
        in_marked.retain(|id| !held.contains(id));
        Ok((held, in_marked))
    }

    /// The JSON object at `key` (the settings, the packs a gc marked), if there is one.
    fn read_json<T: serde::de::DeserializeOwned>(&self, key: &str) -> Result<Option<(T, Version)>> {
        let Some((bytes, version)) = self.bucket.get(key)? else {
            return Ok(None);
        };
        let value = serde_json::from_slice(&bytes).map_err(|e| {
            not_ours(
                self.bucket.url().to_string(),
                format!("{key} is not one mdl wrote: {e}"),
            )
        })?;
        Ok(Some((value, version)))
    }

    /// Receives every pack not applied yet, oldest first ([`Self::apply_pack`]), and returns
    /// every pack listed. One whose delta bases or tensors are in a pack not applied yet (a
    /// writer whose clock is behind) waits for the others; one that still cannot be applied is
    /// left for the next sync (its bases went with a pack gc deleted, and no ref needs it, or
    /// the sync's check of the refs fails); one gone since the listing was deleted by gc.
    fn apply_packs(&self, repo: &Repository) -> Result<Vec<String>> {
        let applied: HashSet<String> = self.records.applied()?.into_iter().collect();
        let listed: Vec<String> = self
            .bucket
            .list(layout::PACKS)?
            .into_iter()
            .filter(|k| k.ends_with(layout::PACK_SUFFIX))
            .collect();
        let mut pending: Vec<&String> = listed.iter().filter(|k| !applied.contains(*k)).collect();
        while !pending.is_empty() {
            let before = pending.len();
            let mut waiting = Vec::new();
            let mut last = None;
            for key in pending {
                match self.apply_pack(repo, key) {
                    Ok(Some(frames)) => {
                        tracing::info!(key, frames = frames.len(), "applied pack");
                        self.records.add(key, &frames)?;
                    }
                    Ok(None) => {}
                    Err(Error::Local(
                        e @ (mdl::Error::BadTransfer(_) | mdl::Error::Incomplete(_)),
                    )) => {
                        last = Some((key.clone(), e));
                        waiting.push(key);
                    }
                    Err(e) => return Err(e),
                }
            }
            if waiting.len() == before {
                if let Some((key, e)) = last {
                    tracing::warn!(
                        "{}: pack {key} cannot be applied yet: {e}",
                        self.bucket.url()
                    );
                }
                break;
            }
            pending = waiting;
        }
        Ok(listed)
    }

    /// Receives pack `key` (`None` when a gc deleted it since the listing), returning its
    /// frames. A small pack is read whole, verified and stored; of a larger one only its table
    /// of contents and what is not a tensor are read, and its tensors are indexed for the
    /// replica's [`Records`] to fetch when first read ([`transfer::receive_indexed`]). A pack
    /// without a table (written by an older mdl) is downloaded whole.
    fn apply_pack(&self, repo: &Repository, key: &str) -> Result<Option<Vec<Frame>>> {
        let Some((tail, len)) = self.bucket.get_tail(key, TAIL_READ)? else {
            return Ok(None);
        };
        if tail.len() as u64 == len {
            return Ok(Some(
                transfer::receive_pack(repo, &mut tail.as_ref(), u64::MAX)?.frames,
            ));
        }
        let mut tail_start = len - tail.len() as u64;
        let mut tail = tail;
        let frames = match transfer::read_toc(&tail, len)? {
            Toc::Absent => return self.apply_whole(repo, key),
            Toc::Frames(frames) => frames,
            Toc::From(start) => {
                let table = std::iter::once(start..len).collect();
                let Some(mut got) = self
                    .bucket
                    .get_ranges(&[(key.to_string(), table)])?
                    .pop()
                    .flatten()
                else {
                    return Ok(None);
                };
                (tail, tail_start) = (got.pop().unwrap_or_default(), start);
                match transfer::read_toc(&tail, len)? {
                    Toc::Frames(frames) => frames,
                    _ => {
                        return Err(mdl::Error::BadTransfer(format!(
                            "{key}: its table of contents is not where it says"
                        ))
                        .into())
                    }
                }
            }
        };
        // Manifests, commits and expired frames: from the bytes read when they are among them.
        let rest: Vec<&Frame> = frames.iter().filter(|f| !f.is_tensor()).collect();
        let ranges: Vec<std::ops::Range<u64>> = rest
            .iter()
            .filter(|f| f.offset < tail_start)
            .map(|f| f.offset..f.offset + f.len)
            .collect();
        let mut fetched = if ranges.is_empty() {
            Vec::new()
        } else {
            match self
                .bucket
                .get_ranges(&[(key.to_string(), ranges)])?
                .pop()
                .flatten()
            {
                Some(parts) => parts,
                None => return Ok(None),
            }
        }
        .into_iter();
        let mut bodies = Vec::with_capacity(rest.len());
        for f in &rest {
            let body = if f.offset < tail_start {
                fetched.next().unwrap_or_default().to_vec()
            } else {
                let at = (f.offset - tail_start) as usize;
                tail.get(at..at + f.len as usize)
                    .ok_or_else(|| mdl::Error::BadTransfer(format!("{key}: a frame past its end")))?
                    .to_vec()
            };
            bodies.push(body);
        }
        Ok(Some(
            transfer::receive_indexed(repo, &frames, &bodies)?.frames,
        ))
    }

    /// Downloads pack `key` whole and receives it (`None` when a gc deleted it).
    fn apply_whole(&self, repo: &Repository, key: &str) -> Result<Option<Vec<Frame>>> {
        let mut file = tempfile::tempfile_in(&self.dir).map_err(cache_err(&self.dir))?;
        if self.bucket.download(key, &mut file)?.is_none() {
            return Ok(None);
        }
        file.seek(SeekFrom::Start(0))
            .map_err(cache_err(&self.dir))?;
        let mut reader = BufReader::with_capacity(1 << 20, file);
        Ok(Some(
            transfer::receive_pack(repo, &mut reader, u64::MAX)?.frames,
        ))
    }

    /// Every ref object in the bucket, by full name.
    fn read_refs(&self) -> Result<BTreeMap<String, (Option<RefValue>, Version)>> {
        let mut out = BTreeMap::new();
        for key in self.bucket.list(layout::REFS)? {
            if transfer::check_ref_name(&key).is_err() {
                tracing::warn!("ignoring {key} in {}: not a ref name", self.bucket.url());
                continue;
            }
            // Deleted between the listing and now: as if not listed.
            if let Some((bytes, version)) = self.bucket.get(&key)? {
                let value = layout::decode_ref(&key, &bytes)
                    .map_err(|why| not_ours(self.bucket.url().to_string(), why))?;
                out.insert(key, (value, version));
            }
        }
        Ok(out)
    }

    /// What every caller does once a command or request ran on the replica, in this order:
    /// what it changed goes out as `how` says (before the caller answers, so that what it
    /// reports is in the bucket), then the replica's cache is trimmed to its budget.
    pub fn finish(&mut self, repo: &Repository, how: Publish) -> Result<Published> {
        let published = match how {
            Publish::Replaying => self.publish(repo)?,
            Publish::Exactly => self.publish_exact(repo)?,
            Publish::Nothing => Published::default(),
        };
        self.trim(repo)?;
        Ok(published)
    }

    /// Sends what changed in the replica since the sync: the records the bucket lacks, as one
    /// pack, then every changed branch and tag by a conditional write, then the settings. A
    /// branch another writer moved meanwhile fails with [`Error::Conflict`] — unless the
    /// replica moved it by one new commit on the tip it read (or made it with a first commit),
    /// which is then replayed onto the other writer's tip ([`mdl::commit::replay`]) and sent
    /// again.
    pub fn publish(&mut self, repo: &Repository) -> Result<Published> {
        self.publish_with(repo, true)
    }

    /// [`Self::publish`] that never replays: a lost race fails with [`Error::Conflict`]. For
    /// commits whose ids someone already holds (a push).
    pub fn publish_exact(&mut self, repo: &Repository) -> Result<Published> {
        self.publish_with(repo, false)
    }

    fn publish_with(&mut self, repo: &Repository, replay: bool) -> Result<Published> {
        let mut published = Published::default();
        for _ in 0..REPLAYS {
            match self.publish_once(repo, &mut published)? {
                None => return Ok(published),
                Some((name, ours, theirs)) => {
                    let url = self.bucket.url().to_string();
                    let parent_was_seen = replay
                        && self.seen.sent.contains(&ours)
                        && repo
                            .load_commit(&ours)
                            .map(|c| c.parents == theirs.into_iter().collect::<Vec<_>>())
                            .unwrap_or(false);
                    if !parent_was_seen || !name.starts_with(Ref::BRANCHES) {
                        return Err(Error::Conflict(format!(
                            "{name} in {url} was changed by another writer while this command ran; nothing of it was published (its result, {}, stays in this machine's copy until then): run it again",
                            ours.short(12)
                        )));
                    }
                    self.sync(repo)?;
                    let Some(tip) = self
                        .seen
                        .refs
                        .get(&name)
                        .and_then(|(v, _)| v.as_ref()?.target())
                    else {
                        return Err(Error::Conflict(format!(
                            "{name} in {url} was deleted by another writer while this command ran; commit {} was not published",
                            ours.short(12)
                        )));
                    };
                    let replayed = mdl::commit::replay(repo, &ours, &tip, &name)?;
                    tracing::info!(%ours, %replayed, %tip, "replayed a commit onto another writer's");
                    published.replayed.push((ours, replayed));
                }
            }
        }
        Err(Error::Conflict(format!(
            "{} kept changing under this command ({REPLAYS} tries); nothing more was published: run it again",
            self.bucket.url()
        )))
    }

    /// One attempt of [`Self::publish`]: `Some((ref, ours, theirs as read))` when a
    /// conditional write lost.
    fn publish_once(
        &mut self,
        repo: &Repository,
        published: &mut Published,
    ) -> Result<Option<(String, ObjectId, Option<ObjectId>)>> {
        let now: BTreeMap<String, RefValue> = mdl::refs::all(repo)?.into_iter().collect();
        let mut changes: Vec<(String, Option<RefValue>)> = Vec::new();
        for (name, value) in &now {
            match self.seen.refs.get(name) {
                Some((Some(v), _)) if v == value => {}
                _ => changes.push((name.clone(), Some(value.clone()))),
            }
        }
        for (name, (value, _)) in &self.seen.refs {
            if value.is_some() && !now.contains_key(name) {
                changes.push((name.clone(), None));
            }
        }
        let tips: Vec<ObjectId> = changes
            .iter()
            .filter_map(|(_, v)| v.as_ref()?.target())
            .collect();
        if !tips.is_empty() {
            self.send_pack(repo, &tips, published)?;
        }
        for (name, value) in changes {
            let bytes = layout::encode_ref(value.as_ref());
            let read = self.seen.refs.get(&name);
            let written = match read {
                None => self.bucket.create(&name, bytes)?,
                Some((_, version)) => self.bucket.replace(&name, bytes, version)?,
            };
            let Some(version) = written else {
                let ours = value.as_ref().and_then(RefValue::target);
                let theirs = read.and_then(|(v, _)| v.as_ref()?.target());
                return match ours {
                    Some(ours) => Ok(Some((name, ours, theirs))),
                    None => Err(Error::Conflict(format!(
                        "{name} in {} was changed by another writer while this command ran; it was not deleted there",
                        self.bucket.url()
                    ))),
                };
            };
            published.refs.push(name.clone());
            self.seen.refs.insert(name, (value, version));
        }
        self.publish_config(repo)?;
        Ok(None)
    }

    /// Uploads, as one pack, those of `ids` (in an order a receiver can import them) the
    /// bucket lacks: records received for a ref update that may reach another machine, so
    /// that they are in the bucket when it does.
    pub fn publish_records(&mut self, repo: &Repository, ids: &[ObjectId]) -> Result<Published> {
        let mut published = Published::default();
        let send: Vec<ObjectId> = ids
            .iter()
            .filter(|id| !self.seen.objects.contains(id))
            .copied()
            .collect();
        self.upload_pack(repo, send, &mut published)?;
        Ok(published)
    }

    /// Uploads, as one pack, the records of `tips`' history that the bucket lacks.
    fn send_pack(
        &mut self,
        repo: &Repository,
        tips: &[ObjectId],
        published: &mut Published,
    ) -> Result<()> {
        let seen = &self.seen;
        let whole = transfer::Shallow::WHOLE;
        let plan = transfer::plan(repo, tips, &|id| seen.objects.contains(id), &whole)?;
        let send: Vec<ObjectId> = plan
            .iter()
            .map(|p| p.id)
            .filter(|id| !seen.objects.contains(id))
            .collect();
        self.upload_pack(repo, send, published)
    }

    /// Uploads the records of `send` as one pack (nothing when empty), written as it goes up
    /// ([`Bucket::upload_from`]).
    fn upload_pack(
        &mut self,
        repo: &Repository,
        send: Vec<ObjectId>,
        published: &mut Published,
    ) -> Result<()> {
        if send.is_empty() {
            return Ok(());
        }
        let key = layout::new_pack_key();
        let (len, frames) = self.bucket.upload_from(&key, |w| {
            let mut pack = PackWriter::new(w)?;
            pack.objects(repo, &send)?;
            Ok(pack.finish_with_toc()?)
        })?;
        self.records.add(&key, &frames)?;
        published.pack = Some(key);
        published.objects += send.len() as u64;
        published.bytes += len;
        for id in send {
            if self.seen.objects.insert(id) && transfer::has_commit(repo, &id)? {
                self.seen.sent.insert(id);
            }
        }
        Ok(())
    }

    /// Writes the settings when the replica's differ from those read.
    fn publish_config(&mut self, repo: &Repository) -> Result<()> {
        let ours: BTreeMap<String, String> =
            mdl::config::with_prefix(repo, "")?.into_iter().collect();
        let theirs = self.seen.config.as_ref().map(|(c, _)| c);
        if theirs == Some(&ours) || (theirs.is_none() && ours.is_empty()) {
            return Ok(());
        }
        let bytes = serde_json::to_vec_pretty(&ours).expect("settings serialize");
        let written = match &self.seen.config {
            None => self.bucket.create(layout::CONFIG, bytes)?,
            Some((_, v)) => self.bucket.replace(layout::CONFIG, bytes, v)?,
        };
        match written {
            Some(v) => {
                self.seen.config = Some((ours, v));
                Ok(())
            }
            None => Err(Error::Conflict(format!(
                "the settings of {} were changed by another writer while this command ran; run it again",
                self.bucket.url()
            ))),
        }
    }
}
