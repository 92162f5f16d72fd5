//! mdl's HTTP client: a [`Remote`] speaks the server's `/v1` API (`docs/HTTP_API.md`), and
//! [`clone`], [`fetch`], [`pull`] and [`push`] move history between a local repository and a
//! server. Only missing objects travel; every object received is re-hashed before it is
//! indexed ([`mdl::transfer::receive_pack`]); refs change by compare-and-swap.
//!
//! A repository's URL is `http://HOST:PORT/REPO`. Remotes are kept in the repository's
//! configuration as `remote.NAME.url`; fetched branches as `refs/remotes/NAME/BRANCH`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use mdl::log::LogEntry;
use mdl::show::Shown;
use mdl::transfer::{self, PlannedObject, Received, RefUpdate};
use mdl::{ObjectId, Ref, RefName, RefValue, Repository, Timestamp};
use mdl_protocol::body::{self, ListedRef, Refs};
use mdl_protocol::{params, route, ErrorCode};

/// What can go wrong talking to a server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with an error.
    #[error("server: {message} ({}, HTTP {status})", code.map_or("no known error code", ErrorCode::as_str))]
    Server {
        /// HTTP status.
        status: u16,
        /// The server's stable error code; `None` for an answer without one this build knows
        /// (a newer server's, or not mdl's), whose text is then in the message.
        code: Option<ErrorCode>,
        /// Its message.
        message: String,
    },
    /// The server could not be reached or the connection failed.
    #[error("cannot reach {url}: {why}")]
    Transport {
        /// The URL.
        url: String,
        /// What failed.
        why: String,
    },
    /// A URL that is not `http://HOST:PORT/REPO`.
    #[error("invalid repository URL {0:?}: expected http://HOST:PORT/REPO")]
    BadUrl(String),
    /// A push or pull that would lose commits.
    #[error("{0}")]
    Rejected(String),
    /// A remote name that is not configured, or already is.
    #[error("{0}")]
    Remote(String),
    /// The local repository failed.
    #[error(transparent)]
    Local(#[from] mdl::Error),
}

impl From<mdl::StoreError> for Error {
    fn from(e: mdl::StoreError) -> Self {
        Error::Local(e.into())
    }
}

/// Result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Most object ids one request carries (the server takes JSON bodies of up to 8 MiB).
pub const IDS_PER_REQUEST: usize = 100_000;

/// A repository on a server.
#[derive(Clone, Debug)]
pub struct Remote {
    url: String,
    api: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl Remote {
    /// A client for the repository at `url` (`http://HOST:PORT/REPO`), sending `token` as a
    /// bearer token when given.
    pub fn new(url: &str, token: Option<String>) -> Result<Remote> {
        let url = url.trim_end_matches('/');
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| Error::BadUrl(url.to_string()))?;
        let (host, repo) = rest
            .split_once('/')
            .ok_or_else(|| Error::BadUrl(url.to_string()))?;
        if host.is_empty() || repo.is_empty() || repo.contains('/') || repo.starts_with('.') {
            return Err(Error::BadUrl(url.to_string()));
        }
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .build()
            .into();
        Ok(Remote {
            url: url.to_string(),
            api: format!(
                "http://{host}{}",
                route::fill(route::REPO, &[("repo", repo)])
            ),
            token: token.filter(|t| !t.is_empty()),
            agent,
        })
    }

    /// The repository's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The repository's name on the server.
    pub fn name(&self) -> &str {
        self.url.rsplit('/').next().unwrap_or_default()
    }

    fn transport(&self, e: ureq::Error) -> Error {
        Error::Transport {
            url: self.url.clone(),
            why: e.to_string(),
        }
    }

