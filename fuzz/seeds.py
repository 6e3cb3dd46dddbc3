#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz targets, as `seed-*` files, into DIR/<target>/
(`python3 fuzz/seeds.py [DIR]`, DIR defaulting to fuzz/corpus). The committed corpora in
fuzz/corpus/ started from these, were fuzzed, then minimized with `cargo fuzz cmin` (which
keeps only the inputs that add coverage, so few `seed-*` files remain).

limit_config: limit strings (every documented form, and broken ones), TOML and JSON
policies, each followed by a NUL and bytes that `arbitrary` decodes into a builder
configuration.

model_ops: inputs in the byte format documented at the top of
fuzz_targets/model_ops.rs: every algorithm on the limit table, bursts to refusal, slot
boundaries, the slot tags' wrap points, huge advances and costs, and tiers.

module_args: SLIDEGATE.RUN calls (arguments separated by spaces, see
fuzz_targets/module_args.rs): good calls, calls at and over every cap, bad entries among
good ones, costs at the edges, malformed limits and times, and stored windows of any bytes
(NaN and huge doubles included) after a newline.

snapshot: a mode byte (see fuzz_targets/snapshot.rs): each algorithm's real snapshot,
undamaged and with bytes overwritten or cut; and, in mode 0, streams written by hand:
well formed (the CRC right), and with every length, count and tag out of bounds.
"""

import os
import random
import struct
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------------------- limit_config

TEXTS = [
    "10/s", "120/min", "240/h", "500/15min", "240/h@1min", "60/min strict",
    " 5 / 10 s @ 5s strict ", "3/250ms", "1/d", "4096/h@1s", "4294967295/s", "7/min@10s",
    "5/2s@500ms strict", "10/second", "10/2 minutes@30 secs", "1/7d", "100/1500ms",
    # Errors, one per reason.
    "0/s", "4294967296/s", "10/0s", "10/s@0ms", "10/s@3s", "10/min@7s", "10/h@500ms",
    "ten/s", "10", "10/", "10/fortnight", "10/sstrict", "10/s strict strict",
    "18446744073709551615/s", "1/18446744073709551615ms", "1/99999999999999999999s",
    "1/18446744073709552s", "10/s@", "/s", "10//s", "10/s@1s@1s", "-1/s", "1.5/s", "",
    "10/s\n120/min\n240/h@1min strict\n0/s",
    # Policies in TOML and JSON.
    'limits = ["10/s", "1000/h@1min"]\nshadow = true\n',
    'limits = ["120 per minute"]\n',
    'limits = []\nshadwo = true\n',
    'limits = ["60/min strict", "4294967295/d@1h"]\n',
    '{"limits": ["10/s", "240/h@1min"], "shadow": false}',
    '{"limits": ["10/s"], "extra": 1}',
]


def limit_config_seeds():
    rng = random.Random(20261123)
    seeds = {}
    for i, text in enumerate(TEXTS):
        data = text.encode()
        if i % 2 == 0:
            data += b"\0" + bytes(rng.randrange(256) for _ in range(rng.randrange(16, 256)))
        seeds[f"text-{i:02}"] = data
    # Builder configurations only (no text): random bytes of several lengths.
    for i in range(12):
        seeds[f"builder-{i:02}"] = b"\0" + bytes(rng.randrange(256) for _ in range(32 << (i % 4)))
    return seeds


# ------------------------------------------------------------------------------ model_ops

SLIDING, FIXED, LOG, GCRA = range(4)
# Indices into LIMITS ++ FINE_LIMITS (tests/support/model.rs).
L3S, L5_2S, L10S, L7MIN, L4_3S, L4_20MS, L6_250MS = range(7)
STRICT = 0x80


def u16(v):
    return struct.pack("<H", v)


def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


def case(algorithm, limits, start=b"\0", ops=b"", tiers=False, keys=1):
    head = algorithm | (4 if tiers else 0) | (keys - 1) << 3
    return bytes([head, len(limits) - 1, *limits]) + start + ops


def before_wrap(pick, ms=0, ns=0):
    return bytes([2, pick]) + u32(ms) if ms else bytes([1, pick]) + u32(ns)


def anywhere(at):
    return b"\3" + u64(at)


def adv_ns(n):
    return b"\0" + bytes([n]) if n < 256 else b"\2" + u32(n)


def adv_ms(ms):
    return b"\1" + u16(ms)


def adv_s(s):
    return b"\3" + u16(s)


def adv_huge(ns):
    return b"\4" + u64(ns << 2)


def align(pick, offset=0):
    return bytes([5, pick, offset & 0xFF])


# Alignment picks (model_ops.rs `align_unit`): 0-6 are 2^32 slots of 1, 10, 20, 100, 250,
# 500, 1000 ms; 7-13 are 100, 250, 500, 1000, 10000, 60000, 20 ms.
A100, A250, A500, A1S, A10S, A60S, A20 = range(7, 14)


def check(key=0, cost=1, times=1):
    if cost == 1:
        c = b"\0"
    elif cost == "max":
        c = b"\6"
    elif cost < 5:
        c = bytes([cost << 3 | 4])
    else:
        c = b"\7" + u64(cost)
    return b"\6" + bytes([key]) + c + bytes([times - 1])


def peek(key=0):
    return bytes([10, key])


def reset(key=0):
    return bytes([11, key])


SWEEP = bytes([12])


def set_policy(key, tier):
    return bytes([13, key, tier])


def clear_policy(key):
    return bytes([14, key])


def update_max(tier, bump):
    return bytes([15, tier, bump])


def burst_and_recover():
    """A burst to refusal, part of a slot, the oldest slot fading, a window later."""
    return (check(0, 1, 12) + peek(0) + adv_ms(250) + check(0, 1, 3) + adv_ms(600) + check(0, 2, 4)
            + peek(0) + adv_ns(1) + check(0, 1, 2) + adv_s(61) + SWEEP + check(0, 1, 5) + reset(0)
            + check(0, 3, 2))


def boundary_heavy(rounds=40):
    """The proptest's deterministic sequence: align to a boundary ±1 ns, check, peek."""
    ops = b""
    for r in range(rounds):
        ops += align([A100, A250, A500, A1S, A10S][r % 5], r % 3 - 1)
        ops += check(r % 2, 1 + r % 3, 4) + peek(1)
        if r % 17 == 0:
            ops += adv_s(61) + SWEEP
    return ops


