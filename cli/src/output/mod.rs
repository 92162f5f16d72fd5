//! Human and JSON renderings of each command's outcome.

use std::io::{self, Write};

use mdl::checkout::CheckoutOutcome;
use mdl::commit::CommitOutcome;
use mdl::diff::{Change, Diff, FileChange, TensorDiff};
use mdl::log::LogEntry;
use mdl::refs::{BranchMove, RefInfo, ReflogLine};
use mdl::show::Shown;
use serde::Serialize;
use serde_json::json;

mod upkeep;

pub(crate) use upkeep::{bucket_gc, compact, fsck, gc, maintenance, stats};

fn emit<T: Serialize + ?Sized>(out: &mut dyn Write, value: &T) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, value)?;
    writeln!(out)
}

/// Bytes in binary units, one decimal.
pub(crate) fn size(n: u64) -> String {
    mdl::storage::human_size(n)
}

pub(crate) fn init(out: &mut dyn Write, json: bool, made: &mdl_ops::Initialized) -> io::Result<()> {
    let (path, shown) = match made {
        mdl_ops::Initialized::Folder(root) => (
            root.display().to_string(),
            root.join(".mdl").display().to_string(),
        ),
        mdl_ops::Initialized::Bucket(url) | mdl_ops::Initialized::Served(url) => {
            (url.clone(), url.clone())
        }
    };
    if json {
        return emit(out, &json!({ "path": path, "branch": "main" }));
    }
    writeln!(out, "initialized empty mdl repository in {shown}")
}

/// `, N evaluations` when `--eval-cmd` scored candidates.
/// Where a lossy commit's one budget went, when more than one copy of the model shared it
/// (`; model.{} 7.1e-4, optim.{}.master 2.5e-4`).
fn copies(s: &mdl::lossy::SearchSummary) -> String {
    if s.copies.len() < 2 {
        return String::new();
    }
    let each: Vec<String> = s
        .copies
        .iter()
        .map(|c| format!("{} {:.2e}", c.copy, c.est_delta_loss))
        .collect();
    format!("; {}", each.join(", "))
}

fn evaluations(s: &mdl::lossy::SearchSummary) -> String {
    if s.evaluations > 0 {
        format!(", {} evaluations", s.evaluations)
    } else {
        String::new()
    }
}

/// The training code's commit as `mdl log` names it: `git 1a2b3c4d`, `+dirty` when its work
/// tree had changes.
fn source_text(properties: &std::collections::BTreeMap<String, String>) -> Option<String> {
    let git = properties.get("source.git")?;
    let dirty = properties.get("source.dirty").is_some_and(|d| d == "true");
    Some(format!(
        "git {}{}",
        printable(git.get(..8).unwrap_or(git)),
        if dirty { "+dirty" } else { "" }
    ))
}

/// A commit's properties as `mdl show` prints them: one line a group (`merge.strategy`,
/// `merge.weights` → `merge  strategy=… weights=…`), in name order.
fn property_lines(
    properties: &std::collections::BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let mut lines: Vec<(String, String)> = Vec::new();
    for (name, value) in properties {
        let (group, key) = name.split_once('.').unwrap_or(("", name));
        let item = format!("{}={}", printable(key), printable(value));
        match lines.last_mut() {
            Some((g, line)) if g == group => {
                line.push(' ');
                line.push_str(&item);
            }
            _ => lines.push((printable(group).to_string(), item)),
        }
    }
    lines
}

/// `mdl merge`: the new commit's id, then what became of the tensors and files on stderr.
pub(crate) fn merge(
    out: &mut dyn Write,
    json: bool,
    m: &mdl::merge::MergeOutcome,
) -> io::Result<()> {
    if json {
        return emit(out, m);
    }
    commit(out, false, &m.commit)?;
    eprintln!(
        "merged {} commits{}: {} computed, {} identical in all{}",
        m.merged.len(),
        m.base
            .map(|b| format!(" over base {}", b.short(12)))
            .unwrap_or_default(),
        plural(m.computed, "tensor", "tensors"),
        m.identical,
        match m.from_first.len() {
            0 => String::new(),
            n => format!(", {n} taken from the first (not float, or not in every commit)"),
        }
    );
    if !m.left_out.is_empty() {
        eprintln!(
            "left out (training state; --optimizer merges it): {}",
            m.left_out.join(", ")
        );
    }
    Ok(())
}

