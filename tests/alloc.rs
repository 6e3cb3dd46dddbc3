//! The hidden-cost guard: a check on a key the limiter already holds allocates nothing,
//! a hot key or one of many, admitted, refused or shadow-refused,
//! with one limit or several, for every algorithm but the sliding log (whose admissions
//! allocate its new snapshot; its refusals must not); and the tower layer's extractors read
//! proxy headers, header keys, credentials and paths without allocating, so that a check on
//! a held header key allocates nothing either. A counting global allocator sees every allocation of the
//! process; this file holds a single test so no other test thread allocates meanwhile, and
//! the limiter runs on a `ManualClock` so it has no background thread either.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use slidegate::{Algorithm, Limit, Limiter, ManualClock};

#[allow(dead_code)]
mod support {
    pub mod counting_alloc;
}
use support::counting_alloc::{allocations_during, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Checks every key (map path), then one hot key (cache path), through slots, minutes and
/// hours; returns (admitted, refused).
fn exercise(limiter: &Limiter<String>, clock: &ManualClock, keys: &[String]) -> (u64, u64) {
    let (mut admitted, mut refused) = (0, 0);
    for round in 0..200u64 {
        // Move through slots, minutes and hours so slot rotation is on the path too.
        clock.advance(Duration::from_millis(137 + round * 31));
        for key in keys {
            let d = limiter.check(key.as_str());
            if d.is_allowed() {
                admitted += 1;
            } else {
                refused += 1;
            }
            let _ = limiter.check_n(key.as_str(), 2);
            let _ = limiter.peek(key.as_str());
        }
        // The same hot key again and again.
        for _ in 0..50 {
            let _ = limiter.check("client-7");
        }
    }
    (admitted, refused)
}

fn limiter(algorithm: Algorithm, clock: &ManualClock) -> Limiter<String> {
    Limiter::<String>::builder()
        .algorithm(algorithm)
        .limit(Limit::per_second(10))
        .limit(Limit::per_minute(120))
        .limit(Limit::per_hour(240).precision(Duration::from_secs(60)))
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[test]
fn checks_on_existing_keys_do_not_allocate() {
    let keys: Vec<String> = (0..64).map(|i| format!("client-{i}")).collect();
    // The sliding log allocates a new snapshot per admission by design; every other
    // algorithm must not allocate at all.
    for algorithm in [Algorithm::SlidingWindow, Algorithm::FixedWindow, Algorithm::Gcra] {
        let clock = ManualClock::new();
        let limiter = limiter(algorithm, &clock);
        // Insert every key (allocating its state and its map entry) and warm the cache up.
        for key in &keys {
            for _ in 0..3 {
                let _ = limiter.check(key.as_str());
            }
        }
        let mut seen = (0, 0);
        let n = allocations_during(|| seen = exercise(&limiter, &clock, &keys));
        let (admitted, refused) = seen;
        assert!(admitted > 0 && refused > 0, "{algorithm:?}: {admitted} admitted, {refused} refused");
        assert_eq!(n, 0, "{algorithm:?}: checks on existing keys allocated {n} times");
        // The guard itself works: a new key does allocate.
        assert!(
            allocations_during(|| {
                let _ = limiter.check("a new key");
            }) > 0
        );
    }

    // Shadow mode takes the other metric series (shadow denials) on the same path: no
    // allocation either. (With feature `metrics` and no recorder installed, as here, each
    // check also looks whether a recorder has been installed since: that look allocates
    // nothing; tests/metrics.rs checks the path with a recorder installed.)
    let clock = ManualClock::new();
    let shadow = Limiter::<String>::builder()
        .limit(Limit::per_second(10))
        .limit(Limit::per_minute(120))
        .shadow(true)
        .clock(clock.clone())
        .build()
        .unwrap();
    for key in &keys {
        let _ = shadow.check(key.as_str());
    }
    let mut shadow_denied = 0;
    let n = allocations_during(|| {
        for round in 0..100u64 {
            clock.advance(Duration::from_millis(50 + round));
            for key in &keys {
                let d = shadow.check_n(key.as_str(), 3);
                assert!(d.is_allowed());
                shadow_denied += u64::from(d.shadow_denial().is_some());
            }
        }
    });
    assert!(shadow_denied > 0);
    assert_eq!(n, 0, "shadow-mode checks on existing keys allocated {n} times");

    // The sliding log stores only admitted units: refusals and peeks on a full key
    // allocate nothing (the allocation is the admission's new snapshot).
    let clock = ManualClock::new();
    let limiter = limiter(Algorithm::SlidingLog, &clock);
    for _ in 0..10 {
        assert!(limiter.check("client-1").is_allowed());
    }
    let n = allocations_during(|| {
        for _ in 0..1000 {
            assert!(!limiter.check("client-1").is_allowed());
            assert!(!limiter.peek("client-1").is_allowed());
        }
    });
    assert_eq!(n, 0, "refusals on a sliding log allocated {n} times");
    assert!(
        allocations_during(|| {
            clock.advance(Duration::from_secs(1));
            assert!(limiter.check("client-1").is_allowed());
        }) > 0
    );

    // The tower layer's proxy-header extractor reads the list's hops from the right where
    // they are: no allocation per request either, over several header lines.
    #[cfg(feature = "tower")]
    {
        use slidegate::tower::{ForwardedFor, KeyError, KeyExtractor};
        use std::net::IpAddr;

        let mut req = http::Request::new(());
        let headers = req.headers_mut();
        headers.append("x-forwarded-for", "198.51.100.7, 203.0.113.9:4711".parse().unwrap());
        headers.append("x-forwarded-for", "[2001:db8::1]:443, 10.0.0.2".parse().unwrap());
        headers.append("forwarded", "for=192.0.2.60;proto=http, for=\"[2001:db8::2]:_p1\"".parse().unwrap());
        headers.append("forwarded", "for=10.0.0.3".parse().unwrap());
        req.extensions_mut().insert("10.0.0.1:5000".parse::<std::net::SocketAddr>().unwrap());
        let proxies = || ForwardedFor::trusting(["10.0.0.0/8"]).unwrap();
        let cases = [
            (ForwardedFor::new(1), "10.0.0.2"),
            (ForwardedFor::new(3), "203.0.113.9"),
            (ForwardedFor::new(9), "10.0.0.1"),
            (proxies(), "2001:db8::"),
            (ForwardedFor::new(3).rfc7239(), "192.0.2.60"),
            (proxies().rfc7239(), "2001:db8::"),
        ];
        let mut keys: Vec<Result<IpAddr, KeyError>> = Vec::with_capacity(cases.len());
        let n = allocations_during(|| {
            for (extractor, _) in &cases {
                keys.push(extractor.extract(&req).map(|ip| *ip));
            }
        });
        assert_eq!(n, 0, "ForwardedFor::extract allocated {n} times");
        for ((_, expected), key) in cases.iter().zip(keys) {
            assert_eq!(key, Ok(expected.parse::<IpAddr>().unwrap()));
        }
    }

    // Header keys, credentials in their usual spelling and normal paths are looked up where
    // they lie in the request: a check on a key the limiter holds copies nothing. The
    // limiter copies a key only to insert it (one allocation, its own bytes).
    #[cfg(feature = "tower")]
    {
        use slidegate::tower::{AuthorizationKey, HeaderKey, KeyExtractor, PathKey};

        let req = http::Request::get("/api/items?page=2")
            .header("x-api-key", "k-0123456789")
            .header("authorization", "Bearer T0KEN")
            .body(())
            .unwrap();
        let (api_key, credentials, path) =
            (HeaderKey::new("x-api-key").unwrap(), AuthorizationKey::new(), PathKey::new());
        let clock = ManualClock::new();
        let bytes =
            Limiter::<Vec<u8>>::builder().limit(Limit::per_second(10)).clock(clock.clone()).build().unwrap();
        let paths =
            Limiter::<String>::builder().limit(Limit::per_second(10)).clock(clock.clone()).build().unwrap();
        let check = || {
            let key = api_key.extract(&req).unwrap();
            let api = bytes.check(&*key).is_allowed();
            let key = credentials.extract(&req).unwrap();
            let auth = bytes.check(&*key).is_allowed();
            let key = path.extract(&req).unwrap();
            api && auth && paths.check(&*key).is_allowed()
        };
        assert!(allocations_during(|| assert!(check())) > 0, "the first check inserts the keys");
        let mut admitted = 0;
        let n = allocations_during(|| {
            for _ in 0..9 {
                admitted += usize::from(check());
            }
        });
        assert_eq!(admitted, 9);
        assert_eq!(n, 0, "checks on held header, credentials and path keys allocated {n} times");
    }
}
