//! A tree sent for one commit: a tar of its files under their paths in the commit, written
//! while it is sent (a thread writes into a pipe the request reads), never whole on disk or in
//! memory.

use std::fs::File;
use std::io::{self, PipeReader};
use std::path::PathBuf;
use std::thread::JoinHandle;

/// The content type of a tree upload (`docs/HTTP_API.md`).
pub(crate) const TAR: &str = "application/x-tar";

/// One file of a tree to commit, opened (so that one that cannot be read is reported before
/// anything is sent).
#[derive(Debug)]
pub struct TreeFile {
    /// Its path in the commit's tree.
    pub tree_path: String,
    /// Where it is read from (for messages).
    pub source: PathBuf,
    /// The open file.
    pub file: File,
    /// Whether it is stored as executable.
    pub executable: bool,
}

/// The thread writing a tree's tar; its error names the file being written when it failed.
pub(crate) type Writing = JoinHandle<Result<(), (PathBuf, io::Error)>>;

/// Starts writing the tar of `files`: what to send, and the writer, whose error says why the
/// upload broke off.
pub(crate) fn stream(files: Vec<TreeFile>) -> io::Result<(PipeReader, Writing)> {
    let (reader, writer) = io::pipe()?;
    let writing = std::thread::spawn(move || {
        let mut tar = tar::Builder::new(io::BufWriter::with_capacity(1 << 20, writer));
        let last = files.last().map(|f| f.source.clone()).unwrap_or_default();
        for f in files {
            let mut add = || -> io::Result<()> {
                let mut header = tar::Header::new_gnu();
                header.set_size(f.file.metadata()?.len());
                header.set_mode(if f.executable { 0o755 } else { 0o644 });
                header.set_entry_type(tar::EntryType::Regular);
                // The tree path alone (no times, owners): the commit records none of them.
                tar.append_data(&mut header, &f.tree_path, &f.file)
            };
            add().map_err(|e| (f.source.clone(), e))?;
        }
        let finish = || -> io::Result<()> {
            tar.into_inner()?
                .into_inner()
                .map_err(io::IntoInnerError::into_error)?;
            Ok(())
        };
        finish().map_err(|e| (last, e))
    });
    Ok((reader, writing))
}