def model_ops_seeds():
    seeds = {}
    table = [L3S, L5_2S, L10S, L7MIN, L4_3S, L4_20MS, L6_250MS]
    names = ["sliding", "fixed", "log", "gcra"]
    for algorithm in range(4):
        name = names[algorithm]
        for limit in table:
            for strict in (0, STRICT):
                seeds[f"{name}-l{limit}{'s' if strict else ''}"] = case(algorithm, [limit | strict],
                                                                        ops=burst_and_recover())
        seeds[f"{name}-three"] = case(algorithm, [L5_2S, L7MIN | STRICT, L3S], ops=boundary_heavy(), keys=2)
        seeds[f"{name}-costs"] = case(algorithm, [L10S, L4_20MS | STRICT],
                                      ops=check(0, "max") + check(0, 11) + check(0, 0) + check(0, 10)
                                      + check(0, 1) + check(1, 4, 3) + adv_ms(30) + check(0, 4, 2)
                                      + check(0, 2**63) + peek(0))
        # Long uptime: just before each kind of wrap point, checks across it.
        for pick in range(6):
            ops = b"".join(check(r % 2, 1, 3) + adv_ms(97 * (r + 1)) + peek(r % 2) for r in range(12))
            seeds[f"{name}-wrap{pick}"] = case(algorithm, [L4_20MS, L6_250MS | STRICT, L5_2S],
                                               start=before_wrap(pick, ms=1500), ops=ops, keys=2)
        seeds[f"{name}-wrap-ns"] = case(algorithm, [L4_20MS | STRICT], start=before_wrap(0, ns=1),
                                        ops=check(0, 1, 5) + adv_ns(1) + check(0, 1, 5) + adv_ms(20)
                                        + check(0, 1, 5))
        seeds[f"{name}-huge"] = case(algorithm, [L3S, L4_20MS],
                                     start=anywhere(2**62 - 12345),
                                     ops=check(0, 3) + adv_huge(2**62 - 1) + check(0, 3) + align(0, -1)
                                     + check(0, 1, 4) + align(5, 1) + check(0, 1, 4) + adv_huge(2**61)
                                     + check(0, 2) + SWEEP + peek(0))
        seeds[f"{name}-jump-slots"] = case(algorithm, [L7MIN | STRICT, L10S],
                                           ops=check(0, 1, 7) + adv_s(5) + check(0, 1, 3) + adv_s(55)
                                           + check(0, 1, 7) + adv_ms(9_999) + check(0, 1, 2) + adv_s(3600)
                                           + SWEEP + check(0, 1, 3) + reset(0) + reset(0))
    for algorithm in (SLIDING, FIXED):
        ops = b""
        for r in range(10):
            ops += check(r % 4, 1, 4) + set_policy(r % 4, r % 3) + check(r % 4, 2, 3) + update_max(r % 3, r % 4)
            ops += clear_policy((r + 1) % 4) + adv_ms(333) + peek(r % 4)
        seeds[f"{names[algorithm]}-tiers"] = case(algorithm, [L3S, L7MIN | STRICT], ops=ops, tiers=True, keys=4)
    return seeds


# ----------------------------------------------------------------------------- module_args

def module_call(keys, limits, entries, now="1000", ttl="61000"):
    """One SLIDEGATE.RUN call as the target reads it: arguments joined by single spaces."""
    args = ["slidegate.run", keys[0] if keys else "k", str(len(keys))] + list(keys)
    args += [now, ttl, str(len(limits))]
    for limit in limits:
        args += [str(v) for v in limit]
    for mode, cost in entries:
        args += [mode, str(cost)]
    return " ".join(args).encode()


