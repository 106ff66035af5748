#!/usr/bin/env bash
# The largest GPT one GPU trains (issue 42): stage 3 with the model state off the GPU, in host memory and, for what
# the host cannot hold, on NVMe at once (offload_optimizer.host_ratio), the activations checkpointed and kept in host
# memory (--checkpoint-activations --offload-activations). zero-gpt-cuda's --config auto-plan chooses the setting
# with zero-estimate's planner and this machine's measured rates, within the budgets below.
#
#   NVME=/dir/on/the/disk LAYERS=40 D_MODEL=4096 HEADS=32 B=1 T=1024 STEPS=4 bash bench/gpt/largest.sh
#
# Prints the planner's table, then the run's tokens/s, MFU, step losses, device peak, and its host and NVMe bytes
# beside zero-estimate's for the config the run wrote (--write-config); then the same width with IN_MEMORY_LAYERS
# blocks (default 2) at stage 0 with everything on the GPU, so that the offload's cost is a ratio of MFU.
# Environment: ZERO_GPT (zero-gpt-cuda), ZERO_ESTIMATE (zero-estimate), OUT, HOST_MEMORY (auto-plan's host budget,
# default: the host's available memory less 16 GiB for the rest of the process), NVME_BYTES (default: the free
# space under NVME less 4 GiB).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
gpu=${ZERO_GPT:-build/gpt-gpu/examples/gpt/zero-gpt-cuda}
est=${ZERO_ESTIMATE:-build/gpt-gpu/tools/zero-estimate}
NVME=${NVME:?NVME names a folder on the disk for the optimizer state}
L=${LAYERS:-40} C=${D_MODEL:-4096} NH=${HEADS:-32} B=${B:-1} T=${T:-1024} STEPS=${STEPS:-4}
mkdir -p "$NVME"
avail_kib=$(awk '/MemAvailable/ {print $2}' /proc/meminfo)
HOST_MEMORY=${HOST_MEMORY:-$(((avail_kib / 1048576) - 16))GiB}
NVME_BYTES=${NVME_BYTES:-$((($(df -k --output=avail "$NVME" | tail -1) / 1048576) - 4))GiB}
model=(--layers "$L" --heads "$NH" --d-model "$C" --seq "$T" --vocab 50257)
echo "model: ${model[*]}; B $B, $STEPS steps; host budget $HOST_MEMORY, NVMe budget $NVME_BYTES under $NVME"

# Random token ids in llm.c's shard format, enough for the steps and one validation window.
python3 - "$OUT/largest_train.bin" "$OUT/largest_val.bin" "$((B * (T + 1) * (STEPS + 2)))" "$((T + 1))" <<'PY'
import random, struct, sys
rng = random.Random(1337)
for path, n in ((sys.argv[1], int(sys.argv[3])), (sys.argv[2], int(sys.argv[4]))):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *(rng.randrange(50257) for _ in range(n))))
PY
data=(--train "$OUT/largest_train.bin" --val "$OUT/largest_val.bin")

"$gpu" "${model[@]}" --describe "$OUT/largest_model.json" || exit 1
log=$OUT/largest_run.log
timed=()
[[ -x /usr/bin/time ]] && timed=(/usr/bin/time -v) # the process's resident peak, where the machine has GNU time
"${timed[@]}" "$gpu" "${model[@]}" "${data[@]}" --batch "$B" --steps "$STEPS" --print-every 1 --clip 1.0 --lr 1e-4 \
  --config auto-plan --host-memory "$HOST_MEMORY" --nvme "$NVME_BYTES" --nvme-path "$NVME" \
  --checkpoint-activations --offload-activations --write-config "$OUT/largest_config.json" --json \
  > "$log" 2> "$OUT/largest_run.err"
rc=$?
echo "largest run rc=$rc"
grep -A40 "auto-plan for" "$OUT/largest_run.err" | head -40
grep -E "Maximum resident|Elapsed" "$OUT/largest_run.err"
[[ $rc -ne 0 ]] && { tail -20 "$OUT/largest_run.err"; exit 1; }
"$est" --model "$OUT/largest_model.json" --config "$OUT/largest_config.json" --json > "$OUT/largest_estimate.log" 2>&1
python3 - "$log" "$OUT/largest_estimate.log" <<'PY'
import json, sys
run = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
print({k: run.get(k) for k in ("tokens_per_s", "mfu", "model_tflops_per_s", "losses", "device_peak_bytes",
                               "activation_bytes", "checkpoint_host_bytes", "host_share", "nvme_bytes",
                               "host_formula_bytes")})
print("host peak (counted):", run["peak_bytes"]["host"])
est = json.loads([l for l in open(sys.argv[2]) if l.startswith("{")][-1])
print("zero-estimate rows for the run's config:")
for row in est["rows"]:
    print(" ", json.dumps(row))
PY

# The same width in GPU memory: IN_MEMORY_LAYERS blocks at stage 0, no offload, no checkpointing.
small=(--layers "${IN_MEMORY_LAYERS:-2}" --heads "$NH" --d-model "$C" --seq "$T" --vocab 50257)
"$gpu" "${small[@]}" "${data[@]}" --batch "$B" --steps "$STEPS" --print-every 1 --stage 0 --json \
  > "$OUT/largest_in_memory.log" 2>&1
echo "in memory, ${IN_MEMORY_LAYERS:-2} blocks rc=$?"
grep "^{" "$OUT/largest_in_memory.log" | python3 -c "
import json, sys
d = json.loads(sys.stdin.read())
print({k: d.get(k) for k in ('tokens_per_s', 'mfu', 'model_tflops_per_s', 'device_peak_bytes')})"
