//! `mdl log`: history, newest first.

use mdl_format::{ObjectId, Ref, Timestamp};
use serde::{Deserialize, Serialize};

use crate::{history, revision, Repository, Result};

/// One commit as `mdl log` shows it (and its stable `--json` form).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LogEntry {
    /// Commit id.
    pub id: ObjectId,
    /// Parent ids.
    pub parents: Vec<ObjectId>,
    /// Commit time, RFC 3339 UTC.
    pub time: String,
    /// Author.
    pub author: String,
    /// Message.
    pub message: String,
    /// Training step.
    pub step: Option<u64>,
    /// Metrics, as a name → value object.
    pub metrics: Metrics,
    /// Checkpoint size.
    pub raw_bytes: u64,
    /// Bytes this commit added to the store.
    pub stored_bytes: u64,
    /// Tensors stored lossily (0 for a lossless commit).
    pub lossy_tensors: u32,
    /// Branches and tags pointing here.
    pub refs: Vec<String>,
    /// Tensors a retention rule expired (a thinned commit when non-zero).
    #[serde(default)]
    pub expired_tensors: u32,
    #[serde(skip)]
    /// Commit time (from `time` when read back from JSON).
    pub timestamp: Timestamp,
}

/// Metrics as an ordered list, serialised as a JSON object `{name: value}`.
#[derive(Clone, Debug, Default)]
pub struct Metrics(pub Vec<(String, f64)>);

impl<'de> Deserialize<'de> for Metrics {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let map = <std::collections::BTreeMap<String, f64>>::deserialize(d)?;
        Ok(Metrics(map.into_iter().collect()))
    }
}

impl Serialize for Metrics {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// History from `rev` (HEAD when `None`), at most `limit` commits.
pub fn log(repo: &Repository, rev: Option<&str>, limit: Option<usize>) -> Result<Vec<LogEntry>> {
    let start = match rev {
        Some(r) => revision::resolve(repo, r)?,
        None => match revision::resolve(repo, "HEAD") {
            Ok(id) => id,
            Err(crate::Error::UnbornBranch(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        },
    };
    log_from(repo, &[start], limit)
}

/// The history of every branch, tag and remote-tracking branch (`log --all`), newest first.
pub fn log_all(repo: &Repository, limit: Option<usize>) -> Result<Vec<LogEntry>> {
    log_from(repo, &history::ref_tips(repo)?, limit)
}

fn log_from(repo: &Repository, starts: &[ObjectId], limit: Option<usize>) -> Result<Vec<LogEntry>> {
    let refs = ref_names(repo)?;
    // Expired objects are never also indexed; manifests are read only when some exist.
    let expired: std::collections::HashSet<ObjectId> = repo
        .store()
        .meta()
        .read()?
        .expired_all()?
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let mut out = Vec::new();
    for (id, _) in history::walk(repo, starts)?
        .into_iter()
        .take(limit.unwrap_or(usize::MAX))
    {
        let c = repo.load_commit(&id)?;
        let expired_tensors = if expired.is_empty() {
            0
        } else {
            let m = repo.load_manifest(&c.manifest)?;
            m.tensors().filter(|(_, e)| expired.contains(&e.id)).count() as u32
        };
        out.push(LogEntry {
            id,
            parents: c.parents.clone(),
            time: c.time.rfc3339(),
            author: c.author,
            message: c.message,
            step: c.step,
            metrics: Metrics(c.metrics),
            raw_bytes: c.stats.raw_bytes,
            stored_bytes: c.stats.stored_bytes,
            lossy_tensors: c.stats.lossy_tensors,
            refs: refs
                .iter()
                .filter(|(_, t)| *t == id)
                .map(|(n, _)| n.clone())
                .collect(),
            expired_tensors,
            timestamp: c.time,
        });
    }
    Ok(out)
}

/// Short names of every branch and tag with the commit each points at.
pub(crate) fn ref_names(repo: &Repository) -> Result<Vec<(String, ObjectId)>> {
    let meta = repo.store().meta().read()?;
    let mut out = Vec::new();
    for (prefix, shown) in [(Ref::BRANCHES, ""), (Ref::TAGS, "tag: ")] {
        for (name, v) in meta.refs(prefix)? {
            if let Some(t) = v.target() {
                out.push((format!("{shown}{}", &name[prefix.len()..]), t));
            }
        }
    }
    Ok(out)
}

/// Draws the commit graph column for each entry of `entries` (in log order): returns one
/// prefix string per entry (`* `, `| * `, …) and the connector lines to print after it.
pub fn graph(entries: &[LogEntry]) -> Vec<(String, Vec<String>)> {
    let mut lanes: Vec<Option<ObjectId>> = Vec::new();
    let mut out: Vec<(String, Vec<String>)> = Vec::with_capacity(entries.len());
    for e in entries {
        let col = match lanes.iter().position(|l| *l == Some(e.id)) {
            Some(c) => c,
            None => match lanes.iter().position(Option::is_none) {
                Some(c) => c,
                None => {
                    lanes.push(None);
                    lanes.len() - 1
                }
            },
        };
        // Other lanes waiting for this same commit (branches that forked from it) join this
        // one before its line: the connector goes after the previous commit's.
        let merging: Vec<usize> = (0..lanes.len())
            .filter(|&i| i != col && lanes[i] == Some(e.id))
            .collect();
        if !merging.is_empty() {
            let mut s = String::new();
            for (i, lane) in lanes.iter().enumerate() {
                if i > 0 && !(merging.contains(&i) && i == col + 1) {
                    s.push(' ');
                }
                s.push(if i == col || (lane.is_some() && !merging.contains(&i)) {
                    '|'
                } else if merging.contains(&i) {
                    '/'
                } else {
                    ' '
                });
            }
            if let Some((_, after)) = out.last_mut() {
                after.push(s.trim_end().to_string());
            }
            for &i in &merging {
                lanes[i] = None;
            }
            while lanes.last() == Some(&None) {
                lanes.pop();
            }
        }
        let mut line = String::new();
        for (i, l) in lanes.iter().enumerate() {
            line.push_str(if i == col {
                "* "
            } else if l.is_some() {
                "| "
            } else {
                "  "
            });
        }
        let mut after = Vec::new();
        lanes[col] = e.parents.first().copied();
        for p in e.parents.iter().skip(1) {
            if !lanes.contains(&Some(*p)) {
                lanes.push(Some(*p));
                let mut s = String::new();
                for (i, l) in lanes.iter().enumerate() {
                    s.push_str(if i == lanes.len() - 1 {
                        "\\"
                    } else if l.is_some() || i == col {
                        "| "
                    } else {
                        "  "
                    });
                }
                after.push(s);
            }
        }
        while lanes.last() == Some(&None) {
            lanes.pop();
        }
        out.push((line, after));
    }
    out
}
