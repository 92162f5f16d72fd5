//! A mixed-precision checkpoint's 16-bit weights stored as the cast of their fp32 master copy
//! (codec `cast`, `mdl_codec::cast`): which pieces are such copies ([`cast_pairs`]), and
//! storing one once its master is stored ([`StoreCtx::store_cast`]). A lossy commit does not
//! quantize the copy on its own: it stores the cast of the master's reconstruction, so that
//! a checkout's two copies agree wherever the trainer's did (docs/DECISIONS.md, "A bf16 copy
//! is the cast of its master").

use std::collections::HashMap;

use mdl_codec::cast;
use mdl_codec::engine::FloatView;
use mdl_codec::CodecTag;
use mdl_format::{Dtype, Exactness, Lossy};
use mdl_store::Placement;

use super::content::Content;
use super::lossless::Counted;
use super::{StoreCtx, Stored};
use crate::input::Input;
use crate::lossy::Role;
use crate::Result;

/// A copy is stored as a cast when at most this fraction of its elements are exceptions: each
/// costs about four bytes, where the copy on its own costs one and a half an element.
const MAX_EXCEPTIONS: f64 = 1.0 / 16.0;

/// Elements of a copy looked at to guess whether it is its master's cast.
const SAMPLES: usize = 1 << 16;

/// Masters of at most this size have cast copies: a cast is read with its master whole, where
/// a larger tensor stored on its own is read a window at a time.
const MAX_MASTER: u64 = 1 << 30;

/// For each piece, the master it is a cast copy of: a 16-bit parameter and an `F32` parameter
/// of the same shape paired with the same moments (`model.{}` and `optim.{}.master`), where
/// the 16-bit one is the master's cast to nearest even on all but a few elements.
pub(in crate::commit) fn cast_pairs(input: &Input, roles: &[Role]) -> Vec<Option<usize>> {
    let mut masters: HashMap<(usize, usize), usize> = HashMap::new();
    for (j, role) in roles.iter().enumerate() {
        if let Role::Param {
            moments: Some(m), ..
        } = role
        {
            if input.pieces[j].header.dtype == Dtype::F32 {
                masters.entry(*m).or_insert(j);
            }
        }
    }
    let mut out = vec![None; roles.len()];
    for (i, role) in roles.iter().enumerate() {
        let Role::Param {
            moments: Some(m), ..
        } = role
        else {
            continue;
        };
        let copy = &input.pieces[i].header;
        let Some(&j) = masters.get(m) else { continue };
        if !cast::supports(copy.dtype)
            || input.pieces[j].header.shape != copy.shape
            || input.pieces[j].len > MAX_MASTER
        {
            continue;
        }
        // A sample decides (a pass over both copies would cost a large model seconds); the
        // store checks the whole copy again (`store_cast`).
        let (differ, looked) =
            cast::sampled_exceptions(copy.dtype, input.tensor(j), input.tensor(i), SAMPLES);
        if differ as f64 <= looked as f64 * MAX_EXCEPTIONS {
            out[i] = Some(j);
        }
    }
    out
}

impl StoreCtx<'_> {
    /// Stores piece `i`, a copy of piece `j` (stored as `master`): the cast of what `j` was
    /// stored as, with the elements where the copy is not its cast. Where the master was
    /// stored exactly, so is the copy; where it was quantized, the copy follows the
    /// reconstruction, and records the error that makes against the copy committed. Under a
    /// master at the policy's depth cap (a cast record would be a step deeper) that content is
    /// stored on its own.
    pub(super) fn store_cast(
        &self,
        i: usize,
        j: usize,
        master: &Stored,
    ) -> Result<(Stored, Exactness)> {
        let depth = self.depth_of(master)?;
        let info = &self.input.pieces[i];
        let dtype = info.header.dtype;
        let read = |k: usize| -> Result<Vec<u8>> {
            let mut buf = vec![0u8; self.input.pieces[k].len as usize];
            self.input.read_into(k, 0, &mut buf)?;
            Ok(buf)
        };
        // What is hashed must be what is encoded: bytes that may change meanwhile are copied.
        let copy = read(i)?;
        let committed = read(j)?;
        let reconstructed = self.kept.lock().unwrap().get(&j).cloned();
        let (content, exactness) = match &reconstructed {
            None => (copy, Exactness::Lossless),
            Some(recon) => {
                let mut out = vec![0u8; copy.len()];
                cast::follow(dtype, &committed, recon, &copy, &mut out);
                let view = |bytes| FloatView { dtype, bytes };
                let err = self.coder.engine.error_stats(view(&copy), view(&out), None);
                let lossy = Lossy {
                    settings: format!("cast of={}", self.input.pieces[j].name),
                    max_abs_error: err.max_abs,
                    rel_error: err.rel_l2(),
                    est_delta_loss: None,
                };
                let exactness = match out == copy {
                    true => Exactness::Lossless,
                    false => Exactness::Lossy(lossy),
                };
                (out, exactness)
            }
        };
        let base: &[u8] = reconstructed.as_deref().map_or(&committed, |r| &r[..]);
        let id = (self.coder.engine).content_id(&info.header.canonical(), &content);
        let payload = cast::encode(dtype, base, &content)
            .map_err(|source| crate::Error::Encode { id, source })?;
        // The sample misled: a copy stored exactly that is not mostly its master's cast is
        // stored on its own (decided before anything claims its id). A lossy copy keeps
        // following its master, its exceptions in the payload.
        if reconstructed.is_none()
            && payload.len() as f64 > (info.len / 2) as f64 * MAX_EXCEPTIONS * 4.0
        {
            return self.store_tensor(i);
        }
        self.input.release(i);
        let stored = match self.is_new(&id, i, &content)? {
            // A master at the policy's depth cap: the copy's content stored on its own.
            true if depth >= self.policy.max_depth => self.encode_new(
                id,
                i,
                Content::Memory(&content),
                CodecTag::FloatSplit,
                Counted::default(),
            )?,
            true => {
                let placement = Placement {
                    generation: 0,
                    base: Some(master.id),
                    depth: depth + 1,
                };
                let out = (self.coder.batch).put_payload(
                    &id,
                    &info.header,
                    CodecTag::Cast,
                    placement,
                    &[&payload],
                )?;
                Stored {
                    id,
                    added: Some((id, out.entry)),
                    rewrite: None,
                }
            }
            false => Stored {
                id,
                added: None,
                rewrite: None,
            },
        };
        self.forget_previous_tip(i, &stored.id);
        self.progress.advance(info.len);
        Ok((stored, exactness))
    }
}
