//! The game server's core loop, shared by `examples/game_server/main.rs` and
//! `tests/game_server.rs`: one UDP socket, one datagram per message, each player's moves and
//! chat rate-limited by slidegate.
//!
//! Protocol (text, one message per datagram): `MOVE <player> <x> <y>` and
//! `CHAT <player> <text>`. The server answers each with `OK` or `SLOW <ms>` (the
//! `retry_after` in whole milliseconds, rounded up), and a malformed message with `BAD`.
//! Players are identified by the id in the message; a real server would key by the
//! authenticated session, and the limiter does not care which.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slidegate::{ConfigError, Limit, Limiter, ManualClock};
use tokio::net::UdpSocket;
use tokio::sync::watch;

/// What the server accepted and throttled, per player: `[moves ok, moves throttled, chat
/// ok, chat throttled]`.
pub type Stats = Arc<Mutex<BTreeMap<u32, [u64; 4]>>>;

/// The most players each limiter tracks at once. Player ids come from the clients'
/// datagrams, so without a bound a client sending random ids would grow the limiters
/// without end; at the bound a new id is refused (`SLOW never`) until idle ones are swept
/// (a player idle for a minute holds no count). Far above the players one server hosts.
pub const MAX_PLAYERS: usize = 10_000;

/// How many refused players each limiter keeps track of, for `top_refused` (the summary's
/// "top refused" line): far more than the players worth listing, few enough to cost
/// nothing.
pub const TRACK_REFUSED: usize = 64;

/// The two limiters of the game: moves at most 30 per second and 600 per minute (a client
/// sending 30/s for more than 20 s is throttled too), chat at most 5 per 10 seconds; each
/// tracks at most [`MAX_PLAYERS`] players, and the [`TRACK_REFUSED`] players it refuses the
/// most. A clone shares the limiters: the server checks with one, the summary reads
/// `top_refused` from another.
#[derive(Clone)]
pub struct Rules {
    pub moves: Arc<Limiter<u32>>,
    pub chat: Arc<Limiter<u32>>,
}

impl Rules {
    /// The rules on the real clock, or on `clock` (tests).
    pub fn new(clock: Option<&ManualClock>) -> Result<Rules, ConfigError> {
        let mut moves = Limiter::builder()
            .name("moves")
            .limit(Limit::per_second(30))
            .limit(Limit::per_minute(600))
            .max_keys(MAX_PLAYERS)
            .track_refused(TRACK_REFUSED);
        let mut chat = Limiter::builder()
            .name("chat")
            .limit(Limit::new(5, Duration::from_secs(10)))
            .max_keys(MAX_PLAYERS)
            .track_refused(TRACK_REFUSED);
        if let Some(clock) = clock {
            moves = moves.clock(clock.clone());
            chat = chat.clock(clock.clone());
        }
        Ok(Rules { moves: Arc::new(moves.build()?), chat: Arc::new(chat.build()?) })
    }

    /// The answer to one datagram, and which stat it counts towards.
    pub fn answer(&self, message: &str, stats: &Stats) -> String {
        let mut words = message.split_whitespace();
        let (kind, player) = match (words.next(), words.next().and_then(|p| p.parse::<u32>().ok())) {
            (Some("MOVE"), Some(player)) => (0, player),
            (Some("CHAT"), Some(player)) => (2, player),
            _ => return "BAD".to_owned(),
        };
        let limiter = if kind == 0 { &self.moves } else { &self.chat };
        let decision = limiter.check(&player);
        let throttled = usize::from(!decision.is_allowed());
        if let Ok(mut stats) = stats.lock() {
            // Player ids come from datagrams: past MAX_PLAYERS, new ids are not tracked, so
            // a spray of ids cannot grow the table (as `max_keys` bounds the limiters).
            if stats.len() < MAX_PLAYERS || stats.contains_key(&player) {
                stats.entry(player).or_default()[kind + throttled] += 1;
            }
        }
        match decision.retry_after() {
            None if decision.is_allowed() => "OK".to_owned(),
            None => "SLOW never".to_owned(),
            Some(wait) => format!("SLOW {}", wait.as_nanos().div_ceil(1_000_000)),
        }
    }
}

/// Serves `socket` until `stop` turns true: answers every datagram to its sender.
pub async fn serve(
    socket: UdpSocket,
    rules: Rules,
    stats: Stats,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let mut buf = [0u8; 512];
    loop {
        let (len, from): (usize, SocketAddr) = tokio::select! {
            received = socket.recv_from(&mut buf) => received?,
            _ = stop.changed() => return Ok(()),
        };
        let message = String::from_utf8_lossy(&buf[..len]);
        let answer = rules.answer(&message, &stats);
        // A reply that cannot be sent (the client went away) is the client's loss.
        let _ = socket.send_to(answer.as_bytes(), from).await;
    }
}
