//! A small reverse proxy (axum) in front of an upstream it starts itself, rate-limited by
//! slidegate's tower layer:
//!
//! * every client IP: 100 requests per second, and `GET /login` 5 per minute;
//! * `/api/...`: 10 per second and 300 per minute per API key (`X-Api-Key`; requests
//!   without one share the key `anonymous`).
//!
//! `cargo run --example http_gateway --features axum` listens on `127.0.0.1:8080`
//! (`--listen ADDR` to change) and prints curl commands to try; Ctrl-C (or SIGTERM) stops it
//! cleanly. `--demo` sends those requests itself (a sixth `/login` within the minute gets the
//! 429) and exits.
//!
//! # Limits that survive a restart: `--state DIR`
//! With `--state DIR` the gateway keeps its counts across restarts (slidegate's feature
//! `serde`: [`Limiter::save`] and [`Limiter::load`]). `DIR` holds one snapshot per limiter,
//! named after it: `DIR/per-ip.snapshot`, `DIR/login.snapshot`, `DIR/api-key.snapshot`.
//!
//! * **At start** the directory is created if it is missing (a directory that cannot be
//!   created stops the gateway before it listens: better than losing the counts at
//!   shutdown), and each snapshot is loaded into its limiter before the first request. A
//!   missing file is not an error: that limiter starts empty. A file that cannot be read or
//!   does not verify (truncated, damaged, another program's) is reported, with the reason,
//!   and that limiter starts empty: the gateway still starts, as refusing to would turn a
//!   damaged file into an outage, and the worst an empty limiter does is grant one more
//!   window's budget. The bad file is left as it is until the shutdown's save replaces it.
//! * **At shutdown** (Ctrl-C or SIGTERM) the server stops taking connections and finishes
//!   the requests in flight (for at most 10 s), then each limiter is saved atomically: to a
//!   temporary file in `DIR`, synced, then renamed over the snapshot (and the directory
//!   synced), so that a crash mid-save leaves the previous snapshot whole. A save that fails
//!   is reported, the others still run, and the gateway exits 1. A `kill -9` or a crash
//!   saves nothing: the next start loads the last snapshot written, if any.
//!
//! What was loaded and saved is printed, per limiter (slidegate's `SnapshotStats`). Counts
//! are aged by the wall clock while the gateway is down: a client that spent its five
//! `/login`s just before a restart is still refused after it, until its minute has passed.
//!
//! # Who is being limited: `GET /slidegate/top`
//! Each limiter tracks the keys it refuses the most (`track_refused(128)`), and
//! `GET /slidegate/top` answers with the 20 most refused of each, as JSON:
//!
//! ```text
//! {"per-ip":[{"key":"203.0.113.7","refused":312}],
//!  "login":[{"key":"127.0.0.1","refused":3}],
//!  "api-key":[{"key":"k-123","refused":41}]}
//! ```
//!
//! Counts are refused requests, halved every longest window of the limiter (1 s for
//! per-ip, 1 min for login and api-key), so they tell who is being limited now. An IPv6
//! client is keyed by its /64 and listed as `2001:db8:1:2::/64`; an API key is listed as
//! UTF-8 (bytes that are not become U+FFFD), cut at 64 characters. The counts live in
//! memory only: they are not in the snapshots, and start from zero after a restart.
//!
//! The route answers peers on loopback only (`127.0.0.0/8`, `::1`, and IPv4-mapped
//! loopback); any other peer gets 404, as if there were no such route. It sits outside the
//! rate limits: the operator can read it whatever the limiters say (from an address whose
//! budget is spent, or while the key table is full), and reading it adds nothing to what it
//! reports. Only the exact path `/slidegate/top` is the admin route: any other spelling
//! (`//slidegate/top`) is an ordinary request, limited and proxied.
//!
//! # The restart, end to end: `--demo --state DIR`
//! With `--state DIR`, `--demo` runs its in-process demo (whose gateway neither loads nor
//! saves) and then a restart check through this binary: it removes the snapshots a previous
//! run left in `DIR`, starts a child gateway `--listen 127.0.0.1:0 --state DIR`, sends it
//! five `GET /login` (all 200), stops it with SIGTERM (it saves), starts a second child on
//! the same `DIR` and checks that its first `/login` is refused (429 with `Retry-After`),
//! then prints its `/slidegate/top`. Every step has a time limit; a child that hangs is
//! killed and the demo exits 1. (Unix only: elsewhere the check is skipped.)

