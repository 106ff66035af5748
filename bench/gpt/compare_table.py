#!/usr/bin/env python3
"""The table of bench/gpt/compare.sh from the logs it leaves in OUT_DIR: tokens/s, model TFLOP/s, MFU and peak GPU
memory per program, and the ratios issue 42 asks for; table.json beside them.

    compare_table.py OUT_DIR PRESET B T
"""
import json, re, statistics, sys
out, preset, B, T = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rows = {}

def mem(name):
    try:
        return int(open(f"{out}/{name}.mem").read()) / 1024
    except (OSError, ValueError):
        return None

def json_line(name):
    try:
        lines = [l[l.find("{"):] for l in open(f"{out}/{name}.log") if l.lstrip().startswith("{") or '"impl"' in l]
        return json.loads(lines[-1]) if lines else None
    except OSError:
        return None

try:  # llm.c: "step    k/N | loss ... | 123.45 ms | 45.6% bf16 MFU | 123456 tok/s"; the first step is its warm-up.
    ms = [float(m.group(1)) for m in re.finditer(r"\| ([0-9.]+) ms \|", open(f"{out}/llmc.log").read())]
    if len(ms) > 1:
        step = statistics.fmean(ms[1:])
        rows["llm.c"] = {"tokens_per_s": B * T / (step / 1e3), "peak_gib": mem("llmc")}
except OSError:
    pass
for name, label in (("zero0", "zero, stage 0"), ("zero3", "zero, stage 3")):
    j = json_line(name)
    if j and j.get("tokens_per_s"):
        rows[label] = {"tokens_per_s": j["tokens_per_s"], "mfu": j.get("mfu"), "fpt": j.get("flops_per_token"),
                       "peak_gib": mem(name), "own_peak_gib": (j.get("device_peak_bytes") or 0) / 2**30}
for name in ("eager", "compile", "fsdp2"):
    j = json_line(name)
    if j and j.get("tokens_per_s"):
        rows[f"torch {name}"] = {"tokens_per_s": j["tokens_per_s"], "mfu": j.get("mfu"), "fpt": j["flops_per_token"],
                                 "peak_gib": mem(name), "own_peak_gib": (j.get("peak_reserved_bytes") or 0) / 2**30}
fpt = next((r["fpt"] for r in rows.values() if r.get("fpt")), None)
peak = next((r["tokens_per_s"] * r["fpt"] / r["mfu"] for r in rows.values() if r.get("mfu") and r.get("fpt")), None)
print(f"\nGPT-2 {preset}, B {B}, T {T}, one GPU (FLOPs per token {fpt:.4g})" if fpt else f"\nGPT-2 {preset}, B {B}, T {T}")
print("| program | tokens/s | model TFLOP/s | MFU | peak GPU memory (nvidia-smi) | its own peak |")
print("|---|---:|---:|---:|---:|---:|")
for name, r in rows.items():
    tf = r["tokens_per_s"] * fpt / 1e12 if fpt else None
    mfu = r["tokens_per_s"] * fpt / peak if fpt and peak else None
    fmt = lambda v, f: f.format(v) if v is not None else "-"
    print(f"| {name} | {r['tokens_per_s']:,.0f} | {fmt(tf, '{:.1f}')} | {fmt(mfu, '{:.1%}')} | "
          f"{fmt(r.get('peak_gib'), '{:.2f} GiB')} | {fmt(r.get('own_peak_gib'), '{:.2f} GiB')} |")
z0, z3, lc = rows.get("zero, stage 0"), rows.get("zero, stage 3"), rows.get("llm.c")
torch_best = max((r for n, r in rows.items() if n.startswith("torch")), key=lambda r: r["tokens_per_s"], default=None)
print()
if z0 and lc:
    print(f"zero stage 0 / llm.c tokens/s: {z0['tokens_per_s'] / lc['tokens_per_s']:.3f} (target >= 1.05)")
if z0 and torch_best:
    print(f"zero stage 0 / best PyTorch tokens/s: {z0['tokens_per_s'] / torch_best['tokens_per_s']:.3f} (target >= 1.0)")
if z0 and z3:
    print(f"zero stage 3 / stage 0 tokens/s: {z3['tokens_per_s'] / z0['tokens_per_s']:.3f} (target >= 0.97)")
fs = rows.get("torch fsdp2")
if z3 and fs and z3.get("peak_gib") and fs.get("peak_gib"):
    print(f"zero stage 3 / FSDP2 peak GPU memory: {z3['peak_gib'] / fs['peak_gib']:.3f} (target <= 1.0)")
json.dump(rows, open(f"{out}/table.json", "w"), indent=1)
