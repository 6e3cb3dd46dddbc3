//! Real servers on loopback for the backend tests: a standalone Redis, a three-primary
//! Redis Cluster and a memcached. `.ci/run` starts them and exports their addresses
//! (`SLIDEGATE_REDIS_URL`, `SLIDEGATE_REDIS_CLUSTER`, `SLIDEGATE_MEMCACHED`); without
//! those, a test starts its own from the binaries on the PATH.
//!
//! The backend test binaries run on `libtest-mimic` (`harness = false`), each test a
//! [`trial`]: one whose server cannot be had is reported `ignored` with the reason (so the
//! runner's summary line counts it, and `cargo test` stays green on a machine without the
//! servers), unless `SLIDEGATE_REQUIRE_SERVERS` is set (CI), where it fails.

use std::future::Future;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// Why a server cannot be had.
fn unavailable(what: &str, why: &str) -> String {
    format!("{what} unavailable: {why}")
}

/// A test on a server: `server` gets it (or says why not), `body` runs on a fresh tokio
/// runtime (current-thread for `worker_threads` 0, else multi-thread). Without the server
/// the trial is ignored with the reason, or fails if `SLIDEGATE_REQUIRE_SERVERS` is set.
pub fn trial<S, F>(
    name: &str,
    worker_threads: usize,
    server: impl FnOnce() -> Result<S, String> + Send + 'static,
    body: impl FnOnce(S) -> F + Send + 'static,
) -> libtest_mimic::Trial
where
    F: Future<Output = ()>,
{
    libtest_mimic::Trial::ignorable_test(name, move || {
        let server = match server() {
            Ok(server) => server,
            Err(why) if std::env::var_os("SLIDEGATE_REQUIRE_SERVERS").is_some() => {
                return Err(format!("{why} (SLIDEGATE_REQUIRE_SERVERS is set)").into());
            }
            Err(why) => {
                return Ok(libtest_mimic::Completion::ignored_with(format!(
                    "{why}; install it, or run .ci/run"
                )))
            }
        };
        let mut runtime = if worker_threads == 0 {
            tokio::runtime::Builder::new_current_thread()
        } else {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(worker_threads);
            builder
        };
        let runtime = runtime.enable_all().build().map_err(|e| format!("tokio runtime: {e}"))?;
        runtime.block_on(body(server));
        Ok(libtest_mimic::Completion::Completed)
    })
}

/// Runs the trials with the command line's arguments (filters, `--list`, ...).
pub fn run(trials: Vec<libtest_mimic::Trial>) -> std::process::ExitCode {
    libtest_mimic::run(&libtest_mimic::Arguments::from_args(), trials).exit_code()
}

/// A free port that a cluster node can use too: Redis Cluster also listens on port + 10000,
/// so the port must be at most 55535 and port + 10000 free as well (a CI run once drew 59031).
fn free_port() -> Option<u16> {
    (0..1000).find_map(|_| {
        let port = TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
        let bus = port.checked_add(10_000).filter(|_| port <= 55_535)?;
        TcpListener::bind(("127.0.0.1", bus)).ok().map(|_| port)
    })
}

fn binary(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| PathBuf::from(d).join(name)).find(|p| p.is_file())
}

/// Sends `command` (RESP inline) and returns the first reply line.
pub fn redis_command(port: u16, command: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(format!("{command}\r\n").as_bytes()).ok()?;
    let mut buf = [0u8; 4096];
    let n = stream.read(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Waits until the redis-server `child` answers on `port`. Another test's server may have
/// taken the port between `free_port` and the start (then `child` exits): only an answer
/// naming `child`'s process id counts.
fn wait_for(port: u16, child: &mut Child) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    let ours = format!("process_id:{}\r", child.id());
    while Instant::now() < deadline {
        if redis_command(port, "INFO server").is_some_and(|r| r.contains(&ours)) {
            return true;
        }
        if !matches!(child.try_wait(), Ok(None)) {
            return false;
        }
        sleep(Duration::from_millis(20));
    }
    eprintln!("redis-server on port {port} did not answer");
    false
}

/// A redis-server this test owns (stopped on drop), persisting to an append-only file in
/// its own directory so a restart finds its data again.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    args: Vec<String>,
}

impl RedisServer {
    pub fn start(extra: &[&str]) -> Result<RedisServer, String> {
        if binary("redis-server").is_none() {
            return Err(unavailable("redis-server", "not found on PATH"));
        }
        // A port another test's server took first: try another.
        let mut last = unavailable("redis-server", "it did not start");
        for _ in 0..3 {
            match RedisServer::start_on_a_free_port(extra) {
                Ok(server) => return Ok(server),
                Err(why) => last = why,
            }
        }
        Err(last)
    }