use std::fs::{self, File};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, OriginalUri, State};
use axum::http::{header, Method, Request, Response, StatusCode, Uri};
use axum::response::IntoResponse;
use axum::routing::any;
use axum::Router;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use slidegate::tower::{HeaderKey, PeerIp, RateLimitLayer};
use slidegate::{Limit, Limiter, SnapshotError, SnapshotStats};
use tokio::net::TcpListener;

type Error = Box<dyn std::error::Error>;
type HttpClient = Client<HttpConnector, Body>;

#[derive(Clone)]
struct Upstream {
    addr: SocketAddr,
    client: HttpClient,
}

/// Forwards the request, as the client sent it, to the upstream.
async fn proxy(
    State(upstream): State<Upstream>,
    OriginalUri(original): OriginalUri,
    mut req: Request<Body>,
) -> Result<Response<Body>, StatusCode> {
    let path = original.path_and_query().map_or("/", |p| p.as_str());
    let uri: Uri = format!("http://{}{path}", upstream.addr).parse().map_err(|_| StatusCode::BAD_REQUEST)?;
    *req.uri_mut() = uri;
    let response = upstream.client.request(req).await.map_err(|_| StatusCode::BAD_GATEWAY)?;
    Ok(response.map(Body::new))
}

/// The upstream: answers every request with what it saw.
async fn start_upstream() -> io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = Router::new().fallback(|req: Request<Body>| async move {
        format!("upstream saw {} {}\n", req.method(), req.uri())
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// The most keys (client IPs, API keys) each limiter holds at once. Both come from
/// clients, and the `X-Api-Key` header is whatever a client sends: without a bound, random
/// values would grow the limiters without end. At the bound a new key gets a 503 until idle
/// ones are swept (a key idle for its longest window holds no count).
const MAX_KEYS: usize = 100_000;
/// How many refused keys each limiter keeps track of, and how many `/slidegate/top` lists.
const TRACK_REFUSED: usize = 128;
const TOP: usize = 20;
/// The admin route, outside the rate limits, for loopback peers only.
const TOP_PATH: &str = "/slidegate/top";
/// The longest an API key is listed in `/slidegate/top`, in characters.
const TOP_KEY_CHARS: usize = 64;
/// How long a shutdown waits for the requests in flight before it saves anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// The names of the limiters: their `RateLimit` items, snapshot files and `/slidegate/top`
/// fields.
const NAMES: [&str; 3] = ["per-ip", "login", "api-key"];

/// The gateway's three limiters, shared by the rate-limit layers, the admin route and the
/// snapshots.
#[derive(Clone)]
struct Limiters {
    per_ip: Arc<Limiter<IpAddr>>,
    login: Arc<Limiter<IpAddr>>,
    api_key: Arc<Limiter<Vec<u8>>>,
}

impl Limiters {
    fn new() -> Result<Limiters, slidegate::ConfigError> {
        let per_ip = Limiter::<IpAddr>::builder()
            .name(NAMES[0])
            .limit(Limit::per_second(100))
            .max_keys(MAX_KEYS)
            .track_refused(TRACK_REFUSED)
            .build()?;
        let login = Limiter::<IpAddr>::builder()
            .name(NAMES[1])
            .limit(Limit::per_minute(5))
            .max_keys(MAX_KEYS)
            .track_refused(TRACK_REFUSED)
            .build()?;
        let api_key = Limiter::<Vec<u8>>::builder()
            .name(NAMES[2])
            .limit(Limit::per_second(10))
            .limit(Limit::per_minute(300))
            .max_keys(MAX_KEYS)
            .track_refused(TRACK_REFUSED)
            .build()?;
        Ok(Limiters { per_ip: Arc::new(per_ip), login: Arc::new(login), api_key: Arc::new(api_key) })
    }

    /// Loads each limiter's snapshot from `dir`, printing what it did. Never fails: a
    /// missing or bad file leaves its limiter empty (see the module docs).
    fn load(&self, dir: &Path) {
        println!("loading state from {}:", dir.display());
        load_file(dir, NAMES[0], |file| self.per_ip.load(file));
        load_file(dir, NAMES[1], |file| self.login.load(file));
        load_file(dir, NAMES[2], |file| self.api_key.load(file));
    }

    /// Saves each limiter's snapshot to `dir`, atomically, printing what it did; all three
    /// are tried, and any failure is returned.
    fn save(&self, dir: &Path) -> Result<(), Error> {
        println!("saving state to {}:", dir.display());
        let saved = [
            save_file(dir, NAMES[0], |file| self.per_ip.save(file)),
            save_file(dir, NAMES[1], |file| self.login.save(file)),
            save_file(dir, NAMES[2], |file| self.api_key.save(file)),
        ];
        let failed: Vec<&str> =
            NAMES.iter().zip(&saved).filter(|(_, ok)| ok.is_err()).map(|(name, _)| *name).collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(format!("could not save {}", failed.join(", ")).into())
        }
    }

    /// `/slidegate/top`'s body: each limiter's most refused keys, as JSON.
    fn top_json(&self) -> String {
        let ip = |ip: &IpAddr| match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("{v6}/64"),
        };
        let api_key = |key: &Vec<u8>| String::from_utf8_lossy(key).chars().take(TOP_KEY_CHARS).collect();
        format!(
            "{{\"{}\":{},\n \"{}\":{},\n \"{}\":{}}}\n",
            NAMES[0],
            json_list(self.per_ip.top_refused(TOP), ip),
            NAMES[1],
            json_list(self.login.top_refused(TOP), ip),
            NAMES[2],
            json_list(self.api_key.top_refused(TOP), api_key),
        )
    }
}

