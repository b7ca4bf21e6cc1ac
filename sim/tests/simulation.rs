//! The simulator end to end: seeds pass, runs are deterministic, traces replay.

use std::io::{BufReader, Write};

use tokenwire_sim::sweep::{compare_runs, sweep};
use tokenwire_sim::{parse_seed, replay, run_seed, run_seed_with, RunOptions};

const EVENTS: u64 = 1_500;

fn temp_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("tokenwire-sim-{}-{name}", std::process::id()))
}

#[test]
fn a_few_seeds_hold_every_invariant() {
    for seed in [0, 1, 2, 6] {
        match run_seed(seed, EVENTS, None) {
            Ok(r) => {
                assert!(r.events >= EVENTS, "{r}");
                assert!(r.requests > 0, "{r}");
            }
            Err(f) => panic!("{f}"),
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_hashes_and_another_seed_does_not() {
    let a = run_seed(2, EVENTS, None);
    let b = run_seed(2, EVENTS, None);
    assert_eq!(compare_runs(&a, &b), Ok(()));
    let c = run_seed(6, EVENTS, None);
    assert!(compare_runs(&a, &c).is_err());
}

#[test]
fn a_recorded_trace_replays_to_the_same_outputs() {
    let path = temp_path("replay.jsonl");
    let report = {
        let mut file = std::fs::File::create(&path).expect("create trace");
        let r = run_seed(1, EVENTS, Some(&mut file)).unwrap_or_else(|f| panic!("{f}"));
        file.flush().expect("flush");
        r
    };
    let file = std::fs::File::open(&path).expect("open trace");
    let replayed = replay(BufReader::new(file)).expect("readable trace");
    assert!(replayed.failure.is_none(), "{:?}", replayed.failure);
    assert_eq!(replayed.events, report.events);
    assert_eq!(replayed.outputs_hash, report.outputs_hash);
    assert_eq!(replayed.inputs_hash, report.inputs_hash);
    assert!(replayed.matches());

    // A trace whose engine answer was tampered with no longer replays.
    let text = std::fs::read_to_string(&path).expect("read");
    let mut tampered = String::new();
    let mut done = false;
    for line in text.lines() {
        if !done && line.contains("\"StepDone\"") && line.contains("\"token\":") {
            let at = line.find("\"token\":").expect("token field") + "\"token\":".len();
            let end = at + line[at..].find([',', '}']).expect("end of number");
            let n: u32 = line[at..end].parse().expect("token id");
            tampered.push_str(&format!("{}{}{}", &line[..at], (n % 200) + 5, &line[end..]));
            done = true;
        } else {
            tampered.push_str(line);
        }
        tampered.push('\n');
    }
    assert!(done, "the trace has a step result");
    let r = replay(BufReader::new(tampered.as_bytes())).expect("readable trace");
    assert!(!r.matches() || r.failure.is_some());
    let f = r.failure.expect("the divergence is reported");
    assert!(f.reproduce().contains("--seed 1"), "{f}");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_sweep_runs_every_seed_and_one_twice() {
    let opts = RunOptions {
        events: 300,
        skip: Vec::new(),
    };
    let report = sweep(0..4, &opts, 2, &|_| {});
    assert_eq!(report.seeds, 4);
    let (seed, verdict) = report.determinism.expect("a seed ran twice");
    assert!((0..4).contains(&seed));
    assert_eq!(verdict, Ok(()));
    assert!(report.events >= 4 * 300);
}

#[test]
fn commit_hashes_are_seeds_and_failures_say_how_to_reproduce() {
    let hash = "15c8075e3b1f0d2a9c4e6b7a8d9f0e1c2b3a4d5e";
    let seed = parse_seed(hash).expect("a commit hash is a seed");
    assert_eq!(parse_seed(hash), Ok(seed));
    let opts = RunOptions {
        events: 200,
        skip: vec!["flow_control".into()],
    };
    let r = run_seed_with(seed, &opts, None);
    if let Err(f) = r {
        panic!("{f}");
    }
    let f = tokenwire_sim::Failure {
        seed: 7,
        seed_text: hash.into(),
        invariant: "stop_strings".into(),
        detail: "x".into(),
        event: 12,
        time: Default::default(),
    };
    let text = f.to_string();
    assert!(text.contains("stop_strings") && text.contains("seed 7") && text.contains("event 12"));
    assert!(text.contains(&format!(
        "cargo run --release -p tokenwire-sim -- --seed {hash}"
    )));
}