    fn auth<B>(&self, req: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) => req.header("Authorization", format!("Bearer {t}")),
            None => req,
        }
    }

    /// Turns an error status into [`Error::Server`].
    fn check(
        &self,
        resp: std::result::Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<ureq::http::Response<ureq::Body>> {
        let mut resp = resp.map_err(|e| self.transport(e))?;
        let status = resp.status().as_u16();
        if status < 400 {
            return Ok(resp);
        }
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        let (code, message) = match serde_json::from_str::<body::Error>(&text) {
            Ok(e) => (Some(e.code), e.message),
            Err(_) => (None, text.trim().to_string()),
        };
        Err(Error::Server {
            status,
            code,
            message,
        })
    }

    fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<T> {
        let mut req = self.auth(self.agent.get(format!("{}{path}", self.api)));
        for (k, v) in query {
            req = req.query(*k, v);
        }
        let mut resp = self.check(req.call())?;
        resp.body_mut()
            .with_config()
            .limit(1 << 30)
            .read_json()
            .map_err(|e| self.transport(e))
    }

    fn post_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<T> {
        let req = self.auth(self.agent.post(format!("{}{path}", self.api)));
        let mut resp = self.check(req.send_json(body))?;
        resp.body_mut()
            .with_config()
            .limit(1 << 30)
            .read_json()
            .map_err(|e| self.transport(e))
    }

    /// Runs `mdl compact` on the server (`POST /maintenance/compact`).
    pub fn compact(
        &self,
        max_depth: Option<u32>,
        dry_run: bool,
    ) -> Result<mdl::compact::CompactOutcome> {
        let opts = mdl::compact::CompactOptions { max_depth, dry_run };
        self.post_json(route::COMPACT, &opts)
    }

    /// Runs `mdl gc` on the server (`POST /maintenance/gc`); durations as `mdl gc` takes them.
    pub fn gc(
        &self,
        prune_older_than: Option<&str>,
        expire_reflog: Option<&str>,
        dry_run: bool,
    ) -> Result<mdl::gc::GcOutcome> {
        let request = body::GcRequest {
            prune_older_than: prune_older_than.map(str::to_string),
            expire_reflog: expire_reflog.map(str::to_string),
            dry_run,
        };
        self.post_json(route::GC, &request)
    }

    /// Branches, tags and HEAD.
    pub fn refs(&self) -> Result<Refs> {
        self.get_json(route::REFS, &[])
    }

    /// History from `rev` (HEAD when `None`).
    pub fn log(&self, rev: Option<&str>, limit: Option<usize>) -> Result<Vec<LogEntry>> {
        let query = body::LogQuery {
            rev: rev.map(str::to_string),
            limit,
        };
        self.get_json(route::LOG, &query.pairs())
    }

    /// A commit and its tensors.
    pub fn show(&self, rev: &str) -> Result<Shown> {
        self.get_json(&route::fill(route::COMMIT, &[("rev", rev)]), &[])
    }

    /// Commits the safetensors file at `file` on the server, as [`mdl::commit::commit`] would
    /// with `opts` there (the query parameters of `POST /commits`). The author defaults to this
    /// machine's ([`mdl::commit::default_author`]), not the server's.
    pub fn commit(
        &self,
        file: &Path,
        opts: &mdl::commit::CommitOptions,
    ) -> Result<mdl::commit::CommitOutcome> {
        let f = std::fs::File::open(file).map_err(|source| mdl::Error::Input {
            path: file.to_path_buf(),
            source,
        })?;
        let mut req = self.auth(self.agent.post(format!("{}{}", self.api, route::COMMITS)));
        for (k, v) in params::encode(opts).map_err(|why| Error::Remote(why.into()))? {
            req = req.query(k, v);
        }
        let mut resp = self.check(upload(req, "application/octet-stream").send(&f))?;
        resp.body_mut().read_json().map_err(|e| self.transport(e))
    }

    /// Downloads `rev`'s checkpoint to `out` (through a temporary file renamed into place).
    pub fn download(
        &self,
        rev: &str,
        out: &Path,
        force: bool,
    ) -> Result<mdl::checkout::CheckoutOutcome> {
        mdl::checkout::refuse_inside_repository(out)?;
        if !force && out.symlink_metadata().is_ok() {
            return Err(mdl::Error::OutputExists(out.to_path_buf()).into());
        }
        let file = format!("{rev}.safetensors");
        let url = format!(
            "{}{}",
            self.api,
            route::fill(route::CHECKPOINT, &[("file", &file)])
        );
        let mut resp = self.check(self.auth(self.agent.get(url)).call())?;
        let commit: ObjectId = resp
            .headers()
            .get(route::HEADER_COMMIT)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| Error::Transport {
                url: self.url.clone(),
                why: "the answer has no X-Mdl-Commit header".into(),
            })?;
        let lossy_tensors: u32 = resp
            .headers()
            .get(route::HEADER_LOSSY_TENSORS)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let expected: Option<u64> = resp
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let write_err = |source| mdl::Error::Output {
            path: out.to_path_buf(),
            source,
        };
        let mut tmp = mdl::checkout::temporary_output(out)?;
        let _interrupted = mdl::interrupt::register(tmp.path());
        let mut reader = resp.body_mut().with_config().limit(u64::MAX).reader();
        let n = std::io::copy(&mut reader, tmp.as_file_mut()).map_err(|e| Error::Transport {
            url: self.url.clone(),
            why: format!("download interrupted: {e}"),
        })?;
        if expected.is_some_and(|e| e != n) {
            return Err(Error::Transport {
                url: self.url.clone(),
                why: format!("download ended after {n} bytes"),
            });
        }
        tmp.persist(out).map_err(|e| write_err(e.error))?;
        Ok(mdl::checkout::CheckoutOutcome {
            id: commit,
            path: out.to_path_buf(),
            bytes: n,
            lossy: lossy_tensors > 0,
            lossy_tensors,
            skipped: Vec::new(),
        })
    }

    /// Which of `ids` the server lacks.
    pub fn missing(&self, ids: &[ObjectId]) -> Result<Vec<ObjectId>> {
        let mut out = Vec::new();
        for chunk in ids.chunks(IDS_PER_REQUEST) {
            let ids = body::Ids {
                ids: chunk.to_vec(),
            };
            let m: body::Missing = self.post_json(route::OBJECTS_MISSING, &ids)?;
            out.extend(m.missing);
        }
        Ok(out)
    }

    /// The objects the server would send for `want` to a repository holding `have`.
    pub fn plan(&self, want: &[ObjectId], have: &[ObjectId]) -> Result<Vec<PlannedObject>> {
        let request = body::PlanRequest {
            want: want.to_vec(),
            have: have.to_vec(),
        };
        let p: body::Plan = self.post_json(route::OBJECTS_PLAN, &request)?;
        Ok(p.objects)
    }

    /// Downloads the records of `ids` and stores them in `repo`, verifying each (in requests
    /// of at most [`IDS_PER_REQUEST`] ids, in order, so bases still come first).
    pub fn fetch_objects(&self, repo: &Repository, ids: &[ObjectId]) -> Result<Received> {
        let mut total = Received::default();
        for chunk in ids.chunks(IDS_PER_REQUEST) {
            let req = self.auth(
                self.agent
                    .post(format!("{}{}", self.api, route::OBJECTS_FETCH)),
            );
            let ids = body::Ids {
                ids: chunk.to_vec(),
            };
            let mut resp = self.check(req.send_json(&ids))?;
            let mut reader = resp.body_mut().with_config().limit(u64::MAX).reader();
            let got = transfer::receive_pack(repo, &mut reader, u64::MAX)?;
            total.objects += got.objects;
            total.bytes += got.bytes;
            total.expired += got.expired;
            total.commits.extend(got.commits);
        }
        Ok(total)
    }

    /// Uploads the records of `ids` from `repo` (a pack built in a temporary file first).
    pub fn send_objects(&self, repo: &Repository, ids: &[ObjectId]) -> Result<Received> {
        let tmp = transfer::spool_pack(repo, ids)?;
        let file = tmp.reopen().map_err(|source| mdl::Error::Output {
            path: tmp.path().to_path_buf(),
            source,
        })?;
        let req = self.auth(self.agent.post(format!("{}{}", self.api, route::OBJECTS)));
        let mut resp = self.check(upload(req, route::PACK).send(&file))?;
        resp.body_mut().read_json().map_err(|e| self.transport(e))
    }

    /// Moves a ref on the server by compare-and-swap.
    pub fn update_ref(&self, update: &RefUpdate) -> Result<()> {
        let _: body::RefMoved = self.post_json(route::REFS, update)?;
        Ok(())
    }
}

