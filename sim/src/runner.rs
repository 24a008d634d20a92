//! The command line: one seed, a sweep, a seed file, or the determinism check.
//!
//! Output contract: the first line of a run is `seed=… commit=…` with every derived fault
//! parameter, the last is its verdict with the trace hash. A failing seed prints the
//! violated invariants, the end of its trace and the one command that replays it.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::scenario::{self, RunReport};
use crate::verdict::Invariant;

/// Features of this build (the injected bugs it carries).
fn features() -> Vec<&'static str> {
    let all = [
        (
            "bug-fence-after-idempotency",
            cfg!(feature = "bug-fence-after-idempotency"),
        ),
        ("bug-per-shard-fence", cfg!(feature = "bug-per-shard-fence")),
        (
            "bug-keep-metadata-on-drain",
            cfg!(feature = "bug-keep-metadata-on-drain"),
        ),
        (
            "bug-ack-before-persist",
            cfg!(feature = "bug-ack-before-persist"),
        ),
        (
            "bug-no-create-compensation",
            cfg!(feature = "bug-no-create-compensation"),
        ),
        (
            "bug-no-delete-compensation",
            cfg!(feature = "bug-no-delete-compensation"),
        ),
        (
            "bug-transition-after-commit",
            cfg!(feature = "bug-transition-after-commit"),
        ),
        (
            "bug-detached-transition-span",
            cfg!(feature = "bug-detached-transition-span"),
        ),
        (
            "bug-lanes-over-budget",
            cfg!(feature = "bug-lanes-over-budget"),
        ),
        ("bug-spread-busiest", cfg!(feature = "bug-spread-busiest")),
    ];
    all.into_iter()
        .filter(|(_, on)| *on)
        .map(|(name, _)| name)
        .collect()
}

fn replay_command(seed: u64) -> String {
    let features = features();
    if features.is_empty() {
        format!("scripts/sim.sh --seed {seed}")
    } else {
        format!(
            "scripts/sim.sh --features {} --seed {seed}",
            features.join(",")
        )
    }
}

fn commit() -> String {
    std::process::Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=12"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(
            || "unknown".to_owned(),
            |o| String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        )
}

#[derive(Debug, Default)]
struct RunnerFlags {
    seeds: Vec<u64>,
    single: bool,
    trace: bool,
    jobs: usize,
    stop_at_first: bool,
    quiet: bool,
    expect_failure: bool,
    determinism: Option<u64>,
}

fn parse_range(text: &str) -> Result<Vec<u64>, String> {
    let bad = || format!("--seeds wants A..B or A..=B, got {text:?}");
    let (low, high, inclusive) = match text.split_once("..=") {
        Some((low, high)) => (low, high, true),
        None => {
            let (low, high) = text.split_once("..").ok_or_else(bad)?;
            (low, high, false)
        }
    };
    let low: u64 = low.parse().map_err(|_| bad())?;
    let high: u64 = high.parse().map_err(|_| bad())?;
    Ok(if inclusive {
        (low..=high).collect()
    } else {
        (low..high).collect()
    })
}

fn parse_file(path: &str) -> Result<Vec<u64>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--seeds-file {path}: {e}"))?;
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(|l| {
            l.parse()
                .map_err(|_| format!("--seeds-file {path}: not a seed: {l:?}"))
        })
        .collect()
}

fn parse(args: &[String]) -> Result<RunnerFlags, String> {
    let mut options = RunnerFlags {
        jobs: 1,
        ..RunnerFlags::default()
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .cloned()
                .ok_or_else(|| format!("{arg} needs a value"))
        };
        match arg.as_str() {
            "--seed" => {
                let seed = value()?;
                options.seeds = vec![seed.parse().map_err(|_| format!("--seed {seed:?}"))?];
                options.single = true;
            }
            "--seeds" => options.seeds = parse_range(&value()?)?,
            "--seeds-file" => options.seeds = parse_file(&value()?)?,
            "--jobs" => options.jobs = value()?.parse().map_err(|_| "--jobs wants a number")?,
            "--check-determinism" => {
                options.determinism = Some(value()?.parse().map_err(|_| "--check-determinism N")?);
            }
            "--trace" => options.trace = true,
            "--stop-at-first" => options.stop_at_first = true,
            "--quiet" => options.quiet = true,
            "--expect-failure" => options.expect_failure = true,
            other => return Err(format!("unknown argument {other:?}\n{}", crate::HOW_TO_RUN)),
        }
    }
    if options.seeds.is_empty() && options.determinism.is_none() {
        return Err(crate::HOW_TO_RUN.to_owned());
    }
    Ok(options)
}