def module_args_seeds():
    minute = (5, 60000, 1000, 0)
    strict_hour = (100, 3600000, 60000, 1)
    seeds = {
        "one-check": module_call(["k"], [minute], [("check", 1)]),
        "server-time": module_call(["k"], [minute], [("check", 1)], now=""),
        "peek": module_call(["k"], [minute], [("peek", 1)]),
        "three-limits": module_call(["k", "j"], [(5, 1000, 1000, 1), minute, strict_hour],
                                    [("check", 3), ("peek", 1)]),
        "a-batch-with-bad-entries": module_call(
            ["a", "b", "c", "d", "e", "a"], [minute],
            [("check", 1), ("check", -1), ("add", 1), ("check", 18446744073709551616),
             ("check", 18446744073709551615), ("check", 2)]),
        "costs-at-the-edges": module_call(["k", "k", "k"], [(9007199254740991, 1000, 1000, 0)],
                                          [("check", 9007199254740991), ("check", 9007199254740992),
                                           ("check", 0)]),
        "at-the-caps": module_call(["k"], [(5, 3600, 1, 0)] * 8, [("check", 1)]),
        "nine-limits": module_call(["k"], [minute] * 9, [("check", 1)]),
        "too-many-slots": module_call(["k"], [(5, 3601, 1, 0)], [("check", 1)]),
        "too-many-keys": module_call([f"k{i}" for i in range(65)], [minute], [("check", 1)] * 65),
        "sixty-four-keys": module_call([f"k{i}" for i in range(64)], [minute], [("check", 1)] * 64),
        "bad-limits": module_call(["k"], [(5, 60000, 7000, 0), (-1, 1000, 1000, 0)], [("check", 1)]),
        "bad-time": module_call(["k"], [minute], [("check", 1)], now="-5", ttl="0"),
        "short": b"slidegate.run k 2 k",
        "numkeys-huge": b"slidegate.run k 99999999999 k",
        "with-state": module_call(["k", "k"], [minute], [("check", 1), ("check", 1)])
        + b"\n" + bytes(range(256)),
        "with-nan-state": module_call(["k"], [(3, 4000, 1000, 1)], [("check", 1)])
        + b"\n" + b"\xff\xff\xff\xff\xff\xff\xf8\x7f" * 3 + b"\x00\x00\x00\x00\x00\x00\xf0\x43",
    }
    return seeds


# ---------------------------------------------------------------------------- snapshot

def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def snapshot_stream(body, keys):
    import zlib
    head = b"slidegate-snapshot\n" + bytes([1]) + struct.pack("<Q", 1_700_000_000 * 10**9)
    out = head + body + b"\x00" + varint(keys)
    return out + struct.pack("<I", zlib.crc32(out) & 0xFFFFFFFF)


def snapshot_seeds():
    policy = b"\x01" + varint(7) + b"default" + b"\x02" + varint(4) + b"4/s" + varint(6) + b"20/min"

    def key(k, entries):
        body = b"\x02" + varint(len(str(k))) + str(k).encode() + varint(0)
        for limit in entries:
            body += varint(len(limit))
            for age, units in limit:
                body += varint((age << 1) if age >= 0 else ((-age << 1) - 1)) + varint(units)
        return body

    good = policy + key(3, [[(0, 2)], [(5 * 10**9, 3), (0, 2)]]) + key(9, [[], [(-10**6, 1)]])
    seeds = {
        "raw-good": b"\x00" + snapshot_stream(good, 2),
        "raw-empty": b"\x00" + snapshot_stream(b"", 0),
        "raw-wrong-count": b"\x00" + snapshot_stream(good, 3),
        "raw-long-key": b"\x00" + snapshot_stream(policy + b"\x02" + varint(1 << 40), 1),
        "raw-many-entries": b"\x00" + snapshot_stream(policy + b"\x02\x013\x00" + varint(1 << 30), 1),
        "raw-bad-limit": b"\x00" + snapshot_stream(b"\x01\x01d\x01\x035/x", 0),
        "raw-bad-tag": b"\x00" + snapshot_stream(b"\x07", 0),
        "raw-garbage": b"\x00" + bytes(range(256)),
    }
    for mode in range(1, 5):
        seeds[f"real-{mode}"] = bytes([mode])
        seeds[f"real-{mode}-damaged"] = bytes([mode, 30, 0, 40, 0xFF, 100, 7])
        seeds[f"real-{mode}-cut"] = bytes([mode, 0xFF, 80])
    return seeds


def write(base, target, seeds):
    directory = os.path.join(base, target)
    os.makedirs(directory, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(directory, f"seed-{name}"), "wb") as f:
            f.write(data)
    print(f"{len(seeds)} seeds in {directory}")


if __name__ == "__main__":
    base = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "corpus")
    write(base, "limit_config", limit_config_seeds())
    write(base, "model_ops", model_ops_seeds())
    write(base, "module_args", module_args_seeds())
    write(base, "snapshot", snapshot_seeds())