/// An upload of `content_type`: with `Expect: 100-continue`, so a server that refuses it
/// before reading the body (a token without write scope, a body over its limit) answers
/// before anything is sent, and its error reaches the user instead of a broken pipe.
fn upload(
    req: ureq::RequestBuilder<ureq::typestate::WithBody>,
    content_type: &str,
) -> ureq::RequestBuilder<ureq::typestate::WithBody> {
    req.content_type(content_type)
        .header("Expect", "100-continue")
}

const REMOTE_PREFIX: &str = "remote.";
const URL_SUFFIX: &str = ".url";

/// Adds remote `name` with `url` to the repository's configuration.
pub fn add_remote(repo: &Repository, name: &str, url: &str) -> Result<()> {
    RefName::new(name).map_err(mdl::Error::from)?;
    if name.contains('/') {
        return Err(Error::Remote(format!(
            "invalid remote name {name:?}: it may not contain '/'"
        )));
    }
    Remote::new(url, None)?;
    let key = format!("{REMOTE_PREFIX}{name}{URL_SUFFIX}");
    if !mdl::config::add(repo, &key, url)? {
        return Err(Error::Remote(format!("remote {name} already exists")));
    }
    Ok(())
}

/// The configured remotes, as (name, url).
pub fn remotes(repo: &Repository) -> Result<Vec<(String, String)>> {
    let all = mdl::config::with_prefix(repo, REMOTE_PREFIX)?;
    Ok(all
        .into_iter()
        .filter_map(|(k, v)| {
            let name = k.strip_prefix(REMOTE_PREFIX)?.strip_suffix(URL_SUFFIX)?;
            Some((name.to_string(), v))
        })
        .collect())
}

