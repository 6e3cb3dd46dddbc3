//! Re-runs every measurement the README and the guides print and writes each into its place:
//! `cargo run --release -p slidegate-tools --bin figures` from the repository root (about 50
//! minutes on 2 cores, 10 of them the soak's long run; `--only NAME` for one report).
//!
//! A place is a region of a markdown file, the lines between `<!-- NAME:begin -->` and
//! `<!-- NAME:end -->`. Each report's region gets a line saying which command produced it, on
//! which machine, on which date and at which commit, then the report's own markdown. The
//! README's `headline` region is the main rows of `bench_report` and `memory`; `accuracy`
//! also redraws `docs/accuracy.svg`. Every file written is named on the way out.
//!
//! The Redis and memcached reports start servers of their own on loopback (`redis-server`
//! with redis-cell's module and slidegate's, built here; `memcached`), and `fuzz` runs
//! `.ci/fuzz` (a nightly toolchain). A report that cannot run (a server missing), or that
//! fails, leaves its regions as they were and makes the command exit 1.
//!
//! `--quick` runs every report in its quick mode, each failing if its bound breaks, checks that
//! every region has a report and every report a region, and writes nothing: `.ci/run` runs it
//! that way.

use std::collections::BTreeMap;
use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// Re-runs every measurement the README and the guides print, and writes it into them.
#[derive(argh::FromArgs)]
struct Args {
    /// run each report in its quick mode and check the regions; write nothing
    #[argh(switch)]
    quick: bool,
    /// run only this report (repeatable): bench_report, memory, idle, accuracy,
    /// gateway_report, redis_report, memcached, fuzz, spray, room, snapshot, churn, soak
    #[argh(option)]
    only: Vec<String>,
    /// seconds of fuzzing per target (default 300; 5 with --quick)
    #[argh(option)]
    fuzz_seconds: Option<u64>,
}

/// The files that hold regions.
const DOCS: &[&str] = &[
    "README.md",
    "docs/semantics.md",
    "docs/gateway.md",
    "docs/policies.md",
    "docs/scaling-out.md",
    "docs/performance.md",
    "docs/reliability.md",
    "docs/design.md",
    "docs/testing.md",
];

/// The reports, in the order they run (the quiet, timing-sensitive ones first).
const REPORTS: &[&str] = &[
    "bench_report",
    "memory",
    "idle",
    "gateway_report",
    "redis_report",
    "memcached",
    "accuracy",
    "spray",
    "room",
    "snapshot",
    "churn",
    "soak",
    "fuzz",
];

/// The README's headline: these rows of `bench_report`'s first table (by their first cell)...
const HEADLINE_SPEED: &[&str] = &[
    "one hot key, admitted",
    "one hot key, refused, history in older slots",
    "one hot key, refused, history in the current slot",
    "1,000 keys, random order",
    "1 M keys random, one slot (per_second)",
    "1 M keys random, one slot, one check at a time",
    "1 M keys random, 60 slots (per_minute)",
    "1 M keys random, 60 slots, a minute of traffic in",
    "GCRA, one hot key",
    "GCRA, 1 M keys random",
    "every check a new key",
    "2 threads, one hot key",
    "1 M keys random, 10/s + 120/min + 240/h",
];
/// ...and these of `memory`'s.
const HEADLINE_MEMORY: &[&str] = &["10/s", "60/min at 1 s precision", "1000/min at 1 s precision"];