/// Entry point of the `sim` binary.
#[must_use]
pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse(&args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    // Panics inside the simulation are reported as violations, with their simulated time.
    scenario::install_panic_hook();
    if let Some(seed) = options.determinism {
        return determinism(seed);
    }
    sweep(&options)
}

fn header(report: &RunReport) -> String {
    let features = features();
    format!(
        "seed={} commit={} features=[{}] {}",
        report.seed,
        commit(),
        features.join(","),
        report.plan
    )
}

fn verdict(report: &RunReport, wall: Duration) -> String {
    let s = &report.stats;
    let status = if report.violations.is_empty() {
        "ok"
    } else {
        "FAILED"
    };
    let mut line = format!(
        "seed={} {status} rpcs={} answered={} indefinite={} host_ops={} crashes={} \
         stall_held={} judged_beside_stall={} judged_held={} judged_after_stall={} \
         simulated={:.1}s wall={:.3}s trace_lines={} sha256={}",
        report.seed,
        s.rpcs,
        s.answered,
        s.indefinite,
        s.host_operations,
        s.crashes,
        s.stall_held,
        s.judged_beside_stall,
        s.judged_held,
        s.judged_after_stall,
        report.simulated.as_secs_f64(),
        wall.as_secs_f64(),
        report.trace_lines,
        report.digest
    );
    for (invariant, count) in &report.violations.counts {
        let _ = write!(line, " {}×{count}", invariant.name());
    }
    line
}

fn failure_details(report: &RunReport) -> String {
    let mut out = String::new();
    for (invariant, count) in &report.violations.counts {
        let _ = writeln!(
            out,
            "  violated: {} — {} ({count}×)",
            invariant.name(),
            invariant.promise()
        );
    }
    for v in &report.violations.first {
        let _ = writeln!(
            out,
            "  [{:>10.6}s] {}: {}",
            v.at.as_secs_f64(),
            v.invariant.name(),
            v.detail
        );
    }
    let _ = writeln!(out, "  last trace lines:");
    for line in &report.tail {
        let _ = writeln!(out, "    {line}");
    }
    let _ = write!(out, "  replay: {}", replay_command(report.seed));
    out
}

struct Finished {
    report: RunReport,
    wall: Duration,
}

/// Wall-clock time, for the report only (runs measure simulated time through madsim). It is
/// read outside any simulation, where madsim's clock interposition passes through.
#[allow(clippy::disallowed_methods)]
fn wall_clock() -> Instant {
    Instant::now()
}

/// Runs one seed on a thread of its own: madsim seeds std's `HashMap` keys per thread, and
/// only a thread that has not made a `HashMap` yet can be seeded.
fn run(seed: u64, trace: bool) -> Finished {
    let started = wall_clock();
    let report = std::thread::Builder::new()
        .name(format!("seed-{seed}"))
        .stack_size(64 << 20)
        .spawn(move || scenario::run_seed(seed, trace))
        .expect("spawn a simulation thread")
        .join()
        .expect("the simulation thread reports panics itself");
    Finished {
        report,
        wall: started.elapsed(),
    }
}

fn sweep(options: &RunnerFlags) -> ExitCode {
    let started = wall_clock();
    let finished = run_all(options);
    let wall = started.elapsed();
    let failed: Vec<&Finished> = finished
        .iter()
        .filter(|f| !f.report.violations.is_empty())
        .collect();
    let (mut rpcs, mut host_ops, mut simulated) = (0, 0, Duration::ZERO);
    let mut stalls = StallTotals::default();
    let mut by_invariant: std::collections::BTreeMap<Invariant, Vec<u64>> = Default::default();
    for f in &finished {
        rpcs += f.report.stats.rpcs;
        host_ops += f.report.stats.host_operations;
        simulated += f.report.simulated;
        stalls.add(&f.report);
        for invariant in f.report.violations.counts.keys() {
            by_invariant
                .entry(*invariant)
                .or_default()
                .push(f.report.seed);
        }
    }
    let seconds = wall.as_secs_f64().max(1e-9);
    println!(
        "sweep seeds={} passed={} failed={} rpcs={rpcs} host_ops={host_ops} simulated={:.0}s \
         wall={seconds:.1}s rpcs_per_wall_second={:.0} ops_per_wall_second={:.0} \
         simulated_seconds_per_wall_second={:.0}",
        finished.len(),
        finished.len() - failed.len(),
        failed.len(),
        simulated.as_secs_f64(),
        rpcs as f64 / seconds,
        (rpcs + host_ops) as f64 / seconds,
        simulated.as_secs_f64() / seconds,
    );
    println!("{stalls}");
    for (invariant, seeds) in &by_invariant {
        let shown: Vec<String> = seeds.iter().take(10).map(u64::to_string).collect();
        println!(
            "  {} violated by seeds {} ({} total)",
            invariant.name(),
            shown.join(","),
            seeds.len()
        );
    }
    if let Some(first) = failed.first() {
        println!("first failing seed: {}", first.report.seed);
        println!("replay: {}", replay_command(first.report.seed));
    }
    match (options.expect_failure, failed.is_empty()) {
        (false, true) | (true, false) => ExitCode::SUCCESS,
        _ => ExitCode::FAILURE,
    }
}

