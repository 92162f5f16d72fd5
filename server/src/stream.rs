//! Response bodies produced on blocking threads: checkpoint byte ranges, single tensors and
//! pack streams. Each is written into a short channel in pieces; decoded tensors count against
//! the process's decode budget (`mdl::budget`) from before they are decoded until their last
//! piece has been written. A failure mid-stream ends the body early (the client sees a body
//! shorter than its Content-Length, or a pack without its end).

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use mdl::checkout::{FileLayout, Piece, Placed};
use mdl::{budget, transfer, ObjectId};

use crate::Served;

/// Decoded bytes a checkpoint stream holds at once (beyond one larger tensor).
const STREAM_WINDOW: u64 = 64 << 20;
/// Size of the pieces a response body is sent in.
const PIECE: usize = 4 << 20;
/// Size of the pieces a JSON answer written as it is made is sent in.
const JSON_PIECE: usize = 64 << 10;

type Sender = tokio::sync::mpsc::Sender<std::io::Result<Bytes>>;

/// A body whose pieces `produce` sends from a blocking thread. `produce` returns an error to
/// end the body with it (logged under `what`); a client that went away makes sends fail.
fn produced(
    what: &'static str,
    produce: impl FnOnce(&Sender) -> Result<(), String> + Send + 'static,
) -> Body {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(4);
    tokio::task::spawn_blocking(move || {
        if let Err(e) = produce(&tx) {
            tracing::error!("{what}: {e}");
            let _ = tx.blocking_send(Err(std::io::Error::other(e)));
        }
    });
    Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// Bytes `start..end` of a file: its inline bytes from the layout, and each touched object
/// decoded a window of objects at a time (in parallel), so memory stays near the window or the
/// largest object.
pub(crate) fn file_range(served: Arc<Served>, file: Arc<FileLayout>, start: u64, end: u64) -> Body {
    produced("file stream", move |tx| {
        let touching: Vec<&Piece> = file.touching(start, end).collect();
        let mut i = 0;
        while i < touching.len() {
            let first = match touching[i] {
                Piece::Inline { offset, bytes } => {
                    let from = start.max(*offset) - offset;
                    let to = end.min(offset + bytes.len() as u64) - offset;
                    let piece = Bytes::copy_from_slice(&bytes[from as usize..to as usize]);
                    if tx.blocking_send(Ok(piece)).is_err() {
                        return Ok(());
                    }
                    i += 1;
                    continue;
                }
                Piece::Object(o) => o,
            };
            // A window of consecutive objects.
            let mut window: Vec<&Placed> = vec![first];
            let mut bytes = first.entry.content_len;
            let mut j = i + 1;
            while let Some(Piece::Object(o)) = touching.get(j) {
                if bytes + o.entry.content_len > STREAM_WINDOW {
                    break;
                }
                bytes += o.entry.content_len;
                window.push(o);
                j += 1;
            }
            for (t, data) in window.iter().zip(decode_window(&served, &window)?) {
                let from = start.max(t.offset) - t.offset;
                let to = end.min(t.offset + t.entry.content_len) - t.offset;
                if !send_pieces(tx, &data, from as usize, to as usize) {
                    return Ok(());
                }
            }
            i = j;
        }
        Ok(())
    })
}

/// One tensor, whole.
pub(crate) fn tensor(served: Arc<Served>, placed: Placed) -> Body {
    produced("tensor stream", move |tx| {
        let [data] = decode_window(&served, &[&placed])?
            .try_into()
            .expect("one tensor decodes to one buffer");
        send_pieces(tx, &data, 0, data.len());
        Ok(())
    })
}

/// The records of `ids` as a pack stream (`mdl::transfer::write_pack_against`: each tensor
/// `against` pairs with a tensor the receiver holds coded against it where that is smaller,
/// and the record `resume` names sent from where the receiver was cut off).
pub(crate) fn pack(
    served: Arc<Served>,
    ids: Arc<Vec<ObjectId>>,
    against: HashMap<ObjectId, ObjectId>,
    resume: Option<mdl_protocol::body::Resume>,
) -> Body {
    produced("pack stream", move |tx| {
        let mut w = PieceWriter {
            tx,
            buf: Vec::with_capacity(PIECE),
            piece: PIECE,
        };
        transfer::write_pack_against(&served.repo, &ids, &against, resume.as_ref(), &mut w)
            .and_then(|_| w.flush().map_err(|e| mdl::StoreError::Output(e).into()))
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
}

/// A JSON answer that `write` writes on a blocking thread as it makes it, sent in pieces of
/// [`JSON_PIECE`]: the server holds what `write` holds, not the answer. An error (or a client
/// that went away) ends the body early, so the client reads JSON cut short.
pub(crate) fn json(
    what: &'static str,
    write: impl FnOnce(&mut dyn Write) -> Result<(), Box<dyn std::error::Error>> + Send + 'static,
) -> Body {
    produced(what, move |tx| {
        let mut w = PieceWriter {
            tx,
            buf: Vec::with_capacity(JSON_PIECE),
            piece: JSON_PIECE,
        };
        write(&mut w).map_err(|e| e.to_string())?;
        w.flush().map_err(|e| e.to_string())
    })
}

/// What writes each item a walk hands it into `w` as the next element of a JSON array already
/// opened there, commas between.
pub(crate) fn elements<'w, T: serde::Serialize>(
    w: &'w mut dyn Write,
) -> impl FnMut(T) -> mdl::Result<()> + 'w {
    let mut first = true;
    move |item| {
        if !std::mem::take(&mut first) {
            w.write_all(b",").map_err(mdl::StoreError::Output)?;
        }
        serde_json::to_writer(&mut *w, &item).map_err(|e| mdl::StoreError::Output(e.into()))?;
        Ok(())
    }
}

/// Decodes `window`'s tensors in parallel (each verified against its id) under the decode
/// budget: the whole window's cost (its delta bases and records too) is reserved before
/// anything is decoded; once decoded, each tensor keeps only its own bytes' share, until its
/// last piece is sent.
fn decode_window(served: &Served, window: &[&Placed]) -> Result<Vec<Bytes>, String> {
    use rayon::prelude::*;
    let mut held = budget::reserve(window.iter().map(|t| budget::decode_cost(&t.entry)).sum());
    let decoded: Vec<_> = window.par_iter().map(|t| t.load(&served.repo)).collect();
    decoded
        .into_iter()
        .map(|data| {
            let data = data.map_err(|e| e.to_string())?;
            let share = held.split_off(data.len() as u64);
            Ok(Bytes::from_owner(Held {
                data,
                _budget: share,
            }))
        })
        .collect()
}

/// A decoded tensor and its share of the decode budget: the pieces sent from it are slices
/// of it, so the share is given back only when the last piece has been written and dropped.
struct Held {
    data: Vec<u8>,
    _budget: budget::Reservation,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

/// Sends `data[from..to]` in pieces; false when the client went away.
fn send_pieces(tx: &Sender, data: &Bytes, from: usize, to: usize) -> bool {
    let mut at = from;
    while at < to {
        let next = (at + PIECE).min(to);
        if tx.blocking_send(Ok(data.slice(at..next))).is_err() {
            return false;
        }
        at = next;
    }
    true
}

/// Writes into a body's channel in pieces of `piece` bytes.
struct PieceWriter<'a> {
    tx: &'a Sender,
    buf: Vec<u8>,
    piece: usize,
}

impl Write for PieceWriter<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= self.piece {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let piece = Bytes::from(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(self.piece),
        ));
        self.tx
            .blocking_send(Ok(piece))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "client went away"))
    }
}
