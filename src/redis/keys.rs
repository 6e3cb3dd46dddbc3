//! The names of a client key's data in Redis.
//!
//! A client key `k` lives in `<prefix>{<h>}` (its windows) and `<prefix>{<h>}:book` (its
//! bookkeeping), where `h` is the first 128 bits of the SHA-256 of `k`'s `Display` text, in
//! 32 lowercase hex digits. The client's bytes never reach the key name:
//!
//! * the hash tag is `h`, so both keys share a Cluster slot whatever `k` holds (a key that
//!   contains `}` cannot split the pair, or move it to another key's slot);
//! * the slot follows from a digest, so keys spread over slots like any others (a client
//!   cannot pile its keys on one node by giving them a common `{...}` part);
//! * two client keys share Redis data only if their digests collide (128 bits: beyond
//!   reach), and every name has the same length, however long the client key.
//!
//! SHA-256 is fixed: every process and every version names a key the same way.

use std::fmt::{self, Write as _};

use sha2::{Digest as _, Sha256};

/// Hex digits of the digest in a key's hash tag (128 bits).
const TAG_HEX: usize = 32;

/// A SHA-256 fed through `fmt::Write`, so that a key's `Display` text is hashed without
/// being collected into a string first.
struct Hashing(Sha256);

impl fmt::Write for Hashing {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.update(s.as_bytes());
        Ok(())
    }
}

/// `key`'s windows key under `prefix`: `<prefix>{<128-bit digest of key, hex>}`.
pub(super) fn windows_key(prefix: &str, key: &impl fmt::Display) -> String {
    let mut hashing = Hashing(Sha256::new());
    // `Hashing` never fails; a `Display` that does leaves what it wrote hashed.
    let _ = write!(hashing, "{key}");
    let digest = hashing.0.finalize();
    let mut name = String::with_capacity(prefix.len().saturating_add(TAG_HEX + 2));
    name.push_str(prefix);
    name.push('{');
    for byte in digest.iter().take(TAG_HEX / 2) {
        let _ = write!(name, "{byte:02x}");
    }
    name.push('}');
    name
}

/// The key of `windows_key`'s bookkeeping (the same hash tag, so the same Cluster slot).
pub(super) fn book_key(windows_key: &str) -> String {
    format!("{windows_key}:book")
}

/// Whether `prefix` can go in front of the hash tag: it must hold no `{` or `}`, which
/// would make Redis Cluster hash part of the prefix instead of the key's digest.
pub(super) fn prefix_is_valid(prefix: &str) -> bool {
    !prefix.contains(['{', '}'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_documented_digest_and_never_carry_client_bytes() {
        // `printf 203.0.113.7 | sha256sum` begins fec52565aa0cf18f57d7cf5b3ac72850: fixed,
        // the same in every process and version.
        let name = windows_key("slidegate:", &"203.0.113.7");
        assert_eq!(name, "slidegate:{fec52565aa0cf18f57d7cf5b3ac72850}");
        assert_eq!(book_key(&name), "slidegate:{fec52565aa0cf18f57d7cf5b3ac72850}:book");
        for hostile in ["}mallory", "a}b", "{a}", "}{", "", "x:book"] {
            let name = windows_key("p:", &hostile);
            assert_eq!(name.len(), 2 + 2 + TAG_HEX, "{hostile:?}");
            assert_eq!(name.matches('{').count() + name.matches('}').count(), 2, "{hostile:?}");
        }
        assert_ne!(windows_key("p:", &"a}b"), windows_key("p:", &"a}zzz"));
        // Display text, not type: 7u64 and "7" are the same client key.
        assert_eq!(windows_key("p:", &7u64), windows_key("p:", &"7"));
    }

    #[test]
    fn prefixes_with_braces_are_refused() {
        assert!(prefix_is_valid("slidegate:"));
        assert!(!prefix_is_valid("tenant{a}:"));
        assert!(!prefix_is_valid("}"));
    }
}
