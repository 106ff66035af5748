#!/usr/bin/env bash
# The largest GPT one GPU trains (issue 42), two runs, each at stage 3 or as planned, the activations checkpointed and
# kept in host memory (--checkpoint-activations --offload-activations):
#   1. LAYERS x D_MODEL (default 52 x 4096, 10.68 G parameters) with --config auto-plan choosing where the state lives
#      within the GPU's, the host's and the disk's budgets (zero-estimate's planner, this machine's measured rates).
#      With 70 GiB of GPU, 110 GiB of host and 55 GiB of disk, and bench/README.md's H100 rates, the planner keeps
#      0.41 of the optimizer state on the GPU and the rest in host memory (stage 3, offload_param cpu, ratio 0.59):
#      a share on the GPU holds more than NVMe, which keeps two slots of its share. 56 blocks fit nothing.
#   2. NVME_LAYERS x D_MODEL (default 40 x 4096, 8.27 G) with the state in host memory and on NVMe at once
#      (offload_optimizer nvme, host_ratio HOST_RATIO, default 0.82: the planner's row for it), which the planner
#      ranks below the GPU share for speed.
# For each: tokens/s, MFU, step losses, device peak, and the host and NVMe bytes beside zero-estimate's for the config
# the run wrote (--write-config). Then the same width with IN_MEMORY_LAYERS blocks (default 2) at stage 0 in GPU
# memory, so that the offload's cost is a ratio of MFU.
#
#   NVME=/dir/on/the/disk bash bench/gpt/largest.sh
#
# Environment: ZERO_GPT (zero-gpt-cuda), ZERO_ESTIMATE (zero-estimate), OUT, B (1), T (1024), STEPS (4), HEADS (32),
# LR (the peak learning rate, 1e-4; the planned run's is reached after max(2, STEPS / 10) warm-up steps),
# WARMUP (the NVMe run's linear warm-up of the lr to LR over that many steps, WarmupLR; default 0: LR throughout),
# TEXT (a text file whose bytes are the tokens, text_to_shard.py, so that the loss has something to fall to; default
# random token ids, on which a few steps show no falling loss: the 8.27 G run of 2026-12-06 fit the 6 windows it saw,
# 11.70 -> 10.10, then rose to 11.76),
# HOST_MEMORY (auto-plan's host budget; default the host's available memory less 16 GiB for the rest of the
# process), GPU_MEMORY (auto-plan's GPU budget, e.g. 72GiB; default the GPU's free memory less the model's
# activations and the example's gradient scratch: the 52-block run of 2026-12-06, planned without the scratch,
# stopped at 79.04 GB of state and gradients with 0.16 GiB free, about 5.4 GiB of the GPU used outside zero's
# count, 1.52 GiB of it the scratch), NVME_BYTES (default the free space under NVME less 4 GiB), ONLY (a subset
# of: planned nvme memory).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
gpu=${ZERO_GPT:-build/gpt-gpu/examples/gpt/zero-gpt-cuda}
est=${ZERO_ESTIMATE:-build/gpt-gpu/tools/zero-estimate}
NVME=${NVME:?NVME names a folder on the disk for the optimizer state}
C=${D_MODEL:-4096} NH=${HEADS:-32} B=${B:-1} T=${T:-1024} STEPS=${STEPS:-4}
ONLY=" ${ONLY:-planned nvme memory} "
want() { [[ "$ONLY" == *" $1 "* ]]; }
mkdir -p "$NVME"
avail_kib=$(awk '/MemAvailable/ {print $2}' /proc/meminfo)
HOST_MEMORY=${HOST_MEMORY:-$(((avail_kib / 1048576) - 16))GiB}
NVME_BYTES=${NVME_BYTES:-$((($(df -k --output=avail "$NVME" | tail -1) / 1048576) - 4))GiB}
echo "B $B, T $T, $STEPS steps; host budget $HOST_MEMORY, NVMe budget $NVME_BYTES under $NVME"

# Token shards in llm.c's format: TEXT's bytes, else random token ids, enough for the steps and one validation window.
if [[ -n "${TEXT:-}" ]]; then
  python3 bench/gpt/text_to_shard.py "$TEXT" "$OUT/largest_train.bin" "$OUT/largest_val.bin"
else
  python3 bench/gpt/random_shard.py "$OUT/largest_train.bin" "$((B * (T + 1) * (STEPS + 2)))" \
    "$OUT/largest_val.bin" "$((T + 1))"
fi
common=(--heads "$NH" --d-model "$C" --seq "$T" --vocab 50257 --train "$OUT/largest_train.bin"
  --val "$OUT/largest_val.bin" --batch "$B" --steps "$STEPS" --print-every 1 --clip 1.0 --lr "${LR:-1e-4}" --json)
