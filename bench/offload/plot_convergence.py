#!/usr/bin/env python3
"""Loss curves of zero-gpt runs side by side (exact offload against the delayed update, docs/offload.md):
each LOG is zero-gpt's output with --print-every and --eval-every; its train and val losses by step.

    plot_convergence.py OUT.png TITLE LABEL=LOG [LABEL=LOG ...]

Prints a table of the final losses and each run's final val loss relative to the first run's.
"""
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def curves(path):
    train, val = [], []
    for line in open(path):
        m = re.search(r"step\s+(\d+)\s+train loss ([0-9.]+)", line)
        if m:
            train.append((int(m.group(1)), float(m.group(2))))
        m = re.search(r"step\s+(\d+)\s+val loss ([0-9.]+)", line)
        if m:
            val.append((int(m.group(1)), float(m.group(2))))
        m = re.search(r"val loss ([0-9.]+) \(byte unigram entropy [0-9.]+\) after (\d+) steps", line)
        if m:
            val.append((int(m.group(2)), float(m.group(1))))
    if not train or not val:
        sys.exit(f"{path}: no train or val losses (was it run with --print-every and --eval-every?)")
    return train, sorted(set(val))


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    out, title, runs = sys.argv[1], sys.argv[2], [a.split("=", 1) for a in sys.argv[3:]]
    fig, ax = plt.subplots(figsize=(7, 4))
    first = None
    print("| run | final train loss | final val loss | val / first run's |")
    print("|---|---:|---:|---:|")
    for label, path in runs:
        train, val = curves(path)
        line, = ax.plot(*zip(*train), label=f"{label}, train")
        ax.plot(*zip(*val), "--", color=line.get_color(), label=f"{label}, val")
        first = first or val[-1][1]
        print(f"| {label} | {train[-1][1]:.4f} | {val[-1][1]:.4f} | {val[-1][1] / first:.4f} |")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per byte)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
