//! The sliding window of `src/redis/limiter.lua`, on the same bytes, in native code: a key's
//! windows string (little-endian doubles) read and rewritten as the script does, so that a
//! server may answer through the module or the script, in any mix, with the same decisions.
//!
//! Layout: `t` (the latest time seen, ms); per limit `k, cur, sum` (the current slot, its
//! units, the units of the closed slots `k-n+1 .. k-1`); per limit a ring of `n+1` entries,
//! slot `s`'s units at position `s mod (n+1)`, for the closed slots `k-n .. k-1`.

use crate::args::{MOST_KEY_BYTES, MOST_LIMITS, MOST_MAX, MOST_SLOTS};

/// One limit, as the script's arguments give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Units per window.
    pub max: i64,
    /// Slot length, ms.
    pub p: i64,
    /// Slots per window.
    pub n: i64,
    /// Strict (the oldest slot counts whole) rather than interpolated.
    pub strict: bool,
}

/// What an entry asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Decide, and count the cost if admitted.
    Check,
    /// Decide without counting.
    Peek,
}

/// The byte layout of a key's windows for `limits`.
#[derive(Debug, Clone)]
pub struct Layout {
    limits: Vec<Limit>,
    /// Where each limit's ring starts.
    rings: Vec<usize>,
    /// The string's length.
    pub length: usize,
}

impl Layout {
    /// The layout of `limits`; `None` if a limit is malformed, or the layout is over a cap
    /// (more than [`MOST_LIMITS`] limits, more than [`MOST_SLOTS`] slots in one, more than
    /// [`MOST_KEY_BYTES`] in all): any client may send the command, and no call may make the
    /// server allocate without bound.
    ///
    /// ```
    /// use slidegate_redis::window::{Layout, Limit};
    /// let minute = Limit { max: 5, p: 1000, n: 60, strict: false };
    /// assert_eq!(Layout::new(vec![minute]).map(|l| l.length), Some(8 + 24 + 61 * 8));
    /// assert!(Layout::new(vec![Limit { n: 1 << 20, ..minute }]).is_none());
    /// ```
    pub fn new(limits: Vec<Limit>) -> Option<Layout> {
        if limits.is_empty() || limits.len() > MOST_LIMITS {
            return None;
        }
        let mut length = limits.len().checked_mul(24)?.checked_add(8)?;
        let mut rings = Vec::with_capacity(limits.len());
        for l in &limits {
            if !(0..=MOST_MAX).contains(&l.max) || l.p <= 0 || l.n <= 0 || l.n > MOST_SLOTS {
                return None;
            }
            rings.push(length);
            let entries = usize::try_from(l.n.checked_add(1)?).ok()?;
            length = length.checked_add(entries.checked_mul(8)?)?;
        }
        (length <= MOST_KEY_BYTES).then_some(Layout { limits, rings, length })
    }
}

fn read(bytes: &[u8], at: usize) -> i64 {
    let mut word = [0u8; 8];
    if let Some(slice) = bytes.get(at..at.saturating_add(8)) {
        word.copy_from_slice(slice);
    }
    // Exact integers below 2^53, as the script stores them.
    f64::from_le_bytes(word) as i64
}

fn write(bytes: &mut [u8], at: usize, value: i64) {
    if let Some(slice) = bytes.get_mut(at..at.saturating_add(8)) {
        slice.copy_from_slice(&(value as f64).to_le_bytes());
    }
}

fn floor_div(a: i64, b: i64) -> i64 {
    a.div_euclid(b)
}

fn ceil_div(a: i64, b: i64) -> i64 {
    let q = floor_div(a, b);
    if q.saturating_mul(b) < a {
        q.saturating_add(1)
    } else {
        q
    }
}

/// One limit's window at `now`, as if moved to the current slot `big_k` (nothing written).
#[derive(Debug, Clone, Copy)]
struct Window {
    big_k: i64,
    e: i64,
    k: i64,
    cur: i64,
    now_cur: i64,
    new_sum: i64,
    whole: i64,
    oldest: i64,
}

struct Key<'a> {
    state: Option<&'a [u8]>,
    layout: &'a Layout,
}