timed=()
[[ -x /usr/bin/time ]] && timed=(/usr/bin/time -v) # the process's resident peak, where the machine has GNU time

# run NAME LAYERS ARGS...: trains with activation checkpointing (ARGS put its checkpoints on the host), then sets
# the run's figures beside zero-estimate's.
run() {
  local name=$1 layers=$2
  shift 2
  "$gpu" --layers "$layers" "${common[@]:0:8}" --describe "$OUT/${name}_model.json" || return 1
  "${timed[@]}" "$gpu" --layers "$layers" "${common[@]}" --checkpoint-activations \
    --write-config "$OUT/${name}_config.json" "$@" > "$OUT/$name.log" 2> "$OUT/$name.err"
  local rc=$?
  echo "$name: $layers blocks of $C, rc=$rc"
  grep -E "auto-plan for|^plan:" "$OUT/$name.err"
  grep -E "Maximum resident|Elapsed" "$OUT/$name.err"
  [[ $rc -ne 0 ]] && { tail -20 "$OUT/$name.err"; return 1; }
  "$est" --model "$OUT/${name}_model.json" --config "$OUT/${name}_config.json" --json > "$OUT/${name}_estimate.log" 2>&1
  python3 - "$OUT/$name.log" "$OUT/${name}_estimate.log" <<'PY'
import json, sys
run = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
print({k: run.get(k) for k in ("tokens_per_s", "mfu", "model_tflops_per_s", "losses", "device_peak_bytes",
                               "device_base_bytes", "device_reserved_peak_bytes", "activation_bytes",
                               "checkpoint_host_bytes", "host_share", "nvme_bytes", "host_formula_bytes")})
if run.get("device_reserved_peak_bytes"):
    # What the GPU held beyond the engine's pool, the model's activations and the use before the engine (the CUDA
    # context): cuBLAS's and the kernels' own memory, and what --config auto-plan's budget does not count.
    outside = run["device_peak_bytes"] - run["device_base_bytes"] - run["device_reserved_peak_bytes"] - \
        run["activation_bytes"]
    print("beyond the pool, the activations and the context: %.2f GiB; pool reserved %.2f GiB against its in-use "
          "count %.2f GiB" % (outside / 2**30, run["device_reserved_peak_bytes"] / 2**30,
                               (run["model_state_peak_bytes"] + run["peak_bytes"]["buffers"]) / 2**30))
print("host peak (counted):", run["peak_bytes"]["host"], "model state on the device:", run["model_state_peak_bytes"])
est = json.loads([l for l in open(sys.argv[2]) if l.startswith("{")][-1])
print("zero-estimate's rows for the run's config:")
for row in est["rows"]:
    print(" ", json.dumps(row))
PY
}

if want planned; then
  run largest_planned "${LAYERS:-52}" --config auto-plan --host-memory "$HOST_MEMORY" --nvme "$NVME_BYTES" \
    --nvme-path "$NVME" --offload-activations ${GPU_MEMORY:+--gpu-memory "$GPU_MEMORY"}
fi
if want nvme; then
  python3 - "$OUT/largest_nvme.json" "$B" "${HOST_RATIO:-0.82}" "$NVME" "${WARMUP:-0}" "${LR:-1e-4}" <<'PY'
import json, sys
out, b, h, nvme, w, lr = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5]), float(sys.argv[6])
json.dump({"train_micro_batch_size_per_gpu": b, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
           "bf16": {"enabled": True},
           "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                 "offload_optimizer": {"device": "nvme", "nvme_path": nvme, "host_ratio": h}},
           "activation_checkpointing": {"cpu_checkpointing": True}}, open(out, "w"))
if w > 0:
    c = json.load(open(out))
    c["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": lr,
                                                     "warmup_num_steps": w, "warmup_type": "linear"}}
    json.dump(c, open(out, "w"))
PY
  run largest_nvme "${NVME_LAYERS:-40}" --config "$OUT/largest_nvme.json" # cpu_checkpointing is in the file
fi
if want memory; then
  # The same width in GPU memory: IN_MEMORY_LAYERS blocks at stage 0, no offload, no checkpointing.
  "$gpu" --layers "${IN_MEMORY_LAYERS:-2}" "${common[@]}" --stage 0 > "$OUT/largest_in_memory.log" 2>&1
  echo "in memory, ${IN_MEMORY_LAYERS:-2} blocks of $C rc=$?"
  grep "^{" "$OUT/largest_in_memory.log" | python3 -c "
import json, sys
d = json.loads(sys.stdin.read())
print({k: d.get(k) for k in ('tokens_per_s', 'mfu', 'model_tflops_per_s', 'device_peak_bytes')})"
fi
