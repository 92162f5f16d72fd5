//! What the commands that look after a repository print: fsck, maintenance, compact, gc (of a
//! folder or a bucket) and stats, as text or `--json`.

use std::io::{self, Write};

use mdl::commit::DeferredReport;
use mdl::compact::CompactOutcome;
use mdl::fsck::{FsckReport, Rebuilt};
use mdl::gc::GcOutcome;
use mdl::stats::Stats;
use mdl_bucket::BucketGc;
use serde_json::json;

use super::{emit, size};

pub(crate) fn fsck(
    out: &mut dyn Write,
    json: bool,
    rebuilt: Option<&Rebuilt>,
    r: &FsckReport,
) -> io::Result<()> {
    if json {
        let rebuilt = rebuilt.map(|b| {
            json!({
                "objects": b.objects,
                "commits": b.commits,
                "refs": b.refs,
                "unusable": b.unusable,
                "journal": b.journal,
                "journal_skipped_bytes": b.journal_skipped_bytes,
                "moved_aside": b.moved_aside,
            })
        });
        return emit(
            out,
            &json!({
                "ok": r.ok(),
                "objects_checked": r.objects_checked,
                "commits_reachable": r.commits_reachable,
                "problems": r.problems,
                "unindexed_records": r.unindexed_records,
                "temp_files": r.temp_files,
                "expired": r.expired,
                "longest_chain": r.longest_chain,
                "cut": r.cut,
                "repaired": r.repaired,
                "rebuilt": rebuilt,
            }),
        );
    }
    if let Some(b) = rebuilt {
        writeln!(
            out,
            "rebuilt meta.redb: {} objects, {} commits, {} refs{}",
            b.objects,
            b.commits,
            b.refs,
            if b.journal {
                " (refs, reflogs, configuration and expiry from the journal)"
            } else {
                " (no journal: main is the newest head, other heads are recovered-* branches)"
            }
        )?;
        if let Some(aside) = &b.moved_aside {
            writeln!(out, "the old database is kept as {}", aside.display())?;
        }
        if b.journal_skipped_bytes > 0 {
            writeln!(
                out,
                "warning: {} bytes of the journal were unreadable and skipped",
                b.journal_skipped_bytes
            )?;
        }
        for u in &b.unusable {
            writeln!(out, "warning: unusable record {u}")?;
        }
    }
    for p in &r.problems {
        writeln!(out, "problem: {p}")?;
    }
    writeln!(
        out,
        "checked {} objects, {} reachable commits: {}",
        r.objects_checked,
        r.commits_reachable,
        if r.ok() { "ok" } else { "DAMAGED" }
    )?;
    if r.expired > 0 {
        writeln!(
            out,
            "note: {} tensors of thinned commits were expired by retention (expected)",
            r.expired
        )?;
    }
    if r.cut > 0 {
        writeln!(
            out,
            "note: history was cut at {} commits (a shallow clone; `mdl fetch --deepen N` brings more)",
            r.cut
        )?;
    }
    if !r.repaired.is_empty() {
        writeln!(out, "repaired: removed {} leftover files", r.repaired.len())?;
    } else if r.unindexed_records > 0 || !r.temp_files.is_empty() {
        writeln!(
            out,
            "note: {} unreferenced records and {} temporary files from interrupted writes (harmless)",
            r.unindexed_records,
            r.temp_files.len()
        )?;
    }
    Ok(())
}

pub(crate) fn maintenance(out: &mut dyn Write, json: bool, r: &DeferredReport) -> io::Result<()> {
    if json {
        return emit(out, r);
    }
    writeln!(
        out,
        "re-encoded {} previous versions of {} commits as reverse deltas, {} saved{}",
        r.rewritten,
        r.commits,
        size(r.saved_bytes),
        if r.pending > 0 {
            format!("; {} commits still queued", r.pending)
        } else {
            String::new()
        }
    )
}

pub(crate) fn compact(out: &mut dyn Write, json: bool, c: &CompactOutcome) -> io::Result<()> {
    if json {
        return emit(out, c);
    }
    let verb = if c.dry_run {
        "would re-encode"
    } else {
        "re-encoded"
    };
    writeln!(
        out,
        "{verb} {} tensors as new bases (cap {} steps); longest chain {} -> {}, branch tips' mean depth {:.1} -> {:.1}; stored {} -> {}{}",
        c.reencoded,
        c.max_depth,
        c.longest_before,
        c.longest_after,
        c.tip_depth_before,
        c.tip_depth_after,
        size(c.bytes_before),
        size(c.bytes_after),
        if c.dry_run { " (estimated)" } else { "" }
    )?;
    if c.skipped > 0 {
        writeln!(
            out,
            "note: {} tensors changed meanwhile and were left as they are",
            c.skipped
        )?;
    }
    Ok(())
}

