//! The path a route is matched against: the request's path as an upstream that normalises
//! would see it, so that no other spelling of a limited path escapes its limit.
//!
//! Steps, on the raw path (`Uri::path`, no query):
//! 1. every `%XX` is decoded (an upstream that decodes sees the decoded byte), except that
//!    an encoded `/`, `\`, `%`, NUL or other control byte makes the path **unsafe**: an
//!    upstream may or may not treat `%2F` as a separator, or decode `%25` twice, so no
//!    single normal form exists; a malformed escape (`%zz`, `%4`) is unsafe too, and so is a
//!    raw `\` (some servers take it for `/`);
//! 2. the path is split on `/`; empty segments (repeated slashes) are dropped;
//! 3. in each segment, a `;` and what follows it is dropped (path parameters, which servlet
//!    containers strip before routing: `/login;x=1` is `/login`);
//! 4. a dot segment (`.` or `..` once decoded and stripped of its parameters: `%2e%2e`,
//!    `..;x=1`) makes the path **unsafe**: an upstream that resolves it (nginx, servlet
//!    containers) and one that does not (axum routes `/users/..` to `/users/{id}`) send the
//!    request to different handlers, so no normal form is right for both; clients resolve
//!    dot segments before sending, so only a crafted request has one;
//! 5. with `ignore_case`, ASCII letters are lowercased.
//!
//! The result keeps a trailing `/` if the path had one. Bytes outside ASCII stay as they
//! were decoded: a route prefix is ASCII, so they can only fail to match it. Since no step
//! moves a segment (none is removed but empty ones), a path is under every route prefix its
//! raw form is under.

use std::borrow::Cow;

/// Why a path has no single normal form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unsafe {
    /// `%` not followed by two hex digits.
    BadEscape,
    /// An escape that decodes to `/`, `\`, `%` or a control byte.
    EncodedDelimiter,
    /// A raw `\`.
    Backslash,
    /// A `.` or `..` segment, encoded or not, with or without parameters.
    DotSegment,
}

impl Unsafe {
    /// What the 400's body says.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Unsafe::BadEscape => "the path has a malformed percent-escape",
            Unsafe::EncodedDelimiter => {
                "the path encodes a '/', '\\', '%' or control character, which servers decode differently"
            }
            Unsafe::Backslash => "the path holds a '\\', which some servers take for '/'",
            Unsafe::DotSegment => {
                "the path has a '.' or '..' segment, which some servers resolve and others route as a name"
            }
        }
    }
}

/// `path` normalised as the module docs say; borrowed when it is normal already.
pub(crate) fn normalize(path: &str, ignore_case: bool) -> Result<Cow<'_, str>, Unsafe> {
    if is_normal(path, ignore_case) {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode(path)?;
    let mut segments: Vec<&[u8]> = Vec::new();
    for segment in decoded.split(|&b| b == b'/') {
        let segment = segment.split(|&b| b == b';').next().unwrap_or_default();
        match segment {
            b"" => {}
            b"." | b".." => return Err(Unsafe::DotSegment),
            _ => segments.push(segment),
        }
    }
    let mut out = Vec::with_capacity(decoded.len().saturating_add(1));
    for segment in &segments {
        out.push(b'/');
        out.extend_from_slice(segment);
    }
    if out.is_empty() || decoded.ends_with(b"/") {
        out.push(b'/');
    }
    if ignore_case {
        out.make_ascii_lowercase();
    }
    Ok(Cow::Owned(String::from_utf8_lossy(&out).into_owned()))
}

/// The common case, checked without allocating: nothing to decode, no empty, dot or
/// parameter segment, no backslash, and (with `ignore_case`) no capital.
fn is_normal(path: &str, ignore_case: bool) -> bool {
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'/') {
        return false;
    }
    let special = |b: &u8| matches!(b, b'%' | b';' | b'\\') || (ignore_case && b.is_ascii_uppercase());
    if bytes.iter().any(special) {
        return false;
    }
    // Segments after the leading `/`: none empty (but a trailing `/`), none `.` or `..`.
    let Some(rest) = path.get(1..) else { return false };
    let mut segments = rest.split('/').peekable();
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        if (segment.is_empty() && !last) || segment == "." || segment == ".." {
            return false;
        }
    }
    true
}