impl Key<'_> {
    /// The units of closed slot `s` of limit `i` whose stored slot is `k` with `cur` units.
    fn stored(&self, i: usize, k: i64, cur: i64, s: i64) -> i64 {
        let Some(l) = self.layout.limits.get(i) else { return 0 };
        if s == k {
            return cur;
        }
        let Some(state) = self.state else { return 0 };
        if s > k || s < k.saturating_sub(l.n) {
            return 0;
        }
        let position = usize::try_from(s.rem_euclid(l.n.saturating_add(1))).unwrap_or(0);
        let ring = self.layout.rings.get(i).copied().unwrap_or(0);
        read(state, ring.saturating_add(position.saturating_mul(8)))
    }

    fn view(&self, i: usize, l: &Limit, now: i64) -> Window {
        let big_k = floor_div(now, l.p);
        let (k, cur, sum) = match self.state {
            Some(state) => {
                let head = 8usize.saturating_add(i.saturating_mul(24));
                (read(state, head), read(state, head.saturating_add(8)), read(state, head.saturating_add(16)))
            }
            None => (big_k, 0, 0),
        };
        let mut w = Window {
            big_k,
            e: now.saturating_sub(big_k.saturating_mul(l.p)),
            k,
            cur,
            now_cur: cur,
            new_sum: sum,
            whole: sum.saturating_add(cur),
            oldest: 0,
        };
        if big_k != k {
            let mut carried = 0;
            if big_k.saturating_sub(k) < l.n {
                carried = sum.saturating_add(cur);
                let mut s = k.saturating_sub(l.n).saturating_add(1);
                while s <= big_k.saturating_sub(l.n) {
                    carried = carried.saturating_sub(self.stored(i, k, cur, s));
                    s = s.saturating_add(1);
                }
            }
            w.now_cur = 0;
            w.new_sum = carried;
            w.whole = carried;
        }
        w.oldest = self.stored(i, k, cur, big_k.saturating_sub(l.n));
        w
    }
}

fn weight(l: &Limit, w: &Window) -> i64 {
    if l.strict {
        l.p
    } else {
        l.p.saturating_sub(w.e)
    }
}

fn admits(l: &Limit, w: &Window, units: i64) -> bool {
    let used = w.whole.saturating_add(units);
    if used > l.max {
        return false;
    }
    i128::from(w.oldest) * i128::from(weight(l, w))
        <= i128::from(l.max.saturating_sub(used)) * i128::from(l.p)
}

fn room(l: &Limit, w: &Window, units: i64) -> i64 {
    let free = l.max.saturating_sub(w.whole).saturating_sub(units);
    if free <= 0 {
        return 0;
    }
    if w.oldest == 0 {
        return free;
    }
    let r = free.saturating_sub(ceil_div(w.oldest.saturating_mul(weight(l, w)), l.p));
    r.max(0)
}

impl Key<'_> {
    /// The earliest time (ms) at which `units` fit if nothing else is admitted.
    fn earliest(&self, i: usize, l: &Limit, w: &Window, units: i64) -> i64 {
        let n = usize::try_from(l.n).unwrap_or(0);
        // c[0] is slot K-n (the oldest, partly covered), c[n] slot K.
        let mut c: Vec<i64> = (0..l.n)
            .map(|idx| self.stored(i, w.k, w.cur, w.big_k.saturating_sub(l.n).saturating_add(idx)))
            .collect();
        c.push(w.now_cur);
        let allowed = l.max.saturating_sub(units);
        let mut whole = w.whole;
        for d in 0..=n.saturating_add(1) {
            if d > 0 && d <= n {
                whole = whole.saturating_sub(c.get(d).copied().unwrap_or(0));
            }
            let oldest = if d <= n { c.get(d).copied().unwrap_or(0) } else { 0 };
            let from = if d == 0 { w.e } else { 0 };
            let d = i64::try_from(d).unwrap_or(i64::MAX);
            let start = w.big_k.saturating_add(d).saturating_mul(l.p);
            if whole <= allowed {
                if l.strict || oldest == 0 {
                    if whole.saturating_add(oldest) <= allowed || oldest == 0 {
                        return start.saturating_add(from);
                    }
                } else {
                    let need = l
                        .p
                        .saturating_sub(floor_div(allowed.saturating_sub(whole).saturating_mul(l.p), oldest))
                        .max(from);
                    if need < l.p {
                        return start.saturating_add(need);
                    }
                }
            }
        }
        w.big_k.saturating_add(l.n).saturating_add(2).saturating_mul(l.p)
    }
}

/// What an entry did: the five replies, and the key's new windows if it wrote them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// `{kind, limit, remaining, retry_ms, now_ms}`, as the script returns them.
    pub reply: [i64; 5],
    /// The windows to store (with the expiry), if the entry counted units.
    pub written: Option<Vec<u8>>,
}

