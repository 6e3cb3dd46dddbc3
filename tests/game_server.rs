//! The UDP game server's core loop (`examples/game_server/server.rs`) on loopback, on a
//! frozen `ManualClock`: a spamming player gets exactly 30 moves per second through and is
//! told how long to wait, a quiet player is never throttled, chat allows exactly 5 per
//! 10 s, malformed datagrams get `BAD`, and the loop stops when told to.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../examples/game_server/server.rs"]
mod server;

use std::time::Duration;

use server::{serve, Rules, Stats};
use slidegate::ManualClock;
use tokio::net::UdpSocket;
use tokio::sync::watch;

async fn ask(client: &UdpSocket, message: &str) -> String {
    client.send(message.as_bytes()).await.unwrap();
    let mut buf = [0u8; 64];
    let len = tokio::time::timeout(Duration::from_secs(5), client.recv(&mut buf)).await.unwrap().unwrap();
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

#[tokio::test]
async fn spammers_are_held_to_the_limits_and_quiet_players_are_not() {
    let clock = ManualClock::new();
    clock.advance(Duration::from_millis(250));
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let stats = Stats::default();
    let (stop, stopped) = watch::channel(false);
    let server = tokio::spawn(serve(socket, Rules::new(Some(&clock)).unwrap(), stats.clone(), stopped));
    let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    client.connect(addr).await.unwrap();

    // 50 moves from player 66 in the same instant: exactly 30 pass.
    let mut answers = Vec::new();
    for i in 0..50 {
        answers.push(ask(&client, &format!("MOVE 66 {i} 0")).await);
    }
    assert_eq!(answers.iter().filter(|a| *a == "OK").count(), 30);
    // The 30 units sit in the slot [0 s, 1 s) of an interpolated 30/s at 1 s precision:
    // one more fits once 30 × (1 − f) ≤ 29 in the next slot, at 1 s + 1/30 s, i.e.
    // 783.333… ms after 250 ms, rounded up to 784 ms.
    assert!(answers[30..].iter().all(|a| a == "SLOW 784"), "{answers:?}");
    // A quiet player in the meantime is not affected.
    assert_eq!(ask(&client, "MOVE 1 5 5").await, "OK");
    // Chat: exactly 5 per 10 s.
    let chat: Vec<String> = futures_join(&client, "CHAT 66 hi", 7).await;
    assert_eq!(chat.iter().filter(|a| *a == "OK").count(), 5, "{chat:?}");
    assert_eq!(ask(&client, "JUMP 1").await, "BAD");
    assert_eq!(ask(&client, "MOVE notanumber 1 1").await, "BAD");
    // A second later the last second's 30 still count for the 75 % of it inside the
    // window: 30 × 0.75 = 22.5, so 7 more fit (the sliding window at work).
    clock.advance(Duration::from_secs(1));
    let mut some = 0;
    for i in 0..10 {
        some += usize::from(ask(&client, &format!("MOVE 66 {i} 1")).await == "OK");
    }
    assert_eq!(some, 7);
    // Two seconds after the burst it is out of the window: 30 more.
    clock.advance(Duration::from_secs(2));
    let mut more = 0;
    for i in 0..40 {
        more += usize::from(ask(&client, &format!("MOVE 66 {i} 1")).await == "OK");
    }
    assert_eq!(more, 30);
    {
        let stats = stats.lock().unwrap();
        assert_eq!(stats[&66], [67, 33, 5, 2]);
        assert_eq!(stats[&1], [1, 0, 0, 0]);
    }
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap().unwrap();
}

async fn futures_join(client: &UdpSocket, message: &str, times: usize) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..times {
        out.push(ask(client, message).await);
    }
    out
}