/// The URL of remote `name`.
pub fn remote_url(repo: &Repository, name: &str) -> Result<String> {
    mdl::config::get(repo, &format!("{REMOTE_PREFIX}{name}{URL_SUFFIX}"))?.ok_or_else(|| {
        Error::Remote(format!(
            "no remote named {name} (mdl remote add {name} URL)"
        ))
    })
}

/// A ref that a fetch, pull or push moved.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Moved {
    /// Full ref name.
    pub name: String,
    /// Its value before.
    pub old: Option<ObjectId>,
    /// Its value now.
    pub new: ObjectId,
}

/// What a transfer did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TransferOutcome {
    /// Objects that travelled.
    pub objects: u64,
    /// Their record bytes.
    pub bytes: u64,
    /// Refs changed (locally for fetch and pull, on the server for push).
    pub moved: Vec<Moved>,
}

/// Fetches `branch` (every branch when `None`) and every tag from `remote` into `repo`:
/// branches land as `refs/remotes/REMOTE_NAME/BRANCH`; tags missing locally are created
/// (existing local tags are never moved).
pub fn fetch(
    repo: &Repository,
    remote_name: &str,
    remote: &Remote,
    branch: Option<&str>,
) -> Result<TransferOutcome> {
    fetch_refs(repo, remote_name, remote, &remote.refs()?, branch)
}

/// [`fetch`] given the server's refs.
fn fetch_refs(
    repo: &Repository,
    remote_name: &str,
    remote: &Remote,
    refs: &Refs,
    branch: Option<&str>,
) -> Result<TransferOutcome> {
    let branches: Vec<&ListedRef> = refs
        .refs
        .iter()
        .filter(|r| match (r.name.strip_prefix(Ref::BRANCHES), branch) {
            (Some(b), Some(want)) => b == want,
            (Some(_), None) => true,
            (None, _) => false,
        })
        .collect();
    if let (Some(b), true) = (branch, branches.is_empty()) {
        return Err(Error::Remote(format!("{} has no branch {b}", remote.url())));
    }
    let tags: Vec<&ListedRef> = refs
        .refs
        .iter()
        .filter(|r| r.name.starts_with(Ref::TAGS))
        .collect();
    let mut outcome = TransferOutcome::default();
    let wanted: Vec<ObjectId> = branches.iter().chain(&tags).map(|r| r.target).collect();
    let received = fetch_commits(repo, remote, &wanted)?;
    outcome.objects = received.objects;
    outcome.bytes = received.bytes;
    for r in &branches {
        let short = branch_name(&r.name[Ref::BRANCHES.len()..])?;
        let tracking = Ref::remote(remote_name, &short).full();
        let old = mdl::refs::get(repo, &tracking)?;
        if old.as_ref().and_then(RefValue::target) == Some(r.target) {
            continue;
        }
        mdl::refs::compare_and_swap(
            repo,
            &tracking,
            old.as_ref(),
            &RefValue::Direct(r.target),
            &format!("fetch {}", remote.url()),
        )?;
        outcome.moved.push(Moved {
            name: tracking,
            old: old.and_then(|v| v.target()),
            new: r.target,
        });
    }
    for t in &tags {
        if mdl::refs::get(repo, &t.name)?.is_some() {
            continue;
        }
        let value = match (&t.tagger, t.time_ms, &t.message) {
            (Some(tagger), Some(time), Some(message)) => RefValue::Annotated {
                target: t.target,
                tagger: tagger.clone(),
                time: Timestamp(time),
                message: message.clone(),
            },
            _ => RefValue::Direct(t.target),
        };
        mdl::refs::compare_and_swap(
            repo,
            &t.name,
            None,
            &value,
            &format!("fetch {}", remote.url()),
        )?;
        outcome.moved.push(Moved {
            name: t.name.clone(),
            old: None,
            new: t.target,
        });
    }
    Ok(outcome)
}

