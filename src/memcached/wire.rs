//! The memcached text protocol as the limiter speaks it: pooled connections, `get` of
//! several keys, `incr` with `add` when the counter is missing, and expiries.

use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// One pooled connection. `clean` is false from the first byte of a request to the last
/// byte of its reply: a connection dropped in between (an error, or the check's timeout)
/// goes back to the pool unclean, and the pool closes it rather than hand it out again.
pub(super) struct Conn {
    io: BufReader<TcpStream>,
    clean: bool,
}

/// Opens the pool's connections to one server.
pub(super) struct Connector {
    pub(super) addr: String,
}

impl managed::Manager for Connector {
    type Type = Conn;
    type Error = std::io::Error;

    async fn create(&self) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(&self.addr).await?;
        // Requests are small and each waits for its reply: do not hold them back.
        stream.set_nodelay(true)?;
        Ok(Conn { io: BufReader::new(stream), clean: true })
    }

    async fn recycle(&self, conn: &mut Conn, _: &Metrics) -> RecycleResult<std::io::Error> {
        if conn.clean {
            Ok(())
        } else {
            Err(RecycleError::message("an exchange with memcached was cut short"))
        }
    }
}

/// The longest value `get_multi` reads: memcached's default largest item (1 MiB).
const MAX_VALUE_BYTES: usize = 1 << 20;

/// `get k1 k2 ...`: the numeric values found.
pub(super) async fn get_multi(conn: &mut Conn, keys: &[&str]) -> std::io::Result<Vec<(String, u64)>> {
    conn.clean = false;
    conn.io.get_mut().write_all(format!("get {}\r\n", keys.join(" ")).as_bytes()).await?;
    let mut out = Vec::new();
    loop {
        let line = read_line(conn).await?;
        let mut parts = line.split_whitespace();
        match parts.next() {
            Some("END") => {
                conn.clean = true;
                return Ok(out);
            }
            Some("VALUE") => {
                let key = parts.next().unwrap_or_default().to_owned();
                let bytes: usize = parts.nth(1).and_then(|b| b.parse().ok()).unwrap_or(0);
                // memcached stores nothing longer by default; a reply that says more is no
                // counter of ours, and must not size an allocation.
                if bytes > MAX_VALUE_BYTES {
                    return Err(std::io::Error::other(format!("memcached: a value of {bytes} bytes")));
                }
                let mut data = vec![0u8; bytes.saturating_add(2)];
                conn.io.read_exact(&mut data).await?;
                let value = data
                    .get(..bytes)
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                out.push((key, value));
            }
            _ => return Err(std::io::Error::other(format!("memcached: unexpected reply {line:?}"))),
        }
    }
}

/// memcached's longest relative expiry (30 days): it reads a larger one as a Unix time.
const MAX_RELATIVE_TTL: u64 = 60 * 60 * 24 * 30;

/// The expiry to give a counter living `ttl_ms`: whole seconds, at least 1; 0 (no expiry,
/// memcached's LRU reclaims it) past [`MAX_RELATIVE_TTL`], where memcached would read it as
/// a date in 1970 and expire the counter at once.
fn ttl_seconds(ttl_ms: u64) -> u64 {
    match ttl_ms.div_ceil(1000).max(1) {
        ttl if ttl > MAX_RELATIVE_TTL => 0,
        ttl => ttl,
    }
}

/// One reply line; the connection closing first is an error.
async fn read_line(conn: &mut Conn) -> std::io::Result<String> {
    let mut line = String::new();
    if conn.io.read_line(&mut line).await? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(line)
}

/// `incr key cost`, creating the counter with `add` (TTL `ttl_ms`) when it is missing.
pub(super) async fn incr(conn: &mut Conn, key: &str, cost: u64, ttl_ms: u64) -> std::io::Result<()> {
    for _ in 0..2 {
        conn.clean = false;
        conn.io.get_mut().write_all(format!("incr {key} {cost}\r\n").as_bytes()).await?;
        let line = read_line(conn).await?;
        if line.trim_end().parse::<u64>().is_ok() {
            conn.clean = true;
            return Ok(());
        }
        if !line.starts_with("NOT_FOUND") {
            return Err(std::io::Error::other(format!("memcached: unexpected reply {line:?}")));
        }
        // Add-if-missing; a racing add that wins is fine: the incr retries on its counter.
        let ttl = ttl_seconds(ttl_ms);
        conn.io.get_mut().write_all(format!("add {key} 0 {ttl} 1\r\n0\r\n").as_bytes()).await?;
        let line = read_line(conn).await?;
        if !(line.starts_with("STORED") || line.starts_with("NOT_STORED")) {
            return Err(std::io::Error::other(format!("memcached: unexpected reply {line:?}")));
        }
        conn.clean = true;
    }
    Err(std::io::Error::other("memcached: counter vanished twice"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::arithmetic_side_effects)]
    use super::*;

    #[test]
    fn expiries_over_30_days_are_not_dates() {
        assert_eq!(ttl_seconds(0), 1);
        assert_eq!(ttl_seconds(1_500), 2);
        assert_eq!(ttl_seconds(MAX_RELATIVE_TTL * 1000), MAX_RELATIVE_TTL);
        assert_eq!(ttl_seconds(MAX_RELATIVE_TTL * 1000 + 1), 0);
        assert_eq!(ttl_seconds(u64::MAX), 0);
    }
}
