#!/usr/bin/env python3
"""ctest driver: the same global batch on 1, 2 and 3 ranks (and through gradient accumulation) gives the same
training, up to the rounding of a different summation order. Runs zero-gpt once per --run (its extra arguments,
e.g. "--ranks 2 --batch 6") with the common arguments and --json, and fails unless every step's loss and global
gradient norm is within --tol (relative) of the first run's. The norm is the one the engine clips with, so a
gradient scaled by the rank count (the mean taken twice) fails here at step 1. With --norm-steps K only the first K
steps' norms are compared (the losses still at every step): in bf16 the runs' trajectories drift apart by rounding,
and a gradient norm follows that drift more than the loss does.

    check_ranks.py --exe zero-gpt --tol 1e-4 --run "--ranks 1 --batch 12" --run "--ranks 3 --batch 4" -- ARGS...
"""
import argparse
import json
import shlex
import subprocess
import sys


def run(exe, args):
    p = subprocess.run([exe, *args, "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{exe} {' '.join(args)} exited with {p.returncode}:\n{p.stderr}{p.stdout}")
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if not lines:
        sys.exit(f"{exe} {' '.join(args)} printed no JSON line:\n{p.stdout}")
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", required=True)
    ap.add_argument("--tol", type=float, required=True)
    ap.add_argument("--run", action="append", required=True, help="one run's own arguments")
    ap.add_argument("--norm-steps", type=int, default=None,
                    help="compare the gradient norms of the first N steps only (default: every step)")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then the arguments of every run")
    a = ap.parse_args()
    common = a.args[1:] if a.args[:1] == ["--"] else a.args
    if len(a.run) < 2:
        sys.exit("give at least two --run")
    results = [(r, run(a.exe, common + shlex.split(r))) for r in a.run]
    first_name, first = results[0]
    worst = 0.0
    for name, res in results[1:]:
        for key in ("losses", "grad_norms"):
            ref, got = first[key], res[key]
            if len(ref) != len(got) or not ref:
                sys.exit(f"{key}: {len(got)} values with '{name}', {len(ref)} with '{first_name}'; expected as many, > 0")
            if key == "grad_norms" and a.norm_steps is not None:
                ref, got = ref[:a.norm_steps], got[:a.norm_steps]
            for step, (x, y) in enumerate(zip(ref, got), start=1):
                rel = abs(x - y) / max(abs(x), 1e-30)
                worst = max(worst, rel)
                if not rel <= a.tol:  # a NaN fails too
                    what = "loss" if key == "losses" else "gradient norm"
                    sys.exit(f"step {step}: {what} {y!r} with '{name}' against {x!r} with '{first_name}': relative "
                             f"difference {rel:.3g}, expected at most {a.tol:g}")
        norms = "" if a.norm_steps is None else f" (of the first {a.norm_steps} steps)"
        print(f"'{name}': {len(first['losses'])} steps, losses and gradient norms{norms} within {a.tol:g} of "
              f"'{first_name}'; final val loss {res['val_loss']:.6f} against {first['val_loss']:.6f}")
    print(f"largest relative difference {worst:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