/// Brings the commits `want` (and their history) from the server, sending only objects this
/// repository lacks.
fn fetch_commits(repo: &Repository, remote: &Remote, want: &[ObjectId]) -> Result<Received> {
    let have: Vec<ObjectId> = transfer::commits(repo)?;
    let have_set: HashSet<ObjectId> = have.iter().copied().collect();
    let want: Vec<ObjectId> = want
        .iter()
        .filter(|id| !have_set.contains(id))
        .copied()
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    if want.is_empty() {
        return Ok(Received::default());
    }
    let plan = remote.plan(&want, &have)?;
    let planned: Vec<ObjectId> = plan.iter().map(|p| p.id).collect();
    let needed = transfer::missing(repo, &planned)?;
    tracing::info!(
        "fetching {} of {} objects from {}",
        needed.len(),
        plan.len(),
        remote.url()
    );
    remote.fetch_objects(repo, &needed)
}

/// Fetches `branch` (HEAD's when `None`) and fast-forwards the local branch to it (creating
/// it when missing). A local branch with commits the remote lacks is left alone with an
/// error naming both tips.
pub fn pull(
    repo: &Repository,
    remote_name: &str,
    remote: &Remote,
    branch: Option<&str>,
) -> Result<TransferOutcome> {
    let branch = match branch {
        Some(b) => b.to_string(),
        None => current_branch(repo)?,
    };
    let mut outcome = fetch(repo, remote_name, remote, Some(&branch))?;
    let tracking = Ref::remote(remote_name, &branch_name(&branch)?).full();
    let theirs = mdl::refs::get(repo, &tracking)?
        .and_then(|v| v.target())
        .ok_or_else(|| Error::Remote(format!("{} has no branch {branch}", remote.url())))?;
    let name = Ref::branch(&branch_name(&branch)?).full();
    let ours = mdl::refs::get(repo, &name)?;
    let ours_id = ours.as_ref().and_then(RefValue::target);
    match ours_id {
        Some(o) if o == theirs => {}
        Some(o) if transfer::is_ancestor(repo, &theirs, &o)? => {}
        Some(o) if !transfer::is_ancestor(repo, &o, &theirs)? => {
            return Err(Error::Rejected(format!(
                "cannot fast-forward {branch}: the local branch ({}) and {}'s ({}) have diverged",
                o.short(12),
                remote.url(),
                theirs.short(12)
            )));
        }
        _ => {
            mdl::refs::compare_and_swap(
                repo,
                &name,
                ours.as_ref(),
                &RefValue::Direct(theirs),
                &format!("pull {}", remote.url()),
            )?;
            outcome.moved.push(Moved {
                name,
                old: ours_id,
                new: theirs,
            });
        }
    }
    Ok(outcome)
}

/// A branch name given by the user or a server, validated.
fn branch_name(name: &str) -> Result<RefName> {
    Ok(RefName::new(name).map_err(mdl::Error::from)?)
}

fn current_branch(repo: &Repository) -> Result<String> {
    let head = repo.head_branch()?;
    Ok(head
        .strip_prefix(Ref::BRANCHES)
        .unwrap_or(&head)
        .to_string())
}