fn main() -> ExitCode {
    let args: Args = argh::from_env();
    if !Path::new("tools/src/bin/figures.rs").exists() {
        eprintln!("figures: run it from the repository root");
        return ExitCode::FAILURE;
    }
    for name in &args.only {
        if !REPORTS.contains(&name.as_str()) {
            eprintln!("figures: no report named {name:?} (reports: {})", REPORTS.join(", "));
            return ExitCode::FAILURE;
        }
    }
    let regions = match find_regions() {
        Ok(regions) => regions,
        Err(e) => {
            eprintln!("figures: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut failed = Vec::new();
    // Every region must have a report and every report a region, or a figure could go stale
    // without anyone noticing.
    for name in regions.keys() {
        if !REPORTS.contains(&name.as_str()) && name != "headline" {
            failed.push(format!("region {name:?} has no report"));
        }
    }
    for name in REPORTS.iter().chain(&["headline"]) {
        if !regions.contains_key(*name) {
            failed.push(format!("report {name} has no region in {}", DOCS.join(", ")));
        }
    }

    let context = Context::new(args.quick, args.fuzz_seconds.unwrap_or(if args.quick { 5 } else { 300 }));
    let mut outputs = BTreeMap::new();
    for &name in REPORTS {
        if !args.only.is_empty() && !args.only.iter().any(|o| o == name) {
            continue;
        }
        eprintln!("\n== figures: {name}");
        let began = Instant::now();
        match context.run(name) {
            Ok(report) => {
                if args.quick {
                    // Nothing is written: the log is where a quick run's figures are read.
                    eprintln!("{}\n\n{}", report.header, report.body);
                }
                eprintln!("== figures: {name} done in {:.0} s", began.elapsed().as_secs_f64());
                outputs.insert(name.to_string(), report);
            }
            Err(e) => {
                eprintln!("== figures: {name} FAILED: {e}");
                failed.push(format!("{name}: {e}"));
            }
        }
    }
    if let (Some(speed), Some(memory)) = (outputs.get("bench_report"), outputs.get("memory")) {
        match headline(speed, memory) {
            Ok(table) => {
                let header = format!(
                    "The main rows of `bench_report` and `memory` (the performance guide), {}; slidegate / governor below 1 is faster or smaller:",
                    context.stamp
                );
                outputs.insert("headline".into(), Report { command: String::new(), header, body: table });
            }
            Err(e) => failed.push(format!("headline: {e}")),
        }
    }

    if !args.quick {
        for (file, names) in files_with_regions(&regions) {
            let written: Vec<&str> =
                names.iter().filter(|n| outputs.contains_key(*n)).map(String::as_str).collect();
            if written.is_empty() {
                continue;
            }
            match rewrite(&file, &outputs) {
                Ok(()) => println!("updated {file}: {}", written.join(", ")),
                Err(e) => failed.push(format!("{file}: {e}")),
            }
        }
        if outputs.contains_key("accuracy") {
            println!("updated docs/accuracy.svg: accuracy");
        }
    }
    if failed.is_empty() {
        println!(
            "figures: {} report(s) run{}",
            outputs.len(),
            if args.quick { ", nothing written (--quick)" } else { "" }
        );
        ExitCode::SUCCESS
    } else {
        println!("\nfigures: FAILED\n  {}", failed.join("\n  "));
        ExitCode::FAILURE
    }
}

/// A report's markdown and how it was made.
struct Report {
    /// The command that produced it, for the header.
    command: String,
    /// The line above the body: the command, the machine, the date and the commit.
    header: String,
    body: String,
}

/// What every report shares: the mode, and the machine, date and commit it runs on.
struct Context {
    quick: bool,
    fuzz_seconds: u64,
    /// "AMD EPYC 7B13 (2 CPUs), 2026-11-24, commit 1234abc".
    stamp: String,
}

impl Context {
    fn new(quick: bool, fuzz_seconds: u64) -> Context {
        let cpu = fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                info.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|m| m.trim().to_string())
            })
            .unwrap_or_else(|| "unknown CPU".into());
        let cpus = thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let date = output(Command::new("date").args(["-u", "+%Y-%m-%d"])).unwrap_or_default();
        let commit = output(Command::new("git").args(["rev-parse", "--short", "HEAD"])).unwrap_or_default();
        // Changes to anything but the files this command writes mean the figures are not of
        // that commit alone: say so.
        let changed =
            output(Command::new("git").args(["status", "--porcelain", "--", ".", ":!README.md", ":!docs"]))
                .map(|s| !s.is_empty())
                .unwrap_or(true);
        let commit = if changed {
            format!("commit {commit} with uncommitted changes")
        } else {
            format!("commit {commit}")
        };
        Context { quick, fuzz_seconds, stamp: format!("{cpu} ({cpus} CPUs), {date}, {commit}") }
    }

    fn run(&self, name: &str) -> Result<Report, String> {
        let quick: &[&str] = if self.quick { &["--quick"] } else { &[] };
        match name {
            "bench_report" | "idle" | "spray" | "room" => self.tool(name, &[], quick),
            "memory" => self.tool(name, &[], &[]),
            "churn" => self.tool(name, &[], if self.quick { quick } else { &["--cycles", "30"] }),
            "soak" if self.quick => self.tool(name, &[], quick),
            "soak" => self.soak(),
            "gateway_report" => self.tool(name, &["--features", "gateway"], quick),
            "snapshot" => self.tool(name, &["--features", "snapshot"], quick),
            "accuracy" => {
                let svg = if self.quick {
                    std::env::temp_dir().join("slidegate-accuracy.svg")
                } else {
                    "docs/accuracy.svg".into()
                };
                let svg = svg.to_string_lossy().into_owned();
                let mut args = quick.to_vec();
                args.extend(["--svg", &svg]);
                let mut report = self.tool(name, &[], &args)?;
                report.body = report
                    .body
                    .lines()
                    .filter(|l| !l.starts_with("SVG written"))
                    .collect::<Vec<_>>()
                    .join("\n");
                Ok(report)
            }
            "redis_report" => self.redis_report(),
            "memcached" => self.memcached(),
            "fuzz" => self.fuzz(),
            _ => Err(format!("no report named {name}")),
        }
    }

    /// The soak twice, CI's quick run and then a 10-minute one: its region gives both.
    fn soak(&self) -> Result<Report, String> {
        let quick = self.tool("soak", &[], &["--quick"])?;
        let full = self.tool("soak", &[], &["--seconds", "600"])?;
        let body = format!("{}\n\n{}\n\n{}", quick.body, full.header, full.body);
        Ok(Report { command: full.command, header: quick.header, body })
    }

    /// `cargo run --release -p slidegate-tools [cargo_args] --bin NAME -- [args]`, its
    /// standard output the report.
    fn tool(&self, name: &str, cargo_args: &[&str], args: &[&str]) -> Result<Report, String> {
        let mut cargo = vec!["run", "--release", "-q", "-p", "slidegate-tools"];
        cargo.extend(cargo_args);
        cargo.extend(["--bin", name]);
        if !args.is_empty() {
            cargo.push("--");
            cargo.extend(args);
        }
        let shown = cargo.iter().filter(|a| **a != "-q").copied().collect::<Vec<_>>().join(" ");
        let command = format!("cargo {shown}");
        let out = Command::new("cargo")
            .args(&cargo)
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("{command}: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(format!(
                "`{command}` exited with {}; its output ended:\n{}",
                out.status,
                tail(&stdout)
            ));
        }
        Ok(self.report(command, &stdout))
    }

    fn report(&self, command: String, stdout: &str) -> Report {
        // A report's own title line (`## ...`) repeats its command; the header says it.
        let body = stdout
            .lines()
            .skip_while(|l| l.trim().is_empty() || l.starts_with("## "))
            .collect::<Vec<_>>()
            .join("\n");
        let header = format!("`{command}`, {}:", self.stamp);
        Report { command, header, body: body.trim_end().to_string() }
    }

    /// `redis_report` against a `redis-server` of its own with redis-cell's module and
    /// slidegate's loaded, both built first.
    fn redis_report(&self) -> Result<Report, String> {
        let cell = Path::new("target/redis-cell/libredis_cell.so");
        run(Command::new("bash").arg(".ci/redis-cell"))?;
        run(Command::new("cargo").args(["build", "--release", "-q", "-p", "slidegate-redis-module"]))?;
        let target =
            std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from);
        let module = target.join("release/libslidegate_redis.so");
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("slidegate-figures-redis-{port}"));
        fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let server = Server::start(
            Command::new("redis-server")
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .arg("--dir")
                .arg(&dir)
                .arg("--loadmodule")
                .arg(absolute(cell)?)
                .arg("--loadmodule")
                .arg(absolute(&module)?),
            port,
        )?;
        let url = format!("redis://127.0.0.1:{port}");
        let mut args = vec!["--url", &url, "--cell-url", &url];
        if self.quick {
            args.push("--quick");
        }
        let report = self.tool("redis_report", &["--features", "redis"], &args);
        drop(server);
        let _ = fs::remove_dir_all(&dir);
        let mut report = report?;
        let version = output(Command::new("redis-server").arg("--version")).unwrap_or_default();
        let version =
            version.split_whitespace().find_map(|w| w.strip_prefix("v=")).unwrap_or("?").to_string();
        report.header = format!(
            "`{}` against Redis {version} on loopback with redis-cell's module (`bash .ci/redis-cell`) and slidegate's loaded, {}:",
            report.command.replace(&url, "redis://127.0.0.1:PORT"),
            self.stamp
        );
        Ok(report)
    }

    /// The memcached test's throughput comparison (pool of one against the default pool)
    /// against a `memcached` of its own.
    fn memcached(&self) -> Result<Report, String> {
        let port = free_port()?;
        let mut command = Command::new("memcached");
        command.args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"]);
        if output(Command::new("id").arg("-u")).as_deref() == Some("0") {
            command.args(["-u", "root"]);
        }
        let server = Server::start(&mut command, port)?;
        let test = [
            "test",
            "--release",
            "-q",
            "--all-features",
            "--test",
            "memcached",
            "--",
            "throughput",
            "--nocapture",
        ];
        let out = Command::new("cargo")
            .args(test)
            .env("SLIDEGATE_MEMCACHED", format!("127.0.0.1:{port}"))
            .env("SLIDEGATE_REQUIRE_SERVERS", "1")
            .output()
            .map_err(|e| e.to_string())?;
        drop(server);
        let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if !out.status.success() {
            return Err(format!("the memcached throughput test failed:\n{}", tail(&all)));
        }
        let line = all
            .lines()
            .find(|l| l.starts_with("memcached throughput"))
            .ok_or("the test printed no throughput line")?;
        let command =
            format!("cargo {}", test.iter().filter(|a| **a != "-q").copied().collect::<Vec<_>>().join(" "));
        let version = output(Command::new("memcached").arg("-V")).unwrap_or_default();
        let header = format!("`{command}` against {version} on loopback, {}:", self.stamp);
        Ok(Report { command, header, body: format!("{line}.") })
    }

    /// `.ci/fuzz` for `fuzz_seconds` per target, as a table.
    fn fuzz(&self) -> Result<Report, String> {
        let seconds = self.fuzz_seconds.to_string();
        let out = Command::new("bash")
            .arg(".ci/fuzz")
            .env("FUZZ_SECONDS", &seconds)
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| e.to_string())?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() || stdout.contains("SKIPPED") {
            return Err(format!("`bash .ci/fuzz` did not fuzz:\n{}", tail(&stdout)));
        }
        let mut body = String::from(
            "| target | executions | seconds | executions/s | crashes | corpus (committed) |\n|---|---:|---:|---:|---:|---:|",
        );
        // "fuzz limit_config: 1064230 executions in 61 s, 0 crashes"
        for line in stdout.lines().filter(|l| l.contains(" executions in ")) {
            let words: Vec<&str> = line.split_whitespace().collect();
            let (Some(target), Some(runs), Some(secs), Some(crashes)) = (
                words.get(1).map(|t| t.trim_end_matches(':')),
                words.get(2).and_then(|w| w.parse::<u64>().ok()),
                words.get(5).and_then(|w| w.parse::<u64>().ok()),
                words.get(7).and_then(|w| w.parse::<u64>().ok()),
            ) else {
                return Err(format!("cannot read {line:?}"));
            };
            let corpus = fs::read_dir(format!("fuzz/corpus/{target}")).map(|d| d.count()).unwrap_or(0);
            body.push_str(&format!(
                "\n| `{target}` | {} | {secs} | {} | {crashes} | {} inputs |",
                slidegate_tools::thousands(runs),
                slidegate_tools::thousands(runs / secs.max(1)),
                slidegate_tools::thousands(corpus as u64)
            ));
        }
        let command = format!("FUZZ_SECONDS={seconds} bash .ci/fuzz");
        let header = format!("`{command}` (cargo-fuzz, libFuzzer, no sanitizer), {}:", self.stamp);
        Ok(Report { command, header, body })
    }
}

