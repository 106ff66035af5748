#!/usr/bin/env python3
"""Reads zero_bench_collectives' Google Benchmark JSON (with repetitions) and prints, per operation and size,
the median bus bandwidth of raw NCCL and of zero's communicator and their ratio (target >= 0.97)."""
import json
import sys


def main(path):
    with open(path) as f:
        data = json.load(f)
    med = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        # name: "<op>/<path>/<bytes>/real_time/threads:<n>_median"
        parts = b["run_name"].split("/")
        op, path, size = parts[0], parts[1], int(parts[2])
        # One GPU has no bus traffic (factor (n-1)/n = 0): compare algorithm bandwidth there.
        med[(op, path, size)] = b["busbw_GBps"] if b["busbw_GBps"] > 0 else b["algbw_GBps"]
    gpus = data.get("context", {}).get("gpus", "?")
    print(f"bus bandwidth, GB/s (median), {gpus} GPUs")
    print(f"{'operation':<16}{'bytes':>12}{'raw NCCL':>12}{'zero':>12}{'zero/raw':>10}")
    worst = None
    for (op, path, size) in sorted(k for k in med if k[1] == "raw"):
        raw = med[(op, "raw", size)]
        z = med.get((op, "zero", size))
        if z is None:
            continue
        ratio = z / raw if raw > 0 else float("nan")
        worst = ratio if worst is None else min(worst, ratio)
        print(f"{op:<16}{size:>12}{raw:>12.1f}{z:>12.1f}{ratio:>10.3f}")
    if worst is not None:
        print(f"lowest ratio: {worst:.3f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "collectives.json")
