//! How a value (a user name, a password, a database name) is written into
//! a part of a URL: percent-encoded, every byte but RFC 3986's unreserved
//! characters, so that `@`, `:` and `/` in a password cannot change what
//! the URL means.

/// `text` percent-encoded for a URL's userinfo or path segment.
pub(crate) fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unreserved_characters_stay_as_they_are() {
        assert_eq!(encode("p@ss:w/rd"), "p%40ss%3Aw%2Frd");
        assert_eq!(encode("s3:cret"), "s3%3Acret");
        assert_eq!(encode("A-z_0.9~"), "A-z_0.9~");
        assert_eq!(encode("é "), "%C3%A9%20");
    }
}