/// The README's headline table from `bench_report`'s and `memory`'s.
fn headline(speed: &Report, memory: &Report) -> Result<String, String> {
    let mut table =
        String::from("| workload | slidegate | governor | slidegate / governor |\n|---|---:|---:|---:|");
    for name in HEADLINE_SPEED {
        let cells = row(&speed.body, name).ok_or(format!("bench_report has no row {name:?}"))?;
        let ratio = if name.starts_with("2 threads") {
            // The throughput ratio is the inverse of the time ratio, as `bench_report` states
            // its target: the median of the rounds' ratios, not the ratio of the medians (which
            // can fall on the other side of 1 when rounds swing, as two threads' do).
            let ratio: f64 = cells[3].parse().map_err(|_| "unreadable ratio")?;
            format!("{} ({:.2}× governor's throughput)", cells[3], 1.0 / ratio)
        } else {
            cells[3].clone()
        };
        table.push_str(&format!("\n| {} | {} | {} | {ratio} |", cells[0], cells[1], cells[2]));
    }
    for name in HEADLINE_MEMORY {
        let cells = row(&memory.body, name).ok_or(format!("memory has no row {name:?}"))?;
        // | policy | algorithm | slots | state | heap | governor heap | ratio | RSS | governor RSS | target |
        let bytes =
            |cell: &String| cell.trim_end_matches(" B").parse::<f64>().map_err(|_| "unreadable bytes");
        let (ours, theirs) = (bytes(&cells[7])?, bytes(&cells[8])?);
        table.push_str(&format!(
            "\n| memory (RSS growth) per key at 1 M keys, {} | {} | {} | {:.2} |",
            cells[0],
            cells[7],
            cells[8],
            ours / theirs
        ));
    }
    Ok(table)
}

