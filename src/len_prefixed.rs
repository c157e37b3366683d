//! Length-prefixed byte strings: a LEB128 byte length, then the bytes. The
//! mirror packs a moment's texts this way, and the request index its request
//! ids (issue 7: no allocation, no allocator rounding per string).

/// Bytes that [`push`] writes for a string of `len` bytes.
pub(crate) fn encoded_len(len: usize) -> usize {
    // At least one prefix byte (for 0), then one per 7 bits of the length.
    (usize::BITS - (len | 1).leading_zeros()).div_ceil(7) as usize + len
}

/// Appends `bytes` to `out`, length first.
pub(crate) fn push(out: &mut Vec<u8>, bytes: &[u8]) {
    let mut len = bytes.len();
    loop {
        // Cast: the low 7 bits.
        let byte = (len & 0x7F) as u8;
        len >>= 7;
        if len == 0 {
            out.push(byte);
            break;
        }
        out.push(byte | 0x80);
    }
    out.extend_from_slice(bytes);
}

/// The string written by [`push`] at `at` in `buf`, and the offset after it.
/// `at` must be where [`push`] started one (the callers keep their offsets).
pub(crate) fn read(buf: &[u8], mut at: usize) -> (&[u8], usize) {
    let mut len = 0usize;
    let mut shift = 0;
    loop {
        let byte = buf[at];
        at += 1;
        len |= usize::from(byte & 0x7F) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            break;
        }
    }
    (&buf[at..at + len], at + len)
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
    }
}