    fn start_on_a_free_port(extra: &[&str]) -> Result<RedisServer, String> {
        let port = free_port().ok_or_else(|| unavailable("redis-server", "no free port"))?;
        let dir = std::env::temp_dir().join(format!("slidegate-redis-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| unavailable("redis-server", &e.to_string()))?;
        let mut args: Vec<String> = vec![
            "--port".into(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            dir.to_string_lossy().into_owned(),
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            "yes".into(),
            "--appendfsync".into(),
            "always".into(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let mut server = RedisServer { child: None, port, dir, args };
        if !server.launch() {
            return Err(unavailable("redis-server", "it did not start"));
        }
        Ok(server)
    }

    fn launch(&mut self) -> bool {
        let Some(bin) = binary("redis-server") else { return false };
        let child = Command::new(bin).args(&self.args).stdout(Stdio::null()).stderr(Stdio::null()).spawn();
        let Ok(mut child) = child else { return false };
        let up = wait_for(self.port, &mut child);
        self.child = Some(child);
        up
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Stops the server (its data is on disk).
    pub fn stop(&mut self) {
        let _ = redis_command(self.port, "SHUTDOWN");
        if let Some(mut child) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and directory.
    pub fn restart(&mut self) -> bool {
        self.launch()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A standalone Redis: the CI's, or one started here.
pub enum Standalone {
    Given(String),
    Own(RedisServer),
}

impl Standalone {
    pub fn get() -> Result<Standalone, String> {
        if let Ok(url) = std::env::var("SLIDEGATE_REDIS_URL") {
            return Ok(Standalone::Given(url));
        }
        RedisServer::start(&[]).map(Standalone::Own)
    }

    pub fn url(&self) -> String {
        match self {
            Standalone::Given(url) => url.clone(),
            Standalone::Own(server) => server.url(),
        }
    }
}

/// A three-primary Redis Cluster: the CI's, or one built here.
pub enum Cluster {
    Given(Vec<String>),
    Own(Vec<RedisServer>),
}

impl Cluster {
    pub fn get() -> Result<Cluster, String> {
        if let Ok(urls) = std::env::var("SLIDEGATE_REDIS_CLUSTER") {
            return Ok(Cluster::Given(urls.split(',').map(str::to_owned).collect()));
        }
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::start(&["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"]))
            .collect::<Result<_, _>>()?;
        let Some(cli) = binary("redis-cli") else {
            return Err(unavailable("redis-cli", "not found on PATH (needed to create the cluster)"));
        };
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let created = Command::new(cli)
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !created.is_ok_and(|s| s.success()) {
            return Err(unavailable("Redis Cluster", "redis-cli --cluster create failed"));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let ok = nodes.iter().all(|n| {
                redis_command(n.port, "CLUSTER INFO").is_some_and(|r| r.contains("cluster_state:ok"))
            });
            if ok {
                return Ok(Cluster::Own(nodes));
            }
            sleep(Duration::from_millis(50));
        }
        Err(unavailable("Redis Cluster", "the cluster did not reach cluster_state:ok"))
    }

    pub fn urls(&self) -> Vec<String> {
        match self {
            Cluster::Given(urls) => urls.clone(),
            Cluster::Own(nodes) => nodes.iter().map(RedisServer::url).collect(),
        }
    }
}

/// A memcached: the CI's (`host:port`), or one started here (killed on drop).
pub struct Memcached {
    child: Option<Child>,
    pub addr: String,
}

impl Memcached {
    pub fn get() -> Result<Memcached, String> {
        if let Ok(addr) = std::env::var("SLIDEGATE_MEMCACHED") {
            return Ok(Memcached { child: None, addr });
        }
        Memcached::start()
    }

    /// A memcached of this test's own (to stop).
    pub fn start() -> Result<Memcached, String> {
        let Some(bin) = binary("memcached") else {
            return Err(unavailable("memcached", "not found on PATH"));
        };
        // A port another test's server took first: try another.
        let mut last = unavailable("memcached", "it did not start");
        for _ in 0..3 {
            match Memcached::start_on_a_free_port(&bin) {
                Ok(server) => return Ok(server),
                Err(why) => last = why,
            }
        }
        Err(last)
    }

    fn start_on_a_free_port(bin: &std::path::Path) -> Result<Memcached, String> {
        let port = free_port().ok_or_else(|| unavailable("memcached", "no free port"))?;
        let mut command = Command::new(bin);
        command.args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"]);
        // memcached refuses to run as root without -u.
        command.args(["-u", "root"]);
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| unavailable("memcached", &e.to_string()))?;
        let addr = format!("127.0.0.1:{port}");
        // Only an answer naming our child's process id counts (see `wait_for`).
        let ours = format!("STAT pid {}\r", child.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if memcached_stats(&addr).is_some_and(|r| r.contains(&ours)) {
                return Ok(Memcached { child: Some(child), addr });
            }
            if !matches!(child.try_wait(), Ok(None)) {
                break;
            }
            sleep(Duration::from_millis(20));
        }
        // Dropping it kills it.
        drop(Memcached { child: Some(child), addr });
        Err(unavailable("memcached", "it did not start"))
    }
}

/// The first reply to `stats` (its first lines hold `STAT pid`).
fn memcached_stats(addr: &str) -> Option<String> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(b"stats\r\n").ok()?;
    let mut buf = [0u8; 4096];
    let n = stream.read(&mut buf).ok()?;
    Some(String::from_utf8_lossy(buf.get(..n)?).into_owned())
}

impl Drop for Memcached {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// slidegate's Redis module (crate `slidegate-redis-module`): `SLIDEGATE_REDIS_MODULE`, or
/// the release build in this workspace's target directory.
pub fn redis_module() -> Result<String, String> {
    let path = std::env::var("SLIDEGATE_REDIS_MODULE")
        .unwrap_or_else(|_| format!("{}/target/release/libslidegate_redis.so", env!("CARGO_MANIFEST_DIR")));
    if std::path::Path::new(&path).exists() {
        Ok(path)
    } else {
        Err(unavailable(
            "slidegate's Redis module",
            &format!("{path} is not built (cargo build --release -p slidegate-redis-module)"),
        ))
    }
}
