//! [`Bucket`]: the object-store calls a repository makes, blocking, under its prefix, each
//! counted. Reads of an absent key, creates of an existing one and replaces of a changed one
//! are answers, not errors; a small write whose outcome is unknown is read back; everything
//! else the client retried (with backoff, on connection failures, 5xx and throttling) and
//! still failed is [`Error::Storage`].

use std::io::{Seek, SeekFrom, Write};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    UpdateVersion, WriteMultipart,
};

use crate::location::Location;
use crate::{Error, Result};

/// Objects up to this size are uploaded in one PUT; larger ones in parts of this size.
pub const PART_SIZE: usize = 16 << 20;
/// Parts of one multipart upload in flight at once.
const PARTS_IN_FLIGHT: usize = 4;
/// Objects read from at once by [`Bucket::get_ranges`] (each with its own ranges in flight).
const OBJECTS_IN_FLIGHT: usize = 8;
/// Whole downloads tried again after the client's own retries gave up mid-body.
const DOWNLOAD_ATTEMPTS: usize = 3;
/// How long after a request failed for good the next requests are tried once each.
const QUIET: std::time::Duration = std::time::Duration::from_secs(60);
/// Times a conditional write cut off on its way is tried again (after 0.5, 1 and 2 s), where
/// the client itself does not (see [`Bucket::put`]).
const CONDITIONAL_TRIES: u32 = 3;
/// Keys remembered as failed for good, at most (a long-lived server's).
const GAVE_UP_KEYS: usize = 10_000;

/// The version of an object a conditional replace expects (its ETag, and its version id
/// where the bucket keeps versions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    e_tag: Option<String>,
    version: Option<String>,
}

impl Version {
    fn update(&self) -> UpdateVersion {
        UpdateVersion {
            e_tag: self.e_tag.clone(),
            version: self.version.clone(),
        }
    }
}

/// Requests made, for the benchmark's PUT counts and for tests.
#[derive(Debug, Default)]
pub struct Counts {
    /// PUT requests: whole objects and multipart parts (a multipart upload's start and
    /// completion are counted once as one PUT besides its parts).
    pub puts: AtomicU64,
    /// GET and HEAD requests.
    pub gets: AtomicU64,
    /// LIST requests (one per listing; the client pages through long ones).
    pub lists: AtomicU64,
    /// Bytes uploaded.
    pub bytes_up: AtomicU64,
    /// Bytes downloaded.
    pub bytes_down: AtomicU64,
}

/// How many requests `object_store` makes for `ranges`: it reads ranges less than
/// [`object_store::OBJECT_STORE_COALESCE_DEFAULT`] apart in one.
fn requests(ranges: &[Range<u64>]) -> u64 {
    let mut sorted: Vec<&Range<u64>> = ranges.iter().collect();
    sorted.sort_by_key(|r| r.start);
    let mut n = 0;
    let mut end: Option<u64> = None;
    for r in sorted {
        match end {
            Some(e) if r.start <= e + object_store::OBJECT_STORE_COALESCE_DEFAULT => {
                end = Some(e.max(r.end))
            }
            _ => {
                n += 1;
                end = Some(r.end);
            }
        }
    }
    n
}

/// Whether `e` is a request that reached no server (refused, timed out connecting, no such
/// host), as opposed to an answer.
fn unreachable(e: &object_store::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            if matches!(
                io.kind(),
                K::ConnectionRefused | K::TimedOut | K::HostUnreachable | K::NetworkUnreachable
            ) {
                return true;
            }
        }
        let text = s.to_string();
        if text.contains("error sending request") || text.contains("dns error") {
            return true;
        }
        source = s.source();
    }
    false
}

/// Whether a write is conditional (`If-None-Match: *`, `If-Match`), which the client does not
/// try again once it was sent.
fn conditional(mode: &PutMode) -> bool {
    !matches!(mode, PutMode::Overwrite)
}

/// A failure of the local file a download writes or an upload reads, in the client's error
/// type (so that it is reported like the request it interrupted).
fn local_file(e: std::io::Error) -> object_store::Error {
    object_store::Error::Generic {
        store: "local file",
        source: Box::new(e),
    }
}