pub(crate) fn commit(out: &mut dyn Write, json: bool, c: &CommitOutcome) -> io::Result<()> {
    if json {
        return emit(out, c);
    }
    writeln!(out, "{}", c.id)?;
    eprintln!(
        "[{}] {} ({} new), {} → {} stored, {:.2}s",
        c.branch,
        plural(c.tensors as usize, "tensor", "tensors"),
        c.new_tensors,
        size(c.raw_bytes),
        size(c.stored_bytes),
        c.seconds
    );
    if c.lossy_tensors > 0 {
        match &c.search {
            // Parameters without moments are held to a relative error, which estimates no
            // loss: say so rather than print their loss change as zero.
            Some(s) if s.priced == 0 && s.relative > 0 => eprintln!(
                "lossy: {} quantized; {} without optimizer moments, each within relative L2 \
                 error {:.1e} (no loss estimate without moments){}",
                plural(c.lossy_tensors as usize, "tensor", "tensors"),
                plural(s.relative, "parameter", "parameters"),
                s.budget / s.loss.map_or(1.0, f64::abs),
                evaluations(s),
            ),
            Some(s) => eprintln!(
                "lossy: {} quantized, estimated loss change {:.3e} (budget {:.3e}{}{}){}{}",
                plural(c.lossy_tensors as usize, "tensor", "tensors"),
                s.est_delta_loss,
                s.budget,
                s.loss
                    .map(|l| format!(" = ε × loss {l}"))
                    .unwrap_or_default(),
                copies(s),
                if s.relative > 0 {
                    format!(
                        "; {} without moments within relative error ε",
                        plural(s.relative, "parameter", "parameters")
                    )
                } else {
                    String::new()
                },
                evaluations(s),
            ),
            None => eprintln!(
                "lossy: {} mantissa-trimmed",
                plural(c.lossy_tensors as usize, "tensor", "tensors")
            ),
        }
    }
    if let Some(b) = c.search.as_ref().and_then(|s| s.adam_betas.as_ref()) {
        eprintln!("lossy: Adam betas {b}");
    }
    Ok(())
}

pub(crate) fn checkout(out: &mut dyn Write, json: bool, c: &CheckoutOutcome) -> io::Result<()> {
    if json {
        return emit(out, c);
    }
    let files = if c.files == 1 {
        String::new()
    } else {
        format!("{} files, ", c.files)
    };
    writeln!(
        out,
        "wrote {} ({files}{}) from commit {}",
        c.path.display(),
        size(c.bytes),
        c.id.short(12)
    )?;
    if !c.skipped.is_empty() {
        writeln!(
            out,
            "left out what retention expired: {}",
            c.skipped
                .iter()
                .map(|s| printable(s).into_owned())
                .collect::<Vec<_>>()
                .join(", ")
        )?;
    }
    if c.lossy {
        writeln!(
            out,
            "lossy commit: {} reconstructions, not the committed bytes",
            if c.lossy_tensors == 1 {
                "1 tensor is a".to_string()
            } else {
                format!("{} tensors are", c.lossy_tensors)
            }
        )?;
    }
    Ok(())
}

