//! A pingora reverse proxy rate-limited by slidegate, per client IP and per API key:
//!
//! * every client IP (an IPv6 client by its /64): 10 requests per minute;
//! * every API key (`X-Api-Key`): 5 requests per minute, on top of its client's IP limit.
//!   A request without the header is held to its IP's limit only.
//!
//! Both are checked in pingora's `request_filter` with one [`Limiter::check_all`] over the
//! request's keys: a request is admitted only if its IP and its key both have room, and a
//! refusal charges neither (a request refused for its key's budget leaves its IP's alone).
//! Refusals follow slidegate's tower layer: 429 with `Retry-After` (whole seconds, rounded
//! up), `RateLimit-Policy` and `RateLimit`; 413 when a request costs more than a limit
//! allows (never here, where each costs 1); 503 when the limiter holds as many keys as it
//! may; 500 without a client address; 400 for an `X-Api-Key` sent twice; 431 for one longer
//! than 256 bytes. Admitted responses get the `RateLimit-Policy` and `RateLimit` fields in
//! `response_filter`.
//!
//! `cargo run --example pingora_gateway --features pingora` listens on `127.0.0.1:8080`
//! (`--listen ADDR`), forwards to a small upstream it starts on loopback, or to `--upstream
//! HOST:PORT`, and prints curl commands to try; Ctrl-C stops it. `--demo` starts its own
//! upstream, sends requests through the proxy over TCP, prints what came back, checks it
//! (and that the upstream saw exactly the admitted requests), and exits 0, or 1 naming what
//! went wrong. Building pingora needs `cmake` (for zlib-ng).

use std::error::Error;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::{http_proxy_service, HttpPeer, ProxyHttp, Server, Session};
use pingora::server::{RunArgs, ShutdownSignal, ShutdownSignalWatch};
use slidegate::tower::RateLimitFields;
use slidegate::{Denial, Limit, Limiter, PolicyConfig};

/// What a request is counted against: its client's address, and its API key if it sends
/// one. One limiter holds both kinds, each under a policy of its own, so that a request's
/// two keys are checked together by `check_all`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Client {
    Ip(IpAddr),
    ApiKey(Vec<u8>),
}

/// The policy of client addresses, and the name of its `RateLimit` items.
const PER_IP: &str = "per-ip";
/// The policy of API keys, and the name of its `RateLimit` items.
const API_KEY: &str = "api-key";
/// The header an API key is read from.
const API_KEY_HEADER: &str = "x-api-key";
/// The longest API key accepted, in bytes (as slidegate's `HeaderKey` by default).
const MAX_KEY_LEN: usize = 256;
/// The most keys (client addresses and API keys together) the limiter holds. Both come from
/// clients, and `X-Api-Key` is whatever a client sends: without a bound, random values would
/// grow the limiter without end. At the bound a new key takes the place of an idle one, or,
/// when every key is live, gets a 503.
const MAX_KEYS: usize = 100_000;

/// The limiter: one policy per kind of key, chosen by the key's kind.
fn limiter() -> Result<Limiter<Client>, slidegate::ConfigError> {
    Limiter::<Client>::builder()
        .name("pingora-gateway")
        .policy(PER_IP, PolicyConfig::new([Limit::per_minute(10)]))
        .policy(API_KEY, PolicyConfig::new([Limit::per_minute(5)]))
        .resolver(policy_of)
        .max_keys(MAX_KEYS)
        .build()
}

fn policy_of(client: &Client) -> Option<&str> {
    Some(match client {
        Client::Ip(_) => PER_IP,
        Client::ApiKey(_) => API_KEY,
    })
}

/// A client address as a key: IPv4 (an IPv4-mapped IPv6 address too) as is, IPv6 cut to its
/// /64, which is what one subscriber is given (as slidegate's `PeerIp` keys it).
fn ip_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !(u128::MAX >> 64))),
        v4 => v4,
    }
}