fn snapshot_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.snapshot"))
}

fn keys(n: u64) -> String {
    if n == 1 {
        "1 key".to_owned()
    } else {
        format!("{n} keys")
    }
}

/// Loads `dir/name.snapshot` through `load`, if there is one, and prints the outcome.
fn load_file(dir: &Path, name: &str, load: impl FnOnce(File) -> Result<SnapshotStats, SnapshotError>) {
    let path = snapshot_path(dir, name);
    let shown = path.display();
    match File::open(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            println!("  {name:<8} no snapshot at {shown}: starts empty");
        }
        Err(e) => println!("  {name:<8} cannot open {shown} ({e}): starts empty"),
        Ok(file) => match load(file) {
            Ok(s) => {
                // Keys moved or removed by checks meanwhile: none before the first request.
                let raced = if s.raced > 0 { format!(", {} raced", s.raced) } else { String::new() };
                println!(
                    "  {name:<8} loaded {shown}: {} ({} inserted, {} expired, {} not inserted: table full{raced}), {} bytes",
                    keys(s.keys),
                    s.inserted,
                    s.expired,
                    s.full,
                    s.bytes
                );
            }
            Err(e) => println!(
                "  {name:<8} cannot load {shown} ({e}): starts empty; the file is replaced at shutdown"
            ),
        },
    }
}

/// Saves through `save` to `dir/name.snapshot`, atomically, and prints the outcome.
fn save_file(
    dir: &Path,
    name: &str,
    save: impl FnOnce(&mut File) -> Result<SnapshotStats, SnapshotError>,
) -> Result<SnapshotStats, Error> {
    let path = snapshot_path(dir, name);
    // In the same directory, so that the rename cannot cross file systems; named by the
    // process, so that two gateways on one directory (a mistake) do not write one file.
    let temporary = dir.join(format!(".{name}.snapshot.{}.tmp", std::process::id()));
    let saved = write_then_rename(&temporary, &path, save);
    match &saved {
        Ok(s) => println!("  {name:<8} saved {}: {}, {} bytes", path.display(), keys(s.keys), s.bytes),
        Err(e) => {
            let _ = fs::remove_file(&temporary);
            println!(
                "  {name:<8} cannot save {} ({e}); the previous snapshot, if any, is unchanged",
                path.display()
            );
        }
    }
    saved
}

fn write_then_rename(
    temporary: &Path,
    path: &Path,
    save: impl FnOnce(&mut File) -> Result<SnapshotStats, SnapshotError>,
) -> Result<SnapshotStats, Error> {
    let mut file = File::create(temporary)?;
    let stats = save(&mut file)?;
    file.sync_all()?;
    drop(file);
    fs::rename(temporary, path)?;
    // The rename itself is durable once the directory is synced (on Unix a directory can be
    // opened and synced; elsewhere the rename is as durable as the platform makes it).
    #[cfg(unix)]
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(stats)
}