/// Pushes `branch` (HEAD's when `None`) to `remote`: sends the objects the server lacks, then
/// moves the server's branch by compare-and-swap. Refused when the server's branch has
/// commits this repository does not descend from (unless `force`), or when it changed
/// during the push.
pub fn push(
    repo: &Repository,
    remote_name: &str,
    remote: &Remote,
    branch: Option<&str>,
    force: bool,
) -> Result<TransferOutcome> {
    let branch = match branch {
        Some(b) => b.to_string(),
        None => current_branch(repo)?,
    };
    let name = Ref::branch(&branch_name(&branch)?).full();
    let tip = mdl::refs::get(repo, &name)?
        .and_then(|v| v.target())
        .ok_or_else(|| mdl::Error::UnbornBranch(branch.clone()))?;
    let refs = remote.refs()?;
    let theirs = refs.get(&name);
    let mut outcome = TransferOutcome::default();
    if theirs == Some(tip) {
        return Ok(outcome);
    }
    if let (Some(t), false) = (theirs, force) {
        let known = transfer::has_commit(repo, &t)?;
        if !known || !transfer::is_ancestor(repo, &t, &tip)? {
            return Err(Error::Rejected(format!(
                "push of {branch} rejected: not a fast-forward ({} has {} there, which {} does not descend from); pull first",
                remote.url(),
                t.short(12),
                tip.short(12)
            )));
        }
    }
    let update = RefUpdate {
        name: name.clone(),
        old: theirs,
        new: Some(tip),
        force,
    };
    // The server answers `incomplete` when gc removed, between these requests, an object it
    // had counted as present; nothing was published, and asking again sends it.
    let mut attempts = 0;
    let sent = loop {
        match send_and_move(repo, remote, &update) {
            Err(Error::Server {
                code: Some(ErrorCode::Incomplete),
                ..
            }) if attempts < PUSH_RETRIES => {
                attempts += 1;
                tracing::info!(
                    "{} lost objects during the push; sending again",
                    remote.url()
                );
            }
            other => break other,
        }
    };
    match sent {
        Ok(received) => {
            outcome.objects = received.objects;
            outcome.bytes = received.bytes;
        }
        Err(Error::Server {
            code: Some(ErrorCode::RefConflict),
            ..
        }) => {
            return Err(Error::Rejected(format!(
                "push of {branch} rejected: {}'s {branch} changed during the push; pull and push again",
                remote.url()
            )));
        }
        Err(Error::Server {
            code: Some(ErrorCode::NotFastForward),
            message,
            ..
        }) => {
            return Err(Error::Rejected(format!(
                "push of {branch} rejected: {message}"
            )));
        }
        Err(e) => return Err(e),
    }
    outcome.moved.push(Moved {
        name,
        old: theirs,
        new: tip,
    });
    // Record what the server now has.
    let tracking = Ref::remote(remote_name, &branch_name(&branch)?).full();
    let old = mdl::refs::get(repo, &tracking)?;
    mdl::refs::compare_and_swap(
        repo,
        &tracking,
        old.as_ref(),
        &RefValue::Direct(tip),
        &format!("push {}", remote.url()),
    )?;
    Ok(outcome)
}

/// How often a push starts again when the server lost objects it had counted as present.
const PUSH_RETRIES: usize = 3;

/// Sends what the server lacks of `update.new`'s history (asking which commits, then which of
/// their objects), then applies `update`.
fn send_and_move(repo: &Repository, remote: &Remote, update: &RefUpdate) -> Result<Received> {
    let tip = update.new.expect("a push moves a ref to a commit");
    let history = transfer::reachable_commits(repo, &[tip])?;
    let missing: HashSet<ObjectId> = remote.missing(&history)?.into_iter().collect();
    let plan = transfer::plan(repo, &[tip], &|id| !missing.contains(id))?;
    let ids: Vec<ObjectId> = plan.iter().map(|p| p.id).collect();
    let needed: HashSet<ObjectId> = remote.missing(&ids)?.into_iter().collect();
    let send: Vec<ObjectId> = ids.into_iter().filter(|id| needed.contains(id)).collect();
    let received = if send.is_empty() {
        Received::default()
    } else {
        remote.send_objects(repo, &send)?
    };
    remote.update_ref(update)?;
    Ok(received)
}

/// What a clone made.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CloneOutcome {
    /// The new repository's work directory.
    pub dir: PathBuf,
    /// The transfer.
    pub transfer: TransferOutcome,
    /// The branch HEAD points at.
    pub head: Option<String>,
}

