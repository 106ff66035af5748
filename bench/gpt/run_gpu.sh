#!/usr/bin/env bash
# The GPT example on the GPU machine, in one go (logs in $OUT):
#   build   zero-gpt (CPU) and zero-gpt-cuda, and the kernels' test against the CPU math (example.gpt.cuda);
#   tests   that test alone, over a build already in build/gpt-gpu (or CARRIED=.carry/bin's binaries, with
#           LD_LIBRARY_PATH naming the libraries the machine lacks); sanitize: compute-sanitizer on its new cases;
#   torch   zero-gpt-cuda against bench/gpt/torch_gpt.py in bf16 on the GPU, 50 steps at stages 0-3, from the same
#           initial weights and batches; torch_more: with clipping, a wider model, and the CPU fp32 comparison;
#   hf      a d12 exported by zero-gpt-cuda loaded by transformers: val loss and logits against zero's bf16 ones;
#           then --init from that folder trains on;
#   speed   tokens/s, model TFLOP/s and MFU of d12 and d48 on one GPU (byte-valued shards of GPT-2's vocabulary);
#   checkpoint  --checkpoint-activations at a long sequence, the block inputs on the device and then on the host;
#   compare bench/gpt/compare.sh: d12 at B 32 and d48 at B 8 beside llm.c (from $LLMC) and PyTorch (issue 42).
# Needs CLI11 and libxxhash from $ZERO_PREFIX where the machine lacks them (as scripts/gpu).
#   ZERO_PREFIX=$PWD/.carry/prefix CORPUS=$PWD/.carry/literature LLMC=$PWD/.carry/llmc \
#     bash bench/gpt/run_gpu.sh build torch torch_more hf speed compare
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=${ZERO_PREFIX:+$ZERO_PREFIX/lib:}${LD_LIBRARY_PATH:-}
CORPUS=${CORPUS:-/usr/share/games/fortunes/literature}
ARGS=" $* "
want() { [[ "$ARGS" == *" all "* || "$ARGS" == *" $1 "* ]]; }
build=build/gpt-gpu
# Binaries built elsewhere for this commit (CARRIED=.carry/bin: zero-gpt-cuda, zero_gpt_cuda_tests, zero-gpt,
# zero-estimate, and COMMIT naming the commit they were built from) stand in for the build step.
if [[ -n "${CARRIED:-}" ]] && ! want build; then
  mkdir -p $build/examples/gpt $build/tools
  cp "$CARRIED"/zero-gpt-cuda "$CARRIED"/zero_gpt_cuda_tests "$CARRIED"/zero-gpt $build/examples/gpt/
  cp "$CARRIED"/zero-estimate $build/tools/ 2> /dev/null
  echo "carried binaries of $(cat "$CARRIED"/COMMIT 2> /dev/null || echo "an unnamed commit"); this tree is $(git rev-parse --short HEAD 2> /dev/null)"
  ldd $build/examples/gpt/zero-gpt-cuda | grep "not found" && { echo "carried binaries miss libraries: build instead"; exit 1; }
fi
nvidia-smi -L | tee "$OUT/gpus.txt"
if want build; then
  start=$(date +%s)
  cmake -S . -B $build -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DZERO_BUILD_TESTS=ON \
    -DZERO_BUILD_EXAMPLES=ON -DZERO_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH="${ZERO_PREFIX:-}" -DZERO_GPT_CORPUS="$CORPUS" > "$OUT/configure.log" 2>&1 ||
    { tail -30 "$OUT/configure.log"; exit 1; }
  cmake --build $build -j "$(nproc)" --target zero-gpt zero-gpt-cuda zero_gpt_cuda_tests > "$OUT/build.log" 2>&1 ||
    { grep -E "error|Error" -A3 "$OUT/build.log" | head -60; exit 1; }
  echo "build: $(($(date +%s) - start)) s"
fi
if want build || want tests; then
  timeout 90 $build/examples/gpt/zero_gpt_cuda_tests > "$OUT/cuda_tests.log" 2>&1
  echo "example.gpt.cuda rc=$?"; grep -E "ERROR|FAILED|CHECK|status|assertions" "$OUT/cuda_tests.log" | head -40
