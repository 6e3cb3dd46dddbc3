//! Feature `serde`: what a load allocates is bounded by the stream, whatever it holds. A
//! small forged stream (a right checksum: a CRC is no authentication) of sliding-log keys,
//! each with the most entries a limit may hold and the most units each: replayed one commit
//! per entry, every commit would copy the whole log (4,096 stamps) and keep the old copy
//! until a grace period the load itself holds up (hundreds of MB from 180 KB). A load lays
//! each log out once. In a binary of its own: it counts the process's heap.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use slidegate::{Algorithm, Limit, Limiter, ManualClock};

#[allow(dead_code)]
mod support {
    pub mod counting_alloc;
}
use support::counting_alloc::{live_bytes, peak_bytes, reset_peak, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn varint(out: &mut Vec<u8>, mut n: u64) {
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

#[test]
fn a_small_forged_stream_cannot_make_a_load_allocate_much() {
    const ENTRIES: u64 = 4096 + 3600 + 2; // the most one limit may hold
    const KEYS: u64 = 4;
    let mut out = b"slidegate-snapshot\n".to_vec();
    out.push(1);
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    out.extend_from_slice(&(wall.as_nanos() as u64).to_le_bytes());
    out.extend_from_slice(b"\x01\x07default\x01\x074096/1h");
    for k in 0..KEYS {
        out.push(2);
        let key = format!("\"k{k}\"");
        varint(&mut out, key.len() as u64);
        out.extend_from_slice(key.as_bytes());
        varint(&mut out, 0);
        varint(&mut out, ENTRIES);
        for i in 0..ENTRIES {
            varint(&mut out, 2 * (ENTRIES - i) * 1000); // zigzag of an age of µs, oldest first
            varint(&mut out, 4096);
        }
    }
    out.push(0);
    varint(&mut out, KEYS);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());

    let clock = ManualClock::new();
    clock.set(Duration::from_secs(100));
    let target = Limiter::<String>::builder()
        .algorithm(Algorithm::SlidingLog)
        .limit(Limit::new(4096, Duration::from_secs(3600)))
        .clock(clock)
        .build()
        .unwrap();
    let base = live_bytes();
    reset_peak();
    let stats = target.load(&out[..]).unwrap();
    let peak = peak_bytes().saturating_sub(base);
    assert_eq!(stats.inserted, KEYS);
    assert!(!target.check("k0").is_allowed(), "a log of 4,096 units in the hour");
    // The stream whole, what it parses into (16 B an entry), and the logs laid out (8 B a
    // stamp, 4,096 a key): about 0.6 MB here. 32 times the stream's 180 KB leaves room.
    assert!(peak < 32 * out.len(), "a peak of {peak} B from a stream of {} B", out.len());
}
