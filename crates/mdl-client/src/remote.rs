//! [`Remote`]: one repository on a server, spoken to through the `/v1` API.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use mdl_format::names::printable;
use mdl_format::ObjectId;
use mdl_protocol::body::{self, Refs};
use mdl_protocol::history::{LogEntry, Shown};
use mdl_protocol::limits::{self, Deadlines};
use mdl_protocol::outcome::CommitOutcome;
use mdl_protocol::params::{self, CommitParams};
use mdl_protocol::route;
use mdl_protocol::transfer::{PlannedObject, Received, RefUpdate, Shallow};

use crate::tree::{self, TreeFile};
use crate::{Error, Result};

/// A repository on a server.
#[derive(Clone, Debug)]
pub struct Remote {
    url: String,
    /// `http://HOST:PORT`.
    pub(crate) server: String,
    /// The repository's routes' prefix: `server` and [`route::REPO`] filled in.
    pub(crate) api: String,
    token: Option<String>,
    deadlines: Deadlines,
    pub(crate) agent: ureq::Agent,
}

/// The server (`HOST:PORT`) and the repository's name of a repository URL
/// `http://HOST:PORT/REPO` or `http://HOST:PORT/NAMESPACE/REPO` (a trailing `/` allowed);
/// anything else is [`Error::BadUrl`].
pub fn parse_url(url: &str) -> Result<(&str, &str)> {
    let bad = || Error::BadUrl(url.to_string());
    let rest = url
        .trim_end_matches('/')
        .strip_prefix("http://")
        .ok_or_else(bad)?;
    let (host, repo) = rest.split_once('/').ok_or_else(bad)?;
    let parts: Vec<&str> = repo.split('/').collect();
    if host.is_empty()
        || parts.len() > 2
        || parts.iter().any(|p| p.is_empty() || p.starts_with('.'))
    {
        return Err(bad());
    }
    Ok((host, repo))
}

/// The deadlines the environment sets (`MDL_REMOTE_…`), over the defaults.
pub fn env_deadlines() -> Result<Deadlines> {
    Deadlines::default()
        .with_env(|name| std::env::var(name).ok())
        .map_err(Error::Config)
}

/// An HTTP agent keeping `d`: no redirect followed (one is refused, so that a token is only
/// ever sent where the user pointed), no compressed answer asked for.
fn agent(d: &Deadlines) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_resolve(Some(d.connect))
        .timeout_connect(Some(d.connect))
        .timeout_per_read(Some(d.idle))
        .timeout_per_write(Some(d.idle))
        .timeout_global(Some(d.request))
        .build()
        .into()
}

impl Remote {
    /// A client for the repository at `url` (`http://HOST:PORT/REPO`), sending `token` as a
    /// bearer token when given, with the deadlines the environment sets ([`env_deadlines`]).
    pub fn new(url: &str, token: Option<String>) -> Result<Remote> {
        Remote::with_deadlines(url, token, env_deadlines()?)
    }

    /// [`Remote::new`] keeping `deadlines`.
    pub fn with_deadlines(
        url: &str,
        token: Option<String>,
        deadlines: Deadlines,
    ) -> Result<Remote> {
        let url = url.trim_end_matches('/');
        let (host, repo) = parse_url(url)?;
        Ok(Remote {
            url: url.to_string(),
            server: format!("http://{host}"),
            api: format!(
                "http://{host}{}",
                route::fill(route::REPO, &[("repo", repo)])
            ),
            token: token.filter(|t| !t.is_empty()),
            agent: agent(&deadlines),
            deadlines,
        })
    }

    /// The repository's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The repository's name on the server (`NAMESPACE/REPO` for one in a namespace).
    pub fn name(&self) -> &str {
        parse_url(&self.url).map_or("", |(_, repo)| repo)
    }

    /// An answer refused.
    pub fn refused(&self, why: impl Into<String>) -> Error {
        Error::Answer {
            url: self.url.clone(),
            why: why.into(),
        }
    }