/// A JSON list of `{"key":..., "refused":...}` objects.
fn json_list<K>(top: Vec<(K, u64)>, label: impl Fn(&K) -> String) -> String {
    let items: Vec<String> = top
        .iter()
        .map(|(key, refused)| format!("{{\"key\":{},\"refused\":{refused}}}", json_string(&label(key))))
        .collect();
    format!("[{}]", items.join(","))
}

/// `s` as a JSON string: quotes, backslashes and control characters escaped.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `GET /slidegate/top`: the most refused keys of each limiter, to loopback peers only.
async fn top(
    State(limiters): State<Limiters>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    method: Method,
) -> Response<Body> {
    if !peer.ip().to_canonical().is_loopback() {
        return StatusCode::NOT_FOUND.into_response();
    }
    if method != Method::GET && method != Method::HEAD {
        return (StatusCode::METHOD_NOT_ALLOWED, [(header::ALLOW, "GET, HEAD")]).into_response();
    }
    let headers = [(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-store")];
    (headers, limiters.top_json()).into_response()
}

/// The gateway's router: the per-IP layer outside, the per-API-key layer on `/api`, and the
/// admin route outside both.
fn gateway(upstream: Upstream, limiters: &Limiters) -> Result<Router, Error> {
    // Every spelling of /login (//login, /%6Cogin, /login;x=1) counts as /login; a dot
    // segment (/api/../login) is refused with 400.
    let ip_layer = RateLimitLayer::new(NAMES[0], Arc::clone(&limiters.per_ip), PeerIp)?.route(
        "/login",
        NAMES[1],
        Arc::clone(&limiters.login),
    )?;
    let key_layer =
        RateLimitLayer::new(NAMES[2], Arc::clone(&limiters.api_key), HeaderKey::new("x-api-key")?)?
            .fallback_key(b"anonymous".to_vec());
    let api = Router::new().fallback(proxy).layer(key_layer);
    let limited = Router::new().nest("/api", api).fallback(proxy).layer(ip_layer).with_state(upstream);
    // Added after `layer`: the layers do not wrap it.
    Ok(limited.route(TOP_PATH, any(top).with_state(limiters.clone())))
}

/// How long the demos wait for any one response.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends `req`, waiting at most [`REQUEST_TIMEOUT`].
async fn send(client: &HttpClient, req: Request<Body>) -> Result<Response<hyper::body::Incoming>, Error> {
    let uri = req.uri().clone();
    match tokio::time::timeout(REQUEST_TIMEOUT, client.request(req)).await {
        Ok(response) => Ok(response?),
        Err(_) => Err(format!("no response to GET {uri} within {REQUEST_TIMEOUT:?}").into()),
    }
}

async fn get(client: &HttpClient, url: &str) -> Result<Response<hyper::body::Incoming>, Error> {
    send(client, Request::get(url).body(Body::empty())?).await
}

/// A response's body as text, read within [`REQUEST_TIMEOUT`].
async fn text(response: Response<hyper::body::Incoming>) -> Result<String, Error> {
    let body = Body::new(response.into_body());
    match tokio::time::timeout(REQUEST_TIMEOUT, axum::body::to_bytes(body, 1 << 20)).await {
        Ok(bytes) => Ok(String::from_utf8_lossy(&bytes?).into_owned()),
        Err(_) => Err(format!("no whole body within {REQUEST_TIMEOUT:?}").into()),
    }
}

/// A header's values, joined, or `-`.
fn header_of(r: &Response<hyper::body::Incoming>, name: &str) -> String {
    let values: Vec<&str> = r.headers().get_all(name).iter().filter_map(|v| v.to_str().ok()).collect();
    if values.is_empty() {
        "-".to_owned()
    } else {
        values.join(", ")
    }
}

fn show(what: &str, r: &Response<hyper::body::Incoming>) {
    println!(
        "{what:<28} {} RateLimit: {}  Retry-After: {}",
        r.status().as_u16(),
        header_of(r, "ratelimit"),
        header_of(r, "retry-after")
    );
}

/// Sends the requests the printed curl commands would, and prints what came back.
async fn demo(addr: SocketAddr) -> Result<(), Error> {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let mut statuses = Vec::new();
    for i in 1..=6 {
        let r = get(&client, &format!("http://{addr}/login")).await?;
        show(&format!("GET /login #{i}"), &r);
        statuses.push(r.status());
    }
    for i in 1..=3 {
        let req = Request::get(format!("http://{addr}/api/items"))
            .header("x-api-key", "k-123")
            .body(Body::empty())?;
        let r = send(&client, req).await?;
        show(&format!("GET /api/items (k-123) #{i}"), &r);
    }
    let r = get(&client, &format!("http://{addr}{TOP_PATH}")).await?;
    let status = r.status();
    let top = text(r).await?;
    println!("GET {TOP_PATH}          {}\n{top}", status.as_u16());
    if !(statuses[..5].iter().all(|s| s.is_success()) && statuses[5] == StatusCode::TOO_MANY_REQUESTS) {
        return Err(format!("unexpected statuses for /login: {statuses:?}").into());
    }
    if status != StatusCode::OK || !top.contains("\"login\":[{\"key\":\"127.0.0.1\",\"refused\":1}]") {
        return Err(format!("{TOP_PATH} should list 127.0.0.1 refused once by login: {status} {top}").into());
    }
    println!("the sixth /login within the minute got the 429, as configured, and {TOP_PATH} lists it");
    Ok(())
}

/// The restart check of `--demo --state DIR`, through child processes of this binary.
#[cfg(unix)]
mod restart {
    use std::io::{BufRead, BufReader};
    use std::path::Path;
    use std::process::{Child, Command, Stdio};
    use std::thread::JoinHandle;
    use std::time::Instant;

    use super::*;

    /// How long a child may take to print its address, and to exit after SIGTERM.
    const START_TIMEOUT: Duration = Duration::from_secs(30);
    const STOP_TIMEOUT: Duration = Duration::from_secs(20);

    /// A child gateway, killed (SIGKILL) if it is still running when dropped: a demo that
    /// fails leaves no process behind.
    struct ChildGateway {
        label: &'static str,
        child: Child,
        /// Copies the child's output to ours, each line marked with `label`.
        output: Option<JoinHandle<()>>,
    }

    impl Drop for ChildGateway {
        fn drop(&mut self) {
            if let Ok(None) = self.child.try_wait() {
                println!("{}: still running, killed", self.label);
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
    }

    impl ChildGateway {
        /// Starts `exe --listen 127.0.0.1:0 --state dir` and waits for the address it prints.
        async fn start(
            exe: &Path,
            dir: &Path,
            label: &'static str,
        ) -> Result<(ChildGateway, SocketAddr), Error> {
            println!("{label}: starting {} --listen 127.0.0.1:0 --state {}", exe.display(), dir.display());
            let mut child = Command::new(exe)
                .args(["--listen", "127.0.0.1:0", "--state"])
                .arg(dir)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()?;
            let stdout = child.stdout.take().ok_or("the child has no stdout")?;
            let (found, address) = tokio::sync::oneshot::channel::<SocketAddr>();
            let output = std::thread::spawn(move || {
                let (mut found, mut addr) = (Some(found), None);
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    println!("    {label} | {line}");
                    // "gateway on http://ADDR -> upstream http://..."
                    if let Some(rest) = line.strip_prefix("gateway on http://") {
                        addr = rest.split_whitespace().next().and_then(|a| a.parse::<SocketAddr>().ok());
                    }
                    // Passed on once the child has printed what it prints at start (the last
                    // line is "Ctrl-C ... to stop"), so that its lines and ours do not mix.
                    if let (Some(addr), true) = (addr, line.starts_with("Ctrl-C")) {
                        if let Some(found) = found.take() {
                            let _ = found.send(addr);
                        }
                    }
                }
            });
            let mut gateway = ChildGateway { label, child, output: Some(output) };
            match tokio::time::timeout(START_TIMEOUT, address).await {
                Ok(Ok(addr)) => Ok((gateway, addr)),
                Ok(Err(_)) => {
                    let status = gateway.child.wait()?;
                    Err(format!("{label} exited ({status}) without printing its address").into())
                }
                Err(_) => Err(format!("{label} printed no address within {START_TIMEOUT:?}").into()),
            }
        }

        /// Sends SIGTERM and waits for a clean exit (status 0), within [`STOP_TIMEOUT`].
        async fn terminate(mut self) -> Result<(), Error> {
            let pid = self.child.id().to_string();
            println!("{}: kill -TERM {pid}", self.label);
            // std's `Child::kill` sends SIGKILL, which would skip the save.
            let sent = Command::new("kill").args(["-TERM", &pid]).status()?;
            if !sent.success() {
                return Err(format!("kill -TERM {pid} failed: {sent}").into());
            }
            let deadline = Instant::now() + STOP_TIMEOUT;
            let status = loop {
                if let Some(status) = self.child.try_wait()? {
                    break status;
                }
                if Instant::now() >= deadline {
                    // Dropping `self` kills it.
                    return Err(
                        format!("{} did not exit within {STOP_TIMEOUT:?} of SIGTERM", self.label).into()
                    );
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            // The child has exited, so its output ends: the copy finishes.
            if let Some(output) = self.output.take() {
                let _ = output.join();
            }
            if status.success() {
                println!("{}: exited cleanly ({status})", self.label);
                Ok(())
            } else {
                Err(format!("{} exited with {status}, not 0", self.label).into())
            }
        }
    }

    /// Exhausts `/login` on one child, stops it with SIGTERM, and checks that a second child
    /// on the same state directory still refuses `/login`.
    pub(super) async fn check(dir: &Path) -> Result<(), Error> {
        println!("\n== restart check: child gateways of this binary on --state {}", dir.display());
        fs::create_dir_all(dir)?;
        // A previous run's counts would refuse the first child's /login.
        for name in NAMES {
            let path = snapshot_path(dir, name);
            match fs::remove_file(&path) {
                Ok(()) => println!("removed the previous run's {}", path.display()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("cannot remove {}: {e}", path.display()).into()),
            }
        }
        let exe = std::env::current_exe()?;

        let (first, addr) = ChildGateway::start(&exe, dir, "child 1").await?;
        println!("child 1: listening on {addr}");
        {
            let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
            for i in 1..=5 {
                let r = get(&client, &format!("http://{addr}/login")).await?;
                show(&format!("child 1: GET /login #{i}"), &r);
                if r.status() != StatusCode::OK {
                    return Err(format!("child 1: /login #{i} got {}, not 200", r.status()).into());
                }
            }
            // The client, and its pooled connections, go before the child is stopped.
        }
        first.terminate().await?;
        for name in NAMES {
            let path = snapshot_path(dir, name);
            let len =
                fs::metadata(&path).map_err(|e| format!("child 1 saved no {}: {e}", path.display()))?.len();
            println!("on disk: {} ({len} bytes)", path.display());
        }

        let (second, addr) = ChildGateway::start(&exe, dir, "child 2").await?;
        println!("child 2: listening on {addr}");
        {
            let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
            let r = get(&client, &format!("http://{addr}/login")).await?;
            show("child 2: GET /login #6", &r);
            if r.status() != StatusCode::TOO_MANY_REQUESTS || r.headers().get("retry-after").is_none() {
                return Err(format!(
                    "child 2: the sixth /login got {} (Retry-After: {}), not 429 with a Retry-After: \
                     the counts did not survive the restart",
                    r.status(),
                    header_of(&r, "retry-after")
                )
                .into());
            }
            let r = get(&client, &format!("http://{addr}{TOP_PATH}")).await?;
            let status = r.status();
            let top = text(r).await?;
            println!("child 2: GET {TOP_PATH} {}\n{top}", status.as_u16());
            if status != StatusCode::OK || !top.contains("\"login\":[{\"key\":\"127.0.0.1\"") {
                return Err(
                    format!("child 2: {TOP_PATH} should list 127.0.0.1 under login: {status} {top}").into()
                );
            }
        }
        second.terminate().await?;
        println!(
            "\nthe sixth /login, sent to a restarted gateway, got the 429: the counts survived the restart"
        );
        Ok(())
    }
}

/// Waits for Ctrl-C or (on Unix) SIGTERM. Made before the gateway prints its address, so a
/// SIGTERM sent as soon as it is up reaches the save instead of killing the process.
struct Shutdown {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Shutdown {
    fn new() -> io::Result<Shutdown> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Shutdown {
                interrupt: signal(SignalKind::interrupt())?,
                terminate: signal(SignalKind::terminate())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Shutdown {})
    }

    /// Which signal came.
    async fn wait(&mut self) -> io::Result<&'static str> {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.interrupt.recv() => Ok("Ctrl-C"),
                _ = self.terminate.recv() => Ok("SIGTERM"),
            }
        }
        #[cfg(not(unix))]
        {
            tokio::signal::ctrl_c().await?;
            Ok("Ctrl-C")
        }
    }
}

/// a reverse proxy rate-limited per client IP and per API key.
#[derive(argh::FromArgs)]
struct Args {
    /// the address to listen on (default 127.0.0.1:8080)
    #[argh(option, default = "String::from(\"127.0.0.1:8080\")")]
    listen: String,
    /// send the printed requests itself, then exit; with --state, then check a restart
    /// through child gateways on that directory
    #[argh(switch)]
    demo: bool,
    /// a directory for the limiters' snapshots (per-ip.snapshot, login.snapshot,
    /// api-key.snapshot): loaded at start, saved on Ctrl-C or SIGTERM
    #[argh(option)]
    state: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args: Args = argh::from_env();
    let listen = args.listen.as_str();
    // In the demo, Ctrl-C stops the demo as it would any program.
    let mut shutdown = if args.demo { None } else { Some(Shutdown::new()?) };
    let limiters = Limiters::new()?;
    // The demo's own gateway neither loads nor saves: the directory is the restart check's.
    let state = if args.demo { None } else { args.state.as_deref() };
    if let Some(dir) = state {
        fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create the state directory {}: {e}", dir.display()))?;
        limiters.load(dir);
    }
    let upstream = Upstream {
        addr: start_upstream().await?,
        client: Client::builder(TokioExecutor::new()).build_http(),
    };
    let listener = TcpListener::bind(listen).await.map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let addr = listener.local_addr()?;
    let app = gateway(upstream.clone(), &limiters)?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    println!("gateway on http://{addr} -> upstream http://{}", upstream.addr);
    println!("  per client IP: 100/s; GET /login: 5/min; /api: 10/s and 300/min per X-Api-Key\n");
    if args.demo {
        let outcome = demo(addr).await;
        let _ = stop.send(());
        server.await??;
        outcome?;
        match &args.state {
            #[cfg(unix)]
            Some(dir) => restart::check(dir).await?,
            #[cfg(not(unix))]
            Some(_) => println!("\nthe restart check sends SIGTERM, so it runs on Unix only: skipped"),
            None => {}
        }
        return Ok(());
    }
    println!("try:");
    println!(
        "  for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{{http_code}}\\n' http://{addr}/login; done"
    );
    println!("  curl -i http://{addr}/login            # RateLimit and Retry-After headers");
    println!("  curl -i -H 'X-Api-Key: k-123' http://{addr}/api/items");
    println!("  for i in $(seq 12); do curl -s -o /dev/null -w '%{{http_code}} ' -H 'X-Api-Key: k-123' http://{addr}/api/items; done; echo");
    println!("  curl -s http://{addr}{TOP_PATH}       # the most refused keys (loopback only)");
    match state {
        Some(dir) => println!("Ctrl-C (or SIGTERM) to stop and save the counts to {}", dir.display()),
        None => println!("Ctrl-C (or SIGTERM) to stop (the counts are not kept: --state DIR keeps them)"),
    }
    let signal = match shutdown.as_mut() {
        Some(shutdown) => shutdown.wait().await?,
        None => "stop",
    };
    println!("{signal}: shutting down");
    let _ = stop.send(());
    // The requests in flight finish (and count) before the save, for at most SHUTDOWN_GRACE.
    let served = match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
        Ok(served) => served.map_err(Error::from).and_then(|r| r.map_err(Error::from)),
        Err(_) => {
            println!("requests still in flight after {SHUTDOWN_GRACE:?}: saving without them");
            Ok(())
        }
    };
    let saved = match state {
        Some(dir) => limiters.save(dir),
        None => Ok(()),
    };
    served?;
    saved
}
