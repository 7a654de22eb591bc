//! Line-ending styles: a project checked out with CRLF line endings (git's
//! `core.autocrlf=true`) is compared with the templates as if it had LF, and
//! each file gpkit changes keeps the style it had.

/// Whether `bytes` uses CRLF line endings: it has a line break, and every
/// `\n` follows a `\r`. Files that mix both styles count as LF.
pub fn is_crlf(bytes: &[u8]) -> bool {
    let mut breaks = 0;
    for (i, byte) in bytes.iter().enumerate() {
        if *byte == b'\n' {
            if i == 0 || bytes[i - 1] != b'\r' {
                return false;
            }
            breaks += 1;
        }
    }
    breaks > 0
}

/// `bytes` with CRLF line endings turned into LF, when it uses CRLF
/// throughout; otherwise unchanged.
pub(crate) fn to_lf(bytes: Vec<u8>) -> Vec<u8> {
    if !is_crlf(&bytes) {
        return bytes;
    }
    let mut out = Vec::with_capacity(bytes.len());
    for (i, byte) in bytes.iter().enumerate() {
        if *byte == b'\r' && bytes.get(i + 1) == Some(&b'\n') {
            continue;
        }
        out.push(*byte);
    }
    out
}

/// `bytes` (LF) with every `\n` written as `\r\n`.
pub fn to_crlf(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + bytes.len() / 32);
    for (i, byte) in bytes.iter().enumerate() {
        if *byte == b'\n' && (i == 0 || bytes[i - 1] != b'\r') {
            out.push(b'\r');
        }
        out.push(*byte);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn styles_are_recognised_and_converted_both_ways() {
        assert!(is_crlf(b"a\r\nb\r\n"));
        assert!(!is_crlf(b"a\nb\n"));
        assert!(!is_crlf(b"a\r\nb\n"), "mixed counts as LF");
        assert!(!is_crlf(b"no break"));
        assert_eq!(to_lf(b"a\r\nb\r\n".to_vec()), b"a\nb\n");
        assert_eq!(to_lf(b"a\r\nb\n".to_vec()), b"a\r\nb\n", "mixed is kept");
        assert_eq!(to_crlf(b"a\nb\n"), b"a\r\nb\r\n");
        assert_eq!(to_lf(to_crlf(b"x\n\ny\n")), b"x\n\ny\n");
    }
}
