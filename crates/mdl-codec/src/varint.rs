//! LEB128 varints, as the lossy payloads store counts and lengths (`docs/FORMAT.md`).

/// Appends `v`, seven bits a byte, low first; the high bit marks a byte that is not the last.
pub(crate) fn put(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The varint at `*at`, moving `*at` past it; `None` when it is truncated or longer than a
/// `u64` takes.
pub(crate) fn read(buf: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*at)?;
        *at += 1;
        v |= ((b & 0x7f) as u64) << shift;
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}