/// `KEY=VALUE` pairs: every digit (`show`), or four significant digits (`log`'s table).
fn metrics_text(m: &mdl::log::Metrics, short: bool) -> String {
    m.0.iter()
        .map(|(k, v)| match short {
            true => format!("{}={}", printable(k), significant(*v)),
            false => format!("{}={v}", printable(k)),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `v` to four significant digits: whole numbers below ten million as they are, others from
/// 0.001 to 100,000 in decimals without trailing zeros, the rest in scientific notation
/// (`1.667e-6`).
fn significant(v: f64) -> String {
    let sci = format!("{v:.3e}");
    let r: f64 = sci.parse().unwrap_or(v);
    let a = r.abs();
    if r.fract() == 0.0 && a < 1e7 {
        return format!("{r:.0}");
    }
    let trim = |s: &str| s.trim_end_matches('0').trim_end_matches('.').to_string();
    if (1e-3..1e5).contains(&a) {
        let decimals = (3 - a.log10().floor() as i32).max(0) as usize;
        return trim(&format!("{r:.decimals$}"));
    }
    match sci.split_once('e') {
        Some((m, e)) => format!("{}e{e}", trim(m)),
        None => sci,
    }
}

/// History as a table: a header, then a commit a line (with `--graph`, the lanes before it):
/// id, date, step, stored and raw size, metrics, then refs, markers and the message's first
/// line.
pub(crate) fn log(
    out: &mut dyn Write,
    json: bool,
    entries: &[LogEntry],
    graph: bool,
) -> io::Result<()> {
    if json {
        return emit(out, entries);
    }
    if entries.is_empty() {
        return writeln!(out, "no commits yet");
    }
    let lanes = if graph {
        mdl::log::graph(entries)
    } else {
        Vec::new()
    };
    struct Row {
        lane: String,
        after: Vec<String>,
        id: String,
        date: String,
        step: String,
        stored: String,
        raw: String,
        metrics: String,
        rest: String,
    }
    let rows: Vec<Row> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let (lane, after) = lanes.get(i).cloned().unwrap_or_default();
            let mut rest = String::new();
            if !e.refs.is_empty() {
                rest.push_str(&format!("({}) ", e.refs.join(", ")));
            }
            if e.lossy_tensors > 0 {
                rest.push_str("[lossy] ");
            }
            if e.expired_tensors > 0 {
                rest.push_str(&format!("[thinned: {} expired] ", e.expired_tensors));
            }
            if let Some(code) = source_text(&e.properties) {
                rest.push_str(&format!("[{code}] "));
            }
            if e.cut {
                rest.push_str("[history cut: older commits not fetched] ");
            }
            rest.push_str(&printable(e.message.lines().next().unwrap_or("")));
            Row {
                lane,
                after,
                id: e.id.short(12),
                // RFC 3339 to the minute: `2026-11-24 05:32`.
                date: e.time.get(..16).unwrap_or(&e.time).replacen('T', " ", 1),
                step: e.step.map_or_else(|| "-".into(), |s| s.to_string()),
                stored: size(e.stored_bytes),
                raw: size(e.raw_bytes),
                metrics: metrics_text(&e.metrics, true),
                rest,
            }
        })
        .collect();
    let width = |f: &dyn Fn(&Row) -> usize, header: &str| {
        rows.iter().map(f).max().unwrap_or(0).max(header.len())
    };
    let lane_w = rows
        .iter()
        .map(|r| r.lane.chars().count())
        .max()
        .unwrap_or(0);
    let step_w = width(&|r| r.step.len(), "STEP");
    let stored_w = width(&|r| r.stored.len(), "STORED");
    let raw_w = width(&|r| r.raw.len(), "RAW");
    let metrics_w = width(&|r| r.metrics.chars().count(), "METRICS");
    writeln!(
        out,
        "{:lane_w$}{:<12}  {:<16}  {:>step_w$}  {:>stored_w$} / {:<raw_w$}  {:<metrics_w$}  MESSAGE",
        "", "COMMIT", "DATE", "STEP", "STORED", "RAW", "METRICS"
    )?;
    for r in &rows {
        let pad = lane_w - r.lane.chars().count();
        let metrics_pad = metrics_w - r.metrics.chars().count();
        writeln!(
            out,
            "{}{:pad$}{}  {:<16}  {:>step_w$}  {:>stored_w$} / {:<raw_w$}  {}{:metrics_pad$}  {}",
            r.lane, "", r.id, r.date, r.step, r.stored, r.raw, r.metrics, "", r.rest
        )?;
        for line in &r.after {
            writeln!(out, "{line}")?;
        }
    }
    if entries.iter().any(|e| e.cut) {
        writeln!(
            out,
            "this is a shallow clone: history ends where marked; `mdl fetch --deepen N` brings N more commits behind each such end"
        )?;
    }
    Ok(())
}

pub(crate) fn show(out: &mut dyn Write, json: bool, s: &Shown) -> io::Result<()> {
    if json {
        return emit(out, s);
    }
    writeln!(out, "commit   {}", s.id)?;
    for p in &s.parents {
        writeln!(out, "parent   {p}")?;
    }
    writeln!(out, "manifest {}", s.manifest)?;
    writeln!(out, "author   {}", printable(&s.author))?;
    writeln!(out, "date     {}", s.time)?;
    if let Some(step) = s.step {
        writeln!(out, "step     {step}")?;
    }
    if !s.metrics.0.is_empty() {
        writeln!(out, "metrics  {}", metrics_text(&s.metrics, false))?;
    }
    for (group, line) in property_lines(&s.properties) {
        writeln!(out, "{group:<8} {line}")?;
    }
    for (k, v) in &s.metadata {
        writeln!(out, "metadata {}={}", printable(k), printable(v))?;
    }
    writeln!(
        out,
        "size     {} raw, {} stored by this commit",
        size(s.raw_bytes),
        size(s.stored_bytes)
    )?;
    if s.expired_tensors > 0 {
        writeln!(
            out,
            "thinned  {} expired by retention (checkout needs --skip-expired)",
            plural(s.expired_tensors as usize, "tensor", "tensors")
        )?;
    }
    if !s.message.is_empty() {
        writeln!(out)?;
        for l in s.message.lines() {
            writeln!(out, "    {}", printable(l))?;
        }
    }
    writeln!(out)?;
    writeln!(
        out,
        "{:<40} {:<11} {:>10} {:>8}",
        "file", "format", "size", "tensors"
    )?;
    for f in &s.files {
        let note = if f.note.is_empty() {
            String::new()
        } else {
            format!("  ({})", printable(&f.note))
        };
        writeln!(
            out,
            "{:<40} {:<11} {:>10} {:>8}{note}",
            printable(&f.path),
            f.format,
            size(f.raw_bytes),
            f.tensors
        )?;
    }
    if !s.pairs.is_empty() {
        writeln!(out)?;
        if let Some(b) = &s.adam_betas {
            writeln!(out, "adam betas {}", printable(b))?;
        }
        writeln!(out, "moments (parameter ← exp_avg, exp_avg_sq; how paired)")?;
        for p in &s.pairs {
            writeln!(
                out,
                "  {} ← {}, {}  ({})",
                printable(&p.param),
                printable(&p.exp_avg),
                printable(&p.exp_avg_sq),
                p.source
            )?;
        }
    }
    let mut file: Option<&str> = None;
    for t in &s.tensors {
        if file != Some(t.file.as_str()) {
            file = Some(t.file.as_str());
            writeln!(out)?;
            writeln!(out, "{}", printable(&t.file))?;
            writeln!(
                out,
                "  {:<38} {:<8} {:<18} {:<11} {:>10} {:>10}  exact",
                "tensor", "dtype", "shape", "codec", "raw", "stored"
            )?;
        }
        let exact = match &t.lossy_info {
            Some(l) => {
                let est = l
                    .est_delta_loss
                    .map(|d| format!(", est. ΔL {d:.2e}"))
                    .unwrap_or_default();
                let coarse = if l.coarsened {
                    ", coarsened by retention"
                } else {
                    ""
                };
                format!(
                    "lossy [{}] max err {:.2e}, rel. L2 {:.2e}{est}{coarse}",
                    l.settings, l.max_abs_error, l.rel_error
                )
            }
            None => "lossless".into(),
        };
        let chain = match (&t.expired, &t.base) {
            (Some(why), _) => format!("  (expired: {})", printable(why)),
            (None, Some(b)) => format!("  (delta on {}, depth {})", b.short(12), t.depth),
            (None, None) => String::new(),
        };
        writeln!(
            out,
            "  {:<38} {:<8} {:<18} {:<11} {:>10} {:>10}  {exact}{chain}",
            printable(&t.name),
            t.dtype,
            format!("{:?}", t.shape),
            t.codec,
            size(t.raw_bytes),
            size(t.stored_bytes),
        )?;
    }
    Ok(())
}

pub(crate) fn diff(
    out: &mut dyn Write,
    json: bool,
    d: &Diff,
    changed_only: bool,
) -> io::Result<()> {
    let shown = |t: &&TensorDiff| !changed_only || t.change != Change::Unchanged;
    if json {
        if !changed_only {
            return emit(out, d);
        }
        let files: Vec<_> = d
            .files
            .iter()
            .filter(|f| f.change != FileChange::Unchanged)
            .collect();
        let tensors: Vec<_> = d.tensors.iter().filter(shown).collect();
        return emit(out, &json!({ "files": files, "tensors": tensors }));
    }
    let count = |c: FileChange| d.files.iter().filter(|f| f.change == c).count();
    let changed = |t: &&TensorDiff| matches!(t.change, Change::Changed { .. });
    writeln!(
        out,
        "{} changed, {} added, {} removed, {} unchanged; {} changed, {} added, {} removed",
        plural(count(FileChange::Changed), "file", "files"),
        count(FileChange::Added),
        count(FileChange::Removed),
        count(FileChange::Unchanged),
        plural(
            d.tensors.iter().filter(changed).count(),
            "tensor",
            "tensors"
        ),
        d.tensors
            .iter()
            .filter(|t| t.change == Change::Added)
            .count(),
        d.tensors
            .iter()
            .filter(|t| t.change == Change::Removed)
            .count(),
    )?;
    for f in d.files.iter().filter(|f| f.change != FileChange::Unchanged) {
        let what = match f.change {
            FileChange::Added => "added",
            FileChange::Removed => "removed",
            _ => "changed",
        };
        writeln!(out, "file {:<43} {what}", printable(&f.path))?;
    }
    let mut file: Option<&str> = None;
    for t in d.tensors.iter().filter(shown) {
        if d.files.len() > 1 && file != Some(t.file.as_str()) {
            file = Some(t.file.as_str());
            writeln!(out, "{}:", printable(&t.file))?;
        }
        let what = match &t.change {
            Change::Unchanged => "unchanged".to_string(),
            Change::Added => "added".to_string(),
            Change::Removed => "removed".to_string(),
            Change::Changed { reshaped: true, .. } => "changed (dtype or shape)".to_string(),
            Change::Changed {
                rel_l2: Some(r), ..
            } => format!("changed (relative L2 {r:.3e})"),
            Change::Changed { rel_l2: None, .. } => "changed".to_string(),
        };
        writeln!(out, "{:<48} {what}", printable(&t.name))?;
    }
    Ok(())
}

pub(crate) fn refs(out: &mut dyn Write, json: bool, refs: &[RefInfo]) -> io::Result<()> {
    if json {
        return emit(out, refs);
    }
    for r in refs {
        let msg = r
            .message
            .as_deref()
            .map(|m| format!("  {}", printable(m.lines().next().unwrap_or(""))))
            .unwrap_or_default();
        writeln!(
            out,
            "{} {:<24} {}{msg}",
            if r.current { "*" } else { " " },
            r.name,
            r.target.short(12)
        )?;
    }
    Ok(())
}

/// `text` with control characters (escape sequences, carriage returns, …) written as `\x1b`
/// or `\u{9b}`, so that names and messages from a repository cannot drive the terminal.
pub(crate) fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c as u32 {
            _ if !c.is_control() => out.push(c),
            n @ 0..=0x7f => out.push_str(&format!("\\x{n:02x}")),
            n => out.push_str(&format!("\\u{{{n:x}}}")),
        }
    }
    out.into()
}

