#!/usr/bin/env python3
"""zero's host AdamW against PyTorch's CPU AdamW and DeepSpeed's CPUAdam, side by side on one host.

Each runs one AdamW step over N parameters (default 2^27, 3.5 GiB of state: above any last-level cache)
at 1, 8 and all of the host's threads, in a process of its own per thread count, and reports the median
step of --repeats timed steps after two of warm-up, in parameters per second. All three move 28 bytes
per parameter: zero reads bf16 gradients and the fp32 master, m and v and writes the three back and a
bf16 parameter copy; PyTorch and DeepSpeed read fp32 parameters, gradients, m and v and write the
parameters, m and v (DeepSpeed's ZeRO-Offload keeps fp32 gradients on the host and casts the
parameters on the GPU).

  zero      zero_bench_host_adamw (bench/cuda), memory:0 (pageable) and memory:2 (pinned, huge pages),
            streaming stores on, the inputs prefetched (the backend's defaults): what the offloaded
            optimizer runs; and pageable again with prefetch:0 (the column "zero pageable, no
            prefetch"). On a host without a GPU, --zero-cpu-bench names zero_bench_cpu_backend
            (bench/cpu) instead: its BM_adamw_step, bf16 gradients and parameters, the widest SIMD
            level, pageable memory (the column "zero pageable"), with and without prefetching
  torch     torch.optim.AdamW(fused=True) on CPU tensors, torch.set_num_threads(T)
  deepspeed deepspeed.ops.adam.DeepSpeedCPUAdam (adamw_mode), OMP_NUM_THREADS=T, where it imports
            and its extension builds; otherwise the reason is printed and it is left out

  python3 bench/cpu/compare_host_adamw.py --zero-bench build/gpu/bench/cuda/zero_bench_host_adamw \
      [--params N] [--repeats 5] [--json out.json]
  python3 bench/cpu/compare_host_adamw.py --zero-cpu-bench build/release/bench/cpu/zero_bench_cpu_backend ...
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import os, statistics, sys, time
kind, n, threads, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
import torch
torch.set_num_threads(threads)
g = torch.Generator().manual_seed(1)
p = torch.nn.Parameter(torch.rand(n, generator=g))
p.grad = torch.rand(n, generator=g) * 1e-3
if kind == "torch":
    opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.01, fused=True)
else:
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    opt = DeepSpeedCPUAdam([p], lr=1e-4, weight_decay=0.01, adamw_mode=True)
times = []
for i in range(2 + repeats):
    t0 = time.perf_counter()
    opt.step()
    t = time.perf_counter() - t0
    if i >= 2:
        times.append(t)
print(statistics.median(times))
"""


def child(kind, n, threads, repeats):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    r = subprocess.run([sys.executable, "-c", CHILD, kind, str(n), str(threads), str(repeats)],
                       capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        lines = (r.stderr or r.stdout).strip().splitlines()
        return None, lines[-1] if lines else f"exit status {r.returncode}"
    return n / float(r.stdout.strip().splitlines()[-1]), None


def zero_rates(bench, n, repeats, memory, threads, cpu_bench=False, prefetch=True):
    env = dict(os.environ, ZERO_BENCH_PARAMS=str(n))
    if cpu_bench:
        flt = f"BM_adamw_step<zero::bf16, zero::bf16>/threads:{threads}/simd:3/prefetch:{-1 if prefetch else 0}/"
    else:
        flt = f"BM_host_adamw/memory:{memory}/threads:{threads}/stream:1/prefetch:{-1 if prefetch else 0}/"
    r = subprocess.run([bench, f"--benchmark_filter={flt}", f"--benchmark_repetitions={repeats}",
                        "--benchmark_format=json"], capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["exit status %d" % r.returncode])[-1]
    runs = [b for b in json.loads(r.stdout)["benchmarks"] if b.get("run_type") == "iteration"]
    if not runs:
        return None, "no benchmark matched " + flt
    return statistics.median(b["params/s"] for b in runs), None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--zero-bench", help="path of zero_bench_host_adamw (a host with a GPU)")
    which.add_argument("--zero-cpu-bench", help="path of zero_bench_cpu_backend (any host)")
    ap.add_argument("--params", type=int, default=1 << 27)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    hw = os.cpu_count() or 1
    thread_counts = sorted({1, min(8, hw), hw})
    rows = []
    for t in thread_counts:
        row = {"threads": t}
        bench, cpu = (a.zero_cpu_bench, True) if a.zero_cpu_bench else (a.zero_bench, False)
        zero = (("zero_pageable", lambda: zero_rates(bench, a.params, a.repeats, 0, t, cpu)),
                ("zero_pageable_no_prefetch", lambda: zero_rates(bench, a.params, a.repeats, 0, t, cpu, False)))
        if not cpu:
            zero += (("zero_pinned_huge", lambda: zero_rates(bench, a.params, a.repeats, 2, t)),)
        for name, fn in zero + (
                ("torch", lambda: child("torch", a.params, t, a.repeats)),
                ("deepspeed", lambda: child("deepspeed", a.params, t, a.repeats))):
            rate, why = fn()
            row[name] = rate
            if why:
                row[name + "_error"] = why
        rows.append(row)
        print(json.dumps(row), flush=True)

    def show(v):
        return "—" if v is None else f"{v / 1e9:.2f}"

    def ratio(a_, b_):
        return "—" if a_ is None or b_ is None else f"{a_ / b_:.2f}"

    # The ratios take zero's pinned figure (what the offloaded optimizer runs on) where it was measured.
    best = "zero_pageable" if a.zero_cpu_bench else "zero_pinned_huge"
    kind = "pageable" if a.zero_cpu_bench else "pinned"
    print(f"\n{a.params} parameters, Gparam/s (median of {a.repeats} steps), {hw} hardware threads")
    print("| threads | zero pageable | zero pageable, no prefetch | zero pinned, huge pages | torch fused AdamW "
          f"| DeepSpeed CPUAdam | zero {kind} / torch | zero {kind} / DeepSpeed |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['threads']} | {show(r['zero_pageable'])} | {show(r['zero_pageable_no_prefetch'])} "
              f"| {show(r.get('zero_pinned_huge'))} "
              f"| {show(r['torch'])} | {show(r['deepspeed'])} | {ratio(r[best], r['torch'])} "
              f"| {ratio(r[best], r['deepspeed'])} |")
    for r in rows:
        for k, v in r.items():
            if k.endswith("_error"):
                print(f"{k[:-6]} at {r['threads']} threads: {v}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"params": a.params, "hardware_threads": hw, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
