//! The central directory of a zip archive, enough to find each entry's stored bytes: the end
//! record (and its zip64 form), the directory's headers, each entry's local header.

use super::TorchError;

/// One entry of an archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ZipEntry {
    pub(crate) name: String,
    /// Compression method (0 = stored).
    pub(crate) method: u16,
    /// Where the entry's bytes start in the file.
    pub(crate) data_offset: u64,
    /// Their length as stored.
    pub(crate) len: u64,
    /// Their length once decompressed.
    pub(crate) uncompressed_len: u64,
}

const EOCD: u32 = 0x0605_4b50;
const ZIP64_EOCD: u32 = 0x0606_4b50;
const ZIP64_LOCATOR: u32 = 0x0706_4b50;
const CENTRAL: u32 = 0x0201_4b50;
const LOCAL: u32 = 0x0403_4b50;

/// Most entries an archive may have (a checkpoint has one per storage, plus a few).
const MAX_ENTRIES: u64 = 1 << 20;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Whether `file` starts like a zip archive (a local header, or an empty archive's end record).
pub(crate) fn looks_like_zip(file: &[u8]) -> bool {
    matches!(u32_at(file, 0), Some(LOCAL) | Some(EOCD))
}

/// The archive's entries in directory order, each checked to lie inside the file.
pub(crate) fn entries(file: &[u8]) -> Result<Vec<ZipEntry>, TorchError> {
    let bad = |why: &str| TorchError::Zip(why.to_string());
    let short = || bad("truncated");
    // The end record is the last 22 bytes plus a comment of at most 65535 bytes.
    let lowest = file.len().saturating_sub(22 + 0xffff);
    let eocd = (lowest..=file.len().saturating_sub(22))
        .rev()
        .find(|&at| {
            u32_at(file, at) == Some(EOCD)
                && u16_at(file, at + 20).map(|c| at + 22 + c as usize) == Some(file.len())
        })
        .ok_or_else(|| bad("no end of central directory record"))?;
    let mut count = u64::from(u16_at(file, eocd + 10).ok_or_else(short)?);
    let mut dir_len = u64::from(u32_at(file, eocd + 12).ok_or_else(short)?);
    let mut dir_at = u64::from(u32_at(file, eocd + 16).ok_or_else(short)?);
    if eocd >= 20 && u32_at(file, eocd - 20) == Some(ZIP64_LOCATOR) {
        let at =
            usize::try_from(u64_at(file, eocd - 12).ok_or_else(short)?).map_err(|_| short())?;
        if u32_at(file, at) != Some(ZIP64_EOCD) {
            return Err(bad("zip64 locator points at no zip64 end record"));
        }
        count = u64_at(file, at + 32).ok_or_else(short)?;
        dir_len = u64_at(file, at + 40).ok_or_else(short)?;
        dir_at = u64_at(file, at + 48).ok_or_else(short)?;
    }
    if count > MAX_ENTRIES {
        return Err(bad("too many entries"));
    }
    let dir_end = dir_at.checked_add(dir_len).ok_or_else(short)?;
    if dir_end > file.len() as u64 {
        return Err(bad("central directory past the end of the file"));
    }
    let mut out = Vec::with_capacity(count as usize);
    let mut at = dir_at as usize;
    for _ in 0..count {
        if u32_at(file, at) != Some(CENTRAL) {
            return Err(bad("bad central directory header"));
        }
        let method = u16_at(file, at + 10).ok_or_else(short)?;
        let mut len = u64::from(u32_at(file, at + 20).ok_or_else(short)?);
        let mut uncompressed_len = u64::from(u32_at(file, at + 24).ok_or_else(short)?);
        let name_len = u16_at(file, at + 28).ok_or_else(short)? as usize;
        let extra_len = u16_at(file, at + 30).ok_or_else(short)? as usize;
        let comment_len = u16_at(file, at + 32).ok_or_else(short)? as usize;
        let mut local = u64::from(u32_at(file, at + 42).ok_or_else(short)?);
        let name = file.get(at + 46..at + 46 + name_len).ok_or_else(short)?;
        let name = std::str::from_utf8(name)
            .map_err(|_| bad("entry name is not UTF-8"))?
            .to_string();
        let extra = file
            .get(at + 46 + name_len..at + 46 + name_len + extra_len)
            .ok_or_else(short)?;
        // Zip64: the fields that overflowed 32 bits are in extra field 1, in this order.
        let mut fields = zip64_fields(extra).into_iter();
        if uncompressed_len == 0xffff_ffff {
            uncompressed_len = fields.next().ok_or_else(|| bad("zip64 size missing"))?;
        }
        if len == 0xffff_ffff {
            len = fields.next().ok_or_else(|| bad("zip64 size missing"))?;
        }
        if local == 0xffff_ffff {
            local = fields.next().ok_or_else(|| bad("zip64 offset missing"))?;
        }
        at += 46 + name_len + extra_len + comment_len;
        // The entry's bytes follow its local header, whose name and extra field may differ
        // in length from the directory's.
        let l = usize::try_from(local).map_err(|_| short())?;
        if u32_at(file, l) != Some(LOCAL) {
            return Err(bad("entry points at no local header"));
        }
        let l_name = u16_at(file, l + 26).ok_or_else(short)? as u64;
        let l_extra = u16_at(file, l + 28).ok_or_else(short)? as u64;
        let data_offset = local + 30 + l_name + l_extra;
        if data_offset.checked_add(len).is_none_or(|end| end > dir_at) {
            return Err(bad("entry's bytes run into the central directory"));
        }
        out.push(ZipEntry {
            name,
            method,
            data_offset,
            len,
            uncompressed_len,
        });
    }
    if at as u64 > dir_end {
        return Err(bad("central directory longer than recorded"));
    }
    Ok(out)
}

/// The 64-bit values of an extra field's zip64 record (id 1), in order.
fn zip64_fields(extra: &[u8]) -> Vec<u64> {
    let mut at = 0;
    while let (Some(id), Some(len)) = (u16_at(extra, at), u16_at(extra, at + 2)) {
        let body = extra.get(at + 4..at + 4 + len as usize).unwrap_or(&[]);
        if id == 1 {
            return body
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect();
        }
        at += 4 + len as usize;
    }
    Vec::new()
}