pub(crate) fn message(out: &mut dyn Write, json: bool, text: &str) -> io::Result<()> {
    if json {
        return emit(out, &json!({ "message": text }));
    }
    writeln!(out, "{text}")
}

/// What `mdl status` says.
#[derive(Serialize)]
pub(crate) struct Status {
    /// The repository's folder.
    pub root: std::path::PathBuf,
    /// HEAD's branch.
    pub branch: String,
    /// Its newest commit (`None`: no commits yet).
    pub commit: Option<LogEntry>,
    /// How many branches and tags.
    pub branches: usize,
    pub tags: usize,
    /// The `mdl serve` that owns the repository, if one does.
    pub served_by: Option<ServedBy>,
}

/// A server that owns a repository.
#[derive(Serialize)]
pub(crate) struct ServedBy {
    pub url: String,
    pub pid: u32,
}

pub(crate) fn status(out: &mut dyn Write, json: bool, s: &Status) -> io::Result<()> {
    if json {
        return emit(out, s);
    }
    writeln!(out, "repository {}", s.root.display())?;
    match &s.commit {
        None => writeln!(out, "on branch {} (no commits yet)", s.branch)?,
        Some(c) => {
            let step = c.step.map(|n| format!(", step {n}")).unwrap_or_default();
            writeln!(
                out,
                "on branch {} at {} ({}{step}): {}",
                s.branch,
                c.id.short(12),
                c.time,
                printable(c.message.lines().next().unwrap_or(""))
            )?;
        }
    }
    writeln!(
        out,
        "{}, {}",
        plural(s.branches, "branch", "branches"),
        plural(s.tags, "tag", "tags")
    )?;
    match &s.served_by {
        Some(sv) => writeln!(
            out,
            "served by mdl serve (pid {}) at {}: commands that write are forwarded there",
            sv.pid, sv.url
        ),
        None => writeln!(out, "not served"),
    }
}