/// What the proxy answers itself: a status and its fields, with an empty body.
struct Refusal {
    status: u16,
    fields: Vec<(&'static str, String)>,
}

impl Refusal {
    fn bare(status: u16) -> Refusal {
        Refusal { status, fields: Vec::new() }
    }
}

/// The `RateLimit-Policy` and `RateLimit` values an admitted request's response gets.
struct Fields {
    policy: String,
    value: String,
}

/// The proxy: the limiter, the upstream, and the advertised policies.
struct Gate {
    limiter: Arc<Limiter<Client>>,
    upstream: SocketAddr,
    /// The fields of the IP policy and of the API key policy, formatted as the tower layer
    /// formats them.
    ip_fields: RateLimitFields,
    key_fields: RateLimitFields,
    /// `RateLimit-Policy` of a request with an API key: its IP's policy and its key's.
    ip_and_key_policy: String,
}

impl Gate {
    fn new(limiter: Arc<Limiter<Client>>, upstream: SocketAddr) -> Result<Gate, String> {
        let fields = |name: &str| {
            let policy = limiter.policy(name).ok_or(format!("no policy {name}"))?;
            RateLimitFields::new(name, &policy.limits).map_err(|e| e.to_string())
        };
        let (ip_fields, key_fields) = (fields(PER_IP)?, fields(API_KEY)?);
        Ok(Gate {
            ip_and_key_policy: format!("{}, {}", ip_fields.policy(), key_fields.policy()),
            ip_fields,
            key_fields,
            limiter,
            upstream,
        })
    }

    /// Checks a request: the fields for its response if it is admitted, else the refusal.
    fn decide(&self, client: Option<SocketAddr>, req: &RequestHeader) -> Result<Fields, Refusal> {
        // No client address (a Unix socket listener): the limiter cannot key the request,
        // a configuration problem, as the tower layer's `MissingKey`.
        let ip = Client::Ip(ip_key(client.ok_or(Refusal::bare(500))?.ip()));
        let mut lines = req.headers.get_all(API_KEY_HEADER).iter();
        let key = match (lines.next(), lines.next()) {
            (None, _) => None,
            // Two readings of the key: this proxy would count one while the upstream may
            // read the other.
            (Some(_), Some(_)) => return Err(Refusal::bare(400)),
            (Some(v), None) if v.len() > MAX_KEY_LEN => return Err(Refusal::bare(431)),
            (Some(v), None) => Some(Client::ApiKey(v.as_bytes().to_vec())),
        };
        let (checked, policy) = match &key {
            Some(key) => (self.limiter.check_all(&[&ip, key], 1), self.ip_and_key_policy.as_str()),
            None => (self.limiter.check_all(&[&ip], 1), self.ip_fields.policy()),
        };
        // One or two keys: `check_all` takes up to four.
        let checked = checked.map_err(|_| Refusal::bare(500))?;
        // The decision is about the key with the least room, or the one that frees up last.
        let of = if checked.key() == 0 { &self.ip_fields } else { &self.key_fields };
        let decision = checked.decision();
        let fields = Fields { policy: policy.to_owned(), value: of.ratelimit(&decision).unwrap_or_default() };
        let status = match decision.denial() {
            None => return Ok(fields),
            Some(Denial::TooManyKeys) => return Err(Refusal::bare(503)),
            // It can never pass: no `Retry-After`.
            Some(Denial::CostTooLarge(_)) => 413,
            // `Denial::Limit` (as the tower layer, any other kind too).
            Some(_) => 429,
        };
        let mut refusal = Refusal { status, fields: Vec::new() };
        if let Some(wait) = RateLimitFields::retry_after(&decision) {
            refusal.fields.push(("Retry-After", wait.to_string()));
        }
        refusal.fields.push(("RateLimit-Policy", fields.policy));
        refusal.fields.push(("RateLimit", fields.value));
        Err(refusal)
    }
}

/// Per request: the fields its response gets, once it is admitted.
#[derive(Default)]
struct Ctx {
    fields: Option<Fields>,
}

#[async_trait]
impl ProxyHttp for Gate {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx::default()
    }