/// What [`Bucket::upload_from`] sent while its producer wrote.
enum Sent {
    Nothing,
    /// One part: written with one PUT once the producer is done.
    One(Bytes),
    /// Parts of a multipart upload, to complete or abort.
    Multi(WriteMultipart),
}

/// The writer [`Bucket::upload_from`]'s producer writes to: [`PART_SIZE`] bytes at a time
/// handed over to the upload.
struct Parts {
    tx: tokio::sync::mpsc::Sender<Bytes>,
    part: Vec<u8>,
}

impl Parts {
    /// Hands the part written so far over (nothing when it is empty).
    fn send(&mut self) -> std::io::Result<()> {
        if self.part.is_empty() {
            return Ok(());
        }
        let part = std::mem::replace(&mut self.part, Vec::with_capacity(PART_SIZE));
        self.tx
            .blocking_send(Bytes::from(part))
            .map_err(|_| std::io::Error::other("the upload stopped"))
    }
}

impl Write for Parts {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len().min(PART_SIZE - self.part.len());
        self.part.extend_from_slice(&buf[..n]);
        if self.part.len() == PART_SIZE {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A repository's objects in a bucket, reached through `object_store`.
pub struct Bucket {
    rt: tokio::runtime::Runtime,
    /// The client whose failed requests are tried again, for [`crate::location::RETRY_FOR`].
    retrying: Arc<dyn ObjectStore>,
    /// The same, trying each request once: used for [`QUIET`] after a request has failed
    /// after its retries, and always for a key one has failed on, so that a command meets the
    /// retry deadline once, not once a request (an endpoint that is down, an object that
    /// cannot be read and is asked for again).
    once: Arc<dyn ObjectStore>,
    /// When a request last failed after its retries, and the keys such requests were for.
    gave_up: std::sync::Mutex<(
        Option<std::time::Instant>,
        std::collections::HashSet<String>,
    )>,
    prefix: String,
    url: String,
    /// What this handle has requested so far.
    pub counts: Counts,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bucket({})", self.url)
    }
}

impl Bucket {
    /// A client for the repository at `loc`.
    pub fn open(loc: &Location) -> Result<Bucket> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("mdl-bucket")
            .enable_all()
            .build()
            .map_err(|e| Error::Location(format!("cannot start the S3 client: {e}")))?;
        Ok(Bucket {
            rt,
            retrying: loc.store(true)?,
            once: loc.store(false)?,
            gave_up: Default::default(),
            prefix: loc.prefix.clone(),
            url: loc.url(),
            counts: Counts::default(),
        })
    }