/// Clones the repository at `url` into `dir` (which must not exist or be empty): every
/// branch and tag, `origin` as its remote, HEAD on the server's HEAD branch. The clone is
/// assembled in a hidden directory beside `dir` and renamed into place when complete, so a
/// failed or interrupted clone leaves `dir` as it was; what a killed clone left beside it is
/// removed by the next clone into the same place.
// The clone is a whole new repository assembled in a staging folder beside `dir`: renaming it
// into place, or removing it after a failure, moves a folder no store owns yet.
#[allow(clippy::disallowed_methods)]
pub fn clone(url: &str, dir: &Path, token: Option<String>) -> Result<CloneOutcome> {
    let remote = Remote::new(url, token)?;
    if dir.exists()
        && std::fs::read_dir(dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        return Err(Error::Remote(format!(
            "{} exists and is not empty",
            dir.display()
        )));
    }
    let staging = staging_dir(dir)?;
    sweep_stale_staging(dir);
    let _interrupted = mdl::interrupt::register(&staging);
    let result = (|| {
        let repo = Repository::init(&staging)?;
        add_remote(&repo, "origin", url)?;
        let refs = remote.refs()?;
        let mut transfer = fetch_refs(&repo, "origin", &remote, &refs, None)?;
        for r in &refs.refs {
            if let Some(Ref::Branch(_)) = Ref::parse(&r.name) {
                let name = r.name.clone();
                mdl::refs::compare_and_swap(
                    &repo,
                    &name,
                    None,
                    &RefValue::Direct(r.target),
                    &format!("clone {url}"),
                )?;
                transfer.moved.push(Moved {
                    name,
                    old: None,
                    new: r.target,
                });
            }
        }
        let head = refs
            .head
            .clone()
            .filter(|h| RefName::new(h).is_ok_and(|n| refs.get(&Ref::branch(&n).full()).is_some()));
        if let Some(h) = &head {
            mdl::refs::switch(&repo, h)?;
        }
        Ok((transfer, head))
    })();
    let done = result.and_then(|(transfer, head)| {
        // An empty `dir` is replaced by the finished clone (rename replaces an empty
        // directory).
        std::fs::rename(&staging, dir).map_err(|source| mdl::Error::Output {
            path: dir.to_path_buf(),
            source,
        })?;
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        Ok(CloneOutcome {
            dir,
            transfer,
            head,
        })
    });
    if done.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    done
}

/// The folder `dir` is in (`.` for a bare name) and its name; `None` for `/` or `..`.
fn place_of(dir: &Path) -> Option<(&Path, &std::ffi::OsStr)> {
    let parent = dir.parent()?;
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    Some((parent, dir.file_name()?))
}

/// Where a clone into `dir` is assembled: `.NAME.mdl-clone-PID` beside it.
fn staging_dir(dir: &Path) -> Result<PathBuf> {
    let (parent, name) = place_of(dir)
        .ok_or_else(|| Error::Remote(format!("{} is not a directory name", dir.display())))?;
    Ok(parent.join(format!(
        ".{}.mdl-clone-{}",
        name.to_string_lossy(),
        std::process::id()
    )))
}

/// Removes what clones into `dir` by processes that no longer run left beside it.
// Staging folders of clones whose process is gone: no repository's files yet.
#[allow(clippy::disallowed_methods)]
fn sweep_stale_staging(dir: &Path) {
    let Some((parent, name)) = place_of(dir) else {
        return;
    };
    let prefix = format!(".{}.mdl-clone-", name.to_string_lossy());
    for entry in std::fs::read_dir(parent).into_iter().flatten().flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            tracing::info!(
                "removing {} left by an interrupted clone",
                entry.path().display()
            );
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_urls_are_checked_and_routed() {
        let r = Remote::new("http://host:8080/run-1/", None).unwrap();
        assert_eq!(r.url(), "http://host:8080/run-1");
        assert_eq!(r.name(), "run-1");
        assert_eq!(r.api, "http://host:8080/v1/repos/run-1");
        assert!(r.token.is_none());
        let t = Remote::new("http://h/r", Some(String::new())).unwrap();
        assert!(t.token.is_none(), "an empty token is no token");
        for bad in [
            "https://h/r",
            "h/r",
            "http://h",
            "http:///r",
            "http://h/a/b",
            "http://h/.hidden",
        ] {
            assert!(
                matches!(Remote::new(bad, None), Err(Error::BadUrl(_))),
                "{bad} accepted"
            );
        }
    }

    #[test]
    fn server_errors_read_as_their_code_or_say_they_have_none() {
        let known = Error::Server {
            status: 409,
            code: Some(ErrorCode::NotFastForward),
            message: "behind".into(),
        };
        assert_eq!(
            known.to_string(),
            "server: behind (not_fast_forward, HTTP 409)"
        );
        let unknown = Error::Server {
            status: 502,
            code: None,
            message: "bad gateway".into(),
        };
        assert!(unknown.to_string().contains("no known error code"));
    }

    #[test]
    fn branch_names_are_validated() {
        assert!(branch_name("exp/lr").is_ok());
        assert!(branch_name("a..b").is_err());
        assert!(branch_name("").is_err());
    }
}
