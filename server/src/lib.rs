//! The HTTP server of mdl: [`app`] builds the `axum` router over a [`State`]; the `mdl serve`
//! command binds it ([`serve`]).
//!
//! The server owns the repositories it serves (it holds their write locks for its lifetime)
//! and advertises itself in each one's `.mdl/serve.json`, so `mdl` commands run in such a
//! directory are forwarded here instead of waiting for the lock. Codec and store work runs on
//! blocking threads; no lock or database transaction is held across an `.await`. Routes,
//! parameters, statuses and error codes: `docs/HTTP_API.md`.

mod access;
mod admin;
mod api;
pub mod auth;
mod bucket;
mod budgeted;
pub mod error;
mod files;
mod hf;
mod hf_changes;
mod hf_history;
mod hf_lfs;
mod hf_write;
mod hf_xet;
mod names;
mod pack_upload;
mod stream;
mod tree;
mod upload;
mod web;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mdl::{LockMode, OpenOptions, Repository};
use mdl_protocol::ErrorCode;

use crate::access::ApiResult;

pub use api::app;
pub use auth::{Scope, Tokens};
pub use error::ApiError;
pub use files::{parse_range, Unsatisfiable};
pub use names::valid_repo_name;

/// Where the served repositories are.
#[derive(Clone, Debug)]
pub enum Repos {
    /// One repository, served under `name`.
    One {
        /// Its name in URLs (the directory's name).
        name: String,
        /// Its work directory.
        path: PathBuf,
    },
    /// Every repository directly under a directory, by directory name.
    Root(PathBuf),
    /// One repository in object storage, served under `name` from this machine's replica
    /// of it in `cache` (brought up to date before each request, what a request changed
    /// published before it is answered).
    Bucket {
        /// Its name in URLs.
        name: String,
        /// Where it is.
        location: mdl_bucket::Location,
        /// The folder of this machine's replicas ([`mdl_bucket::cache_root`]).
        cache: PathBuf,
    },
}

/// How the server runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// The repositories.
    pub repos: Repos,
    /// Accepted tokens.
    pub tokens: Tokens,
    /// Reads need no token.
    pub read_public: bool,
    /// Largest request body (uploads), in bytes.
    pub max_body: u64,
    /// Files of at least this many bytes are uploaded by `huggingface_hub` through Xet (with
    /// `hf_xet`) or git LFS (without); `None`: every file travels inline in the commit
    /// request.
    pub hf_lfs_from: Option<u64>,
    /// How long to wait for another process holding a repository when opening it.
    pub wait: Duration,
    /// Connection limits and timeouts.
    pub limits: Limits,
}

/// What one client may hold of the server.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections open at once; more wait in the listen queue.
    pub max_connections: usize,
    /// Connections one client address may hold at once; one more is closed as soon as it
    /// is accepted, so a single client cannot hold every connection.
    pub max_per_address: usize,
    /// A request's headers must arrive within this (also how long an idle connection waiting
    /// for its next request is kept).
    pub header_timeout: Duration,
    /// A request body that sends nothing for this long is cut off (408); a response the
    /// client takes nothing of for this long ends its connection.
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 512,
            max_per_address: 64,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
        }
    }
}

/// One served repository.
pub(crate) struct Served {
    /// The repository, for reading. On disk it is opened as a reader: no lock, the database
    /// opened for each read, so other processes write beside the server (a training loop
    /// committing into the served folder); each change opens it for writing for its duration
    /// ([`Served::writer`]). In object storage it is the replica, which this server alone
    /// writes, held for writing: its [`Repository::writer`] serialises the changes.
    pub(crate) repo: Repository,
    /// For a repository on disk: its folder, and how long a change waits for another writer.
    disk: Option<(PathBuf, Duration)>,
    /// The codec engine chosen when the repository was first opened (its `engine` setting).
    engine: mdl::engine::Selected,
    /// Whether `.mdl/serve.json` names this server (removed when the repository is let go).
    advertised: bool,
    /// For a repository in object storage, the replica `repo` is (see [`bucket`]).
    replica: Option<Mutex<mdl_bucket::Replica>>,
    /// The web view's storage report, kept while the repository does not change.
    pub(crate) storage: web::StorageCache,
}

