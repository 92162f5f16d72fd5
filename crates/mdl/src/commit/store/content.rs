//! A tensor's content, and its delta base's, read for one pass of the float codecs: held in
//! memory (one window, the whole tensor), or a window of whole chunks at a time so a tensor
//! of any size costs a constant amount of memory — read from the input file (copied into a
//! private buffer by `pread`, on a thread of its own, and hashed as it is read; bytes that are
//! also on a GPU are read in place, see [`Input::on_device`]), or decoded from the store along
//! its chain.

use mdl_codec::huffman::CHUNK_LOG2;
use mdl_format::{ObjectId, TensorHasher};
use mdl_store::{IndexEntry, Store};

use crate::input::Input;
use crate::{Error, Result};

/// Where one side of a pass reads from.
pub(in crate::commit) enum Content<'a> {
    /// Bytes in memory (already hashed, or decoded and verified).
    Memory(&'a [u8]),
    /// Piece `i` of the input, a window at a time; `id` is what its bytes hash to.
    Input {
        input: &'a Input,
        i: usize,
        id: ObjectId,
    },
    /// An object of the store, decoded a window at a time.
    Stored {
        store: &'a Store,
        id: ObjectId,
        entry: IndexEntry,
    },
}

impl Content<'_> {
    pub(in crate::commit) fn len(&self) -> usize {
        match self {
            Content::Memory(b) => b.len(),
            Content::Input { input, i, .. } => input.pieces[*i].len as usize,
            Content::Stored { entry, .. } => entry.content_len as usize,
        }
    }

    fn is_input(&self) -> bool {
        matches!(self, Content::Input { .. })
    }

    pub(in crate::commit) fn windowed(&self) -> bool {
        !matches!(self, Content::Memory(_))
    }
}

/// Bytes of a window of a tensor of `width`-byte elements.
pub(in crate::commit) fn window_bytes(width: usize) -> usize {
    ((mdl_store::WINDOW_CHUNKS as usize) << CHUNK_LOG2) * width
}

/// What a pass does with each window of a tensor and of its base.
pub(in crate::commit) type Visit<'a> = dyn FnMut(&[u8], Option<&[u8]>) -> Result<()> + 'a;

/// One pass over `data` (and `base`, window by window in lockstep): `f` gets each window of
/// both. Content in memory on both sides is one window. With a `hasher`, returns the hash of
/// the input's bytes as they were read, on whichever side the input is (a pass encoding from
/// it compares this with the id: a file rewritten during the commit must not be stored under
/// the old content's id).
pub(in crate::commit) fn pass(
    data: &Content<'_>,
    base: Option<&Content<'_>>,
    width: usize,
    hasher: Option<TensorHasher>,
    f: &mut Visit<'_>,
) -> Result<Option<ObjectId>> {
    let len = data.len();
    if base.is_some_and(|b| b.len() != len) {
        return Err(Error::Store(mdl_store::StoreError::Output(
            std::io::Error::other("base length differs from the tensor's"),
        )));
    }
    let windowed = data.windowed() || base.is_some_and(Content::windowed);
    let step = if windowed {
        window_bytes(width)
    } else {
        len.max(1)
    };
    if let (Content::Input { input, i, .. }, true) = (data, windowed) {
        if !input.on_device(*i) {
            return prefetched(input, *i, base, step, hasher, f);
        }
    }
    let mut hasher = hasher;
    let mut reader = Reader::new(data)?;
    let mut base_reader = base.map(Reader::new).transpose()?;
    let mut at = 0;
    // At least one window, so an empty tensor is seen too.
    loop {
        let n = step.min(len - at);
        let d = reader.window(at, n)?;
        let b = match base_reader.as_mut() {
            Some(r) => Some(r.window(at, n)?),
            None => None,
        };
        if let Some(h) = hasher.as_mut() {
            match (data.is_input(), b) {
                (true, _) => h.update(d),
                (false, Some(b)) if base.is_some_and(Content::is_input) => h.update(b),
                _ => {}
            }
        }
        f(d, b)?;
        at += n;
        if at >= len {
            break;
        }
    }
    reader.finish()?;
    if let Some(r) = base_reader {
        r.finish()?;
    }
    Ok(hasher.map(|h| h.finalize()))
}