/// `1 branch`, `2 branches`.
pub(crate) fn plural(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

/// A ref's reflog, newest first: `old -> new  time  message`.
pub(crate) fn reflog(
    out: &mut dyn Write,
    json: bool,
    name: &str,
    lines: &[ReflogLine],
) -> io::Result<()> {
    if json {
        return emit(out, &json!({ "ref": name, "entries": lines }));
    }
    if lines.is_empty() {
        return writeln!(out, "{name}: no reflog entries");
    }
    let id = |v: Option<mdl::ObjectId>| v.map_or_else(|| "-".repeat(12), |id| id.short(12));
    for l in lines {
        let when = mdl::Timestamp(l.time_ms).to_string();
        writeln!(
            out,
            "{} -> {}  {when}  {}",
            id(l.old),
            id(l.new),
            printable(&l.message)
        )?;
    }
    Ok(())
}

/// A branch set by `reset` or `branch -f`.
pub(crate) fn branch_move(out: &mut dyn Write, json: bool, m: &BranchMove) -> io::Result<()> {
    if json {
        return emit(out, m);
    }
    let to = m.to.short(12);
    match m.from {
        Some(from) if from == m.to => writeln!(out, "{} stays at {to}", m.branch),
        Some(from) => writeln!(out, "{} now at {to} (was {})", m.branch, from.short(12)),
        None => writeln!(out, "branch {} at {to}", m.branch),
    }
}

pub(crate) fn config(
    out: &mut dyn Write,
    json: bool,
    entries: &[(String, String, bool)],
) -> io::Result<()> {
    if json {
        let v: Vec<_> = entries
            .iter()
            .map(|(k, v, set)| serde_json::json!({"key": k, "value": v, "default": !set}))
            .collect();
        return emit(out, &v);
    }
    for (k, v, set) in entries {
        let note = if *set { "" } else { "  (default)" };
        writeln!(out, "{k} = {v}{note}")?;
    }
    Ok(())
}

pub(crate) fn transfer(
    out: &mut dyn Write,
    json: bool,
    what: &str,
    t: &mdl_remote::TransferOutcome,
) -> io::Result<()> {
    if json {
        return writeln!(out, "{}", serde_json::to_string(t).expect("serialisable"));
    }
    writeln!(out, "{what}: {} objects, {}", t.objects, size(t.bytes))?;
    for m in &t.moved {
        match m.old {
            Some(old) => writeln!(out, "  {} {}..{}", m.name, old.short(12), m.new.short(12))?,
            None => writeln!(out, "  {} (new) {}", m.name, m.new.short(12))?,
        }
    }
    if t.moved.is_empty() {
        writeln!(out, "  everything up to date")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::significant;

    #[test]
    fn metrics_in_the_log_take_four_significant_digits() {
        for (v, text) in [
            (2.275888752937317, "2.276"),
            (0.0000016666666666666667, "1.667e-6"),
            (0.05, "0.05"),
            (123.456, "123.5"),
            (3.0, "3"),
            (1200.0, "1200"),
            (-0.25, "-0.25"),
            (99999.5, "100000"),
            (123456.7, "123500"),
            (0.000123456, "1.235e-4"),
            (1.5e-6, "1.5e-6"),
            (2.5e9, "2.5e9"),
            (0.001, "0.001"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(significant(v), text, "{v}");
        }
    }
}
