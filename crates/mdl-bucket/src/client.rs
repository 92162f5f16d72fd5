//! [`Bucket`]: the object-store calls a repository makes, blocking, under its prefix, each
//! counted. Reads of an absent key, creates of an existing one and replaces of a changed one
//! are answers, not errors; a small write whose outcome is unknown is read back; everything
//! else the client retried (with backoff, on connection failures, 5xx and throttling) and
//! still failed is [`Error::Storage`].

use std::io::{Read, Seek, SeekFrom, Write};
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

/// A failure of the local file a download writes or an upload reads, in the client's error
/// type (so that it is reported like the request it interrupted).
fn local_file(e: std::io::Error) -> object_store::Error {
    object_store::Error::Generic {
        store: "local file",
        source: Box::new(e),
    }
}

/// A repository's objects in a bucket, reached through `object_store`.
pub struct Bucket {
    rt: tokio::runtime::Runtime,
    store: Arc<dyn ObjectStore>,
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
            store: loc.store()?,
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

    fn fail(&self, what: &str, key: &str, e: object_store::Error) -> Error {
        Error::Storage {
            url: self.url.clone(),
            why: format!("{what} {key}: {e}"),
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
            let r = self.store.get(&path).await?;
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
        self.count(&self.counts.puts, 1);
        self.count(&self.counts.bytes_up, bytes.len() as u64);
        let path = self.path(key);
        let bytes = Bytes::from(bytes);
        let put = self.rt.block_on(self.store.put_opts(
            &path,
            PutPayload::from(bytes.clone()),
            PutOptions::from(mode),
        ));
        match put {
            Ok(r) => Ok(Some(Version {
                e_tag: r.e_tag,
                version: r.version,
            })),
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => Ok(None),
            Err(e) => match self.landed(key, &bytes) {
                Some(version) => Ok(Some(version)),
                None => Err(self.fail("writing", key, e)),
            },
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
            .block_on(self.store.list(Some(&path)).try_collect())
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
                let mut stream = self.store.get(&path).await?.into_stream();
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

    /// Uploads `len` bytes of `file` (from its start) to `key`: one PUT up to [`PART_SIZE`],
    /// else a multipart upload with [`PARTS_IN_FLIGHT`] parts in flight. Only for keys no other
    /// writer can choose (their names hold a hash of the content): it overwrites.
    pub fn upload(&self, key: &str, file: &mut std::fs::File, len: u64) -> Result<()> {
        let io = |e: std::io::Error| self.fail("uploading", key, local_file(e));
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        if len <= PART_SIZE as u64 {
            let mut buf = Vec::with_capacity(len as usize);
            file.take(len).read_to_end(&mut buf).map_err(io)?;
            self.put(key, buf, PutMode::Overwrite)?;
            return Ok(());
        }
        let path = self.path(key);
        let parts = len.div_ceil(PART_SIZE as u64);
        self.count(&self.counts.puts, parts + 1);
        self.count(&self.counts.bytes_up, len);
        let done = self.rt.block_on(async {
            let upload = self.store.put_multipart(&path).await?;
            let mut w = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
            let mut left = len;
            let mut buf = vec![0u8; PART_SIZE];
            while left > 0 {
                let n = left.min(PART_SIZE as u64) as usize;
                if let Err(e) = file.read_exact(&mut buf[..n]) {
                    let _ = w.abort().await;
                    return Err(local_file(e));
                }
                w.wait_for_capacity(PARTS_IN_FLIGHT).await?;
                w.put(Bytes::copy_from_slice(&buf[..n]));
                left -= n as u64;
            }
            w.finish().await.map(drop)
        });
        done.map_err(|e| self.fail("uploading", key, e))
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
            let r = self.store.get_opts(&path, opts).await?;
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
        let store = &self.store;
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
        match self.rt.block_on(self.store.delete(&path)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.fail("deleting", key, e)),
        }
    }
}