/// The cells of the first table row of `markdown` whose first cell is `first`.
fn row(markdown: &str, first: &str) -> Option<Vec<String>> {
    markdown.lines().find_map(|line| {
        let cells: Vec<String> = line
            .trim()
            .strip_prefix('|')?
            .strip_suffix('|')?
            .split('|')
            .map(|c| c.trim().to_string())
            .collect();
        (cells.first().map(String::as_str) == Some(first) && cells.len() >= 4).then_some(cells)
    })
}

fn begin(name: &str) -> String {
    format!("<!-- {name}:begin -->")
}

/// Region name -> the files that have it. A region opened and not closed, or closed twice, is
/// an error.
fn find_regions() -> Result<BTreeMap<String, Vec<String>>, String> {
    let mut regions: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in DOCS {
        let text = fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
        let mut open: Option<&str> = None;
        for (n, line) in text.lines().enumerate() {
            let Some(marker) = line.trim().strip_prefix("<!-- ").and_then(|l| l.strip_suffix(" -->")) else {
                continue;
            };
            if let Some(name) = marker.strip_suffix(":begin") {
                if let Some(outer) = open {
                    return Err(format!("{file}:{}: {name} begins inside {outer}", n + 1));
                }
                open = Some(name);
                regions.entry(name.to_string()).or_default().push(file.to_string());
            } else if let Some(name) = marker.strip_suffix(":end") {
                if open != Some(name) {
                    return Err(format!("{file}:{}: {name} ends but {open:?} is open", n + 1));
                }
                open = None;
            }
        }
        if let Some(name) = open {
            return Err(format!("{file}: {name} never ends"));
        }
    }
    Ok(regions)
}

