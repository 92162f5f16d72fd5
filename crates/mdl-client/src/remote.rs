//! [`Remote`]: one repository on a server, spoken to through the `/v1` API.

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use mdl_format::ObjectId;
use mdl_protocol::body::{self, Refs};
use mdl_protocol::history::{BranchMove, Diff, LogEntry, Shown};
use mdl_protocol::outcome::{CommitOutcome, CompactOptions, CompactOutcome, FsckReport, Stats};
use mdl_protocol::params::{self, CommitParams};
use mdl_protocol::route;
use mdl_protocol::transfer::{PlannedObject, Received, RefUpdate};

use crate::tree::{self, TreeFile};
use crate::{Error, Result};

/// A repository on a server.
#[derive(Clone, Debug)]
pub struct Remote {
    url: String,
    /// `http://HOST:PORT`.
    server: String,
    /// The repository's routes' prefix: `server` and [`route::REPO`] filled in.
    api: String,
    token: Option<String>,
    agent: ureq::Agent,
}

/// The server (`HOST:PORT`) and the repository's name of a repository URL
/// `http://HOST:PORT/REPO` (a trailing `/` allowed); anything else is [`Error::BadUrl`].
pub fn parse_url(url: &str) -> Result<(&str, &str)> {
    let bad = || Error::BadUrl(url.to_string());
    let rest = url
        .trim_end_matches('/')
        .strip_prefix("http://")
        .ok_or_else(bad)?;
    let (host, repo) = rest.split_once('/').ok_or_else(bad)?;
    if host.is_empty() || repo.is_empty() || repo.contains('/') || repo.starts_with('.') {
        return Err(bad());
    }
    Ok((host, repo))
}