impl Served {
    /// The repository opened for one change: on disk a handle of its own that owns the
    /// repository's lock until dropped (waiting for another process's writer at most the
    /// server's `wait`); in object storage the replica's repository.
    pub(crate) fn writer(&self) -> ApiResult<Opened<'_>> {
        self.opened(LockMode::Write, None)
    }

    /// [`Served::writer`] for `mode`, waiting at most `wait` (default: the server's).
    fn opened(&self, mode: LockMode, wait: Option<Duration>) -> ApiResult<Opened<'_>> {
        let Some((path, server_wait)) = &self.disk else {
            return Ok(Opened::Held(&self.repo));
        };
        let opts = OpenOptions {
            mode,
            wait: wait.unwrap_or(*server_wait),
            purpose: format!("mdl serve (pid {})", std::process::id()),
            ..OpenOptions::default()
        };
        let mut repo = Repository::open(path, &opts).map_err(ApiError::from)?;
        repo.set_engine(self.engine.engine.clone());
        Ok(Opened::Own(Box::new(repo)))
    }

    /// The repository opened to be checked (`fsck`): beside other checks, after writers.
    pub(crate) fn checker(&self) -> ApiResult<Opened<'_>> {
        self.opened(LockMode::Check, None)
    }

    /// Works the re-encodes that commits left for later (`delta.defer`), if any are queued, on a
    /// thread of its own, a commit's step at a time. It stops at the next step when another
    /// writer waits (a request's change, or another process), and goes on after a later commit.
    /// `warm` is the last commit's tensors, where kept.
    pub(crate) fn work_deferred(self: &Arc<Self>, warm: Option<Arc<mdl::warm::WarmTensors>>) {
        if mdl::commit::pending_deferred(&self.repo).unwrap_or(0) == 0 {
            return;
        }
        let served = self.clone();
        let started = std::thread::Builder::new()
            .name("mdl-deferred".into())
            .spawn(move || {
                let done = served
                    .opened(LockMode::Write, Some(OPEN_WAIT))
                    .and_then(|repo| {
                        let yield_to_writers = || mdl::commit::writer_waiting(&repo);
                        Ok(mdl::commit::run_deferred(
                            &repo,
                            warm.as_deref(),
                            &yield_to_writers,
                        )?)
                    });
                if let Err(e) = done {
                    tracing::info!("deferred re-encodes left for later: {}", e.message);
                }
                give_back_memory();
            });
        if let Err(e) = started {
            tracing::warn!("cannot start the deferred re-encodes: {e}");
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if self.advertised {
            self.repo.withdraw_advertisement();
        }
    }
}

/// Hands the memory this process freed back to the system: glibc keeps it otherwise, and a
/// commit of a million tensors (or the deferred work after it) left 1.3 GiB resident after it
/// ended. Called when a change or the deferred work ends.
pub(crate) fn give_back_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists; it takes no pointer of
    // ours and is safe to call from any thread at any time.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A repository opened for a change or a check ([`Served::writer`]).
pub(crate) enum Opened<'a> {
    /// A handle of its own (a repository on disk).
    Own(Box<Repository>),
    /// The served repository itself (a replica).
    Held(&'a Repository),
}

impl std::ops::Deref for Opened<'_> {
    type Target = Repository;
    fn deref(&self) -> &Repository {
        match self {
            Opened::Own(r) => r,
            Opened::Held(r) => r,
        }
    }
}

/// A repository's place in the server: empty until it is opened (and again after it failed
/// and was let go). Its lock is held only to look, or while opening this one repository.
type Slot = Arc<Mutex<Option<Arc<Served>>>>;

/// How long a request waits for another process that holds a repository it opens, before
/// answering 503 with `Retry-After` (at startup, [`Config::wait`] applies).
const OPEN_WAIT: Duration = Duration::from_secs(1);