    /// The rate limits, before anything is sent upstream.
    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> pingora::Result<bool> {
        let client = session.client_addr().and_then(|a| a.as_inet()).copied();
        match self.decide(client, session.req_header()) {
            Ok(fields) => {
                ctx.fields = Some(fields);
                Ok(false)
            }
            Err(refusal) => {
                let mut response = ResponseHeader::build(refusal.status, Some(refusal.fields.len() + 1))?;
                for (name, value) in refusal.fields {
                    response.insert_header(name, value)?;
                }
                response.insert_header("Content-Length", "0")?;
                // Close the connection after the refusal rather than read (and drop) the
                // body of a refused upload to reuse it.
                session.set_keepalive(None);
                session.write_response_header(Box::new(response), true).await?;
                Ok(true)
            }
        }
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut Ctx) -> pingora::Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.upstream, false, String::new())))
    }

    /// An admitted request's response, from the upstream, gets its fields (appended: the
    /// upstream's own lines stay).
    async fn response_filter(
        &self,
        _session: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> pingora::Result<()> {
        if let Some(fields) = ctx.fields.take() {
            response.append_header("RateLimit-Policy", fields.policy)?;
            response.append_header("RateLimit", fields.value)?;
        }
        Ok(())
    }
}

/// Stops the server when its sender sends or is dropped: pingora's `run` then returns.
struct StopOn(tokio::sync::Mutex<tokio::sync::oneshot::Receiver<()>>);

#[async_trait]
impl ShutdownSignalWatch for StopOn {
    async fn recv(&self) -> ShutdownSignal {
        let _ = (&mut *self.0.lock().await).await;
        // No grace period: the demo's requests are all answered by now.
        ShutdownSignal::FastShutdown
    }
}

/// The upstream: a small HTTP/1.1 server on loopback that answers every request with what it
/// saw, and counts them.
fn start_upstream() -> std::io::Result<(SocketAddr, Arc<AtomicUsize>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&hits);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let hits = Arc::clone(&counted);
            std::thread::spawn(move || {
                let _ = serve_upstream(stream, &hits);
            });
        }
    });
    Ok((addr, hits))
}

/// Answers the requests of one connection (pingora keeps upstream connections alive).
fn serve_upstream(stream: TcpStream, hits: &AtomicUsize) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let (mut length, mut close) = (0usize, false);
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
                if name == "content-length" {
                    length = value.parse().unwrap_or(0);
                } else if name == "connection" && value.eq_ignore_ascii_case("close") {
                    close = true;
                }
            }
        }
        std::io::copy(&mut (&mut reader).take(length as u64), &mut std::io::sink())?;
        hits.fetch_add(1, Ordering::SeqCst);
        let mut parts = request_line.split_whitespace();
        let body = format!("upstream saw {} {}\n", parts.next().unwrap_or("?"), parts.next().unwrap_or("?"));
        write!(
            writer,
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )?;
        if close {
            return Ok(());
        }
    }
}

/// A response as the demo's client read it.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
}

impl Reply {
    /// A header's values, joined with ", " (`-` when absent).
    fn header(&self, name: &str) -> String {
        let values: Vec<&str> = self
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect();
        if values.is_empty() {
            "-".to_owned()
        } else {
            values.join(", ")
        }
    }
}

/// Sends `GET path` with `headers` over a new connection, and reads the response; every step
/// bounded in time. The first request retries connecting while the proxy starts.
fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Result<Reply, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let stream = loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(stream) => break stream,
            Err(e) if Instant::now() > deadline => {
                return Err(format!("cannot connect to the proxy at {addr}: {e}"))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let io = |e: std::io::Error| format!("GET {path}: {e}");
    stream.set_read_timeout(Some(Duration::from_secs(5))).map_err(io)?;
    stream.set_write_timeout(Some(Duration::from_secs(5))).map_err(io)?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    (&stream).write_all(request.as_bytes()).map_err(io)?;
    let mut reader = BufReader::new(&stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).map_err(io)?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or(format!("GET {path}: no status line in {status_line:?}"))?;
    let mut reply = Reply { status, headers: Vec::new() };
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).map_err(io)? == 0 {
            break;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            reply.headers.push((name.trim().to_owned(), value.trim().to_owned()));
        }
    }
    let length: u64 = reply.header("content-length").parse().unwrap_or(0);
    std::io::copy(&mut reader.take(length), &mut std::io::sink()).map_err(io)?;
    Ok(reply)
}

