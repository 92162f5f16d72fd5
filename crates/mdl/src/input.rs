//! What a commit reads: a safetensors file, validated and mapped into memory, and its tensors
//! as bytes or as float views.

use std::fs::File;
use std::path::Path;

use mdl_codec::engine::{FloatView, Moments};
use mdl_format::safetensors::{self, Layout};

use crate::{Error, Result};

/// A validated safetensors file mapped into memory.
pub(crate) struct Input {
    map: memmap2::Mmap,
    pub(crate) layout: Layout,
}

impl Input {
    /// Maps and validates `path`; nothing is written anywhere.
    pub(crate) fn open(path: &Path) -> Result<Input> {
        let io = |source| Error::Input {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(io(std::io::Error::other("not a regular file")));
        }
        let invalid = |source| Error::InvalidInput {
            path: path.to_path_buf(),
            source,
        };
        if meta.len() < 8 {
            return Err(invalid(safetensors::SafetensorsError::TooShort {
                len: meta.len(),
            }));
        }
        // SAFETY: the map is read-only and private. Another process truncating the file while
        // it is mapped would fault, as for every mmap-based reader (safetensors included); one
        // rewriting it in place cannot corrupt the store, because every tensor is re-hashed as
        // it is encoded and a mismatch aborts the commit.
        #[allow(unsafe_code)]
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let header_len = safetensors::header_len(&map[..8], map.len() as u64).map_err(invalid)?;
        let header = &map[8..8 + header_len as usize];
        let layout = safetensors::parse(header, map.len() as u64).map_err(invalid)?;
        Ok(Input { map, layout })
    }

    /// The whole file.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.map
    }

    pub(crate) fn header_json(&self) -> &[u8] {
        &self.map[8..self.layout.data_start() as usize]
    }

    pub(crate) fn tensor(&self, i: usize) -> &[u8] {
        let t = &self.layout.tensors[i];
        let start = (self.layout.data_start() + t.offset) as usize;
        &self.map[start..start + t.len as usize]
    }

    /// Tensor `i` as floats (a lossy candidate: bf16, f16 or f32).
    pub(crate) fn view(&self, i: usize) -> FloatView<'_> {
        FloatView {
            dtype: self.layout.tensors[i].header.dtype,
            bytes: self.tensor(i),
        }
    }

    /// The moments at tensor indices `(exp_avg, exp_avg_sq)`.
    pub(crate) fn moments(&self, pair: Option<(usize, usize)>) -> Option<Moments<'_>> {
        pair.map(|(m, v)| Moments {
            m: self.view(m),
            v: self.view(v),
        })
    }

    /// Drops the pages of tensor `i` from this process's memory (they stay in the page cache),
    /// so resident memory follows the tensor being worked on, not the file size.
    pub(crate) fn release(&self, i: usize) {
        let t = &self.layout.tensors[i];
        let start = (self.layout.data_start() + t.offset) as usize;
        let page = 4096;
        let aligned = start.div_ceil(page) * page;
        let end = (start + t.len as usize) / page * page;
        if end > aligned {
            // SAFETY: the mapping is a read-only private file mapping that this process never
            // writes, so discarding its pages only means they are read from the file again on
            // the next access; no slice into the range is used concurrently in a way that
            // depends on the pages staying resident.
            #[allow(unsafe_code)]
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    aligned,
                    end - aligned,
                )
            };
        }
    }
}