/// The server's shared state.
pub struct State {
    config: Config,
    /// Slots by repository name. This map's lock is held only to find or add a slot, never
    /// while a repository opens, so one repository held by another process stalls no other.
    open: Mutex<HashMap<String, Slot>>,
    /// Base URL (`http://HOST:PORT`) and owner token written into advertisements.
    advertise: Option<(String, String)>,
    /// The last upload commit's tensors, whichever repository it went to (content-addressed,
    /// so one budget serves them all): a push of the next checkpoint of a series takes its
    /// deltas against them without decoding them again.
    pub(crate) warm: Arc<mdl::warm::WarmTensors>,
    /// The web view's signed-in browsers.
    pub(crate) sessions: web::Sessions,
    /// Held while a repository is created, one at a time.
    creating: Mutex<()>,
}

impl State {
    /// State for `config`. With `advertise = Some(base_url)`, every repository opened is
    /// advertised under `.mdl/` with a fresh write token accepted by this server.
    pub fn new(mut config: Config, advertise: Option<String>) -> Result<Arc<State>, String> {
        let advertise = match advertise {
            Some(base) => {
                let token = random_token()?;
                config
                    .tokens
                    .add("local-owner", Scope::Write, token.clone());
                Some((base, token))
            }
            None => None,
        };
        Ok(Arc::new(State {
            config,
            open: Mutex::new(HashMap::new()),
            advertise,
            warm: Arc::new(mdl::warm::WarmTensors::new(mdl::warm::DEFAULT_WARM_BYTES)),
            sessions: web::Sessions::default(),
            creating: Mutex::new(()),
        }))
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Opens every repository now (a root's existing ones), so they are owned and advertised
    /// from the start. Returns their names.
    pub fn open_all(&self) -> Result<Vec<String>, mdl_bucket::Error> {
        let names = self.names();
        for name in &names {
            self.open_repo(name, self.config.wait)?;
        }
        Ok(names)
    }

    /// Names of the repositories served now.
    pub fn names(&self) -> Vec<String> {
        match &self.config.repos {
            Repos::One { name, .. } | Repos::Bucket { name, .. } => vec![name.clone()],
            Repos::Root(root) => {
                // Repositories at the top, and one folder down in namespaces.
                let mut names = Vec::new();
                for (name, path) in folders(root) {
                    if is_repository(&path) {
                        names.push(name);
                    } else {
                        names.extend(
                            folders(&path)
                                .filter(|(_, p)| is_repository(p))
                                .map(|(n, _)| format!("{name}/{n}")),
                        );
                    }
                }
                names.retain(|n| valid_repo_name(n));
                names.sort();
                names
            }
        }
    }

    /// Creates repository `name` in the served folder, where `admin` (whether the request may)
    /// is `Ok`. A server of one repository (or of one in object storage) creates none. Called
    /// on blocking threads only.
    pub(crate) fn create_repo(
        &self,
        name: &str,
        admin: Result<(), ApiError>,
    ) -> Result<(), ApiError> {
        let Repos::Root(root) = &self.config.repos else {
            return Err(ApiError::new(
                ErrorCode::Unsupported,
                "this server serves one repository and creates none: serve a folder of repositories (mdl serve --root DIR) to create them over HTTP",
            ));
        };
        if !valid_repo_name(name) {
            return Err(ApiError::new(
                ErrorCode::InvalidRepositoryName,
                format!("{name:?} is not a repository name (NAME or NAMESPACE/NAME, each of letters, digits, '-', '_', '.', not starting with '.'; NAME not a route's word such as refs or tree)"),
            ));
        }
        let _one_at_a_time = self.creating.lock().unwrap_or_else(|p| p.into_inner());
        let dir = root.join(name);
        if dir.join(mdl::MDL_DIR).exists() {
            return Err(ApiError::new(
                ErrorCode::Exists,
                format!("repository {name} exists already"),
            ));
        }
        // A namespace is a folder of repositories, never one itself, and the other way round.
        if let Some((namespace, _)) = name.split_once('/') {
            if is_repository(&root.join(namespace)) {
                return Err(ApiError::new(
                    ErrorCode::InvalidRepositoryName,
                    format!("{namespace} is a repository, so it cannot hold {name}: choose another namespace"),
                ));
            }
        } else if folders(&dir).any(|(_, p)| is_repository(&p)) {
            return Err(ApiError::new(
                ErrorCode::InvalidRepositoryName,
                format!("{name} is a namespace holding repositories: name the new one {name}/NAME"),
            ));
        }
        admin?;
        Repository::init(&dir)?;
        tracing::info!("created repository {name}");
        Ok(())
    }

    /// The repository named `name`, opened (and locked) on first use; one whose database
    /// failed (a write error inside redb, e.g. a full disk) is let go and opened again, so the
    /// server recovers once the cause is gone. Called on blocking threads only.
    pub(crate) fn repo(&self, name: &str) -> Result<Arc<Served>, mdl_bucket::Error> {
        self.open_repo(name, OPEN_WAIT.min(self.config.wait))
    }

    fn open_repo(&self, name: &str, wait: Duration) -> Result<Arc<Served>, mdl_bucket::Error> {
        let path = match &self.config.repos {
            Repos::One { name: n, path } if n == name => path.clone(),
            Repos::Bucket { name: n, .. } if n == name => PathBuf::new(),
            Repos::One { .. } | Repos::Bucket { .. } => return Err(no_such_repo(name).into()),
            Repos::Root(root) if valid_repo_name(name) => root.join(name),
            Repos::Root(_) => return Err(no_such_repo(name).into()),
        };
        let slot: Slot = self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name.to_string())
            .or_default()
            .clone();
        // Held while this repository opens: a second request for it waits here (at most
        // `wait`), requests for other repositories do not.
        let mut served = slot.lock().unwrap_or_else(|p| p.into_inner());
        match served.as_ref() {
            Some(s) if !s.repo.failed() => return Ok(s.clone()),
            Some(_) => {
                tracing::warn!("repository {name}: its database failed; opening it again");
                // Requests still using the failed one keep it (and its lock) until they end;
                // until then the new open finds the repository busy and answers 503.
                *served = None;
            }
            None => {}
        }
        let replica = match &self.config.repos {
            Repos::Bucket {
                location, cache, ..
            } => Some(mdl_bucket::Replica::open(location, cache, wait)?),
            _ => None,
        };
        let path = replica.as_ref().map_or(path, mdl_bucket::Replica::root);
        if !path.join(".mdl").join("meta.redb").is_file() {
            return Err(no_such_repo(name).into());
        }
        // A replica is this server's alone: one database handle for its readers and writers.
        // A folder is read without a lock, beside other processes, and each change opens it
        // for writing (`Served::writer`).
        let opts = OpenOptions {
            mode: if replica.is_some() {
                LockMode::Write
            } else {
                LockMode::Read
            },
            hold: replica.is_some(),
            wait,
            purpose: format!("mdl serve (repository {name})"),
            ..OpenOptions::default()
        };
        let mut repo = Repository::open(&path, &opts)?;
        for left in repo.sweep_incoming() {
            tracing::info!(
                "repository {name}: removed {} (a killed process's)",
                left.display()
            );
        }
        // The repository's `engine` setting (auto by default) picks where commits it receives
        // are compressed and checkouts decoded.
        let engine = mdl::engine::select(&repo, None)?;
        tracing::info!("repository {name}: engine {}", engine.why);
        repo.set_engine(engine.engine.clone());
        let disk = replica.is_none().then(|| (path.clone(), self.config.wait));
        let advertised = match &self.advertise {
            // A replica is no folder a user runs mdl in.
            Some(_) if replica.is_some() => false,
            Some((base, token)) => {
                repo.advertise(&mdl_protocol::body::Advertisement {
                    pid: std::process::id(),
                    url: format!("{base}/{name}"),
                    token: token.clone(),
                })?;
                true
            }
            None => false,
        };
        let new = Arc::new(Served {
            repo,
            disk,
            engine,
            advertised,
            replica: replica.map(Mutex::new),
            storage: web::StorageCache::default(),
        });
        *served = Some(new.clone());
        // What commits made before it was served left for later.
        new.work_deferred(None);
        Ok(new)
    }

    /// Closes every repository: releases the locks and removes the advertisements.
    pub fn close_all(&self) {
        let slots: Vec<Slot> = self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, s)| s)
            .collect();
        for slot in slots {
            slot.lock().unwrap_or_else(|p| p.into_inner()).take();
        }
    }
}

