//! A UDP game server that rate-limits each player's messages (moves: 30/s and 600/min;
//! chat: 5 per 10 s), with built-in bots: three well-behaved players and two spammers.
//!
//! `cargo run --release --example game_server --features tokio` runs server and bots for 5 seconds and
//! prints, every second, what each player got through and what was throttled: the spammers
//! are held to the limits, the well-behaved players never notice them. Each second ends
//! with the top offenders, as an operator would ask the server for them: the three players
//! the limiters refused the most ([`Limiter::top_refused`](slidegate::Limiter::top_refused),
//! moves and chat added up). Those are recent totals, not the second's: each limiter halves
//! its counts every longest window (a minute for moves, 10 s for chat).
//!
//! Options: `--seconds N` (default 5); `--listen ADDR` (default `127.0.0.1:0`); `--serve`
//! (no bots: serve until Ctrl-C, and try it with
//! `echo "MOVE 1 10 20" | nc -u -w1 127.0.0.1 PORT`).

#[path = "server.rs"]
mod server;

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use server::{serve, Rules, Stats, TRACK_REFUSED};
use tokio::net::UdpSocket;
use tokio::sync::watch;

/// A bot: player id, role, moves per second, chat messages per second.
const BOTS: [(u32, &str, f64, f64); 5] = [
    (1, "player", 8.0, 0.25),
    (2, "player", 9.0, 0.4),
    (3, "player", 5.0, 0.2),
    (66, "spammer", 120.0, 3.0),
    (99, "spammer", 400.0, 10.0),
];

/// Sends `player`'s moves and chat at their rates until `stop`.
async fn bot(
    server: SocketAddr,
    player: u32,
    moves: f64,
    chat: f64,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let socket = UdpSocket::bind("127.0.0.1:0").await?;
    socket.connect(server).await?;
    let mut move_tick = tokio::time::interval(Duration::from_secs_f64(1.0 / moves));
    let mut chat_tick = tokio::time::interval(Duration::from_secs_f64(1.0 / chat));
    let mut buf = [0u8; 64];
    let mut step = 0u64;
    loop {
        tokio::select! {
            _ = move_tick.tick() => {
                step += 1;
                socket.send(format!("MOVE {player} {} {}", step % 100, step % 37).as_bytes()).await?;
            }
            _ = chat_tick.tick() => socket.send(format!("CHAT {player} gg").as_bytes()).await.map(|_| ())?,
            // Replies are read and dropped so the socket's buffer never fills.
            _ = socket.recv(&mut buf) => {}
            _ = stop.changed() => return Ok(()),
        }
    }
}

/// The `n` players refused the most, moves and chat added up, as `99 (1040 moves, 12 chat)`.
fn top_offenders(rules: &Rules, n: usize) -> String {
    let mut refused: BTreeMap<u32, [u64; 2]> = BTreeMap::new();
    for (limiter, kind) in [(&rules.moves, 0), (&rules.chat, 1)] {
        for (player, units) in limiter.top_refused(TRACK_REFUSED) {
            refused.entry(player).or_default()[kind] += units;
        }
    }
    let mut ranked: Vec<(u32, [u64; 2])> = refused.into_iter().collect();
    ranked.sort_by_key(|&(player, [moves, chat])| (Reverse(moves + chat), player));
    if ranked.is_empty() {
        return "none".to_owned();
    }
    ranked
        .iter()
        .take(n)
        .map(|(player, [moves, chat])| format!("{player} ({moves} moves, {chat} chat)"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// a UDP game server that rate-limits each player's moves and chat, with built-in bots.
#[derive(argh::FromArgs)]
struct Args {
    /// run the bots for this many seconds (default 5)
    #[argh(option, default = "5")]
    seconds: u64,
    /// the UDP address to serve on (default 127.0.0.1:0, any free port)
    #[argh(option, default = "String::from(\"127.0.0.1:0\")")]
    listen: String,
    /// no bots: serve until Ctrl-C
    #[argh(switch)]
    serve: bool,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Args = argh::from_env();
    let (seconds, listen) = (args.seconds, args.listen);
    let socket = UdpSocket::bind(&listen).await?;
    let addr = socket.local_addr()?;
    let stats = Stats::default();
    let (stop, stopped) = watch::channel(false);
    let rules = Rules::new(None)?;
    let server = tokio::spawn(serve(socket, rules.clone(), stats.clone(), stopped.clone()));
    println!("game server on udp://{addr}: moves 30/s and 600/min per player, chat 5 per 10 s");

    if args.serve {
        println!(
            "serving until Ctrl-C; try: echo \"MOVE 1 10 20\" | nc -u -w1 {} {}",
            addr.ip(),
            addr.port()
        );
        tokio::signal::ctrl_c().await?;
        stop.send(true)?;
        server.await??;
        return Ok(());
    }

    // The bots stop first, then the server: a bot still sending to a closed port would get
    // "connection refused" back.
    let (stop_bots, bots_stopped) = watch::channel(false);
    let bots: Vec<_> = BOTS
        .iter()
        .map(|&(player, _, moves, chat)| tokio::spawn(bot(addr, player, moves, chat, bots_stopped.clone())))
        .collect();
    println!(
        "bots: {}\n",
        BOTS.iter()
            .map(|b| format!("{} ({}, {}/s moves, {}/s chat)", b.0, b.1, b.2, b.3))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("second | player | role    | moves ok | moves throttled | chat ok | chat throttled");
    println!("------ | ------ | ------- | -------- | --------------- | ------- | --------------");
    let mut before: BTreeMap<u32, [u64; 4]> = BTreeMap::new();
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.tick().await;
    for second in 1..=seconds {
        ticker.tick().await;
        let now = stats.lock().map(|s| s.clone()).unwrap_or_default();
        for &(player, role, _, _) in &BOTS {
            let [a, b, c, d] = now.get(&player).copied().unwrap_or_default();
            let [pa, pb, pc, pd] = before.get(&player).copied().unwrap_or_default();
            println!(
                "{second:>6} | {player:>6} | {role:<7} | {:>8} | {:>15} | {:>7} | {:>14}",
                a - pa,
                b - pb,
                c - pc,
                d - pd
            );
        }
        println!("{second:>6} | top refused: {}", top_offenders(&rules, 3));
        before = now;
    }
    stop_bots.send(true)?;
    for bot in bots {
        bot.await??;
    }
    stop.send(true)?;
    server.await??;
    let throttled_players: u64 =
        BOTS.iter().filter(|b| b.1 == "player").map(|b| before.get(&b.0).map_or(0, |s| s[1] + s[3])).sum();
    let throttled_spammers: u64 =
        BOTS.iter().filter(|b| b.1 == "spammer").map(|b| before.get(&b.0).map_or(0, |s| s[1] + s[3])).sum();
    println!("\nthrottled: well-behaved players {throttled_players}, spammers {throttled_spammers}");
    Ok(())
}
