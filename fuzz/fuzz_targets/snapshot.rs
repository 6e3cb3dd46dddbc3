//! Fuzz target: `Limiter::load` (feature `serde`) on any bytes, and on damaged snapshots.
//!
//! Input: the first byte picks a mode, the rest are its bytes.
//! - Mode 0: the bytes are the stream, as they are.
//! - Otherwise: a real snapshot of a small limiter (keys 0 to 15 checked a few times each,
//!   under the algorithm the mode's low bits pick, two limits and a GCRA burst among them)
//!   is damaged by the bytes, read as pairs `(offset, value)`: each pair overwrites one byte
//!   (offset modulo the length), an offset byte of 0xFF cuts the stream there instead.
//!
//! Either way the stream is loaded into a limiter that already holds keys 0 to 7: `load`
//! must not panic; if it fails, the limiter must be as it was (its length and what a peek
//! of keys 0 to 15 says); if it succeeds, no key may have more room than before (a load only
//! adds units). The undamaged snapshot must load.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use slidegate::{Algorithm, Limit, Limiter, ManualClock};

const ALGORITHMS: [Algorithm; 4] =
    [Algorithm::SlidingWindow, Algorithm::FixedWindow, Algorithm::SlidingLog, Algorithm::Gcra];

fn limiter(algorithm: Algorithm, clock: &ManualClock) -> Limiter<u64> {
    let second =
        if algorithm == Algorithm::Gcra { Limit::per_second(4).burst(6) } else { Limit::per_second(4) };
    Limiter::<u64>::builder()
        .algorithm(algorithm)
        .limit(second)
        .limit(Limit::per_minute(20))
        .clock(clock.clone())
        .build()
        .expect("a valid configuration")
}

fn looks(limiter: &Limiter<u64>) -> (usize, Vec<u64>) {
    (limiter.len(), (0..16).map(|k| limiter.peek(&k).remaining()).collect())
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let algorithm = ALGORITHMS[usize::from(mode) % 4];
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(1000));
    let stream = if mode == 0 {
        rest.to_vec()
    } else {
        let old = limiter(algorithm, &clock);
        for k in 0..16u64 {
            for _ in 0..(k % 5) {
                let _ = old.check(&k);
            }
            clock.advance(Duration::from_millis(300));
        }
        let mut file = Vec::new();
        old.save(&mut file).expect("saving into a Vec");
        let target = limiter(algorithm, &clock);
        assert!(target.load(&file[..]).is_ok(), "an undamaged snapshot must load");
        for pair in rest.chunks(2) {
            if file.is_empty() {
                break;
            }
            let at = usize::from(pair[0]) % file.len();
            match pair {
                [0xFF, ..] => file.truncate(at),
                [_, value] => file[at] = *value,
                _ => {}
            }
        }
        file
    };
    let target = limiter(algorithm, &clock);
    for k in 0..8u64 {
        let _ = target.check_n(&k, k % 3);
    }
    let before = looks(&target);
    match target.load(&stream[..]) {
        Err(e) => {
            assert!(!e.to_string().is_empty());
            assert_eq!(looks(&target), before, "a failed load changed the limiter: {e}");
        }
        Ok(_) => {
            let after = looks(&target);
            for (k, (b, a)) in before.1.iter().zip(&after.1).enumerate() {
                assert!(a <= b, "key {k}: a load gave room ({b} before, {a} after)");
            }
        }
    }
});