fn files_with_regions(regions: &BTreeMap<String, Vec<String>>) -> BTreeMap<String, Vec<String>> {
    let mut files: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, in_files) in regions {
        for file in in_files {
            files.entry(file.clone()).or_default().push(name.clone());
        }
    }
    files
}

/// Replaces every region of `file` that has a report with the report.
fn rewrite(file: &str, outputs: &BTreeMap<String, Report>) -> Result<(), String> {
    let text = fs::read_to_string(file).map_err(|e| e.to_string())?;
    let mut out = String::with_capacity(text.len());
    let mut skipping = false;
    for line in text.lines() {
        let marker = line.trim();
        if skipping {
            if marker.ends_with(":end -->") {
                skipping = false;
                out.push_str(line);
                out.push('\n');
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
        for (name, report) in outputs {
            if marker == begin(name) {
                out.push_str(&format!("{}\n\n{}\n", report.header, report.body));
                skipping = true;
            }
        }
    }
    fs::write(file, out).map_err(|e| e.to_string())
}

/// A server on loopback, stopped when dropped.
struct Server(Child);

impl Server {
    fn start(command: &mut Command, port: u16) -> Result<Server, String> {
        let program = command.get_program().to_string_lossy().into_owned();
        let child = command
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("{program} could not start ({e}): is it installed?"))?;
        let server = Server(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err(format!("{program} did not listen on port {port} within 10 s"));
            }
            thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).map_err(|e| e.to_string())?;
    listener.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

fn absolute(path: &Path) -> Result<PathBuf, String> {
    fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Runs `command` to success, its output shown on standard error.
fn run(command: &mut Command) -> Result<(), String> {
    // On standard error: standard output is the list of files written.
    let status = command.stdout(std::io::stderr()).status().map_err(|e| e.to_string())?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{command:?} exited with {status}"))
    }
}

/// A command's standard output, trimmed, if it succeeded.
fn output(command: &mut Command) -> Option<String> {
    let out = command.output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The last lines of a long output, for an error message.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
