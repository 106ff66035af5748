#!/usr/bin/env python3
"""Draws zero-memory-table's CSV: model-state bytes per rank against ranks, one line per stage,
measured (solid) beside the ZeRO formula (dashed), as in Table 1 of the ZeRO paper.

    python3 bench/engine/plot_memory_table.py memory_table.csv docs/memory_table.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src: str, dst: str) -> None:
    rows = list(csv.DictReader(open(src)))
    if not rows:
        sys.exit(f"{src}: no rows")
    params = int(rows[0]["parameters"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for stage in sorted({int(r["stage"]) for r in rows}):
        pts = [r for r in rows if int(r["stage"]) == stage]
        n = [int(r["ranks"]) for r in pts]
        ax.plot(n, [int(r["model_state_bytes_per_rank"]) / params for r in pts], marker="o",
                label=f"stage {stage} (measured)")
        ax.plot(n, [int(r["formula_bytes_per_rank"]) / params for r in pts], linestyle="--", color="grey",
                linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("data-parallel ranks N")
    ax.set_ylabel("model-state bytes per rank / parameters")
    ax.set_title(f"{params:,} parameters, bf16 + fp32 AdamW; dashed: ZeRO formula", fontsize=10)
    ax.grid(True, which="both", linewidth=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print(f"wrote {dst}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot_memory_table.py memory_table.csv out.png")
    main(sys.argv[1], sys.argv[2])