/// `mdl -C s3://… gc`: the packs deleted, and those marked for a later gc.
pub(crate) fn bucket_gc(out: &mut dyn Write, json: bool, g: &BucketGc) -> io::Result<()> {
    if json {
        return emit(out, g);
    }
    let packs = |n: usize| format!("{n} pack{}", if n == 1 { "" } else { "s" });
    let (deleted, marked) = if g.dry_run {
        ("would delete", "would mark")
    } else {
        ("deleted", "marked")
    };
    writeln!(out, "{deleted} {} no ref needs", packs(g.deleted.len()))?;
    if let Some(due) = g.due_ms {
        let wait = ((due - mdl::Timestamp::now().0).max(0) as u64).div_ceil(1000);
        writeln!(
            out,
            "{marked} {} no ref needs: a gc from {wait} s on deletes those still unneeded",
            packs(g.marked.len())
        )?;
    }
    Ok(())
}

pub(crate) fn gc(out: &mut dyn Write, json: bool, g: &GcOutcome) -> io::Result<()> {
    if json {
        return emit(out, g);
    }
    let verb = if g.dry_run { "would remove" } else { "removed" };
    writeln!(
        out,
        "{verb} {} commits, {} manifests, {} tensors unreachable; {} tensors expired by retention ({} commits thinned); {} leftover files; {} freed",
        g.commits,
        g.manifests,
        g.tensors,
        g.expired,
        g.thinned_commits,
        g.leftover_files,
        size(g.bytes_freed)
    )?;
    if g.reencoded > 0 {
        let verb = if g.dry_run {
            "would re-encode"
        } else {
            "re-encoded"
        };
        writeln!(
            out,
            "{verb} {} kept tensors whose delta base went",
            g.reencoded
        )?;
    }
    let c = &g.coarsened;
    if c.tensors > 0 {
        if g.dry_run {
            writeln!(
                out,
                "would coarsen {} moment tensors of commits behind the tips ({} now)",
                c.tensors,
                size(c.bytes_before)
            )?;
        } else {
            writeln!(
                out,
                "coarsened {} moment tensors of commits behind the tips: {} -> {}",
                c.tensors,
                size(c.bytes_before),
                size(c.bytes_after)
            )?;
        }
    }
    if g.reflog_expired > 0 {
        writeln!(out, "expired {} reflog entries", g.reflog_expired)?;
    }
    if g.kept_young > 0 {
        writeln!(
            out,
            "kept {} unreachable objects younger than the grace period",
            g.kept_young
        )?;
    }
    Ok(())
}

pub(crate) fn stats(out: &mut dyn Write, json: bool, s: &Stats) -> io::Result<()> {
    if json {
        return emit(out, s);
    }
    writeln!(out, "commits      {}", s.commits)?;
    writeln!(out, "objects      {}", s.objects)?;
    writeln!(out, "raw bytes    {} ({})", s.raw_bytes, size(s.raw_bytes))?;
    writeln!(
        out,
        "stored bytes {} ({})",
        s.stored_bytes,
        size(s.stored_bytes)
    )?;
    writeln!(out, "ratio        {:.3}", s.ratio)?;
    if s.tips_bytes > 0 {
        writeln!(
            out,
            "tips         {} ({}) of decoded chain ends, beside the records",
            s.tips_bytes,
            size(s.tips_bytes)
        )?;
    }
    if s.pending_reencodes > 0 {
        writeln!(
            out,
            "queued       the re-encodes of {} commits (mdl maintenance; smaller after)",
            s.pending_reencodes
        )?;
    }
    if let Some(a) = &s.lossy {
        accounting(out, a)?;
    }
    Ok(())
}

/// `mdl stats --lossy`: HEAD's series by role, and its ratio by each accounting.
fn accounting(out: &mut dyn Write, a: &mdl::accounting::Accounting) -> io::Result<()> {
    writeln!(
        out,
        "\nHEAD's series, {} commits (each record counted once, as stored):",
        a.commits
    )?;
    writeln!(
        out,
        "  {:<11} {:>14} {:>12} {:>12} {:>12}",
        "role", "elements", "raw", "stored", "bits/elt"
    )?;
    for (name, r) in [
        ("weights", &a.weights),
        ("exp_avg", &a.exp_avg),
        ("exp_avg_sq", &a.exp_avg_sq),
        ("other", &a.other),
    ] {
        let bits = if r.elements == 0 {
            "-".to_string()
        } else {
            format!("{:.3}", 8.0 * r.stored_bytes as f64 / r.elements as f64)
        };
        writeln!(
            out,
            "  {:<11} {:>14} {:>12} {:>12} {:>12}",
            name,
            r.elements,
            size(r.raw_bytes),
            size(r.stored_bytes),
            bits
        )?;
    }
    for (name, ratio) in [
        ("mdl's (every byte)", a.ratio),
        ("DynaQuant's (weights, against fp32)", a.dynaquant),
        (
            "ExCP's (weights and moments after the first, against fp32)",
            a.excp,
        ),
    ] {
        writeln!(out, "  ratio, {name:<60} {ratio:>7.2}x")?;
    }
    Ok(())
}
