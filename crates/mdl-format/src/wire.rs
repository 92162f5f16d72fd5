//! Little-endian primitives shared by the canonical encodings.

use crate::{FormatError, ObjectId};

/// Appends little-endian values to a buffer.
#[derive(Default)]
pub(crate) struct Writer {
    pub(crate) buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub(crate) fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn f64(&mut self, v: f64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_bits().to_le_bytes());
        self
    }
    pub(crate) fn id(&mut self, id: &ObjectId) -> &mut Self {
        self.buf.extend_from_slice(id.as_bytes());
        self
    }
    /// A byte string with a u32 length prefix.
    pub(crate) fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u32(u32::try_from(b.len()).expect("field longer than 4 GiB"));
        self.buf.extend_from_slice(b);
        self
    }
    pub(crate) fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }
}

/// Reads little-endian values, never panicking and never allocating more than the input holds.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, what }
    }
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        if self.buf.len() < n {
            return Err(FormatError::Truncated {
                what: self.what,
                needed: n - self.buf.len(),
            });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub(crate) fn i64(&mut self) -> Result<i64, FormatError> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub(crate) fn f64(&mut self) -> Result<f64, FormatError> {
        Ok(f64::from_bits(self.u64()?))
    }
    pub(crate) fn id(&mut self) -> Result<ObjectId, FormatError> {
        Ok(ObjectId::from_bytes(self.take(32)?.try_into().unwrap()))
    }
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], FormatError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    pub(crate) fn str(&mut self) -> Result<&'a str, FormatError> {
        let what = self.what;
        std::str::from_utf8(self.bytes()?)
            .map_err(|_| FormatError::invalid(what, "string is not UTF-8"))
    }
    /// A count of items that each occupy at least `min_item` bytes; rejects counts the remaining
    /// input could not possibly hold, so a corrupt count cannot trigger a huge allocation.
    pub(crate) fn count(&mut self, min_item: usize) -> Result<usize, FormatError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_item.max(1)) > self.buf.len() {
            return Err(FormatError::invalid(
                self.what,
                format!("count {n} exceeds the input"),
            ));
        }
        Ok(n)
    }
    /// What is left to read.
    pub(crate) fn remaining(&self) -> &'a [u8] {
        self.buf
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    pub(crate) fn finish(self) -> Result<(), FormatError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(FormatError::invalid(
                self.what,
                format!("{} trailing bytes", self.buf.len()),
            ))
        }
    }
}