    /// What a failure of the HTTP client while doing `what` means: a deadline passed, an
    /// answer over its limit or not the JSON expected, or the server unreachable.
    fn failed(&self, what: &str, e: ureq::Error) -> Error {
        let d = &self.deadlines;
        let late = |waited: String, setting| Error::Deadline {
            url: self.url.clone(),
            what: format!("{waited} while {what}"),
            setting,
        };
        match e {
            ureq::Error::Timeout(t) => {
                use ureq::Timeout as T;
                match t {
                    T::Resolve | T::Connect => late(
                        format!("could not connect within {} s", d.connect.as_secs()),
                        "remote.connect-timeout",
                    ),
                    T::PerRead | T::RecvResponse | T::RecvBody => late(
                        format!("sent nothing for {} s", d.idle.as_secs()),
                        "remote.idle-timeout",
                    ),
                    T::PerWrite | T::SendRequest | T::SendBody => late(
                        format!("took nothing of the request for {} s", d.idle.as_secs()),
                        "remote.idle-timeout",
                    ),
                    _ => late(
                        "did not finish in time".to_string(),
                        "remote.request-timeout and remote.min-speed",
                    ),
                }
            }
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => late(
                format!("sent nothing for {} s", d.idle.as_secs()),
                "remote.idle-timeout",
            ),
            ureq::Error::BodyExceedsLimit(limit) => {
                self.refused(format!("{what}: an answer over {limit} bytes"))
            }
            ureq::Error::Json(e) => self.refused(format!("{what}: not the JSON expected ({e})")),
            other => self.transport(format!("{what}: {other}")),
        }
    }

    /// [`Self::failed`] of an error reading an answer's body (a ureq error inside an I/O
    /// error, unwrapped by `From`).
    fn failed_io(&self, what: &str, e: std::io::Error) -> Error {
        self.failed(what, ureq::Error::from(e))
    }

    fn transport(&self, e: impl std::fmt::Display) -> Error {
        Error::Transport {
            url: self.url.clone(),
            why: e.to_string(),
        }
    }

