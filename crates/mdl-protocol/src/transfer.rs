//! What moves history between repositories says on the wire: the objects a transfer plans to
//! send, a ref change asked of the other side, and what a received pack added.

use mdl_format::ObjectId;
use serde::{Deserialize, Serialize};

/// One object a transfer sends.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PlannedObject {
    /// The object.
    pub id: ObjectId,
    /// Bytes of its record (0 for an expired tensor).
    pub size: u64,
    /// A tensor a retention rule deleted: only the fact travels, so the receiver knows it
    /// expired rather than went missing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expired: bool,
    /// A version of this tensor that the receiver holds (the same tensor of the newest commit
    /// it has): a fetch that names it may get this tensor as a delta against it, never longer
    /// than `size`. Planned only for a receiver that takes deltas, and only for a tensor
    /// stored whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub against: Option<ObjectId>,
    /// A commit whose parents do not travel and the receiver does not hold: its history is cut
    /// there (a shallow transfer, or a sender whose own history was cut), and the receiver
    /// keeps it as such.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cut: bool,
}

/// How much history a transfer takes (a shallow clone): everything when empty.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Shallow {
    /// Only the commits fewer than this many steps from a wanted one (1: the wanted commits
    /// alone); at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
    /// Not the ancestors of this commit (the commit itself travels, where a wanted commit
    /// reaches it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<ObjectId>,
}

impl Shallow {
    /// All of history.
    pub const WHOLE: Shallow = Shallow {
        depth: None,
        since: None,
    };

    /// Whether it takes all of history.
    pub fn is_whole(&self) -> bool {
        *self == Shallow::WHOLE
    }
}

/// A ref change requested by another repository: `name` (`refs/heads/…` or `refs/tags/…`)
/// from `old` (`None`: must not exist) to `new` (`None`: delete).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RefUpdate {
    /// Full ref name.
    pub name: String,
    /// The value the sender last saw.
    pub old: Option<ObjectId>,
    /// The new value.
    pub new: Option<ObjectId>,
    /// Allow a branch to move to a commit that does not descend from `old`.
    #[serde(default)]
    pub force: bool,
}

/// What a received pack added.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Received {
    /// Objects stored (objects already present are skipped).
    pub objects: u64,
    /// Record bytes stored.
    pub bytes: u64,
    /// Commits among them.
    pub commits: Vec<ObjectId>,
    /// Tensors recorded as expired (thinned commits' deleted optimizer state).
    #[serde(default)]
    pub expired: u64,
}

impl Received {
    /// Adds what another pack added.
    pub fn add(&mut self, other: Received) {
        self.objects += other.objects;
        self.bytes += other.bytes;
        self.commits.extend(other.commits);
        self.expired += other.expired;
    }
}
