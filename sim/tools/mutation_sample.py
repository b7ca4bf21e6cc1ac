#!/usr/bin/env python3
"""Mutation score of tokenwire-core's two oracles: its own tests, and the
simulator sweep.

Lists cargo-mutants' mutants of a set of the core's files (by default
the scheduler, generation machine, Host, `generate` dialect, parameter
validation and timers; `--area dialects` the four newer dialects with the
dialect context and state; `--files` any globs), samples N of them with a
fixed seed, and for each one, in a scratch git worktree of HEAD: applies
the mutant, runs `cargo test -p tokenwire-core` (oracle 1) and
`tokenwire-sim --seeds 0..S` (oracle 2), and records which oracle killed it.
A mutant that does not build is unviable and left out of the scores.

    python3 sim/tools/mutation_sample.py [--area core|dialects | --files GLOB,GLOB]
        [--n 50] [--seed 8] [--sim-seeds 200] [--out results.tsv] [--only 3,7]
        [--listed-at COMMIT] [--sim-only]

`--sim-only` skips the core tests: half the time, to look for the
simulator's gaps in a sample of its own rather than to measure both.

`--listed-at` draws the sample from the mutants as listed at an earlier
commit and applies their diffs to HEAD: with `--only`, the survivors of an
earlier sample re-run after changes (which alter the list, and so what a
seed draws).

Needs cargo-mutants (`cargo install cargo-mutants --locked`). Takes about
two minutes per mutant on two cores (two builds each). HEAD is measured:
commit first.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile

AREAS = {
    # The code the simulator was first built to judge.
    "core": [
        "core/src/sched/*.rs",
        "core/src/gen/*.rs",
        "core/src/host/*.rs",
        "core/src/dialect/generate/*.rs",
        "core/src/params.rs",
        "core/src/timer.rs",
    ],
    # The four dialects that came after it (issue #31).
    "dialects": [
        "core/src/dialect/session/*.rs",
        "core/src/dialect/responses/*.rs",
        "core/src/dialect/batch/*.rs",
        "core/src/dialect/cai/*.rs",
        "core/src/dialect/cx.rs",
        "core/src/dialect/state.rs",
    ],
}


def run(cmd, cwd, env, timeout):
    """Runs `cmd` in its own process group; past `timeout` the whole group is
    killed (killing cargo alone left a hung test binary running)."""
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return "timeout", out or ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--area", choices=sorted(AREAS), default="core",
                    help="a named file set (default: core)")
    ap.add_argument("--files", default="",
                    help="comma-separated globs under the repository root, instead of --area")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--sim-seeds", type=int, default=200)
    ap.add_argument("--out", default="mutation-results.tsv")
    ap.add_argument("--only", default="", help="comma-separated indexes into the sample, to re-run some")
    ap.add_argument("--listed-at", default="",
                    help="list the mutants at this commit (the sample of an earlier run), apply them to HEAD")
    ap.add_argument("--sim-only", action="store_true",
                    help="judge by the simulator alone (about half the time): to look for "
                         "its gaps, not to measure both oracles")
    args = ap.parse_args()

    root = subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip()
    listing = ["cargo", "mutants", "--list", "--json", "-p", "tokenwire-core"]
    files = [f for f in args.files.split(",") if f] or AREAS[args.area]
    for f in files:
        listing += ["-f", f]
    list_dir = root
    if args.listed_at:
        list_dir = tempfile.mkdtemp(prefix="tw-mutants-list-")
        subprocess.check_call(["git", "worktree", "add", "--detach", list_dir, args.listed_at],
                              cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        mutants = json.loads(subprocess.check_output(listing, cwd=list_dir, text=True))
    finally:
        if args.listed_at:
            subprocess.run(["git", "worktree", "remove", "--force", list_dir], cwd=root)
    mutants = [m for m in mutants if not m["file"].endswith("tests.rs")]
    print(f"{len(mutants)} mutants in {', '.join(files)}; sampling {min(args.n, len(mutants))} "
          f"with seed {args.seed}", flush=True)
    rng = random.Random(args.seed)
    sample = rng.sample(mutants, min(args.n, len(mutants)))
    only = {int(i) for i in args.only.split(",") if i}

    wt = tempfile.mkdtemp(prefix="tw-mutants-")
    subprocess.check_call(["git", "worktree", "add", "--detach", wt, "HEAD"], cwd=root,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = dict(os.environ)
    env["CARGO_TARGET_DIR"] = os.environ.get("MUTANTS_TARGET_DIR", "/tmp/tw-mutants-target")
    env["CARGO_TERM_COLOR"] = "never"
    rows = []
    try:
        for i, m in enumerate(sample):
            if only and i not in only:
                continue
            diff = m["diff"].split("\n")
            diff[1] = "+++ " + m["file"]
            patch = "\n".join(diff) + "\n"
            subprocess.run(["git", "checkout", "-q", "--", "."], cwd=wt)
            p = subprocess.run(["patch", "-p0", "-s"], cwd=wt, input=patch, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if p.returncode != 0:
                rows.append((i, m["name"], "unapplied", "unapplied"))
                continue
            code, out = run(["cargo", "build", "--release", "-p", "tokenwire-sim"], wt, env, 1200)
            if code != 0:
                rows.append((i, m["name"], "unviable", "unviable"))
                print(f"[{i}] unviable: {m['name']}", flush=True)
                continue
            sim = os.path.join(env["CARGO_TARGET_DIR"], "release", "tokenwire-sim")
            code, out = run([sim, "--seeds", f"0..{args.sim_seeds}"], wt, env, 300)
            sim_verdict = "survived" if code == 0 else "killed"
            if args.sim_only:
                code, out = 0, "skipped"
            else:
                code, out = run(["cargo", "test", "-p", "tokenwire-core"], wt, env, 600)
            if args.sim_only:
                unit_verdict = "skipped"
            elif code != 0 and "error[E" in out and "could not compile" in out:
                unit_verdict = "unviable"
            else:
                unit_verdict = "survived" if code == 0 else "killed"
            rows.append((i, m["name"], unit_verdict, sim_verdict))
            print(f"[{i}] unit={unit_verdict} sim={sim_verdict}: {m['name']}", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", wt], cwd=root)
    with open(args.out, "w") as f:
        f.write("index\tmutant\tcore_tests\tsimulator\n")
        for r in rows:
            f.write("\t".join(str(x) for x in r) + "\n")
    viable = [r for r in rows if r[2] != "unviable" and r[3] != "unviable" and r[2] != "unapplied"]
    n = len(viable)
    unit = sum(r[2] == "killed" for r in viable)
    sim = sum(r[3] == "killed" for r in viable)
    both = sum(r[2] == "killed" or r[3] == "killed" for r in viable)
    sim_only = sum(r[3] == "killed" and r[2] != "killed" for r in viable)
    print(f"viable {n}: core tests killed {unit}, simulator killed {sim}, "
          f"either {both}, simulator only {sim_only}")


if __name__ == "__main__":
    sys.exit(main())