    pub(crate) fn auth<B>(&self, req: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) => req.header("Authorization", format!("Bearer {t}")),
            None => req,
        }
    }

    /// A request that may take the whole-request deadline plus `bytes` at the minimum speed
    /// (a transfer of known size).
    fn moving<B>(&self, req: ureq::RequestBuilder<B>, bytes: u64) -> ureq::RequestBuilder<B> {
        req.config()
            .timeout_global(Some(self.deadlines.for_bytes(bytes)))
            .build()
    }

    /// Turns an error status into [`Error::Server`] (its body read up to
    /// [`limits::MAX_ERROR_BODY`]), and refuses a redirect or an encoded answer, neither of
    /// which mdl asks for; `what` says what was asked.
    pub(crate) fn check(
        &self,
        what: &str,
        resp: std::result::Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<ureq::http::Response<ureq::Body>> {
        let mut resp = resp.map_err(|e| self.failed(what, e))?;
        let status = resp.status().as_u16();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .map(|v| printable(&String::from_utf8_lossy(v.as_bytes())))
        };
        if (300..400).contains(&status) {
            return Err(self.refused(format!(
                "{what}: a redirect (HTTP {status}) to {}; mdl follows none: give the repository's own URL",
                header("location").unwrap_or_else(|| "nowhere".into())
            )));
        }
        if let Some(enc) = header("content-encoding").filter(|e| e != "identity") {
            return Err(self.refused(format!(
                "{what}: content encoded as {enc:?}, which mdl does not ask for (HTTP {status})"
            )));
        }
        if status < 400 {
            return Ok(resp);
        }
        let mut text = Vec::new();
        let read = resp
            .body_mut()
            .as_reader()
            .take(limits::MAX_ERROR_BODY)
            .read_to_end(&mut text);
        let mut error = error_answer(status, &text);
        if let (Error::Server { message, .. }, Err(e)) = (&mut error, read) {
            if message == NO_MESSAGE {
                *message = format!("no message ({})", self.failed_io(what, e));
            }
        }
        Err(error)
    }

    /// Reads a JSON answer of at most `limit` bytes (a declared length over it is refused
    /// before anything is read).
    pub(crate) fn json<T: serde::de::DeserializeOwned>(
        &self,
        what: &str,
        mut resp: ureq::http::Response<ureq::Body>,
        limit: u64,
    ) -> Result<T> {
        if let Some(len) = resp.body().content_length().filter(|&n| n > limit) {
            return Err(self.refused(format!(
                "{what}: an answer of {len} bytes, over the limit of {limit}"
            )));
        }
        let bytes = resp
            .body_mut()
            .with_config()
            .limit(limit)
            .read_to_vec()
            .map_err(|e| self.failed(what, e))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| self.refused(format!("{what}: not the JSON expected ({e})")))
    }

    pub(crate) fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
        limit: u64,
    ) -> Result<T> {
        let what = format!("reading {path}");
        let mut req = self.auth(self.agent.get(format!("{}{path}", self.api)));
        for (k, v) in query {
            req = req.query(*k, v);
        }
        let resp = self.check(&what, req.call())?;
        self.json(&what, resp, limit)
    }

    pub(crate) fn post_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &impl serde::Serialize,
        limit: u64,
    ) -> Result<T> {
        let what = format!("posting to {path}");
        let req = self.auth(self.agent.post(format!("{}{path}", self.api)));
        let resp = self.check(&what, req.send_json(body))?;
        self.json(&what, resp, limit)
    }

    /// Branches, tags and HEAD.
    pub fn refs(&self) -> Result<Refs> {
        self.get_json(route::REFS, &[], limits::MAX_REFS)
    }

    /// History from `rev` (HEAD when `None`).
    pub fn log(&self, rev: Option<&str>, limit: Option<usize>) -> Result<Vec<LogEntry>> {
        let query = body::LogQuery {
            rev: rev.map(str::to_string),
            limit,
            all: false,
        };
        self.get_json(route::LOG, &query.pairs(), limits::MAX_DOCUMENT)
    }

    /// Waits until ref `name` (a full name) no longer points at `from`, at most `timeout` (the
    /// server holds each request up to [`body::MAX_WAIT_MS`]; longer waits ask again): where
    /// it points then, and whether it moved in time.
    pub fn wait_ref(
        &self,
        name: &str,
        from: Option<ObjectId>,
        timeout: std::time::Duration,
    ) -> Result<body::Waited> {
        let end = std::time::Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            let query = body::WaitQuery {
                name: name.to_string(),
                from,
                timeout_ms: Some((left.as_millis() as u64).min(body::MAX_WAIT_MS)),
            };
            let w: body::Waited =
                self.get_json(route::REFS_WAIT, &query.pairs(), limits::MAX_DOCUMENT)?;
            if w.moved || std::time::Instant::now() >= end {
                return Ok(w);
            }
        }
    }

    /// Every branch's, tag's and remote-tracking branch's history, newest first (`mdl log
    /// --all`).
    pub fn log_all(&self, limit: Option<usize>) -> Result<Vec<LogEntry>> {
        let query = body::LogQuery {
            rev: None,
            limit,
            all: true,
        };
        self.get_json(route::LOG, &query.pairs(), limits::MAX_DOCUMENT)
    }

    /// A commit and its tensors.
    pub fn show(&self, rev: &str) -> Result<Shown> {
        self.get_json(
            &route::fill(route::COMMIT, &[("rev", rev)]),
            &[],
            limits::MAX_DOCUMENT,
        )
    }

    /// Commits the safetensors file at `file` on the server, as a local commit would with
    /// `commit` there (the query parameters of `POST /commits`); the file keeps its name in
    /// the commit's tree.
    pub fn commit(&self, file: &Path, commit: &CommitParams) -> Result<CommitOutcome> {
        let input = |source| Error::Input {
            path: file.to_path_buf(),
            source,
        };
        let f = std::fs::File::open(file).map_err(input)?;
        let len = f.metadata().map_err(input)?.len();
        let mut req = self.commit_request(commit);
        if let Some(name) = file.file_name().and_then(|n| n.to_str()) {
            req = req.query(params::PATH, name);
        }
        let what = "committing";
        let sent = self
            .moving(upload(req, "application/octet-stream"), len)
            .send(&f);
        let resp = self.check(what, sent)?;
        self.json(what, resp, limits::MAX_DOCUMENT)
    }

    /// `POST /commits` with `commit` as its query parameters.
    fn commit_request(
        &self,
        commit: &CommitParams,
    ) -> ureq::RequestBuilder<ureq::typestate::WithBody> {
        let mut req = self.auth(self.agent.post(format!("{}{}", self.api, route::COMMITS)));
        for (k, v) in params::encode(commit) {
            req = req.query(k, v);
        }
        req
    }

    /// Commits a tree of `files` on the server: they go as one tar, written while it is sent.
    pub fn commit_tree(
        &self,
        files: Vec<TreeFile>,
        commit: &CommitParams,
    ) -> Result<CommitOutcome> {
        let bytes = files
            .iter()
            .map(|f| f.file.metadata().map_or(0, |m| m.len()))
            .sum();
        let req = self
            .commit_request(commit)
            .query(params::FILES, files.len().to_string());
        let (mut tar, writing) = tree::stream(files).map_err(|e| self.transport(e))?;
        let sent = self
            .moving(upload(req, tree::TAR), bytes)
            .send(ureq::SendBody::from_reader(&mut tar));
        drop(tar);
        // A file that could not be read broke the upload off: that is what to report.
        if let Ok(Err((path, source))) = writing.join() {
            return Err(Error::Input { path, source });
        }
        let what = "committing a tree";
        let resp = self.check(what, sent)?;
        self.json(what, resp, limits::MAX_DOCUMENT)
    }

    /// The files of `rev`, and the commit it resolved to (`GET /files/REV`).
    pub fn files(&self, rev: &str) -> Result<body::Files> {
        self.get_json(
            &route::fill(route::FILES, &[("rev", rev)]),
            &[],
            limits::MAX_LISTING,
        )
    }

    /// Writes file `path` of commit `commit` to `to` (by commit id: whatever the branch does
    /// meanwhile): exactly `len` bytes, the length the commit gives it. An answer of another
    /// length, declared or sent, is refused (nothing past `len` is read).
    pub fn download_file(
        &self,
        commit: &ObjectId,
        path: &str,
        len: u64,
        to: &mut dyn Write,
    ) -> Result<()> {
        let url = format!(
            "{}{}",
            self.api,
            route::fill(route::FILE, &[("rev", &commit.to_hex()), ("path", path)])
        );
        let what = format!("sending {}", printable(path));
        let req = self.moving(self.auth(self.agent.get(url)), len);
        let mut resp = self.check(&what, req.call())?;
        if let Some(declared) = resp.body().content_length().filter(|&n| n != len) {
            return Err(self.refused(format!(
                "{}: {declared} bytes announced, the commit says {len}",
                printable(path)
            )));
        }
        let mut reader = resp
            .body_mut()
            .with_config()
            .limit(u64::MAX)
            .reader()
            .take(len.saturating_add(1));
        let mut buf = vec![0u8; (1 << 20).min(len as usize + 1)];
        let mut n = 0u64;
        loop {
            let got = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(got) => got,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.failed_io(&what, e)),
            };
            n += got as u64;
            if n > len {
                return Err(self.refused(format!(
                    "{}: more than the {len} bytes the commit gives it",
                    printable(path)
                )));
            }
            to.write_all(&buf[..got]).map_err(|source| Error::Output {
                what: path.to_string(),
                source,
            })?;
        }
        if n != len {
            return Err(self.refused(format!(
                "{}: {n} bytes sent, the commit gives it {len}",
                printable(path)
            )));
        }
        Ok(())
    }

    /// Which of `ids` the server lacks.
    pub fn missing(&self, ids: &[ObjectId]) -> Result<Vec<ObjectId>> {
        let mut out = Vec::new();
        for chunk in ids.chunks(body::MAX_IDS) {
            let ids = body::Ids {
                ids: chunk.to_vec(),
            };
            let m: body::Missing =
                self.post_json(route::OBJECTS_MISSING, &ids, limits::MAX_DOCUMENT)?;
            out.extend(m.missing);
        }
        Ok(out)
    }

    /// The objects the server would send for `want` (with as much history as `limit` takes)
    /// to a repository holding `have`, each tensor stored whole there paired with the version
    /// of it `have` holds (its `against`, for [`Self::fetch_pack`]).
    pub fn plan(
        &self,
        want: &[ObjectId],
        have: &[ObjectId],
        limit: &Shallow,
    ) -> Result<Vec<PlannedObject>> {
        let request = body::PlanRequest {
            want: want.to_vec(),
            have: have.to_vec(),
            deltas: !have.is_empty(),
            shallow: *limit,
        };
        let p: body::Plan = self.post_json(route::OBJECTS_PLAN, &request, limits::MAX_PLAN)?;
        Ok(p.objects)
    }

    /// The pack of the records of `ids` (at most [`body::MAX_IDS`] of them, `bytes` planned),
    /// bases first, as it arrives (`POST /objects/fetch`); the tensors `against` pairs with a
    /// version this side holds may come coded against it, and the record `resume` names from
    /// where this side holds it to.
    pub fn fetch_pack(
        &self,
        ids: &[ObjectId],
        against: &[body::Against],
        resume: Option<body::Resume>,
        bytes: u64,
    ) -> Result<PackStream> {
        let req = self.auth(
            self.agent
                .post(format!("{}{}", self.api, route::OBJECTS_FETCH)),
        );
        let ids = body::FetchRequest {
            ids: ids.to_vec(),
            against: against.to_vec(),
            resume,
        };
        let what = "sending the pack";
        let resp = self.check(what, self.moving(req, bytes).send_json(&ids))?;
        Ok(PackStream {
            reader: resp.into_body().into_with_config().limit(u64::MAX).reader(),
            remote: self.clone(),
            failure: Failure::default(),
        })
    }

    /// How much of the pack whose blake3 hash is `key` the server holds from an upload of it
    /// cut off (`GET /objects/uploads/{key}`); 0 from a server that keeps none.
    pub fn upload_held(&self, key: &ObjectId) -> Result<u64> {
        let path = route::OBJECTS_UPLOAD.replace("{key}", &key.to_hex());
        match self.get_json::<body::UploadHeld>(&path, &[], limits::MAX_DOCUMENT) {
            Ok(held) => Ok(held.held),
            Err(Error::Server { status: 404, .. }) => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Uploads a pack of `len` bytes read from `pack` (`POST /objects`): what the server
    /// stored. With `resumable`, the pack's key (its blake3 hash: what the server keeps of it
    /// if the upload is cut off is kept under it) and the offset in the pack `pack` starts at
    /// (where the server holds the bytes before it: [`Self::upload_held`]).
    pub fn send_pack(
        &self,
        pack: &mut dyn Read,
        len: u64,
        resumable: Option<(ObjectId, u64)>,
    ) -> Result<Received> {
        // The declared length keeps the upload one sized body (the server checks it first).
        let mut req = self
            .auth(self.agent.post(format!("{}{}", self.api, route::OBJECTS)))
            .header("Content-Length", len.to_string());
        if let Some((key, offset)) = resumable {
            req = req
                .header(route::HEADER_UPLOAD, key.to_hex())
                .header(route::HEADER_UPLOAD_OFFSET, offset.to_string());
        }
        let body = ureq::SendBody::from_reader(pack);
        let what = "receiving the pack";
        let resp = self.check(what, self.moving(upload(req, route::PACK), len).send(body))?;
        self.json(what, resp, limits::MAX_DOCUMENT)
    }

    /// Moves a ref on the server by compare-and-swap.
    pub fn update_ref(&self, update: &RefUpdate) -> Result<()> {
        let _: body::RefMoved = self.post_json(route::REFS, update, limits::MAX_DOCUMENT)?;
        Ok(())
    }
}

/// What an error answer's body says: its code and message when it is mdl's JSON error, else
/// its text; the message shown escaped ([`printable`]) and cut at 300 characters, whatever the
/// body holds.
pub fn error_answer(status: u16, body: &[u8]) -> Error {
    let text = String::from_utf8_lossy(body);
    let (code, message) = match serde_json::from_str::<body::Error>(&text) {
        Ok(e) => (Some(e.code), e.message),
        Err(_) => (None, text.trim().to_string()),
    };
    let mut message = printable(&message);
    if message.chars().count() > MAX_MESSAGE {
        message = message.chars().take(MAX_MESSAGE).collect::<String>() + "…";
    }
    if message.is_empty() {
        message = NO_MESSAGE.to_string();
    }
    Error::Server {
        status,
        code,
        message,
    }
}

/// Characters of a server's message shown.
const MAX_MESSAGE: usize = 300;
/// What an error answer without a message says.
const NO_MESSAGE: &str = "no message";

/// A pack as it arrives ([`Remote::fetch_pack`]). A read that fails keeps its cause as the
/// client's error ([`Failure`]), for the reader of the pack to report rather than the read
/// error it saw.
pub struct PackStream {
    reader: ureq::BodyReader<'static>,
    remote: Remote,
    failure: Failure,
}

/// The first failure of a [`PackStream`], shared with whoever reads it.
#[derive(Clone, Debug, Default)]
pub struct Failure(Arc<Mutex<Option<Error>>>);

impl Failure {
    /// The failure, if the stream failed.
    pub fn take(&self) -> Option<Error> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl PackStream {
    /// Where its failure will be.
    pub fn failure(&self) -> Failure {
        self.failure.clone()
    }
}

impl Read for PackStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.reader.read(buf).map_err(|e| {
            let kind = e.kind();
            let error = self.remote.failed_io("sending the pack", e);
            let text = error.to_string();
            let mut slot = self.failure.0.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert(error);
            std::io::Error::new(kind, text)
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    #[test]
    fn repository_urls_are_checked_and_routed() {
        let r = Remote::new("http://host:8080/run-1/", None).unwrap();
        assert_eq!(r.url(), "http://host:8080/run-1");
        assert_eq!(r.name(), "run-1");
        assert_eq!(r.api, "http://host:8080/v1/repos/run-1");
        assert!(r.token.is_none());
        let t = Remote::new("http://h/r", Some(String::new())).unwrap();
        assert!(t.token.is_none(), "an empty token is no token");
        // A repository in a namespace: one segment in its routes.
        let n = Remote::new("http://host:8080/team/run-1", None).unwrap();
        assert_eq!(n.name(), "team/run-1");
        assert_eq!(n.api, "http://host:8080/v1/repos/team%2Frun-1");
        for bad in [
            "https://h/r",
            "h/r",
            "http://h",
            "http:///r",
            "http://h/a/b/c",
            "http://h/a//b",
            "http://h/.hidden",
            "http://h/a/.b",
        ] {
            assert!(
                matches!(Remote::new(bad, None), Err(Error::BadUrl(_))),
                "{bad} accepted"
            );
        }
    }
}