    /// The repository's location, `s3://BUCKET/PREFIX`.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn path(&self, key: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(key)
        } else {
            Path::from(format!("{}/{key}", self.prefix))
        }
    }

    /// The client for the next request, for `keys`: [`Bucket::once`] within [`QUIET`] of a
    /// request that gave up, or for a key one gave up on.
    fn store<'a>(&self, keys: impl IntoIterator<Item = &'a str>) -> &Arc<dyn ObjectStore> {
        let gave_up = self.gave_up.lock().unwrap_or_else(|p| p.into_inner());
        let (last, failed) = &*gave_up;
        if last.is_some_and(|t| t.elapsed() < QUIET) || keys.into_iter().any(|k| failed.contains(k))
        {
            &self.once
        } else {
            &self.retrying
        }
    }

    fn fail(&self, what: &str, key: &str, e: object_store::Error) -> Error {
        let mut gave_up = self.gave_up.lock().unwrap_or_else(|p| p.into_inner());
        gave_up.0 = Some(std::time::Instant::now());
        if gave_up.1.len() < GAVE_UP_KEYS {
            gave_up.1.insert(key.to_string());
        }
        drop(gave_up);
        // A store that never answered is said as such first; the client's own text follows.
        let why = match unreachable(&e) {
            true => format!(
                "{what} {key}: the object store at {} did not answer (is it running, and is AWS_ENDPOINT right?): {e}",
                Location::endpoint().unwrap_or_else(|| "AWS's default endpoint".into())
            ),
            false => format!("{what} {key}: {e}"),
        };
        Error::Storage {
            url: self.url.clone(),
            why,
        }
    }

    fn count(&self, counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The object at `key` and its version; `None` when there is none.
    pub fn get(&self, key: &str) -> Result<Option<(Bytes, Version)>> {
        self.count(&self.counts.gets, 1);
        let path = self.path(key);
        let got = self.rt.block_on(async {
            let r = self.store([key]).get(&path).await?;
            let version = Version {
                e_tag: r.meta.e_tag.clone(),
                version: r.meta.version.clone(),
            };
            Ok::<_, object_store::Error>((r.bytes().await?, version))
        });
        match got {
            Ok((bytes, v)) => {
                self.count(&self.counts.bytes_down, bytes.len() as u64);
                Ok(Some((bytes, v)))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.fail("reading", key, e)),
        }
    }

    fn put(&self, key: &str, bytes: Vec<u8>, mode: PutMode) -> Result<Option<Version>> {
        let path = self.path(key);
        let bytes = Bytes::from(bytes);
        let mut tries = 0;
        loop {
            self.count(&self.counts.puts, 1);
            self.count(&self.counts.bytes_up, bytes.len() as u64);
            let store = self.store([key]);
            let quiet = Arc::ptr_eq(store, &self.once);
            let put = self.rt.block_on(store.put_opts(
                &path,
                PutPayload::from(bytes.clone()),
                PutOptions::from(mode.clone()),
            ));
            match put {
                Ok(r) => {
                    return Ok(Some(Version {
                        e_tag: r.e_tag,
                        version: r.version,
                    }))
                }
                Err(
                    object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. },
                ) => {
                    // After a try whose outcome was unknown, the condition failing may be
                    // that try's own write.
                    if tries > 0 {
                        if let Some(version) = self.landed(key, &bytes) {
                            return Ok(Some(version));
                        }
                    }
                    return Ok(None);
                }
                Err(e) => {
                    if let Some(version) = self.landed(key, &bytes) {
                        return Ok(Some(version));
                    }
                    // The client does not try a conditional write again once it was sent (a
                    // connection the store dropped while restarting, reused from the pool):
                    // its outcome is unknown to it. Its condition makes trying again safe —
                    // had it landed, the condition now fails and `landed` sees our bytes.
                    if tries < CONDITIONAL_TRIES && !quiet && conditional(&mode) && unreachable(&e)
                    {
                        tries += 1;
                        std::thread::sleep(std::time::Duration::from_millis(250 << tries));
                        continue;
                    }
                    return Err(self.fail("writing", key, e));
                }
            }
        }
    }

    /// The version of `key` when it holds `bytes`: a write whose outcome is unknown (its
    /// response was lost after the client's retries, or came without the ETag a conditional
    /// write needs, as SeaweedFS's sometimes does) landed if the object now holds what it
    /// wrote.
    fn landed(&self, key: &str, bytes: &[u8]) -> Option<Version> {
        match self.get(key) {
            Ok(Some((now, version))) if now == bytes && version.e_tag.is_some() => Some(version),
            _ => None,
        }
    }

    /// Writes `key` unless it exists (`If-None-Match: *`): its version, or `None` when another
    /// writer made it first.
    pub fn create(&self, key: &str, bytes: Vec<u8>) -> Result<Option<Version>> {
        self.put(key, bytes, PutMode::Create)
    }

    /// Replaces `key` if it is still at `expected` (`If-Match`): its new version, or `None`
    /// when another writer changed it first.
    pub fn replace(
        &self,
        key: &str,
        bytes: Vec<u8>,
        expected: &Version,
    ) -> Result<Option<Version>> {
        self.put(key, bytes, PutMode::Update(expected.update()))
    }

    /// The keys under `dir` (`refs/`, `packs/`), relative to the repository, sorted.
    pub fn list(&self, dir: &str) -> Result<Vec<String>> {
        self.count(&self.counts.lists, 1);
        let path = self.path(dir.trim_end_matches('/'));
        let listed: Vec<object_store::ObjectMeta> = self
            .rt
            .block_on(self.store([dir]).list(Some(&path)).try_collect())
            .map_err(|e| self.fail("listing", dir, e))?;
        let strip = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        let mut keys: Vec<String> = listed
            .into_iter()
            .filter_map(|m| m.location.as_ref().strip_prefix(&strip).map(str::to_string))
            .collect();
        keys.sort();
        Ok(keys)
    }

    /// Downloads `key` into `out` (from its start, which is truncated first), returning its
    /// length, or `None` when there is no such object. A download cut off after the client's
    /// retries starts again, a few times.
    pub fn download(&self, key: &str, out: &mut std::fs::File) -> Result<Option<u64>> {
        let path = self.path(key);
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.count(&self.counts.gets, 1);
            out.set_len(0)
                .and_then(|_| out.seek(SeekFrom::Start(0)).map(drop))
                .map_err(|e| self.fail("downloading", key, local_file(e)))?;
            let got = self.rt.block_on(async {
                let mut stream = self.store([key]).get(&path).await?.into_stream();
                let mut n = 0u64;
                while let Some(chunk) = stream.try_next().await? {
                    out.write_all(&chunk).map_err(local_file)?;
                    n += chunk.len() as u64;
                }
                Ok::<_, object_store::Error>(n)
            });
            match got {
                Ok(n) => {
                    self.count(&self.counts.bytes_down, n);
                    return Ok(Some(n));
                }
                Err(object_store::Error::NotFound { .. }) => return Ok(None),
                Err(e) if attempt >= DOWNLOAD_ATTEMPTS => {
                    return Err(self.fail("downloading", key, e))
                }
                Err(e) => tracing::info!("downloading {key} again: {e}"),
            }
        }
    }

    /// Uploads to `key` what `produce` writes, while it writes: one PUT if it writes at most
    /// [`PART_SIZE`], else a multipart upload whose parts go up (at most [`PARTS_IN_FLIGHT`]
    /// at once) as soon as `produce` has written them. Nothing is uploaded, or the upload is
    /// aborted, when `produce` fails (its error is returned). Only for keys no other writer can
    /// choose: it overwrites.
    pub fn upload_from<T: Send>(
        &self,
        key: &str,
        produce: impl FnOnce(&mut dyn Write) -> Result<T> + Send,
    ) -> Result<T> {
        // Parts handed over as they fill, one waiting at most: the producer runs ahead of the
        // upload by a part.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(1);
        let path = self.path(key);
        std::thread::scope(|s| {
            let producer = s.spawn(move || {
                let mut parts = Parts {
                    tx,
                    part: Vec::with_capacity(PART_SIZE),
                };
                let made = produce(&mut parts)?;
                parts
                    .send()
                    .map_err(|e| self.fail("uploading", key, local_file(e)))?;
                Ok::<T, Error>(made)
            });
            // The receiver is dropped with this future, so a producer still writing stops.
            let sent = self.rt.block_on(async move {
                let Some(first) = rx.recv().await else {
                    return Ok(Sent::Nothing);
                };
                let Some(second) = rx.recv().await else {
                    return Ok(Sent::One(first));
                };
                let upload = self.store([key]).put_multipart(&path).await?;
                let mut w = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
                let (mut parts, mut bytes) = (0u64, 0u64);
                let (mut part, mut next) = (first, Some(second));
                loop {
                    w.wait_for_capacity(PARTS_IN_FLIGHT).await?;
                    parts += 1;
                    bytes += part.len() as u64;
                    w.put(part);
                    match next.take() {
                        Some(p) => {
                            part = p;
                            next = rx.recv().await;
                        }
                        None => break,
                    }
                }
                self.count(&self.counts.puts, parts + 1);
                self.count(&self.counts.bytes_up, bytes);
                Ok::<_, object_store::Error>(Sent::Multi(w))
            });
            let made = producer
                .join()
                .expect("an upload's producer does not panic");
            match (made, sent) {
                // The upload failed first (the producer then finds it stopped): its error.
                (_, Err(e)) => Err(self.fail("uploading", key, e)),
                (Ok(made), Ok(Sent::Nothing)) => {
                    self.put(key, Vec::new(), PutMode::Overwrite)?;
                    Ok(made)
                }
                (Ok(made), Ok(Sent::One(part))) => {
                    self.put(key, part.to_vec(), PutMode::Overwrite)?;
                    Ok(made)
                }
                (Ok(made), Ok(Sent::Multi(w))) => {
                    self.rt
                        .block_on(w.finish())
                        .map_err(|e| self.fail("uploading", key, e))?;
                    Ok(made)
                }
                (Err(e), Ok(Sent::Multi(w))) => {
                    let _ = self.rt.block_on(w.abort());
                    Err(e)
                }
                (Err(e), Ok(_)) => Err(e),
            }
        })
    }

    /// The last `n` bytes of `key` (all of it when it is no longer) and its length; `None`
    /// when there is no such object.
    pub fn get_tail(&self, key: &str, n: u64) -> Result<Option<(Bytes, u64)>> {
        self.count(&self.counts.gets, 1);
        let path = self.path(key);
        let opts = GetOptions {
            range: Some(GetRange::Suffix(n)),
            ..GetOptions::default()
        };
        let got = self.rt.block_on(async {
            let r = self.store([key]).get_opts(&path, opts).await?;
            let len = r.meta.size;
            Ok::<_, object_store::Error>((r.bytes().await?, len))
        });
        match got {
            Ok((bytes, len)) => {
                self.count(&self.counts.bytes_down, bytes.len() as u64);
                Ok(Some((bytes, len)))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.fail("reading", key, e)),
        }
    }

    /// The byte ranges `ranges` of each object of `wanted`, several objects at once (ranges
    /// close together are read in one request): `None` for an object that is gone.
    pub fn get_ranges(
        &self,
        wanted: &[(String, Vec<Range<u64>>)],
    ) -> Result<Vec<Option<Vec<Bytes>>>> {
        let store = self.store(wanted.iter().map(|(k, _)| k.as_str()));
        let got: Vec<object_store::Result<Vec<Bytes>>> = self.rt.block_on(
            futures_util::stream::iter(wanted.iter().map(|(key, ranges)| {
                let path = self.path(key);
                async move { store.get_ranges(&path, ranges).await }
            }))
            .buffered(OBJECTS_IN_FLIGHT)
            .collect(),
        );
        let mut out = Vec::with_capacity(got.len());
        for ((key, ranges), got) in wanted.iter().zip(got) {
            // Requests made: ranges less than a megabyte apart go as one.
            self.count(&self.counts.gets, requests(ranges));
            match got {
                Ok(parts) => {
                    let n: usize = parts.iter().map(Bytes::len).sum();
                    self.count(&self.counts.bytes_down, n as u64);
                    out.push(Some(parts));
                }
                Err(object_store::Error::NotFound { .. }) => out.push(None),
                Err(e) => return Err(self.fail("reading", key, e)),
            }
        }
        Ok(out)
    }

    /// Deletes `key` (nothing when it is gone already).
    pub fn delete(&self, key: &str) -> Result<()> {
        let path = self.path(key);
        match self.rt.block_on(self.store([key]).delete(&path)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.fail("deleting", key, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bucket held in memory (`object_store`'s own), for the client's logic alone.
    fn in_memory() -> Bucket {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        Bucket {
            rt: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap(),
            retrying: store.clone(),
            once: store,
            gave_up: Default::default(),
            prefix: "repo".into(),
            url: "memory://repo".into(),
            counts: Counts::default(),
        }
    }

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    }

    #[test]
    fn uploads_while_written_land_whole_and_failed_ones_leave_nothing() {
        let b = in_memory();
        // One PUT (at most a part), a part exactly, and several parts with a short last one,
        // each written in uneven pieces.
        for (k, n) in [10, PART_SIZE, 2 * PART_SIZE + 12345]
            .into_iter()
            .enumerate()
        {
            let want = bytes(n, k as u8);
            let key = format!("packs/{k}");
            let got = b
                .upload_from(&key, |w| {
                    for piece in want.chunks(1_000_003) {
                        w.write_all(piece).unwrap();
                    }
                    Ok(n)
                })
                .unwrap();
            assert_eq!(got, n);
            assert_eq!(b.get(&key).unwrap().unwrap().0, want, "{n} bytes");
        }
        // A producer that fails, before a part is full or after several went up: its error
        // is returned and no object is left under the key.
        for n in [100, 2 * PART_SIZE + 7] {
            let key = format!("packs/failed-{n}");
            let failed = b.upload_from(&key, |w| {
                w.write_all(&bytes(n, 9)).unwrap();
                Err::<(), _>(Error::Location("the records could not be read".into()))
            });
            assert!(
                matches!(&failed, Err(Error::Location(m)) if m.contains("could not be read")),
                "{failed:?}"
            );
            assert!(b.get(&key).unwrap().is_none(), "{n} bytes left behind");
        }
    }
}
