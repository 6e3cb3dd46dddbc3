//! Resident memory of this process, from Linux's `/proc` (the memory examples' RSS figures):
//! resident pages from `/proc/self/statm` times the page size (from `/proc/self/auxv`), and
//! the resident high-water mark `VmHWM`, which writing `5` to `/proc/self/clear_refs`
//! resets. Each returns `None` where `/proc` does not say (another OS).

use std::fs;

/// `AT_PAGESZ` in the auxiliary vector.
const AT_PAGESZ: u64 = 6;

/// The page size, from the auxiliary vector (`None` if it is not there).
pub fn page_size() -> Option<u64> {
    let auxv = fs::read("/proc/self/auxv").ok()?;
    let mut words = auxv.chunks_exact(8).map(|w| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(w);
        u64::from_ne_bytes(bytes)
    });
    while let (Some(kind), Some(value)) = (words.next(), words.next()) {
        if kind == AT_PAGESZ {
            return Some(value);
        }
    }
    None
}

/// Resident bytes now: resident pages (`/proc/self/statm`, second field) × page size.
pub fn resident_bytes() -> Option<u64> {
    let statm = fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * page_size()?)
}

/// The most resident bytes since the process started or [`reset_peak`] (`VmHWM`).
pub fn peak_resident_bytes() -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Resets the high-water mark to the resident bytes now; `false` if the kernel refused.
pub fn reset_peak() -> bool {
    fs::write("/proc/self/clear_refs", "5").is_ok()
}