/// What a sweep's stalls did, so a sweep shows the serving check was not idle.
#[derive(Default)]
struct StallTotals {
    seeds: usize,
    held: u64,
    judged_beside: u64,
    judged_held: u64,
    judged_after: u64,
    seeds_judged_beside: usize,
    seeds_judged_held: usize,
    seeds_judged_after: usize,
}

impl StallTotals {
    fn add(&mut self, report: &RunReport) {
        if report.plan.host.stalls.is_empty() {
            return;
        }
        let s = &report.stats;
        self.seeds += 1;
        self.held += s.stall_held;
        self.judged_beside += s.judged_beside_stall;
        self.judged_held += s.judged_held;
        self.judged_after += s.judged_after_stall;
        self.seeds_judged_beside += usize::from(s.judged_beside_stall > 0);
        self.seeds_judged_held += usize::from(s.judged_held > 0);
        self.seeds_judged_after += usize::from(s.judged_after_stall > 0);
    }
}

impl std::fmt::Display for StallTotals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stalls: seeds={} calls_held={} judged_beside_stall={} (in {} seeds) \
             judged_held={} (in {} seeds) judged_after_stall={} (in {} seeds)",
            self.seeds,
            self.held,
            self.judged_beside,
            self.seeds_judged_beside,
            self.judged_held,
            self.seeds_judged_held,
            self.judged_after,
            self.seeds_judged_after
        )
    }
}

fn print_finished(options: &RunnerFlags, f: &Finished) {
    if options.single {
        println!("{}", header(&f.report));
        for line in f.report.trace.iter().flatten() {
            println!("{line}");
        }
    }
    let failed = !f.report.violations.is_empty();
    if !options.quiet || failed {
        println!("{}", verdict(&f.report, f.wall));
    }
    if failed {
        if !options.single {
            println!("{}", header(&f.report));
        }
        println!("{}", failure_details(&f.report));
    }
}

fn run_all(options: &RunnerFlags) -> Vec<Finished> {
    let jobs = options.jobs.max(1);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| {
                loop {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        return;
                    }
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&seed) = options.seeds.get(i) else {
                        return;
                    };
                    let finished = run(seed, options.trace);
                    let mut done = done.lock().expect("results lock");
                    print_finished(options, &finished);
                    if options.stop_at_first && !finished.report.violations.is_empty() {
                        stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    done.push(finished);
                }
            });
        }
    });
    let mut finished = done.into_inner().expect("results lock");
    finished.sort_by_key(|f| f.report.seed);
    finished
}

/// Runs `seed` twice and compares the trace hashes, then lets madsim compare every random
/// draw of two more runs (`Runtime::check_determinism`).
fn determinism(seed: u64) -> ExitCode {
    let (first, second) = (run(seed, false), run(seed, false));
    println!("{}", header(&first.report));
    println!("{}", verdict(&first.report, first.wall));
    println!("{}", verdict(&second.report, second.wall));
    let same = first.report.digest == second.report.digest
        && first.report.trace_lines == second.report.trace_lines;
    if !same {
        println!("determinism FAILED: seed {seed} gave two different traces");
        return ExitCode::FAILURE;
    }
    let checked = std::panic::catch_unwind(|| {
        madsim::runtime::Runtime::check_determinism(seed, madsim::Config::default(), || {
            scenario::current_seed()
        });
    });
    match checked {
        Ok(()) => {
            println!(
                "determinism ok: seed {seed} twice gave sha256={}; madsim check_determinism ok",
                first.report.digest
            );
            ExitCode::SUCCESS
        }
        Err(_) => {
            println!("determinism FAILED: madsim check_determinism found a divergent draw");
            ExitCode::FAILURE
        }
    }
}
