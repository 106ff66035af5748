#!/usr/bin/env bash
# GPT-2 on one GPU, one run, the same model, batch B, sequence T and steps for every program: zero-gpt-cuda at
# stages 0 and 3, llm.c (karpathy/llm.c's train_gpt2cu, built here from a copy of its sources), and PyTorch
# (torch_speed.py: eager, torch.compile, FSDP2 on one rank). Then a table of tokens/s, model TFLOP/s, MFU and peak
# GPU memory, and the ratios issue 42 asks for.
#
#   LLMC=.carry/llmc ZERO_GPT=build/gpt-gpu/examples/gpt/zero-gpt-cuda bash bench/gpt/compare.sh d12 32
#   bash bench/gpt/compare.sh d48 8
#
# Arguments: the preset (d12, d24, d36, d48: GPT-2's sizes, vocabulary 50257) and B. Environment: T (default 1024),
# STEPS (default 20; each program's first steps are its warm-up: zero-gpt and llm.c leave out the first, torch
# runs 3 more first), OUT (default ./gpu-out), ONLY (a space-separated subset of: llmc zero0 zero3 eager compile
# fsdp2), ZERO_ARGS (more zero-gpt-cuda flags, e.g. --no-gemm-epilogues), LLMC_BUILD (a folder with a train_gpt2cu
# built before, from the same sources and flags as below). Needs nvcc and cuBLAS for llm.c (built with NO_MULTI_GPU=1 USE_CUDNN=0; CUDA 13's cudaMemAdvise takes a
# cudaMemLocation, patched in the build copy), python3 with torch for the PyTorch rows.
#
# Step time: each program's mean step after its warm-up (zero-gpt's own tokens/s; llm.c's printed per-step ms;
# torch_speed.py's mean). Peak memory: the GPU's used memory (nvidia-smi, sampled every 0.1 s) above what it used
# before the program started, the one measure every program gets; the programs' own figures are in the JSON lines.
# The data are random token ids in llm.c's shard format (256 int32 header, uint16 tokens), the same files for all.
set -uo pipefail
preset=${1:-d12}
B=${2:-32}
T=${T:-1024}
STEPS=${STEPS:-20}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-$PWD/gpu-out}
out=$OUT/gpt_compare_${preset}_b${B}_t${T}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
ONLY=" ${ONLY:-llmc zero0 zero3 eager compile fsdp2} "
want() { [[ "$ONLY" == *" $1 "* ]]; }
case $preset in d12 | d24 | d36 | d48) ;; *)
  echo "compare.sh: preset $preset; expected d12, d24, d36 or d48" >&2
  exit 2
  ;;
esac

# Random shards: enough tokens for llm.c's loaders (B * T + 1 per step, train and val).
python3 "$here/random_shard.py" "$out/train.bin" "$((B * T * 4 + 1))" "$out/val.bin" "$((B * T * 4 + 1))"

# Runs "$@" with its output in $out/$name.log, sampling the GPU's used memory; the peak above the start goes to
# $out/$name.mem (MiB).
measure() {
  local name=$1
  shift
  local base
  base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0)
  "$@" > "$out/$name.log" 2>&1 &
  local pid=$! peak=$base
  while kill -0 $pid 2> /dev/null; do
    local now
    now=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0)
    ((now > peak)) && peak=$now
    sleep 0.1
  done
  wait $pid
  local rc=$?
  echo $((peak - base)) > "$out/$name.mem"
  echo "$name rc=$rc"
  [[ $rc -ne 0 ]] && tail -5 "$out/$name.log"
}

if want llmc; then
  # One build serves every preset of this $OUT; LLMC_BUILD names one made before (a folder holding train_gpt2cu).
  build=${LLMC_BUILD:-$OUT/llmc-build}
  if [[ ! -x $build/train_gpt2cu ]]; then
    LLMC=${LLMC:?LLMC names a copy of karpathy/llm.c (Makefile, train_gpt2.cu, llmc/), or LLMC_BUILD a build of it}
    rm -rf "$build" && cp -r "$LLMC" "$build"
    # CUDA 13: cudaMemAdvise's location is a cudaMemLocation, not a device number.
    if nvcc --version | grep -q "release 1[3-9]"; then
      sed -i 's/cudaMemAdvise(\*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdvise(*out, bytes, cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
        "$build/llmc/cuda_utils.cuh"
    fi
    (cd "$build" && make train_gpt2cu NO_MULTI_GPU=1 USE_CUDNN=0 GPU_COMPUTE_CAPABILITY=90 > build.log 2>&1) ||
      { tail -20 "$build/build.log"; exit 1; }
  fi
  # -e dN: from scratch at GPT-2's size. Its validation runs at the first and the last step only (-v past the end:
  # -v 0 would divide by zero), one batch (-m 1), outside the steps it times; no sampling, checkpoints or HellaSwag.
  measure llmc "$build/train_gpt2cu" -i "$out/train.bin" -j "$out/val.bin" -e "$preset" -b "$B" -t "$T" \
    -x "$STEPS" -v 1000000 -m 1 -s 0 -n 0 -h 0
fi
if want zero0 || want zero3; then
  ZERO_GPT=${ZERO_GPT:?ZERO_GPT names the zero-gpt-cuda binary}
  for s in 0 3; do
    want zero$s || continue
    measure zero$s "$ZERO_GPT" --preset "$preset" --train "$out/train.bin" --val "$out/val.bin" --batch "$B" \
      --seq "$T" --steps "$STEPS" --stage $s --print-every 5 --json ${ZERO_ARGS:-}
  done
fi
for mode in eager compile fsdp2; do
  want $mode || continue
  measure $mode python3 "$here/torch_speed.py" --preset "$preset" --batch "$B" --seq "$T" --steps "$STEPS" --mode $mode
done

python3 "$here/compare_table.py" "$out" "$preset" "$B" "$T"
