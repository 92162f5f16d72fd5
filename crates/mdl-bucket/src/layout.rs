//! The keys of a repository in a bucket and what they hold (`docs/FORMAT.md`, "In object
//! storage"):
//!
//! - `mdl-repository`: JSON `{"format": 1, "head": "refs/heads/main"}`, created once by
//!   `init` (`If-None-Match: *`); what makes the prefix a repository.
//! - `refs/heads/NAME`, `refs/tags/NAME`: one object per ref, JSON `{"target": HEX}` (plus
//!   `tagger`, `time_ms`, `message` for an annotated tag) or `{"deleted": true}`; changed only
//!   by conditional writes against the version last read.
//! - `config`: JSON object of the repository's settings, changed the same way.
//! - `packs/TIME-HASH.pack`: the records one publish added, as a pack stream (the format the
//!   HTTP transfer uses), never changed once written; TIME (milliseconds, 13 digits) orders
//!   them, HASH (of the content) makes the name unique.
//! - `gc/pending`: JSON `{"marked_ms": TIME, "packs": [KEY, …]}`, the packs the last gc found
//!   no ref needing; a later gc deletes those still unneeded once the grace period has passed
//!   since `marked_ms`. Writers treat their records as absent from the bucket.

use mdl::{ObjectId, RefValue, Timestamp};
use serde::{Deserialize, Serialize};

/// The object that makes a prefix a repository.
pub const MARKER: &str = "mdl-repository";
/// Where refs are.
pub const REFS: &str = "refs/";
/// Where packs are.
pub const PACKS: &str = "packs/";
/// The repository's settings.
pub const CONFIG: &str = "config";
/// The packs a gc marked for deletion ([`Pending`]).
pub const GC_PENDING: &str = "gc/pending";
/// Layout version written by `init`; a newer one is refused.
pub const FORMAT: u32 = 1;
/// What a pack's key ends with.
pub const PACK_SUFFIX: &str = ".pack";

/// The marker's content.
#[derive(Debug, Serialize, Deserialize)]
pub struct Marker {
    /// Layout version.
    pub format: u32,
    /// The branch a new replica's HEAD names.
    pub head: String,
}

/// What `gc/pending` holds.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    /// When they were marked (ms since the epoch, the marking gc's clock).
    pub marked_ms: i64,
    /// Their keys.
    pub packs: Vec<String>,
}

/// A ref as stored.
#[derive(Debug, Default, Serialize, Deserialize)]
struct StoredRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tagger: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    time_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    deleted: bool,
}

/// The bytes of a ref's object: its value, or a deletion (`None`), which is kept so that the
/// next creation is a conditional write too.
pub fn encode_ref(value: Option<&RefValue>) -> Vec<u8> {
    let stored = match value {
        None => StoredRef {
            deleted: true,
            ..StoredRef::default()
        },
        Some(RefValue::Direct(id)) => StoredRef {
            target: Some(id.to_hex()),
            ..StoredRef::default()
        },
        Some(RefValue::Annotated {
            target,
            tagger,
            time,
            message,
        }) => StoredRef {
            target: Some(target.to_hex()),
            tagger: Some(tagger.clone()),
            time_ms: Some(time.0),
            message: Some(message.clone()),
            deleted: false,
        },
        Some(RefValue::Symbolic(_)) => unreachable!("symbolic refs stay in the replica"),
    };
    let mut v = serde_json::to_vec(&stored).expect("a ref serializes");
    v.push(b'\n');
    v
}

/// Parses [`encode_ref`]'s bytes; what else is there, said in a sentence.
pub fn decode_ref(name: &str, bytes: &[u8]) -> Result<Option<RefValue>, String> {
    let bad = |why: String| format!("ref {name} is not one mdl wrote: {why}");
    let stored: StoredRef = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
    if stored.deleted {
        return Ok(None);
    }
    let target: ObjectId = stored
        .target
        .as_deref()
        .ok_or_else(|| bad("no target".into()))?
        .parse::<ObjectId>()
        .map_err(|e| bad(e.to_string()))?;
    Ok(Some(
        match (stored.tagger, stored.time_ms, stored.message) {
            (Some(tagger), Some(time), Some(message)) => RefValue::Annotated {
                target,
                tagger,
                time: Timestamp(time),
                message,
            },
            _ => RefValue::Direct(target),
        },
    ))
}

/// A new pack's key: the time now and a hash of what makes it unique — this process, the
/// time and 64 random bits — as a pack is uploaded while it is written, before its bytes could
/// be hashed (no two writers may ever choose the same key: uploads overwrite).
pub fn new_pack_key() -> String {
    let now = Timestamp::now();
    let mut h = blake3::Hasher::new();
    h.update(&std::process::id().to_le_bytes());
    h.update(&now.0.to_le_bytes());
    h.update(&random_u64().to_le_bytes());
    pack_key(now, &h.finalize())
}

/// A pack's key: its time and a hash.
fn pack_key(now: Timestamp, hash: &blake3::Hash) -> String {
    format!(
        "{PACKS}{:013}-{}{PACK_SUFFIX}",
        now.0.max(0),
        &hash.to_hex()[..32]
    )
}

/// 64 random bits: the standard library seeds its hash maps' keys from the operating system.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// When the pack `key` was written, by its writer's clock (ms since the epoch).
pub fn pack_time(key: &str) -> Option<i64> {
    key.strip_prefix(PACKS)?.get(..13)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_keys_carry_their_time() {
        let key = pack_key(Timestamp(1_700_000_000_123), &blake3::hash(b"p"));
        // New keys: now, and never the same twice, even within a millisecond.
        let (a, b) = (new_pack_key(), new_pack_key());
        assert_ne!(a, b);
        let t = pack_time(&a).unwrap();
        assert!((Timestamp::now().0 - t).abs() < 60_000, "{a}");
        assert_eq!(pack_time(&key), Some(1_700_000_000_123));
        assert_eq!(pack_time("packs/x.pack"), None);
        assert_eq!(pack_time("refs/heads/main"), None);
    }

    #[test]
    fn refs_round_trip_and_deletions_are_kept_as_such() {
        let id = ObjectId::hash(b"x");
        let values = [
            Some(RefValue::Direct(id)),
            Some(RefValue::Annotated {
                target: id,
                tagger: "a <a@b>".into(),
                time: Timestamp(1_700_000_000_000),
                message: "best".into(),
            }),
            None,
        ];
        for v in values {
            assert_eq!(decode_ref("r", &encode_ref(v.as_ref())).unwrap(), v);
        }
        let err = decode_ref("refs/heads/x", b"{\"target\":\"zz\"}").unwrap_err();
        assert!(
            err.to_string()
                .contains("ref refs/heads/x is not one mdl wrote"),
            "{err}"
        );
    }
}
