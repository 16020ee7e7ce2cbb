//! How a remote body is quoted in an error message: short, printable, with its size.

/// Longest part of a remote body an error message repeats: enough to recognise an error page,
/// too little to turn discovery into a way of reading internal pages.
const EXCERPT_CHARS: usize = 64;

/// A short, printable excerpt of a remote `body` and its size.
pub fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut shown: String = text
        .chars()
        .take(EXCERPT_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().nth(EXCERPT_CHARS).is_some() {
        shown.push_str(&format!("… ({} bytes in all)", body.len()));
    }
    shown
}
