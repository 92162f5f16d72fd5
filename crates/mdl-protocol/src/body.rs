//! The JSON bodies of requests and responses other than what an operation reports (those are
//! in [`crate::history`], [`crate::outcome`] and [`crate::transfer`]).

use mdl_format::ObjectId;
use serde::{Deserialize, Serialize};

use crate::history::ReflogLine;
use crate::outcome::GcOutcome;
use crate::transfer::PlannedObject;

/// `GET /v1/repos`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Repos {
    /// Repository names.
    pub repos: Vec<String>,
}

/// `POST /v1/repos`: the repository to create.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NewRepo {
    /// Its name: one path component of `[A-Za-z0-9._-]`, not starting with `.`.
    pub name: String,
}

/// A ref as `GET /refs` lists it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ListedRef {
    /// Full name (`refs/heads/main`).
    pub name: String,
    /// The commit.
    pub target: ObjectId,
    /// Annotated tags: who tagged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tagger: Option<String>,
    /// Annotated tags: when (ms since the epoch, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_ms: Option<i64>,
    /// Annotated tags: the message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `GET /files/REV`: a commit's files, in path order.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Files {
    /// The commit `REV` resolved to.
    pub commit: ObjectId,
    /// Its files.
    pub files: Vec<ListedFile>,
}

/// One file of [`Files`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ListedFile {
    /// Its path in the tree.
    pub path: String,
    /// Its size.
    pub size: u64,
    /// The id of its content (the file route's ETag): equal ids, equal bytes.
    pub etag: ObjectId,
    /// How many tensors it holds.
    pub tensors: u32,
    /// How many of them are lossy reconstructions.
    pub lossy_tensors: u32,
    /// Whether a checkout marks it executable.
    pub executable: bool,
}

/// `GET /refs`: the server's branches and tags.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Refs {
    /// The branch HEAD points at (short name).
    pub head: Option<String>,
    /// Branches and tags.
    pub refs: Vec<ListedRef>,
}

impl Refs {
    /// The commit of a full ref name.
    pub fn get(&self, name: &str) -> Option<ObjectId> {
        self.refs.iter().find(|r| r.name == name).map(|r| r.target)
    }
}

/// The answer to a ref update.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RefMoved {
    /// The ref.
    pub name: String,
    /// Its new value (`None`: deleted).
    pub new: Option<ObjectId>,
}

/// Longest a server holds `GET /refs/wait` (a client that waits longer asks again).
pub const MAX_WAIT_MS: u64 = 25_000;

/// The query of `GET /refs/wait`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WaitQuery {
    /// The full ref name (`refs/heads/main`).
    pub name: String,
    /// The commit the asker holds it at (absent: the ref does not exist for it yet).
    pub from: Option<ObjectId>,
    /// How long to hold the request when the ref has not moved (at most [`MAX_WAIT_MS`]).
    pub timeout_ms: Option<u64>,
}

impl WaitQuery {
    /// The query string's parameters.
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![("name", self.name.clone())];
        out.extend(self.from.map(|f| ("from", f.to_hex())));
        out.extend(self.timeout_ms.map(|t| ("timeout_ms", t.to_string())));
        out
    }
}

/// The answer to `GET /refs/wait`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Waited {
    /// The ref.
    pub name: String,
    /// Where it points now (absent: it does not exist).
    pub target: Option<ObjectId>,
    /// Whether that differs from the `from` asked about (false: the wait timed out).
    pub moved: bool,
}

/// The query of `GET /log`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LogQuery {
    /// Where history starts (HEAD when absent).
    pub rev: Option<String>,
    /// At most this many commits.
    pub limit: Option<usize>,
    /// Every branch's, tag's and remote-tracking branch's history (`mdl log --all`; not with
    /// `rev`).
    #[serde(default)]
    pub all: bool,
}

impl LogQuery {
    /// The query string's parameters.
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut q = Vec::new();
        if let Some(r) = &self.rev {
            q.push(("rev", r.clone()));
        }
        if let Some(n) = self.limit {
            q.push(("limit", n.to_string()));
        }
        if self.all {
            q.push(("all", "true".to_string()));
        }
        q
    }
}

/// A list of object ids: `POST /objects/missing` and `POST /objects/fetch`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ids {
    /// The ids, at most [`MAX_IDS`].
    pub ids: Vec<ObjectId>,
}

/// The body of `POST /objects/fetch`: the records wanted, in order, and for some of them a
/// version the asker holds, against which the sender may code them ([`Against`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FetchRequest {
    /// The ids, at most [`MAX_IDS`].
    pub ids: Vec<ObjectId>,
    /// Tensors of `ids` that may come as deltas, each against a version the asker holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub against: Vec<Against>,
    /// A record of `ids` the asker holds the start of (a transfer cut off inside it), to be
    /// sent from there if the sender's record still starts with those bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Resume>,
}

/// How much of a pack upload cut off the server holds (`GET /objects/uploads/{key}`).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct UploadHeld {
    /// Its first bytes held: where an upload with the same key may go on from (0: none).
    pub held: u64,
}

/// The start of a record the asker holds: the record of `id` (as the sender would send it,
/// coded against the `against` base named for it, if any) of `len` bytes, of which it holds the
/// first `held`, whose blake3 hash is `digest`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Resume {
    /// The record's object.
    pub id: ObjectId,
    /// The whole record's length.
    pub len: u64,
    /// How many of its first bytes the asker holds (fewer than `len`).
    pub held: u64,
    /// The blake3 hash of those bytes.
    pub digest: ObjectId,
}

/// A tensor that may be sent as a delta against `base`, a tensor the receiver holds.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Against {
    /// The tensor asked for.
    pub id: ObjectId,
    /// The version the asker holds.
    pub base: ObjectId,
}

