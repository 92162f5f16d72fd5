//! A tree sent for one commit: a tar of its files under their paths in the commit, written
//! while it is sent (a thread writes into a pipe the request reads), never whole on disk or in
//! memory.

use std::fs::File;
use std::io::{self, PipeReader};
use std::thread::JoinHandle;

use mdl::commit::SourceFile;

/// The content type of a tree upload (`docs/HTTP_API.md`).
pub(crate) const TAR: &str = "application/x-tar";

/// Opens every file of the tree, so that one that cannot be read is reported before anything is
/// sent.
pub(crate) fn open(files: Vec<SourceFile>) -> mdl::Result<Vec<(SourceFile, File)>> {
    files
        .into_iter()
        .map(|f| match File::open(&f.source) {
            Ok(file) => Ok((f, file)),
            Err(source) => Err(mdl::Error::Input {
                path: f.source,
                source,
            }),
        })
        .collect()
}

/// Starts writing the tar of `files`: what to send, and the writer, whose error (a file that
/// could not be read) says why the upload broke off.
pub(crate) fn stream(
    files: Vec<(SourceFile, File)>,
) -> io::Result<(PipeReader, JoinHandle<io::Result<()>>)> {
    let (reader, writer) = io::pipe()?;
    let writing = std::thread::spawn(move || -> io::Result<()> {
        let mut tar = tar::Builder::new(io::BufWriter::with_capacity(1 << 20, writer));
        for (f, file) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(file.metadata()?.len());
            header.set_mode(if f.executable { 0o755 } else { 0o644 });
            header.set_entry_type(tar::EntryType::Regular);
            // The tree path alone (no times, owners): the commit records none of them.
            tar.append_data(&mut header, &f.tree_path, file)?;
        }
        tar.into_inner()?
            .into_inner()
            .map_err(io::IntoInnerError::into_error)?;
        Ok(())
    });
    Ok((reader, writing))
}