/// Sends the demo's requests through the proxy at `addr`, prints what came back, and checks
/// it against the limits: the first error found, if any.
fn demo(addr: SocketAddr, hits: &AtomicUsize, limiter: &Limiter<Client>) -> Result<(), String> {
    let mut last_policy = String::new();
    let mut send = |what: &str, path: &str, headers: &[(&str, &str)]| -> Result<Reply, String> {
        let reply = get(addr, path, headers)?;
        let policy = reply.header("ratelimit-policy");
        if policy != last_policy && policy != "-" {
            println!("{:<34}     RateLimit-Policy: {policy}", "");
            last_policy = policy;
        }
        println!(
            "{what:<34} {}  RateLimit: {}  Retry-After: {}",
            reply.status,
            reply.header("ratelimit"),
            reply.header("retry-after")
        );
        Ok(reply)
    };
    let mut admitted = 0usize;
    // A run of requests: `allowed` admissions counting down `item`'s `r`, then a 429 from `item`.
    let mut burst = |label: &str, key: Option<&str>, allowed: u64, item: &str| -> Result<(), String> {
        let headers: Vec<(&str, &str)> = key.map(|k| (API_KEY_HEADER, k)).into_iter().collect();
        for i in 1..=allowed + 1 {
            let reply = send(&format!("GET /api/items {label} #{i}"), "/api/items", &headers)?;
            let ratelimit = reply.header("ratelimit");
            if i <= allowed {
                let expected = format!("\"{item}\";r={}", allowed - i);
                if reply.status != 200 || ratelimit != expected {
                    return Err(format!(
                        "{label} #{i}: expected 200 and RateLimit {expected}, got {}, {ratelimit}",
                        reply.status
                    ));
                }
                admitted += 1;
            } else {
                expect_429(&reply, item).map_err(|e| format!("{label} #{i}: {e}"))?;
            }
        }
        Ok(())
    };
    // The key's budget (5) runs out first; the refusal leaves the IP's 10 - 5 = 5 alone.
    burst("(key k-123)", Some("k-123"), 5, API_KEY)?;
    // Without a key the IP's budget alone applies: the 5 left.
    burst("(no key)", None, 5, PER_IP)?;
    // A new key from the same IP is refused for the IP's sake, and its own budget is untouched.
    let reply = send("GET /api/items (key k-456)", "/api/items", &[(API_KEY_HEADER, "k-456")])?;
    expect_429(&reply, PER_IP).map_err(|e| format!("k-456: {e}"))?;
    // `peek` answers as a check would, consuming nothing: a check now would leave 4 of 5,
    // so the refused request used none.
    let left = limiter.peek(&Client::ApiKey(b"k-456".to_vec())).remaining();
    if left != 4 {
        return Err(format!(
            "k-456's budget was charged for a refused request: a check would leave {left}, not 4"
        ));
    }
    // Key errors are answered before the limiter, as the tower layer answers them.
    let reply = send(
        "GET /api/items (key sent twice)",
        "/api/items",
        &[(API_KEY_HEADER, "a"), (API_KEY_HEADER, "b")],
    )?;
    if reply.status != 400 {
        return Err(format!("a repeated X-Api-Key: expected 400, got {}", reply.status));
    }
    let long = "k".repeat(MAX_KEY_LEN + 1);
    let reply =
        send(&format!("GET /api/items ({}-byte key)", long.len()), "/api/items", &[(API_KEY_HEADER, &long)])?;
    if reply.status != 431 {
        return Err(format!("an overlong X-Api-Key: expected 431, got {}", reply.status));
    }
    let reached = hits.load(Ordering::SeqCst);
    if reached != admitted {
        return Err(format!("the upstream saw {reached} requests, the proxy admitted {admitted}"));
    }
    println!(
        "\n{admitted} requests admitted, and the upstream saw {reached}: the refused ones never reached it"
    );
    println!("k-123's 6th request was refused for its key and left the IP's budget alone (5 more passed without a key);");
    println!("k-456's was refused for its IP and left k-456's budget alone");
    Ok(())
}