fi
if want sanitize; then
  # compute-sanitizer on the fused attention's, the activation store's and the whole model's test cases (the last
  # runs the cross-entropy, LayerNorm and bias kernels at widths of whole 16-byte packs and the epilogues' GEMMs):
  # memcheck on all, racecheck and synccheck (shared memory, barriers) on the attention and the whole model.
  for tool in memcheck racecheck synccheck; do
    cases="*fused attention*,*match cpu_model within*"
    [[ $tool == memcheck ]] && cases="*fused attention*,*activation checkpointing*,*match cpu_model within*,*epilogues*"
    timeout ${SANITIZE_TIMEOUT:-120} compute-sanitizer --tool $tool --error-exitcode 9 $build/examples/gpt/zero_gpt_cuda_tests \
      -tc="$cases" > "$OUT/sanitize_$tool.log" 2>&1
    echo "compute-sanitizer $tool rc=$?"; grep -E "ERROR SUMMARY|assertions" "$OUT/sanitize_$tool.log" | tail -2
  done
fi
cpu=$build/examples/gpt/zero-gpt
gpu=$build/examples/gpt/zero-gpt-cuda
small=(--text "$CORPUS" --layers 2 --heads 2 --d-model 64 --seq 64 --batch 4 --steps 50)
if want torch; then
  # bf16 on the GPU: one rank (one GPU), every stage, without and with clipping; the tolerance is docs/gpt.md's.
  timeout 150 python3 bench/gpt/compare_losses.py --zero-gpt $gpu "${small[@]}" --ranks 1 --stages 0,1,2,3 --clip 0 \
    --device cuda --dtype bf16 --tol "${BF16_TOL:-3.9e-3}" --workdir "$OUT/torch_bf16" > "$OUT/torch_bf16.log" 2>&1
  echo "torch bf16 stages 0-3 rc=$?"; tail -12 "$OUT/torch_bf16.log"
fi
if want torch_more; then
  timeout 200 python3 bench/gpt/compare_losses.py --zero-gpt $gpu "${small[@]}" --ranks 1 --stages 3 --clip 1.0 \
    --device cuda --dtype bf16 --tol "${BF16_TOL:-3.9e-3}" > "$OUT/torch_bf16_clip.log" 2>&1
  echo "torch bf16 clip rc=$?"; tail -3 "$OUT/torch_bf16_clip.log"
  # A wider model: d_model 256, 4 blocks, sequence 128 (more rounding per step).
  timeout 200 python3 bench/gpt/compare_losses.py --zero-gpt $gpu --text "$CORPUS" --layers 4 --heads 4 --d-model 256 \
    --seq 128 --batch 8 --steps 50 --ranks 1 --stages 0,3 --clip 1.0 --device cuda --dtype bf16 \
    --tol "${BF16_TOL:-3.9e-3}" > "$OUT/torch_bf16_wide.log" 2>&1
  echo "torch bf16 wide rc=$?"; tail -3 "$OUT/torch_bf16_wide.log"
  # fp32 on this host's CPU: the same check CI skips for want of PyTorch.
  timeout 120 python3 bench/gpt/compare_losses.py --zero-gpt $cpu "${small[@]}" --ranks 4 --stages 0,1,2,3 --clip 1.0 \
    --tol 1e-4 > "$OUT/torch_fp32.log" 2>&1
  echo "torch fp32 cpu rc=$?"; tail -3 "$OUT/torch_fp32.log"
fi
python3 bench/gpt/text_to_shard.py "$CORPUS" "$OUT/train.bin" "$OUT/val.bin"
shards=(--train "$OUT/train.bin" --val "$OUT/val.bin")
if want hf; then
  d12=/tmp/zero-gpt-d12
  rm -rf $d12
  # GPT-2 d12 as zero initialises it, exported (bf16 parameters, written as fp32), then its val loss and logits on
  # the GPU in bf16 beside transformers' in fp32 on the same folder.
  timeout 60 $gpu --preset d12 "${shards[@]}" --steps 0 --export $d12 --json > "$OUT/hf_export.log" 2>&1
  echo "d12 export rc=$?"
  timeout 60 $gpu --eval-only --init $d12 "${shards[@]}" --batch 4 --logits "$OUT/d12_logits.bin" > "$OUT/hf_eval.log" 2>&1
  echo "d12 eval-only rc=$?"; tail -1 "$OUT/hf_eval.log"
  loss=$(tail -1 "$OUT/hf_eval.log" | python3 -c "import json,sys; print(json.load(sys.stdin)['val_loss'])")
  python3 - "$OUT/val.bin" "$OUT/val.txt" <<'EOF'
import struct, sys
raw = open(sys.argv[1], "rb").read()[1024:]
open(sys.argv[2], "wb").write(bytes(struct.unpack(f"<{len(raw) // 2}H", raw)))
EOF
  # hf_check.py reads the validation part of a text: the last 10% of val.txt's bytes is not val.bin, so give it a
  # text whose last 10% is exactly val.bin's tokens: nine copies of nothing before them.
  python3 - "$OUT/val.txt" "$OUT/hf_text.txt" <<'EOF'
