//! Fuzz target: the arguments of the Redis module's `SLIDEGATE.RUN`, as any client may send
//! them, through the module's own parser (`slidegate_redis::args`) and window
//! (`slidegate_redis::window`), without a server.
//!
//! Input: the first line is the call, its arguments separated by single spaces (two spaces
//! make an empty argument, as the time may be; the command name comes first, as in the
//! server's `argv`); the bytes after the first `\n`, if any, are a key's stored windows,
//! repeated or cut to the layout's length (any bytes: a client with write access to the
//! key can store anything there).
//!
//! Checked: nothing panics (the fuzz build keeps overflow checks); the key positions the
//! module declares to the server are arguments, and include every key a parsed call opens;
//! a parsed call is within the caps (64 keys, 8 limits, 3600 slots per limit, 256 KiB per
//! key); each entry is decided (kind 0, 1 or 2) and writes a string of the layout's
//! length only when it counted units; a cost above every possible `max` (2^53 − 1) is kind
//! 2; and what one entry writes, the next reads without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slidegate_redis::args::{self, MOST_ENTRIES, MOST_KEY_BYTES, MOST_MAX};
use slidegate_redis::window::{self, Mode};

fuzz_target!(|data: &[u8]| {
    let (line, state) = match data.iter().position(|&b| b == b'\n') {
        Some(nl) => (&data[..nl], Some(&data[nl + 1..])),
        None => (data, None),
    };
    let argv: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let positions: Vec<usize> = args::key_positions(&argv).collect();
    assert!(positions.iter().all(|&p| p > 0 && p < argv.len()), "{positions:?} of {} arguments", argv.len());
    let Ok(call) = args::parse(&argv) else { return };
    assert!(!call.entries.is_empty() && call.entries.len() <= MOST_ENTRIES);
    assert!(call.layout.length <= MOST_KEY_BYTES, "{} bytes per key", call.layout.length);
    assert!(call.ttl > 0);
    let mut stored = state
        .filter(|s| !s.is_empty())
        .map(|s| s.iter().copied().cycle().take(call.layout.length).collect::<Vec<u8>>());
    for entry in call.entries.iter().flatten() {
        assert!(
            positions.contains(&entry.key),
            "key at {} opened but not declared: {positions:?}",
            entry.key
        );
        let now = call.now.unwrap_or(1_000_000);
        let outcome = window::run(&call.layout, stored.as_deref(), now, entry.mode, entry.cost);
        let [kind, limit, remaining, _, _] = outcome.reply;
        assert!((0..=2).contains(&kind), "{:?}", outcome.reply);
        assert!(limit >= 0 && remaining >= 0, "{:?}", outcome.reply);
        if entry.cost > MOST_MAX.unsigned_abs() {
            assert_eq!(kind, 2, "cost {} above every max: {:?}", entry.cost, outcome.reply);
        }
        if kind != 0 || entry.mode == Mode::Peek || entry.cost == 0 {
            assert!(outcome.written.is_none(), "{:?} wrote", outcome.reply);
        }
        if let Some(written) = outcome.written {
            assert_eq!(written.len(), call.layout.length);
            stored = Some(written);
        }
    }
});
