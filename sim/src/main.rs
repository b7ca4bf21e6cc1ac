//! `tokenwire-sim`: runs the deterministic simulator.
//!
//! ```text
//! tokenwire-sim --seed 42                     one seed (run twice: determinism)
//! tokenwire-sim --seed <40-hex commit hash>   the hash taken as a seed (SHA-256, first 8 bytes)
//! tokenwire-sim --seeds 0..1000 [--jobs 2]    a sweep (A..B excludes B, A..=B includes it)
//! tokenwire-sim --seed 42 --trace run.jsonl   record every Host input with its time
//! tokenwire-sim --replay run.jsonl            feed a trace back; outputs must match
//! ```
//!
//! `--events M` sets the safety-phase events per seed. Exit status: 0 when
//! every invariant held, 1 when one broke (the failure says how to reproduce
//! it), 2 on bad arguments or an unreadable trace. Wall-clock time is read
//! here only, for the events-per-second figure.

use std::fs::File;
use std::io::{BufReader, LineWriter, Write};
use std::ops::Range;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use tokenwire_sim::sweep::{compare_runs, sweep};
use tokenwire_sim::{parse_seed, replay, run_seed_with, Failure, RunOptions, DEFAULT_EVENTS};

/// tokenwire's deterministic simulator: seeded swarms of clients and faults
/// against the sans-IO core, with invariant checkers after every event.
#[derive(Parser, Debug)]
#[command(name = "tokenwire-sim", version)]
struct Args {
    /// Run one seed: a decimal u64 or a 40-hex-digit commit hash.
    #[arg(long, conflicts_with_all = ["seeds", "replay"])]
    seed: Option<String>,
    /// Run a sweep of seeds: `A..B` (B excluded) or `A..=B`.
    #[arg(long, conflicts_with = "replay")]
    seeds: Option<String>,
    /// Safety-phase events per seed.
    #[arg(long, default_value_t = DEFAULT_EVENTS)]
    events: u64,
    /// Record every Host input of the `--seed` run to this file (JSON lines).
    #[arg(long, requires = "seed")]
    trace: Option<String>,
    /// Feed a recorded trace back and check that it reproduces its outputs.
    #[arg(long)]
    replay: Option<String>,
    /// Worker threads for a sweep (default: the machine's cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Print each seed's report line.
    #[arg(long, short)]
    verbose: bool,
    /// Switch a checker off by name (repeatable): only to look past a known,
    /// reported bug while it is being fixed.
    #[arg(long = "skip", value_name = "INVARIANT")]
    skip: Vec<String>,
}

impl Args {
    fn options(&self) -> RunOptions {
        RunOptions {
            events: self.events,
            skip: self.skip.clone(),
        }
    }
}

fn parse_range(text: &str) -> Result<Range<u64>, String> {
    let bad = || format!("`{text}` is not a seed range like 0..1000 or 0..=999");
    let (a, b, inclusive) = if let Some((a, b)) = text.split_once("..=") {
        (a, b, true)
    } else if let Some((a, b)) = text.split_once("..") {
        (a, b, false)
    } else {
        return Err(bad());
    };
    let a: u64 = a.trim().parse().map_err(|_| bad())?;
    let b: u64 = b.trim().parse().map_err(|_| bad())?;
    let end = if inclusive { b.saturating_add(1) } else { b };
    if end <= a {
        return Err(format!("seed range `{text}` is empty"));
    }
    Ok(a..end)
}