/// Every `%XX` decoded; unsafe escapes and raw backslashes refused.
fn decode(path: &str) -> Result<Vec<u8>, Unsafe> {
    let mut out = Vec::with_capacity(path.len());
    let mut bytes = path.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'\\' => return Err(Unsafe::Backslash),
            b'%' => {
                let (Some(hi), Some(lo)) = (bytes.next(), bytes.next()) else {
                    return Err(Unsafe::BadEscape);
                };
                let (Some(hi), Some(lo)) = (hex(hi), hex(lo)) else { return Err(Unsafe::BadEscape) };
                let byte = (hi << 4) | lo;
                if matches!(byte, b'/' | b'\\' | b'%') || byte.is_ascii_control() {
                    return Err(Unsafe::EncodedDelimiter);
                }
                out.push(byte);
            }
            _ => out.push(b),
        }
    }
    Ok(out)
}

fn hex(digit: u8) -> Option<u8> {
    char::from(digit).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

/// Whether normalised `path` is `prefix` or below it (`prefix` normalised too): `/login`
/// matches `/login` and `/login/x`, not `/loginx`; a prefix ending in `/` matches what
/// starts with it.
pub(crate) fn under(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/') || prefix.ends_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(path: &str) -> Result<String, Unsafe> {
        normalize(path, false).map(Cow::into_owned)
    }

    #[test]
    fn every_spelling_of_a_path_normalises_to_it() {
        for spelling in [
            "/login",
            "//login",
            "/%6Cogin",
            "/%6cogin",
            "///login",
            "/login;jsessionid=1",
            "/;x/login",
            "/login/",
        ] {
            let normal = norm(spelling).unwrap();
            assert!(under(&normal, "/login"), "{spelling} -> {normal}");
        }
        assert_eq!(normalize("/LOGIN", true).unwrap(), "/login");
        assert_eq!(norm("/LOGIN").unwrap(), "/LOGIN");
    }

    #[test]
    fn normal_paths_are_borrowed() {
        for path in ["/", "/login", "/a/b/", "/a.b/c..d/.e"] {
            assert!(matches!(normalize(path, false), Ok(Cow::Borrowed(p)) if p == path), "{path}");
        }
        assert!(matches!(normalize("/a//b", false), Ok(Cow::Owned(_))));
    }

    #[test]
    fn paths_without_one_normal_form_are_refused() {
        assert_eq!(norm("/%2Flogin"), Err(Unsafe::EncodedDelimiter));
        assert_eq!(norm("/%2flogin"), Err(Unsafe::EncodedDelimiter));
        assert_eq!(norm("/%5Clogin"), Err(Unsafe::EncodedDelimiter));
        assert_eq!(norm("/%256Cogin"), Err(Unsafe::EncodedDelimiter));
        assert_eq!(norm("/%00login"), Err(Unsafe::EncodedDelimiter));
        assert_eq!(norm("/%zzlogin"), Err(Unsafe::BadEscape));
        assert_eq!(norm("/login%4"), Err(Unsafe::BadEscape));
        assert_eq!(norm("/\\login"), Err(Unsafe::Backslash));
        for dots in [
            "/.",
            "/..",
            "/./login",
            "/api/../login",
            "/x/..;/login",
            "/%2E/login",
            "/%2e%2e/login",
            "/.%2E/login",
            "/login/.",
            "/login/..;x=1",
            "/users/..",
        ] {
            assert_eq!(norm(dots), Err(Unsafe::DotSegment), "{dots}");
        }
    }

    #[test]
    fn other_paths_keep_their_shape() {
        assert_eq!(norm("/a//b/").unwrap(), "/a/b/");
        assert_eq!(norm("").unwrap(), "/");
        assert_eq!(norm("/a/.../b").unwrap(), "/a/.../b");
        assert_eq!(norm("/.well-known/x;y").unwrap(), "/.well-known/x");
        assert!(!under(&norm("/loginx").unwrap(), "/login"));
        assert!(under(&norm("/static/x").unwrap(), "/static/"));
    }

    proptest::proptest! {
        /// Any path built from the characters that matter normalises without panicking, and
        /// a normal form is its own normal form (so a route matches it as the upstream sees it).
        #[test]
        fn normalising_is_idempotent(path in "[/.;%2FfCc6aLl5eE0Aé\\\\]{0,24}", ignore_case: bool) {
            if let Ok(normal) = normalize(&path, ignore_case) {
                let again = normalize(&normal, ignore_case);
                proptest::prop_assert_eq!(again.as_deref(), Ok(normal.as_ref()));
                proptest::prop_assert!(normal.starts_with('/'));
                proptest::prop_assert!(!normal.contains("//") && !normal.contains(';'));
                proptest::prop_assert!(!normal.split('/').any(|s| s == "." || s == ".."));
            }
        }
    }
}
