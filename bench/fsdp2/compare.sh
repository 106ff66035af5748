#!/usr/bin/env bash
# zero against PyTorch FSDP2 on the same deep residual MLP, on GPUS GPUs (default 2): ZeRO stage 2 and 3
# (examples/deep_mlp_cuda, one thread per GPU) and FSDP2 "stage 2" (reshard_after_forward=False) and
# "stage 3" (True, fsdp2_mlp.py under torchrun), one run after another with the same sizes, then a
# table with the ratios zero / FSDP2. First, zero at stage 0 on one GPU with the same rows per GPU: the
# communication-free step (its forward + backward, plus its AdamW time divided by GPUS, the sharded
# update), which both are measured against.
#
#   bench/fsdp2/compare.sh build/rel/examples/deep_mlp_cuda/zero-deep-mlp-cuda [size flags]
#
# Size flags go to both programs unchanged: --hidden H --blocks L --rows R (per GPU) --steps N
# --warmup N --lr X (defaults: 8192, 24, 8192, 10, 3, 1e-4). Builds nothing. Needs python3 and a
# torchrun on PATH (or TORCHRUN=...); the logs stay in $OUT_DIR (default: a new temporary folder).
# GPUS=1 compares on one GPU (every stage then shards over one rank).
set -euo pipefail

if [[ $# -lt 1 || ! -x "$1" ]]; then
  echo "usage: $0 path/to/zero-deep-mlp-cuda [--hidden H --blocks L --rows R --steps N --warmup N --lr X]" >&2
  exit 2
fi
bin=$1
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
torchrun=${TORCHRUN:-torchrun}
out=${OUT_DIR:-$(mktemp -d /tmp/zero-vs-fsdp2.XXXXXX)}
mkdir -p "$out"
# NVLink SHARP (NVLS) off for both: the machines lend GPUs without multicast objects.
export NCCL_NVLS_ENABLE=0
gpus=${GPUS:-2}

echo "== zero stage 0, one GPU (the communication-free step)" >&2
"$bin" --gpus 1 --stage 0 --json "$@" | tee "$out/zero_free.log" >&2
for stage in 2 3; do
  echo "== zero stage $stage" >&2
  "$bin" --gpus "$gpus" --stage "$stage" --json "$@" | tee "$out/zero_stage$stage.log" >&2
  echo "== fsdp2 stage $stage" >&2
  "$torchrun" --standalone --nproc_per_node="$gpus" "$here/fsdp2_mlp.py" --stage "$stage" --json "$@" \
    | tee "$out/fsdp2_stage$stage.log" >&2
done

python3 - "$out" <<'PY'
import json
import sys

out = sys.argv[1]


def last_json(path):
    # The result line, even behind a launcher's prefix such as "[rank0]: ".
    with open(path) as f:
        lines = [l[l.find("{"):] for l in f.read().splitlines() if '"impl":' in l and "{" in l]
    if not lines:
        sys.exit(f"compare.sh: no JSON result line in {path}")
    return json.loads(lines[-1])


gib = float(1 << 30)
rows = [
    ("step time (ms, median)", "step_ms", 1.0, "{:.2f}"),
    ("step wall time (ms, median)", "step_wall_ms", 1.0, "{:.2f}"),
    ("  forward (ms, median)", "forward_ms", 1.0, "{:.2f}"),
    ("  backward (ms, median)", "backward_ms", 1.0, "{:.2f}"),
    ("  optimizer to next step (ms)", "optimizer_ms", 1.0, "{:.2f}"),
    ("TFLOP/s per GPU", "tflops_per_gpu", 1.0, "{:.1f}"),
    ("peak allocated (GiB)", "peak_allocated_bytes", gib, "{:.2f}"),
    ("peak reserved (GiB)", "peak_reserved_bytes", gib, "{:.2f}"),
    ("loss, first step", "loss_first", 1.0, "{:.5f}"),
    ("loss, last step", "loss_last", 1.0, "{:.5f}"),
]
first = last_json(f"{out}/zero_stage2.log")
print(f"\nzero vs FSDP2: {first['gpus']} GPUs, hidden {first['hidden']}, {first['blocks']} blocks, "
      f"{first['rows']} rows per GPU, {first['params']} parameters, median of {first['steps']} steps "
      f"after {first['warmup']} warm-up")
print("peak allocated: zero = the peak of bytes in use in the caching pool engine and framework share (by")
print("                size class); FSDP2 = torch.cuda.max_memory_allocated. peak reserved: zero = the pool's")
print("                peak held, FSDP2 = torch.cuda.max_memory_reserved. Ratio = zero / FSDP2 (below 1 is")
print("                better for time and memory, above 1 for TFLOP/s).")
free = last_json(f"{out}/zero_free.log")
gpus = first["gpus"]
free_ms = free["forward_ms"] + free["backward_ms"] + free["optimizer_ms"] / gpus
print(f"communication-free step: {free_ms:.2f} ms = zero stage 0 on one GPU, forward {free['forward_ms']:.2f} + "
      f"backward {free['backward_ms']:.2f} + AdamW {free['optimizer_ms']:.2f} / {gpus} GPUs\n")
header = f"{'':30} {'zero':>12} {'FSDP2':>12} {'ratio':>8}"
for stage in (2, 3):
    z = last_json(f"{out}/zero_stage{stage}.log")
    t = last_json(f"{out}/fsdp2_stage{stage}.log")
    print(f"stage {stage} (FSDP2 reshard_after_forward={'True' if stage == 3 else 'False'})")
    print(header)
    for label, key, scale, fmt in rows:
        zv, tv = z[key] / scale, t[key] / scale
        ratio = f"{zv / tv:8.3f}" if key.startswith(("step", "peak", "tflops")) or key.endswith("_ms") and tv else f"{'':8}"
        print(f"{label:30} {fmt.format(zv):>12} {fmt.format(tv):>12} {ratio}")
    print(f"{'step / communication-free step':30} {z['step_ms'] / free_ms:12.3f} {t['step_ms'] / free_ms:12.3f}")
    print()
print(f"logs: {out}")
PY