fn report_failure(f: &Failure) {
    eprintln!("FAIL {f}");
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(path) = &args.replay {
        return run_replay(path);
    }
    if let Some(seed_text) = &args.seed {
        return run_one(seed_text, &args);
    }
    let Some(seeds) = args.seeds.as_deref() else {
        eprintln!("tokenwire-sim: give --seed N, --seeds A..B or --replay FILE (see --help)");
        return ExitCode::from(2);
    };
    let range = match parse_range(seeds) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tokenwire-sim: {e}; give --seed N, --seeds A..B or --replay FILE");
            return ExitCode::from(2);
        }
    };
    let jobs = args.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let verbose = args.verbose;
    let started = Instant::now();
    let report = sweep(range.clone(), &args.options(), jobs, &|r| match r {
        Ok(r) if verbose => println!("{r}"),
        Ok(_) => {}
        Err(f) => report_failure(f),
    });
    let wall = started.elapsed().as_secs_f64();
    let determinism = match &report.determinism {
        Some((seed, Ok(()))) => format!("seed {seed} ran twice: identical"),
        Some((seed, Err(e))) => format!("seed {seed} ran twice: DIFFERENT ({e})"),
        None => "none".into(),
    };
    println!(
        "tokenwire-sim: {} seeds ({}..{}), {} events, {} requests, {} failed; faults: {}; determinism: {}; {:.0} simulated events/s ({:.1} s wall, {} jobs)",
        report.seeds,
        range.start,
        range.end,
        report.events,
        report.requests,
        report.failures.len(),
        report.faults,
        determinism,
        report.events as f64 / wall.max(1e-9),
        wall,
        jobs
    );
    if verbose {
        for (k, v) in &report.tally {
            println!("  {v:>10}  {k}");
        }
    }
    let nondeterministic = matches!(report.determinism, Some((_, Err(_))));
    if report.failures.is_empty() && !nondeterministic {
        ExitCode::SUCCESS
    } else {
        for f in &report.failures {
            eprintln!(
                "failed seed {}: `{}`; reproduce: {}",
                f.seed,
                f.invariant,
                f.reproduce()
            );
        }
        ExitCode::from(1)
    }
}

fn run_one(seed_text: &str, args: &Args) -> ExitCode {
    let seed = match parse_seed(seed_text) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tokenwire-sim: {e}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let first = match &args.trace {
        Some(path) => {
            let file = match File::create(path) {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("tokenwire-sim: cannot create {path}: {e}");
                    return ExitCode::from(2);
                }
            };
            let mut w = LineWriter::new(file);
            let r = run_seed_with(seed, &args.options(), Some(&mut w));
            if let Err(e) = w.flush() {
                eprintln!("tokenwire-sim: writing {path}: {e}");
            }
            r
        }
        None => run_seed_with(seed, &args.options(), None),
    };
    let second = run_seed_with(seed, &args.options(), None);
    let wall = started.elapsed().as_secs_f64();
    let events = [&first, &second]
        .iter()
        .map(|r| match r {
            Ok(r) => r.events,
            Err(f) => f.event,
        })
        .sum::<u64>();
    let same = compare_runs(&first, &second);
    let mut code = ExitCode::SUCCESS;
    match &first {
        Ok(r) => println!("{r}"),
        Err(f) => {
            let mut f = f.clone();
            f.seed_text = seed_text.trim().to_string();
            report_failure(&f);
            code = ExitCode::from(1);
        }
    }
    let faults = first
        .as_ref()
        .map(|r| r.faults.to_string())
        .unwrap_or_else(|_| "-".into());
    println!(
        "tokenwire-sim: 1 seed ({seed}), {events} events (run twice), faults: {faults}; determinism: {}; {:.0} simulated events/s ({:.2} s wall)",
        match &same {
            Ok(()) => "identical".to_string(),
            Err(e) => format!("DIFFERENT ({e})"),
        },
        events as f64 / wall.max(1e-9),
        wall
    );
    if same.is_err() {
        code = ExitCode::from(1);
    }
    code
}

fn run_replay(path: &str) -> ExitCode {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("tokenwire-sim: cannot open {path}: {e}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let r = match replay(BufReader::new(file)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tokenwire-sim: {path}: {e}");
            return ExitCode::from(2);
        }
    };
    let wall = started.elapsed().as_secs_f64();
    let recorded_failure = r.recorded.as_ref().and_then(|e| e.failure.clone());
    if let Some(f) = &r.failure {
        report_failure(f);
    }
    println!(
        "tokenwire-sim: replayed {path} (seed {}): {} events, outputs {}, {}; recorded failure: {}; {:.0} events/s",
        r.seed,
        r.events,
        r.outputs_hash,
        if r.matches() {
            "identical to the recording"
        } else {
            "DIFFERENT from the recording"
        },
        recorded_failure
            .map(|(i, n)| format!("`{i}` at event {n}"))
            .unwrap_or_else(|| "none".into()),
        r.events as f64 / wall.max(1e-9)
    );
    if r.matches() && r.failure.is_none() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