impl Remote {
    /// A client for the repository at `url` (`http://HOST:PORT/REPO`), sending `token` as a
    /// bearer token when given.
    pub fn new(url: &str, token: Option<String>) -> Result<Remote> {
        let url = url.trim_end_matches('/');
        let (host, repo) = parse_url(url)?;
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .build()
            .into();
        Ok(Remote {
            url: url.to_string(),
            server: format!("http://{host}"),
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

    fn transport(&self, e: impl std::fmt::Display) -> Error {
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
    pub fn compact(&self, max_depth: Option<u32>, dry_run: bool) -> Result<CompactOutcome> {
        let opts = CompactOptions { max_depth, dry_run };
        self.post_json(route::COMPACT, &opts)
    }

    /// Creates this repository on its server (`POST /v1/repos`): for an `admin` token, on a
    /// server that serves a folder of repositories.
    pub fn create(&self) -> Result<()> {
        let req = self.auth(self.agent.post(format!("{}{}", self.server, route::REPOS)));
        let new = body::NewRepo {
            name: self.name().to_string(),
        };
        let mut resp = self.check(req.send_json(&new))?;
        let _: body::NewRepo = resp.body_mut().read_json().map_err(|e| self.transport(e))?;
        Ok(())
    }

    /// Runs `mdl gc` on the server (`POST /maintenance/gc`); durations as `mdl gc` takes them.
    pub fn gc(
        &self,
        prune_older_than: Option<&str>,
        expire_reflog: Option<&str>,
        dry_run: bool,
    ) -> Result<body::GcAnswer> {
        let request = body::GcRequest {
            prune_older_than: prune_older_than.map(str::to_string),
            expire_reflog: expire_reflog.map(str::to_string),
            dry_run,
        };
        self.post_json(route::GC, &request)
    }

    /// The repository's totals (`GET /stats`).
    pub fn stats(&self) -> Result<Stats> {
        self.get_json(route::STATS, &[])
    }

    /// Revisions `a` and `b` compared (`GET /diff`).
    pub fn diff(&self, a: &str, b: &str) -> Result<Diff> {
        self.get_json(route::DIFF, &[("a", a.to_string()), ("b", b.to_string())])
    }

    /// Every setting: key, value, whether it is the default (`GET /config`).
    pub fn config(&self) -> Result<Vec<(String, String, bool)>> {
        self.get_json(route::CONFIG, &[])
    }

    /// Changes one setting (`POST /config`).
    pub fn set_config(&self, key: &str, value: &str) -> Result<body::ConfigSet> {
        let req = body::ConfigSet {
            key: key.to_string(),
            value: value.to_string(),
        };
        self.post_json(route::CONFIG, &req)
    }

    /// Creates branch `name` at `rev` (HEAD's commit when `None`); with `force`, creates or
    /// moves it (`POST /branches`).
    pub fn branch(&self, name: &str, rev: Option<&str>, force: bool) -> Result<BranchMove> {
        let req = body::BranchRequest {
            name: name.to_string(),
            rev: rev.map(str::to_string),
            force,
        };
        self.post_json(route::BRANCHES, &req)
    }

    /// Deletes branch `name`; without `force`, only if its commits stay reachable
    /// (`DELETE /branches/{name}`). Returns the commit it pointed at.
    pub fn delete_branch(&self, name: &str, force: bool) -> Result<ObjectId> {
        let path = route::fill(route::BRANCH, &[("name", name)]);
        let req = self
            .auth(self.agent.delete(format!("{}{path}", self.api)))
            .query("force", force.to_string());
        let mut resp = self.check(req.call())?;
        let deleted: body::Deleted = resp.body_mut().read_json().map_err(|e| self.transport(e))?;
        Ok(deleted.was)
    }

    /// Creates tag `name` at `rev` (HEAD's commit when `None`), annotated by `tagger` when
    /// `message` is given (`POST /tags`); the commit it names.
    pub fn tag(
        &self,
        name: &str,
        rev: Option<&str>,
        message: Option<&str>,
        tagger: &str,
    ) -> Result<ObjectId> {
        let req = body::TagRequest {
            name: name.to_string(),
            rev: rev.map(str::to_string),
            message: message.map(str::to_string),
            tagger: tagger.to_string(),
        };
        let tagged: body::Tagged = self.post_json(route::TAGS, &req)?;
        Ok(tagged.target)
    }

    /// Deletes tag `name` (`DELETE /tags/{name}`); the commit it named.
    pub fn delete_tag(&self, name: &str) -> Result<ObjectId> {
        let path = route::fill(route::TAG, &[("name", name)]);
        let req = self.auth(self.agent.delete(format!("{}{path}", self.api)));
        let mut resp = self.check(req.call())?;
        let deleted: body::Deleted = resp.body_mut().read_json().map_err(|e| self.transport(e))?;
        Ok(deleted.was)
    }

    /// Moves the current branch to `rev` (`POST /reset`).
    pub fn reset(&self, rev: &str) -> Result<BranchMove> {
        let req = body::ResetRequest {
            rev: rev.to_string(),
        };
        self.post_json(route::RESET, &req)
    }

    /// Where ref `name` (HEAD's branch when `None`) pointed, newest first (`GET /reflog`).
    pub fn reflog(&self, name: Option<&str>) -> Result<body::Reflog> {
        let query: Vec<(&str, String)> =
            name.map(|n| ("name", n.to_string())).into_iter().collect();
        self.get_json(route::REFLOG, &query)
    }

    /// Points HEAD at branch `name` (`POST /head`).
    pub fn switch(&self, name: &str) -> Result<()> {
        let req = body::Head {
            branch: name.to_string(),
        };
        self.post_json::<body::Head>(route::HEAD, &req).map(|_| ())
    }

    /// Checks the whole repository on the server, without repairing
    /// (`POST /maintenance/fsck`).
    pub fn fsck(&self) -> Result<FsckReport> {
        self.post_json(route::FSCK, &serde_json::json!({}))
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
            all: false,
        };
        self.get_json(route::LOG, &query.pairs())
    }

    /// Every branch's, tag's and remote-tracking branch's history, newest first (`mdl log
    /// --all`).
    pub fn log_all(&self, limit: Option<usize>) -> Result<Vec<LogEntry>> {
        let query = body::LogQuery {
            rev: None,
            limit,
            all: true,
        };
        self.get_json(route::LOG, &query.pairs())
    }

    /// A commit and its tensors.
    pub fn show(&self, rev: &str) -> Result<Shown> {
        self.get_json(&route::fill(route::COMMIT, &[("rev", rev)]), &[])
    }

    /// Commits the safetensors file at `file` on the server, as a local commit would with
    /// `commit` there (the query parameters of `POST /commits`); the file keeps its name in
    /// the commit's tree.
    pub fn commit(&self, file: &Path, commit: &CommitParams) -> Result<CommitOutcome> {
        let f = std::fs::File::open(file).map_err(|source| Error::Input {
            path: file.to_path_buf(),
            source,
        })?;
        let mut req = self.commit_request(commit);
        if let Some(name) = file.file_name().and_then(|n| n.to_str()) {
            req = req.query(params::PATH, name);
        }
        let mut resp = self.check(upload(req, "application/octet-stream").send(&f))?;
        resp.body_mut().read_json().map_err(|e| self.transport(e))
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
        let req = self
            .commit_request(commit)
            .query(params::FILES, files.len().to_string());
        let (mut tar, writing) = tree::stream(files).map_err(|e| self.transport(e))?;
        let sent = upload(req, tree::TAR).send(ureq::SendBody::from_reader(&mut tar));
        drop(tar);
        // A file that could not be read broke the upload off: that is what to report.
        if let Ok(Err((path, source))) = writing.join() {
            return Err(Error::Input { path, source });
        }
        let mut resp = self.check(sent)?;
        resp.body_mut().read_json().map_err(|e| self.transport(e))
    }

    /// The files of `rev`, and the commit it resolved to (`GET /files/REV`).
    pub fn files(&self, rev: &str) -> Result<body::Files> {
        self.get_json(&route::fill(route::FILES, &[("rev", rev)]), &[])
    }

    /// Writes file `path` of commit `commit` to `to` (by commit id: whatever the branch does
    /// meanwhile); returns its length, checked against what the server announced.
    pub fn download_file(&self, commit: &ObjectId, path: &str, to: &mut dyn Write) -> Result<u64> {
        let url = format!(
            "{}{}",
            self.api,
            route::fill(route::FILE, &[("rev", &commit.to_hex()), ("path", path)])
        );
        let mut resp = self.check(self.auth(self.agent.get(url)).call())?;
        let expected: Option<u64> = resp
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let mut reader = resp.body_mut().with_config().limit(u64::MAX).reader();
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0u64;
        loop {
            let got = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(got) => got,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(Error::Transport {
                        url: self.url.clone(),
                        why: format!("download interrupted: {e}"),
                    })
                }
            };
            to.write_all(&buf[..got]).map_err(|source| Error::Output {
                what: path.to_string(),
                source,
            })?;
            n += got as u64;
        }
        if expected.is_some_and(|e| e != n) {
            return Err(Error::Transport {
                url: self.url.clone(),
                why: format!("download of {path} ended after {n} bytes"),
            });
        }
        Ok(n)
    }

    /// Which of `ids` the server lacks.
    pub fn missing(&self, ids: &[ObjectId]) -> Result<Vec<ObjectId>> {
        let mut out = Vec::new();
        for chunk in ids.chunks(body::MAX_IDS) {
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

    /// The pack of the records of `ids` (at most [`body::MAX_IDS`] of them), bases first, as
    /// it arrives (`POST /objects/fetch`).
    pub fn fetch_pack(&self, ids: &[ObjectId]) -> Result<impl Read + Send + 'static> {
        let req = self.auth(
            self.agent
                .post(format!("{}{}", self.api, route::OBJECTS_FETCH)),
        );
        let ids = body::Ids { ids: ids.to_vec() };
        let resp = self.check(req.send_json(&ids))?;
        Ok(resp.into_body().into_with_config().limit(u64::MAX).reader())
    }

    /// Uploads a pack of `len` bytes read from `pack` (`POST /objects`): what the server
    /// stored.
    pub fn send_pack(&self, pack: &mut dyn Read, len: u64) -> Result<Received> {
        // The declared length keeps the upload one sized body (the server checks it first).
        let req = self
            .auth(self.agent.post(format!("{}{}", self.api, route::OBJECTS)))
            .header("Content-Length", len.to_string());
        let body = ureq::SendBody::from_reader(pack);
        let mut resp = self.check(upload(req, route::PACK).send(body))?;
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
}