/// A 429 refused by `item`: `Retry-After` in whole seconds within the minute, and `RateLimit`
/// saying `r=0` and the same wait.
fn expect_429(reply: &Reply, item: &str) -> Result<(), String> {
    let wait = reply.header("retry-after");
    let ratelimit = reply.header("ratelimit");
    let seconds: u64 =
        wait.parse().map_err(|_| format!("expected 429 with Retry-After, got {} ({wait})", reply.status))?;
    let expected = format!("\"{item}\";r=0;t={seconds}");
    if reply.status != 429 || !(1..=60).contains(&seconds) || ratelimit != expected {
        return Err(format!(
            "expected 429, Retry-After 1 to 60 and RateLimit {expected}; got {}, {wait}, {ratelimit}",
            reply.status
        ));
    }
    if reply.header("ratelimit-policy") == "-" {
        return Err("a 429 without RateLimit-Policy".to_owned());
    }
    Ok(())
}

/// a pingora reverse proxy rate-limited per client IP and per API key.
#[derive(argh::FromArgs)]
struct Args {
    /// the address to listen on (default 127.0.0.1:8080; with --demo 127.0.0.1:0, a free port)
    #[argh(option)]
    listen: Option<String>,
    /// the upstream to forward to, HOST:PORT (default: a small upstream started on loopback)
    #[argh(option)]
    upstream: Option<String>,
    /// start an upstream, send requests through the proxy, print what came back and check it,
    /// then exit (0 if all was as expected)
    #[argh(switch)]
    demo: bool,
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Args = argh::from_env();
    if args.demo && args.upstream.is_some() {
        return Err("--demo starts its own upstream and counts what reaches it: leave --upstream out".into());
    }
    let (upstream, hits) = match &args.upstream {
        Some(given) => {
            let addr = given
                .to_socket_addrs()
                .map_err(|e| format!("--upstream {given}: {e}"))?
                .next()
                .ok_or(format!("--upstream {given}: no address"))?;
            (addr, Arc::new(AtomicUsize::new(0)))
        }
        None => start_upstream()?,
    };
    let listen = args.listen.as_deref().unwrap_or(if args.demo { "127.0.0.1:0" } else { "127.0.0.1:8080" });
    // pingora logs a failed bind and serves nothing, and reports no port for `:0`: bind here
    // first, for the error and the port, then hand pingora the address.
    let addr = TcpListener::bind(listen)
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let limiter = Arc::new(limiter()?);
    let gate = Gate::new(Arc::clone(&limiter), upstream)?;

    // No command line or configuration file of pingora's: its defaults (one worker thread).
    let mut server = Server::new(None)?;
    server.bootstrap();
    let mut proxy = http_proxy_service(&server.configuration, gate);
    proxy.add_tcp(&addr.to_string());
    server.add_service(proxy);
    println!("pingora gateway on http://{addr} -> upstream http://{upstream}");
    println!(
        "  per client IP: 10/min; per X-Api-Key: 5/min, on top of its IP's (no key: the IP's limit only)\n"
    );

    if args.demo {
        // Whatever happens, the demo ends within a minute.
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_secs(60));
            eprintln!("the demo did not finish within 60 s");
            std::process::exit(1);
        });
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let client = std::thread::spawn(move || {
            let outcome = demo(addr, &hits, &limiter);
            let _ = stop.send(());
            outcome
        });
        server.run(RunArgs { shutdown_signal: Box::new(StopOn(tokio::sync::Mutex::new(stopped))) });
        return match client.join() {
            Ok(outcome) => outcome.map_err(Into::into),
            Err(_) => Err("the demo's client thread panicked".into()),
        };
    }
    println!("try:");
    println!(
        "  for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{{http_code}}\\n' -H 'X-Api-Key: k-123' http://{addr}/; done"
    );
    println!("  curl -i -H 'X-Api-Key: k-123' http://{addr}/   # RateLimit and Retry-After headers");
    println!("  curl -i http://{addr}/                         # no key: the IP's limit only");
    println!("Ctrl-C to stop");
    // Returns on SIGINT (Ctrl-C: a fast shutdown), or on SIGTERM after pingora's grace period
    // (`ServerConf::grace_period_seconds`, 300 s by default).
    server.run(RunArgs::default());
    println!("shut down");
    Ok(())
}
