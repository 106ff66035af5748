#!/usr/bin/env bash
# On the GPU machine (transformers and PyTorch there): builds zero-gpt, then for a small trained model and for an
# initialised GPT-2 d12 exports with --export, prints zero's --eval-only val loss and checks it against
# transformers' GPT2LMHeadModel loaded from the same folder (hf_check.py). Logs go to $OUT.
#   ZERO_PREFIX=.carry/prefix CORPUS=.carry/literature bash bench/gpt/run_hf_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}
CORPUS=${CORPUS:-/usr/share/games/fortunes/literature}
mkdir -p "$OUT"
build=build/gpt
cmake -S . -B $build -DCMAKE_BUILD_TYPE=Release -DZERO_WITH_CUDA=OFF -DZERO_BUILD_TESTS=OFF -DZERO_BUILD_BENCH=OFF \
  -DCMAKE_PREFIX_PATH="$PWD/${ZERO_PREFIX:-}" > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build $build -j "$(nproc)" --target zero-gpt > "$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
gpt=$build/examples/gpt/zero-gpt
check() { # name, then zero-gpt's arguments for the export
  local name=$1; shift
  rm -rf "/tmp/$name"
  /usr/bin/time -f "$name export: %e s, %M KiB" "$gpt" --text "$CORPUS" "$@" --export "/tmp/$name" --json > "$OUT/$name.json" || return 1
  local loss
  loss=$("$gpt" --eval-only --init "/tmp/$name" --text "$CORPUS" --ranks 1 | tail -1 | python3 -c "import json,sys; print(json.load(sys.stdin)['val_loss'])")
  echo "$name: zero --eval-only val_loss $loss"
  python3 bench/gpt/hf_check.py "/tmp/$name" "$CORPUS" --zero-val-loss "$loss" --tolerance "${TOL:-1e-4}"
  echo "$name: hf_check rc=$?"
}
check small --ranks 4 --stage 3 --steps 300 --layers 2 --heads 2 --d-model 64 --seq 64
check d12 --preset d12 --ranks 1 --eval-only --batch 1