/// The folders in `dir`, by name (none if it cannot be read).
fn folders(dir: &std::path::Path) -> impl Iterator<Item = (String, PathBuf)> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .filter(|(_, p)| p.is_dir())
}

/// Whether `dir` holds a repository.
fn is_repository(dir: &std::path::Path) -> bool {
    dir.join(mdl::MDL_DIR).join("meta.redb").is_file()
}

fn no_such_repo(name: &str) -> mdl::Error {
    mdl::StoreError::NotARepository(PathBuf::from(name)).into()
}

/// 32 random bytes from the OS, as hex.
/// A one-time link that signs a browser into the web view (`/ui/.login?code=…`, good once,
/// for ten minutes): what `mdl serve` prints, so that no token goes into a URL.
pub fn sign_in_path(state: &State) -> Result<String, String> {
    Ok(format!(
        "/ui/.login?code={}",
        state.sessions.issue_code(web::SERVER_OWNER)?
    ))
}

pub(crate) fn random_token() -> Result<String, String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("cannot read /dev/urandom: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Serves `state` on `listener` until SIGINT or SIGTERM, then finishes the requests in flight
/// and closes the repositories. At most [`Limits::max_connections`] connections are open at
/// once (the next is accepted when one closes), at most [`Limits::max_per_address`] of them
/// from one address (one more is closed at once); headers must arrive within
/// [`Limits::header_timeout`], which also closes connections idle between requests; a
/// connection whose writes make no progress for [`Limits::body_timeout`] is closed.
///
/// The signal handlers are installed when this is called, before the future is first polled:
/// a caller says it listens after this returns, and a SIGTERM sent as soon as it has said so
/// stops the server gracefully (it once killed it).
pub fn serve(
    state: Arc<State>,
    listener: tokio::net::TcpListener,
) -> std::io::Result<impl std::future::Future<Output = std::io::Result<()>>> {
    let shutdown = shutdown_signal()?;
    Ok(serve_until(state, listener, shutdown))
}

async fn serve_until(
    state: Arc<State>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let limits = state.config.limits;
    let router = app(state.clone());
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let per_address = PerAddress::new(limits.max_per_address);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            _ = &mut shutdown => break,
        };
        let (stream, held) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match per_address.take(peer.ip()) {
                    Some(held) => (stream, held),
                    // Closed unanswered; its permit goes back to the others.
                    None => continue,
                },
                Err(e) => {
                    // Out of descriptors and the like: wait a little instead of spinning.
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        // A write that makes no progress for the body timeout fails the connection: a client
        // that stops reading a download lets go of what it holds (its decode budget).
        let mut io = tokio_io_timeout::TimeoutStream::new(stream);
        io.set_write_timeout(Some(limits.body_timeout));
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(Box::pin(io)), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("connection: {e}");
            }
            drop((permit, held));
        });
    }
    tracing::info!("shutting down: finishing requests in flight");
    graceful.shutdown().await;
    // On a blocking thread: a replica's storage client has a runtime of its own, which may
    // not be dropped inside this one.
    let _ = tokio::task::spawn_blocking(move || state.close_all()).await;
    Ok(())
}

/// How many connections each client address holds, against [`Limits::max_per_address`].
#[derive(Clone)]
struct PerAddress {
    max: usize,
    open: Arc<std::sync::Mutex<HashMap<std::net::IpAddr, usize>>>,
}

/// One connection counted against its address until dropped.
struct AddressHeld {
    ip: std::net::IpAddr,
    counts: PerAddress,
}

impl PerAddress {
    fn new(max: usize) -> PerAddress {
        PerAddress {
            max: max.max(1),
            open: Arc::default(),
        }
    }

    /// Counts a connection from `ip`, unless that address already holds the most it may.
    fn take(&self, ip: std::net::IpAddr) -> Option<AddressHeld> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= self.max {
            tracing::debug!("closed a connection from {ip}: it holds {n} already");
            return None;
        }
        *n += 1;
        Some(AddressHeld {
            ip,
            counts: self.clone(),
        })
    }
}

impl Drop for AddressHeld {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// SIGINT or SIGTERM, their handlers installed now.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    })
}