import sys
v = open(sys.argv[1], "rb").read()
open(sys.argv[2], "wb").write(b"\n" * (9 * len(v)) + v)
EOF
  timeout 90 python3 bench/gpt/hf_check.py $d12 "$OUT/hf_text.txt" --zero-val-loss "$loss" --tolerance "${HF_TOL:-1e-2}" \
    --zero-logits "$OUT/d12_logits.bin" --logits-tolerance "${HF_LOGITS_TOL:-2e-2}" > "$OUT/hf_check.log" 2>&1
  echo "hf_check d12 rc=$?"; grep "^{" "$OUT/hf_check.log"
  timeout 60 $gpu --init $d12 "${shards[@]}" --batch 4 --steps 20 --print-every 5 > "$OUT/hf_continue.log" 2>&1
  echo "d12 --init trains on rc=$?"; tail -8 "$OUT/hf_continue.log"
fi
if want speed; then
  runs=("d12 --batch 16" "d48 --batch 4") # SPEED_RUNS="d12 --batch 16 --stage 3,d48 --batch 8": others
  if [[ -n "${SPEED_RUNS:-}" ]]; then IFS=, read -ra runs <<< "$SPEED_RUNS"; fi
  for run in "${runs[@]}"; do
    set -- $run
    name=$1; shift
    log="$OUT/speed_$(echo "$name $*" | tr -c 'a-z0-9\n' '_').log"
    timeout 90 $gpu --preset $name "${shards[@]}" "$@" --steps ${SPEED_STEPS:-10} --print-every 5 --json > "$log" 2>&1
    echo "speed $name $* rc=$?"
    grep "^{" "$log" | python3 -c "
import json, sys
d = json.loads(sys.stdin.read())
print({k: d.get(k) for k in ('device', 'stage', 'tokens_per_s', 'model_tflops_per_s', 'mfu', 'device_peak_bytes',
      'model_state_peak_bytes', 'activation_bytes', 'train_loss')})
p = d.get('profile_ms_per_step', {})  # with --profile in the run's arguments
total = sum(p.values())
for name, ms in sorted(p.items(), key=lambda kv: -kv[1]):
    print(f'  {name:34s} {ms:9.3f} ms {100 * ms / total:5.1f}%')
if p:
    print(f'  in all {total:.3f} ms per step')
" || tail -5 "$log"
  done
fi
if want checkpoint; then
  # Activation checkpointing (--checkpoint-activations) at a long sequence, CKPT_RUN="PRESET B T" (default the d48 at
  # B 8, T 4096, where keeping every block's activations does not fit): the block inputs kept on the device, then in
  # host memory (activation_checkpointing.cpu_checkpointing), the configs otherwise the same. Tokens/s, the device's
  # peak and the final parameters' checksum (the same bits expected).
  read -r name b t <<< "${CKPT_RUN:-d48 8 4096}"
  python3 - "$OUT" "$b" <<'PY'
import json, sys
out, b = sys.argv[1], int(sys.argv[2])
for where in ("device", "host"):
    cfg = {"train_micro_batch_size_per_gpu": b, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
           "bf16": {"enabled": True},
           "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
           "zero_optimization": {"stage": 0},
           "activation_checkpointing": {"cpu_checkpointing": where == "host"}}
    json.dump(cfg, open(f"{out}/ckpt_{where}.json", "w"))
PY
  for where in device host; do
    log="$OUT/ckpt_${name}_t${t}_${where}.log"
    timeout 150 $gpu --preset $name --seq "$t" "${shards[@]}" --config "$OUT/ckpt_$where.json" --checkpoint-activations \
      --steps ${CKPT_STEPS:-6} --print-every 2 --json > "$log" 2>&1
    echo "checkpoint $name B $b T $t on the $where rc=$?"
    grep "^{" "$log" | python3 -c "
import json, sys
d = json.loads(sys.stdin.read())
print({k: d.get(k) for k in ('tokens_per_s', 'mfu', 'device_peak_bytes', 'activation_bytes', 'checkpoint_host_bytes',
      'params_checksum', 'train_loss', 'val_loss')})" || tail -5 "$log"
  done
fi
if want compare; then
  runs=("d12 32" "d48 8") # COMPARE_RUNS="d12 16,d24 8": others
  if [[ -n "${COMPARE_RUNS:-}" ]]; then IFS=, read -ra runs <<< "$COMPARE_RUNS"; fi
  for run in "${runs[@]}"; do
    set -- $run
    OUT=$OUT ZERO_GPT=$gpu LLMC=${LLMC:-} STEPS=${COMPARE_STEPS:-20} timeout 580 bash bench/gpt/compare.sh "$1" "$2" \
      2>&1 | tail -16
  done
fi
