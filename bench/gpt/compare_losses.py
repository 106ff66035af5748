#!/usr/bin/env python3
"""zero-gpt against its PyTorch reference (torch_gpt.py), step by step.

It writes the initial weights with `zero-gpt --steps 0 --export DIR`, trains zero-gpt from them (`--init DIR`) for
--steps steps at each stage of --stages with --json, trains torch_gpt.py from the same DIR with the same data, seed,
batch, ranks, steps, lr and clip, and compares each step's loss over the global batch, and the final validation
loss: |zero - torch| / |torch| must be <= --tol for every one. It prints a table and, as its last line, a JSON
summary; it exits 1 on a difference above --tol (naming the stage, the step and both losses), 2 on a run that
failed, and 77 when PyTorch or safetensors is missing (ctest's SKIP_RETURN_CODE).

The CPU fp32 check (the ctests to wire, from the build folder; each skipped with 77 where torch is missing):

    python3 bench/gpt/compare_losses.py --zero-gpt build/release/examples/gpt/zero-gpt \
        --text /usr/share/games/fortunes/literature --layers 2 --heads 2 --d-model 64 --seq 64 --batch 4 \
        --ranks 4 --stages 0,1,2,3 --clip 0 --steps 50 --tol 1e-4
    python3 bench/gpt/compare_losses.py --zero-gpt build/release/examples/gpt/zero-gpt \
        --text /usr/share/games/fortunes/literature --layers 2 --heads 2 --d-model 64 --seq 64 --batch 4 \
        --ranks 4 --stages 3 --clip 1.0 --steps 50 --tol 1e-4
    python3 bench/gpt/compare_losses.py --zero-gpt build/release/examples/gpt/zero-gpt \
        --text /usr/share/games/fortunes/literature --layers 2 --heads 2 --d-model 64 --seq 64 --batch 4 \
        --ranks 1 --stages 0 --clip 0 --steps 50 --tol 1e-4

zero-gpt's --json line has "losses" (each step's mean token loss over the global batch, full precision) and
"val_loss" (its evaluate()); torch_gpt.py prints the same keys.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77


def last_json(text, who):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"{who}: no JSON line in its output:\n{text}")


def run(cmd, who):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        print(f"compare_losses: {who} exited with {p.returncode}:\n  {' '.join(cmd)}\n{p.stderr}{p.stdout}",
              file=sys.stderr)
        sys.exit(2)
    return last_json(p.stdout, who), dt


def rel(a, b):
    return abs(a - b) / abs(b) if b != 0 else abs(a - b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zero-gpt", required=True, help="the zero-gpt binary")
    ap.add_argument("--text", help="a text file, one token per byte")
    ap.add_argument("--train", help="llm.c token shard for training")
    ap.add_argument("--val", help="llm.c token shard for validation")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--vocab", type=int, help="zero-gpt's --vocab (with --train/--val; 256 with --text)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--stages", default="0,1,2,3", help="comma-separated ZeRO stages")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--clip", type=float, default=1.0, help="gradient clipping's global norm, 0 for none")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--tol", type=float, required=True, help="largest relative difference of a loss allowed")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="torch_gpt.py's device; cuda also passes --device cuda to zero-gpt")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="torch_gpt.py's dtype")
    ap.add_argument("--config", help="a DeepSpeed config for zero-gpt (e.g. bf16); default: its built-in fp32")
    ap.add_argument("--python", default=sys.executable, help="the python that runs torch_gpt.py")
    ap.add_argument("--workdir", help="keep the export and the runs' JSON here (default: a temporary folder)")
    a = ap.parse_args()

    probe = subprocess.run([a.python, "-c", "import torch, safetensors, numpy"], capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"compare_losses: SKIP: {a.python} has no torch/safetensors/numpy:\n{probe.stderr.strip()}")
        return SKIP
    stages = [int(s) for s in a.stages.split(",") if s.strip()]
    if not stages or any(s not in (0, 1, 2, 3) for s in stages):
        ap.error(f"--stages {a.stages}: expected stages among 0,1,2,3")
    if a.steps < 1:
        ap.error("--steps must be >= 1: a comparison of no step checks nothing")

    work = a.workdir or tempfile.mkdtemp(prefix="compare_losses.")
    os.makedirs(work, exist_ok=True)
    init = os.path.join(work, "init")
    shutil.rmtree(init, ignore_errors=True)
    data = (["--text", a.text] if a.text else []) + (["--train", a.train] if a.train else []) + \
        (["--val", a.val] if a.val else [])
    size = ["--layers", str(a.layers), "--heads", str(a.heads), "--d-model", str(a.d_model), "--seq", str(a.seq)]
    common = data + size + ["--batch", str(a.batch), "--ranks", str(a.ranks), "--steps", str(a.steps), "--lr",
                            repr(a.lr), "--clip", repr(a.clip), "--seed", str(a.seed)]
    zero_extra = (["--vocab", str(a.vocab)] if a.vocab else []) + (["--config", a.config] if a.config else []) + \
        (["--device", "cuda"] if a.device == "cuda" else [])

    t_start = time.perf_counter()
    # The initial weights: the export of a run of no step (its rank count and stage do not change them).
    _, t_export = run([a.zero_gpt] + data + size + zero_extra + ["--steps", "0", "--ranks", "1", "--export", init,
                                                                 "--json"], "zero-gpt --export")
    here = os.path.dirname(os.path.abspath(__file__))
    ref_cmd = [a.python, os.path.join(here, "torch_gpt.py"), "--init", init] + common + \
        ["--device", a.device, "--dtype", a.dtype]
    # The reference does not depend on the stage, except bf16's gradient dtype (fp32 at stage 0, bf16 above).
    refs = {}
    for s in stages:
        key = 0 if (a.dtype == "fp32" or s == 0) else 1
        if key not in refs:
            refs[key] = run(ref_cmd + ["--stage", str(s)], f"torch_gpt.py --stage {s}")
    zeros = {}
    for s in stages:
        zeros[s] = run([a.zero_gpt] + common + zero_extra + ["--stage", str(s), "--init", init, "--json"],
                       f"zero-gpt --stage {s}")

    summary = {"ranks": a.ranks, "batch": a.batch, "steps": a.steps, "clip": a.clip, "lr": a.lr, "seed": a.seed,
               "device": a.device, "dtype": a.dtype, "tol": a.tol, "stages": {}, "export_seconds": t_export}
    failures = []
    print(f"{'stage':>5} {'step':>5} {'zero loss':>20} {'torch loss':>20} {'rel diff':>10}")
    for s in stages:
        ref, t_ref = refs[0 if (a.dtype == "fp32" or s == 0) else 1]
        z, t_zero = zeros[s]
        zl, tl = z.get("losses"), ref.get("losses")
        if not isinstance(zl, list) or len(zl) != a.steps or len(tl) != a.steps:
            failures.append(f"stage {s}: zero-gpt gave {len(zl) if isinstance(zl, list) else 'no'} losses and "
                            f"torch_gpt.py {len(tl)}; expected {a.steps} each")
            continue
        worst, worst_step = -1.0, 0
        for i, (x, y) in enumerate(zip(zl, tl)):
            d = rel(x, y)
            if not (d <= a.tol):  # NaN fails too
                failures.append(f"stage {s} step {i + 1}: zero loss {x!r}, torch loss {y!r}, relative difference "
                                f"{d:.3e} > {a.tol:g}")
            if not (d <= worst):
                worst, worst_step = d, i + 1
            if i < 3 or (i + 1) % 10 == 0 or i + 1 == a.steps or d > a.tol:
                print(f"{s:>5} {i + 1:>5} {x:>20.15f} {y:>20.15f} {d:>10.3e}")
        dv = rel(z["val_loss"], ref["val_loss"])
        if not (dv <= a.tol):
            failures.append(f"stage {s} final val loss: zero {z['val_loss']!r}, torch {ref['val_loss']!r}, relative "
                            f"difference {dv:.3e} > {a.tol:g}")
        print(f"{s:>5} {'val':>5} {z['val_loss']:>20.15f} {ref['val_loss']:>20.15f} {dv:>10.3e}")
        summary["stages"][str(s)] = {"max_rel_diff": worst, "at_step": worst_step, "val_rel_diff": dv,
                                     "zero_val_loss": z["val_loss"], "torch_val_loss": ref["val_loss"],
                                     "zero_seconds": t_zero, "torch_seconds": t_ref}
    summary["seconds"] = time.perf_counter() - t_start
    summary["passed"] = not failures
    for f in failures[:20]:
        print(f"FAIL {f}", file=sys.stderr)
    if len(failures) > 20:
        print(f"FAIL ... and {len(failures) - 20} more", file=sys.stderr)
    print(json.dumps(summary))
    if not a.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
