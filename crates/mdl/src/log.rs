//! `mdl log`: history, newest first.

use mdl_format::{ObjectId, Ref};

pub use mdl_protocol::history::{LogEntry, Metrics};

use crate::{history, revision, Repository, Result};

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
    let cut = crate::shallow::cut(repo)?;
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
            properties: c.properties.into_iter().collect(),
            cut: cut.contains(&id),
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
///
/// A lane is a line down the page waiting for the commit it leads to; lanes sit side by side
/// with no gaps. Where a branch forked, its lane joins the lane of the commit it forked from,
/// one lane a connector row (`|/`, or `|_|/` across lanes between), and lanes to its right
/// move over (`/`); a root commit's lane ends, and the lanes right of it move over too. A
/// second parent opens a lane beside its commit (`|\`), pushing the others right (`\`).
pub fn graph(entries: &[LogEntry]) -> Vec<(String, Vec<String>)> {
    let mut lanes: Vec<ObjectId> = Vec::new();
    let mut out: Vec<(String, Vec<String>)> = Vec::with_capacity(entries.len());
    for e in entries {
        let col = match lanes.iter().position(|l| *l == e.id) {
            Some(c) => c,
            None => {
                lanes.push(e.id);
                lanes.len() - 1
            }
        };
        // Other lanes waiting for this commit join its lane, after the previous line.
        while let Some(i) = (col + 1..lanes.len()).find(|&i| lanes[i] == e.id) {
            let row = connector(lanes.len(), |m| match m {
                m if m < col => Lane::Stays,
                m if m == col => Lane::Joined { from: i },
                m if m < i => Lane::Stays,
                m if m == i => Lane::Leaves,
                _ => Lane::MovesLeft,
            });
            if let Some((_, after)) = out.last_mut() {
                after.push(row);
            }
            lanes.remove(i);
        }
        let line: String = (0..lanes.len())
            .map(|i| if i == col { "* " } else { "| " })
            .collect();
        let mut after = Vec::new();
        // Where history was cut, the lane ends as at a root.
        let parents: &[ObjectId] = if e.cut { &[] } else { &e.parents };
        match parents.first() {
            Some(p) => lanes[col] = *p,
            None => {
                if col + 1 < lanes.len() {
                    after.push(connector(lanes.len(), |m| match m {
                        m if m < col => Lane::Stays,
                        m if m == col => Lane::Leaves,
                        _ => Lane::MovesLeft,
                    }));
                }
                lanes.remove(col);
            }
        }
        let mut at = col;
        for p in parents.iter().skip(1) {
            if !lanes.contains(p) {
                after.push(connector(lanes.len(), |m| match m {
                    m if m < at => Lane::Stays,
                    m if m == at => Lane::Opens,
                    _ => Lane::MovesRight,
                }));
                at += 1;
                lanes.insert(at, *p);
            }
        }
        out.push((line, after));
    }
    out
}

/// What a lane does in a connector row.
enum Lane {
    /// Goes straight down: `|`.
    Stays,
    /// Goes straight down and takes in the lane at `from`, to its right: `|/`, `|_|/`.
    Joined { from: usize },
    /// Ends here (drawn by whoever takes it in, or by nothing for a root).
    Leaves,
    /// Moves one column left: `/` before its column.
    MovesLeft,
    /// Goes straight down and opens a lane beside it: `|\`.
    Opens,
    /// Moves one column right: `\` after its column.
    MovesRight,
}

/// One connector row across `lanes` lanes: column `m` at character `2m`, the gaps between.
fn connector(lanes: usize, what: impl Fn(usize) -> Lane) -> String {
    let mut row = vec![' '; 2 * lanes + 1];
    for m in 0..lanes {
        match what(m) {
            Lane::Stays => row[2 * m] = '|',
            Lane::Joined { from } => {
                row[2 * m] = '|';
                for gap in m..from - 1 {
                    row[2 * gap + 1] = '_';
                }
                row[2 * from - 1] = '/';
            }
            Lane::Leaves => {}
            Lane::MovesLeft => row[2 * m - 1] = '/',
            Lane::Opens => {
                row[2 * m] = '|';
                row[2 * m + 1] = '\\';
            }
            Lane::MovesRight => row[2 * m + 1] = '\\',
        }
    }
    row.into_iter().collect::<String>().trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ObjectId {
        ObjectId::hash(&[n])
    }

    /// Commits `(n, parents)`, newest first, drawn as `log --graph` draws them.
    fn drawn(commits: &[(u8, &[u8])]) -> String {
        let entries: Vec<LogEntry> = commits
            .iter()
            .map(|(n, parents)| LogEntry {
                id: id(*n),
                parents: parents.iter().map(|p| id(*p)).collect(),
                time: String::new(),
                author: String::new(),
                message: String::new(),
                step: None,
                metrics: Default::default(),
                raw_bytes: 0,
                stored_bytes: 0,
                lossy_tensors: 0,
                refs: Vec::new(),
                expired_tensors: 0,
                properties: Default::default(),
                cut: false,
                timestamp: mdl_format::Timestamp(0),
            })
            .collect();
        let mut out = String::new();
        for ((line, after), (n, _)) in graph(&entries).into_iter().zip(commits) {
            out.push_str(&format!("{}{n}\n", line));
            for a in after {
                out.push_str(&format!("{a}\n"));
            }
        }
        out
    }

    #[test]
    fn a_fork_joins_the_lane_it_forked_from() {
        // 1 ← 2 ← 3 (main), 2 ← 4 (a branch).
        let g = drawn(&[(3, &[2]), (4, &[2]), (2, &[1]), (1, &[])]);
        assert_eq!(g, "* 3\n| * 4\n|/\n* 2\n* 1\n");
    }

    #[test]
    fn forks_from_different_commits_leave_no_gap() {
        // main 0 ← 1 ← 2 ← 3 ← 4; a forked at 1 (a1 ← a2), b at 2 (b1).
        let g = drawn(&[
            (4, &[3]),
            (21, &[2]),
            (12, &[11]),
            (11, &[1]),
            (3, &[2]),
            (2, &[1]),
            (1, &[0]),
            (0, &[]),
        ]);
        let want = "\
* 4
| * 21
| | * 12
| | * 11
* | | 3
|/ /
* | 2
|/
* 1
* 0
";
        assert_eq!(g, want);
    }

    #[test]
    fn a_lane_joins_across_the_lanes_between() {
        // 5 and 6 fork from 1; 7, drawn between them, from 0.
        let g = drawn(&[(5, &[1]), (7, &[0]), (6, &[1]), (1, &[0]), (0, &[])]);
        let want = "\
* 5
| * 7
| | * 6
|_|/
* | 1
|/
* 0
";
        assert_eq!(g, want);
    }

    #[test]
    fn a_root_ends_its_lane_and_a_merge_opens_one() {
        // Two unrelated histories; then a commit with two parents.
        let g = drawn(&[(3, &[1, 2]), (1, &[]), (2, &[])]);
        assert_eq!(g, "* 3\n|\\\n* | 1\n /\n* 2\n");
    }
}
