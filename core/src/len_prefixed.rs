//! Length-prefixed byte strings: a LEB128 byte length, then the bytes. The
//! mirror packs a moment's texts this way, and the request index its request
//! ids (no allocation, no allocator rounding per string).

/// Bytes of `value` as LEB128 (7 bits a byte, low bits first).
pub(crate) fn leb128_len(value: u64) -> usize {
    // At least one byte (for 0), then one per 7 bits.
    (u64::BITS - (value | 1).leading_zeros()).div_ceil(7) as usize
}

/// Appends `value` as LEB128.
pub(crate) fn push_leb128(out: &mut Vec<u8>, mut value: u64) {
    loop {
        // Cast: the low 7 bits.
        let byte = (value & 0x7F) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// The LEB128 value written by [`push_leb128`] at `at` in `buf`, and the
/// offset after it. `at` must be where [`push_leb128`] started one.
pub(crate) fn read_leb128(buf: &[u8], mut at: usize) -> (u64, usize) {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let byte = buf[at];
        at += 1;
        value |= u64::from(byte & 0x7F) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return (value, at);
        }
    }
}

/// Bytes that [`push`] writes for a string of `len` bytes.
pub(crate) fn encoded_len(len: usize) -> usize {
    // Cast: usize is at most 64 bits.
    leb128_len(len as u64) + len
}

/// Appends `bytes` to `out`, length first.
pub(crate) fn push(out: &mut Vec<u8>, bytes: &[u8]) {
    push_leb128(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// The string written by [`push`] at `at` in `buf`, and the offset after it.
/// `at` must be where [`push`] started one (the callers keep their offsets).
pub(crate) fn read(buf: &[u8], at: usize) -> (&[u8], usize) {
    let (len, at) = read_leb128(buf, at);
    // Cast: written from a usize.
    let len = len as usize;
    (&buf[at..at + len], at + len)
}

/// [`read_leb128`] for bytes from outside (a checkpoint file): `None`
/// when the value runs past the end of `buf` or past 64 bits.
pub(crate) fn checked_read_leb128(buf: &[u8], mut at: usize) -> Option<(u64, usize)> {
    let mut value = 0u64;
    let mut shift = 0u32;
    loop {
        let byte = *buf.get(at)?;
        at += 1;
        if shift == 63 && byte > 1 || shift > 63 {
            return None;
        }
        value |= u64::from(byte & 0x7F) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return Some((value, at));
        }
    }
}

/// [`read`] for bytes from outside (a checkpoint file): `None` when the
/// length or the bytes run past the end of `buf`.
pub(crate) fn checked_read(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let (len, at) = checked_read_leb128(buf, at)?;
    let end = at.checked_add(usize::try_from(len).ok()?)?;
    Some((buf.get(at..end)?, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_exact_sizes() {
        let mut buf = Vec::new();
        let texts: Vec<Vec<u8>> = [0usize, 1, 127, 128, 16_383, 16_384, 70_000]
            .iter()
            .map(|&n| vec![b'x'; n])
            .collect();
        let mut ends = Vec::new();
        for t in &texts {
            push(&mut buf, t);
            ends.push(buf.len());
        }
        let mut at = 0;
        for (t, end) in texts.iter().zip(ends) {
            assert_eq!(encoded_len(t.len()), end - at);
            let (got, next) = read(&buf, at);
            assert_eq!((got, next), (t.as_slice(), end));
            at = next;
        }
        let mut buf = Vec::new();
        for value in [0u64, 1, 127, 128, 10_000_000, u64::MAX] {
            let at = buf.len();
            push_leb128(&mut buf, value);
            assert_eq!(buf.len() - at, leb128_len(value));
            assert_eq!(read_leb128(&buf, at), (value, buf.len()));
            assert_eq!(checked_read_leb128(&buf, at), Some((value, buf.len())));
            assert_eq!(checked_read_leb128(&buf[..buf.len() - 1], at), None);
        }
        assert_eq!(checked_read_leb128(&[0xFF; 11], 0), None);
        assert_eq!(checked_read(&[5, b'a'], 0), None);
        assert_eq!(checked_read(&[1, b'a'], 0), Some((&b"a"[..], 2)));
    }
}