/// Most ids one [`Ids`] request may name: what a client sends per request (about 6.7 MB of
/// JSON), and what bounds the answer of `POST /objects/fetch`, whose repeated ids are sent once.
pub const MAX_IDS: usize = 100_000;

/// The answer to `POST /objects/missing`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Missing {
    /// Those of the ids asked about that the server has neither as objects nor as expired
    /// tensors, in the order asked.
    pub missing: Vec<ObjectId>,
}

/// `POST /objects/plan`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PlanRequest {
    /// Commits wanted.
    pub want: Vec<ObjectId>,
    /// Commits the asker already has.
    #[serde(default)]
    pub have: Vec<ObjectId>,
    /// Whether the asker takes a tensor as a delta against a version it holds: the plan then
    /// names one for each tensor stored whole ([`crate::transfer::PlannedObject::against`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deltas: bool,
    /// How much history to take (`depth`, `since`; all of it when neither is given).
    #[serde(flatten)]
    pub shallow: crate::transfer::Shallow,
}

/// The answer to `POST /objects/plan`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Plan {
    /// What a fetch of the wanted commits would send, bases first.
    pub objects: Vec<PlannedObject>,
}

/// `POST /maintenance/gc`; durations as `mdl gc` takes them (`1h`, `30d`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct GcRequest {
    /// Grace period for unreachable objects.
    pub prune_older_than: Option<String>,
    /// Reflog entries older than this expire.
    pub expire_reflog: Option<String>,
    /// Plan and report, change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// What a gc of a repository in object storage did (or, with `dry_run`, would do): it marks
/// unneeded packs, and a later gc deletes those still unneeded once the grace period has passed.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BucketGc {
    /// Nothing was changed.
    pub dry_run: bool,
    /// Packs deleted: marked by an earlier gc at least the grace period ago, still unneeded.
    pub deleted: Vec<String>,
    /// Packs marked now, to be deleted by a gc after `due_ms` if still unneeded.
    pub marked: Vec<String>,
    /// When the marked packs may be deleted (ms since the epoch), if any are marked.
    pub due_ms: Option<i64>,
}

/// `POST /maintenance/gc`'s answer: a repository on the server's disk answers
/// [`GcOutcome`], one in object storage [`BucketGc`].
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GcAnswer {
    /// A repository in object storage (tried first: its fields are required).
    Bucket(BucketGc),
    /// A repository on the server's disk.
    Disk(GcOutcome),
}

/// The query of `GET /stats`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StatsQuery {
    /// With HEAD's series under the lossy papers' accountings (`mdl stats --lossy`).
    #[serde(default)]
    pub lossy: bool,
}

/// The query of `GET /diff`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DiffQuery {
    /// The revision compared from.
    pub a: String,
    /// The revision compared to.
    pub b: String,
}

/// `POST /config`: one setting changed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConfigSet {
    /// The setting's key.
    pub key: String,
    /// Its new value, as `mdl config KEY VALUE` takes it.
    pub value: String,
}

/// `POST /branches`: a branch created at `rev` (HEAD's commit when absent), or with `force`
/// created or moved there; answered by [`crate::history::BranchMove`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BranchRequest {
    /// The branch's short name.
    pub name: String,
    /// Where it points.
    pub rev: Option<String>,
    /// Move it if it exists (`branch -f`).
    #[serde(default)]
    pub force: bool,
}

/// The query of `DELETE /branches/{name}`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DeleteBranch {
    /// Delete even if its commits would become unreachable (`branch -D`).
    #[serde(default)]
    pub force: bool,
}

/// The answer to `DELETE /branches/{name}` and `DELETE /tags/{name}`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Deleted {
    /// The branch's or tag's short name.
    pub name: String,
    /// The commit it pointed at (recorded in its reflog, so it can be made again).
    pub was: ObjectId,
}

/// `POST /tags`: a tag made at a revision (`mdl tag NAME [REV] [-m MESSAGE]`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TagRequest {
    /// The tag's short name.
    pub name: String,
    /// What it names (HEAD's commit when `None`).
    pub rev: Option<String>,
    /// Its message: given, the tag is annotated (a tag object with tagger and time).
    pub message: Option<String>,
    /// Who tags (the client's `user <email>`), for an annotated tag.
    pub tagger: String,
}

/// The answer to `POST /tags`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Tagged {
    /// The tag's short name.
    pub name: String,
    /// The commit it names.
    pub target: ObjectId,
}

/// `POST /reset`: the current branch moved to `rev` (`mdl reset`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ResetRequest {
    /// Where it moves.
    pub rev: String,
}

/// The query of `GET /reflog`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ReflogQuery {
    /// The ref (a branch, tag or full name); HEAD's branch when absent.
    pub name: Option<String>,
}

/// The answer to `GET /reflog`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Reflog {
    /// The ref's full name.
    pub name: String,
    /// Its entries, newest first.
    pub entries: Vec<ReflogLine>,
}

/// `POST /head`: HEAD made to name another branch (`switch`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Head {
    /// The branch's short name.
    pub branch: String,
}

/// Every error answer's body.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Error {
    /// What went wrong, for programs.
    pub code: crate::ErrorCode,
    /// One line for people.
    pub message: String,
}

/// What `.mdl/serve.json` holds while `mdl serve` serves a folder: how an `mdl` command run in
/// that folder reaches the server.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Advertisement {
    /// The server's process id (a dead one means the advertisement is stale).
    pub pid: u32,
    /// The repository's URL (`http://HOST:PORT/NAME`).
    pub url: String,
    /// A write token for commands run in the folder; the file is readable by its owner only.
    pub token: String,
}