/// [`pass`] over piece `i` of the input, read a window at a time: a thread of its own reads
/// and hashes the next window while `f` works on this one.
fn prefetched(
    input: &Input,
    i: usize,
    base: Option<&Content<'_>>,
    step: usize,
    hasher: Option<TensorHasher>,
    f: &mut Visit<'_>,
) -> Result<Option<ObjectId>> {
    let len = input.pieces[i].len as usize;
    // Two buffers go round: one being read, one being worked on.
    let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<Result<Vec<u8>>>(1);
    let (empty_tx, empty_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    for _ in 0..2 {
        // Allocated here, where they are freed.
        let buf = Vec::with_capacity(step.min(len));
        empty_tx.send(buf).expect("the receiver is here");
    }
    std::thread::scope(|s| {
        let reader = s.spawn(move || {
            let mut hasher = hasher;
            let mut at = 0;
            // At least one window, so an empty tensor is seen too.
            loop {
                let n = step.min(len - at);
                let Ok(mut buf) = empty_rx.recv() else {
                    return None;
                };
                buf.resize(n, 0);
                let read = input.read_into(i, at as u64, &mut buf);
                if let (Ok(()), Some(h)) = (&read, hasher.as_mut()) {
                    h.update(&buf);
                }
                let failed = read.is_err();
                if full_tx.send(read.map(|()| buf)).is_err() || failed {
                    return None;
                }
                at += n;
                if at >= len {
                    return Some(hasher.map(|h| h.finalize()));
                }
            }
        });
        let worked = (move || -> Result<()> {
            let mut base_reader = base.map(Reader::new).transpose()?;
            let mut at = 0;
            while let Ok(window) = full_rx.recv() {
                let d = window?;
                let n = d.len();
                let b = match base_reader.as_mut() {
                    Some(r) => Some(r.window(at, n)?),
                    None => None,
                };
                f(&d, b)?;
                let _ = empty_tx.send(d);
                at += n;
                if at >= len {
                    break;
                }
            }
            if let Some(r) = base_reader {
                r.finish()?;
            }
            Ok(())
        })();
        // The channels are closed here, so a reader still waiting on them stops.
        let hash = reader.join().expect("the reading thread does not panic");
        worked?;
        Ok(hash.expect("every window was read"))
    })
}

/// Reads one side of a pass.
enum Reader<'a> {
    Memory(&'a [u8]),
    Input {
        input: &'a Input,
        i: usize,
        buf: Vec<u8>,
    },
    Stored {
        windows: Box<mdl_store::TensorWindows<'a>>,
        buf: Vec<u8>,
    },
}

impl<'a> Reader<'a> {
    fn new(c: &Content<'a>) -> Result<Reader<'a>> {
        Ok(match c {
            Content::Memory(b) => Reader::Memory(b),
            // Bytes also on a GPU stay unchanged while the commit runs: read in place (an
            // engine on that GPU finds each window there).
            Content::Input { input, i, .. } if input.on_device(*i) => {
                Reader::Memory(input.tensor(*i))
            }
            Content::Input { input, i, .. } => Reader::Input {
                input,
                i: *i,
                buf: Vec::new(),
            },
            Content::Stored { store, id, entry } => Reader::Stored {
                windows: Box::new(store.tensor_windows(id, entry)?),
                buf: Vec::new(),
            },
        })
    }

    /// Bytes `at..at + n` (windows are asked for in order).
    fn window(&mut self, at: usize, n: usize) -> Result<&[u8]> {
        Ok(match self {
            Reader::Memory(b) => &b[at..at + n],
            Reader::Input { input, i, buf } => {
                // A private copy: what is hashed is exactly what is encoded, even if the file
                // changes meanwhile.
                buf.resize(n, 0);
                input.read_into(*i, at as u64, buf)?;
                buf
            }
            Reader::Stored { windows, buf } => {
                buf.resize(n, 0);
                windows.next_into(buf)?;
                buf
            }
        })
    }

    fn finish(self) -> Result<()> {
        if let Reader::Stored { windows, .. } = self {
            windows.finish()?;
        }
        Ok(())
    }
}
