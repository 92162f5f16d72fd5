//! How a failed command ends: one line on stderr (and, under `--json`, one JSON document
//! `{"error": {"code", "message"}}` on stdout, with the HTTP API's stable codes), and an exit
//! code that says what kind of failure it was.

use std::io::{self, Write};
use std::process::ExitCode;

use mdl_protocol::ErrorCode;

/// Reports `e`: on stderr, and on `out` as JSON when `json`.
pub(crate) fn report(e: &anyhow::Error, json: bool, out: &mut dyn Write) {
    let message = one_line(e);
    let _ = writeln!(io::stderr(), "error: {message}");
    if json {
        let doc = serde_json::json!({ "error": { "code": code(e), "message": message } });
        let _ = writeln!(out, "{doc:#}");
        let _ = out.flush();
    }
}

/// A command line clap refused: help and version as clap prints them; an error as clap does,
/// and also as JSON when `--json` was asked for. Exit code 2.
pub(crate) fn usage(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let asked_json = std::env::args().skip(1).any(|a| a == "--json");
    if !asked_json || matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit();
    }
    let text = e.to_string();
    let message = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("invalid command line")
        .trim_start_matches("error: ")
        .to_string();
    let _ = e.print();
    let doc = serde_json::json!({ "error": { "code": ErrorCode::Usage, "message": message } });
    println!("{doc:#}");
    ExitCode::from(2)
}

/// The stable code of a failure: the library's, the bucket's or the remote's own, else
/// `bad_input` (a refusal of the command line's own, such as a command that does not run
/// over HTTP) or `io_error` (writing the output).
pub(crate) fn code(e: &anyhow::Error) -> ErrorCode {
    for cause in e.chain() {
        if let Some(code) = mdl_ops::code_of(cause) {
            return code;
        }
        if cause.downcast_ref::<io::Error>().is_some() {
            return ErrorCode::IoError;
        }
    }
    ErrorCode::BadInput
}

pub(crate) fn one_line(e: &anyhow::Error) -> String {
    let mut s = String::new();
    for (i, cause) in e.chain().enumerate() {
        let text = cause.to_string();
        if i > 0 && s.contains(&text) {
            continue;
        }
        if i > 0 {
            s.push_str(": ");
        }
        s.push_str(&text);
    }
    // Whatever a server or a file put in a message reaches the terminal escaped.
    mdl::names::printable(&s.replace('\n', " "))
}

/// Exit codes: 1 for an operation that failed, 3 for a repository found damaged by fsck,
/// 4 for a repository held by another process past `--wait` (here or, over HTTP, on the
/// server). (clap uses 2 for usage errors.)
pub(crate) fn exit_code(e: &anyhow::Error) -> u8 {
    match e.downcast_ref::<mdl_ops::Error>() {
        Some(mdl_ops::Error::Local(e)) => library_exit_code(e),
        Some(mdl_ops::Error::Bucket(e)) => bucket_exit_code(e),
        Some(mdl_ops::Error::Remote(e)) => remote_exit_code(e),
        Some(mdl_ops::Error::Unsupported { .. } | mdl_ops::Error::Location(_)) => 1,
        None => match (
            e.downcast_ref::<mdl::Error>(),
            e.downcast_ref::<mdl_bucket::Error>(),
            e.downcast_ref::<mdl_remote::Error>(),
        ) {
            (Some(e), _, _) => library_exit_code(e),
            (_, Some(e), _) => bucket_exit_code(e),
            (_, _, Some(e)) => remote_exit_code(e),
            (None, None, None) => 1,
        },
    }
}

fn bucket_exit_code(e: &mdl_bucket::Error) -> u8 {
    match e {
        mdl_bucket::Error::Local(e) => library_exit_code(e),
        mdl_bucket::Error::Location(_)
        | mdl_bucket::Error::Storage { .. }
        | mdl_bucket::Error::NotARepository(_)
        | mdl_bucket::Error::AlreadyExists(_)
        | mdl_bucket::Error::Conflict(_)
        | mdl_bucket::Error::Unsupported(_)
        | mdl_bucket::Error::Cache { .. } => 1,
    }
}

fn remote_exit_code(e: &mdl_remote::Error) -> u8 {
    match e {
        mdl_remote::Error::Local(e) => library_exit_code(e),
        mdl_remote::Error::Client(mdl_client::Error::Server { code, .. })
        | mdl_remote::Error::Peer { code, .. } => match code {
            Some(mdl_protocol::ErrorCode::Busy) => 4,
            _ => 1,
        },
        mdl_remote::Error::Client(_)
        | mdl_remote::Error::Rejected(_)
        | mdl_remote::Error::Remote(_) => 1,
    }
}

/// Every library error named, so that a new one is a decision about its exit code.
fn library_exit_code(e: &mdl::Error) -> u8 {
    use mdl::Error as E;
    use mdl::StoreError as S;
    match e {
        E::Store(S::Busy { .. }) => 4,
        E::Store(
            S::Io { .. }
            | S::DbIo(_)
            | S::Db(_)
            | S::Malformed(_)
            | S::ReadOnlyDatabase
            | S::Damaged(_)
            | S::NeedsRecovery
            | S::Corrupt { .. }
            | S::Missing(_)
            | S::Fetch { .. }
            | S::ReadOnly(_)
            | S::NotARepository(_)
            | S::AlreadyExists(_)
            | S::NewerFormat { .. }
            | S::Output(_)
            | S::InputChanged(_)
            | S::OutOfMemory(_)
            | S::TooLarge { .. }
            | S::RefConflict { .. },
        )
        | E::Input { .. }
        | E::Changed { .. }
        | E::InvalidInput { .. }
        | E::DamagedCheckpoint { .. }
        | E::TooLarge(_)
        | E::Assemble(_)
        | E::Merge(_)
        | E::UnknownRevision(_)
        | E::NotABranchHere { .. }
        | E::ShortIdPrefix(_)
        | E::NoSuchPath { .. }
        | E::AmbiguousRevision { .. }
        | E::NoSuchAncestor { .. }
        | E::UnbornBranch(_)
        | E::InvalidName(_)
        | E::RefExists { .. }
        | E::NoSuchRef { .. }
        | E::DeleteCurrentBranch(_)
        | E::UnmergedBranch { .. }
        | E::OutputExists(_)
        | E::OutputInRepository(_)
        | E::Output { .. }
        | E::InvalidMetric(_)
        | E::InvalidConfig { .. }
        | E::EvalCommand { .. }
        | E::UnknownConfig(_)
        | E::Corrupt { .. }
        | E::Encode { .. }
        | E::WrongKind { .. }
        | E::BadTransfer(_)
        | E::TransferCut { .. }
        | E::BaseNotSent { .. }
        | E::PlanChanged { .. }
        | E::Incomplete(_)
        | E::NotFastForward { .. }
        | E::Expired { .. }
        | E::GpuUnavailable(_)
        | E::InvalidDuration(_)
        | E::Background(_) => 1,
    }
}