/// One entry on a key whose stored windows are `state` (`None`: none, or laid out for
/// other limits), at the server's time `server_now` (ms). A cost above a limit's `max` (any
/// `u64`) is answered `{2, limit, remaining, 0, now}` and counts nothing.
///
/// ```
/// use slidegate_redis::window::{run, Layout, Limit, Mode};
/// let layout = Layout::new(vec![Limit { max: 5, p: 1000, n: 60, strict: false }]).unwrap();
/// let first = run(&layout, None, 100_000, Mode::Check, 1);
/// assert_eq!(first.reply, [0, 0, 4, 0, 100_000]);
/// assert_eq!(run(&layout, first.written.as_deref(), 100_000, Mode::Check, u64::MAX).reply, [2, 0, 4, 0, 100_000]);
/// ```
pub fn run(layout: &Layout, state: Option<&[u8]>, server_now: i64, mode: Mode, cost: u64) -> Outcome {
    let state = state.filter(|s| s.len() == layout.length);
    let now = state.map_or(server_now, |s| server_now.max(read(s, 0)));
    let key = Key { state, layout };
    let windows: Vec<Window> = layout.limits.iter().enumerate().map(|(i, l)| key.view(i, l, now)).collect();
    let pairs = || layout.limits.iter().zip(&windows);
    let least_room = |units: i64| {
        let mut best: Option<(i64, i64)> = None;
        for (i, (l, w)) in pairs().enumerate() {
            let r = room(l, w, units);
            if best.map_or(true, |(b, _)| r < b) {
                best = Some((r, i64::try_from(i).unwrap_or(0)));
            }
        }
        best.unwrap_or((0, 0))
    };
    for (i, l) in layout.limits.iter().enumerate() {
        if u64::try_from(l.max).map_or(true, |max| cost > max) {
            return Outcome {
                reply: [2, i64::try_from(i).unwrap_or(0), least_room(0).0, 0, now],
                written: None,
            };
        }
    }
    // At most one limit's `max` (below 2^53) from here on.
    let cost = i64::try_from(cost).unwrap_or(i64::MAX);
    if pairs().all(|(l, w)| admits(l, w, cost)) {
        let written = (mode == Mode::Check && cost > 0).then(|| key.count(&windows, now, cost));
        let (r, at) = least_room(cost);
        return Outcome { reply: [0, at, r, 0, now], written };
    }
    let mut worst: Option<(i64, i64)> = None;
    for (i, (l, w)) in pairs().enumerate() {
        if !admits(l, w, cost) {
            let t = key.earliest(i, l, w, cost);
            if worst.map_or(true, |(b, _)| t > b) {
                worst = Some((t, i64::try_from(i).unwrap_or(0)));
            }
        }
    }
    let (t, at) = worst.unwrap_or((now, 0));
    Outcome { reply: [1, at, least_room(0).0, t.saturating_sub(now), now], written: None }
}

impl Key<'_> {
    /// The windows moved to their current slots with `units` more there, and the time.
    fn count(&self, windows: &[Window], now: i64, units: i64) -> Vec<u8> {
        let layout = self.layout;
        let mut out = match self.state {
            Some(state) => state.to_vec(),
            None => vec![0u8; layout.length],
        };
        write(&mut out, 0, now);
        for (i, (l, w)) in layout.limits.iter().zip(windows).enumerate() {
            let head = 8usize.saturating_add(i.saturating_mul(24));
            write(&mut out, head, w.big_k);
            write(&mut out, head.saturating_add(8), w.now_cur.saturating_add(units));
            write(&mut out, head.saturating_add(16), w.new_sum);
            if self.state.is_none() || w.big_k == w.k {
                continue;
            }
            let ring = layout.rings.get(i).copied().unwrap_or(0);
            let entries = l.n.saturating_add(1);
            if w.big_k.saturating_sub(w.k) > entries {
                for s in 0..entries {
                    write(
                        &mut out,
                        ring.saturating_add(usize::try_from(s).unwrap_or(0).saturating_mul(8)),
                        0,
                    );
                }
                continue;
            }
            // Slot k closes with its count; the skipped slots k+1 .. K-1 are empty.
            let mut s = w.k;
            while s < w.big_k {
                let value = if s == w.k { w.cur } else { 0 };
                let position = usize::try_from(s.rem_euclid(entries)).unwrap_or(0);
                write(&mut out, ring.saturating_add(position.saturating_mul(8)), value);
                s = s.saturating_add(1);
            }
        }
        out
    }
}
