//! Writes the semantics guide for rustdoc with its accuracy chart inside it, as a data URI:
//! the guide's relative link to `docs/accuracy.svg` works on a repository page, but rustdoc
//! (docs.rs) copies no image, so the guide it renders would show a broken one.

use std::path::Path;
use std::{env, fs};

const GUIDE: &str = "docs/semantics.md";
const CHART: &str = "docs/accuracy.svg";
/// The guide's link to the chart, as the guide writes it.
const LINK: &str = "](accuracy.svg)";

fn main() {
    println!("cargo:rerun-if-changed={GUIDE}");
    println!("cargo:rerun-if-changed={CHART}");
    let (Ok(guide), Ok(chart), Some(out)) =
        (fs::read_to_string(GUIDE), fs::read(CHART), env::var_os("OUT_DIR"))
    else {
        // Cargo always sets OUT_DIR, and the package ships both files: nothing to embed
        // means a broken checkout, which `include_str!` of the output then reports.
        return;
    };
    let embedded = guide.replace(LINK, &format!("](data:image/svg+xml;base64,{})", base64(&chart)));
    // A failed write leaves no file, which `include_str!` then reports.
    let _ = fs::write(Path::new(&out).join("semantics.md"), embedded);
}

/// Standard base64 with padding (RFC 4648 §4).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}
