#!/usr/bin/env bash
# Two source trees of zero side by side on one GPU machine, in one call: do they give the same bits, and is
# either slower? For a change to the engine that must not change what a step computes (a refactor), run on
# the tree before it (A, e.g. `git archive REV | tar -x -C DIR`) and the tree after it (B).
#
#   ZERO_PREFIX=... bash bench/engine/ab_gpu.sh A_DIR B_DIR build bits speed offload
#
#   build    zero-gpt-cuda and zero-deep-mlp-cuda (or $TARGETS) in each tree (A_DIR/build/ab, B_DIR/build/ab), both
#            at once;
#   bits     zero-gpt-cuda (2 blocks, width 64, T 64, B 4, 20 steps, bf16) over a sweep of stage x clipping x
#            accumulation x offload (cpu, both, overlap, ratio, nvme) x ZeRO++: the final parameters' checksum
#            of A and B, one line a setting, "same" or "DIFFERENT" (exit status 1 if any differs);
#   speed    zero-deep-mlp-cuda at compare.sh's size (hidden 8192, 24 blocks, 8192 rows, 10 steps after 3) on
#            one GPU at stages 0, 2 and 3, A and B alternating, REPS pairs (default 2);
#   offload  the same with the offload configs of examples/deep_mlp_cuda (5 steps after 2, as bench/README.md).
# speed and offload print each run's step median and final loss (the loss must match bit for bit, the MLP's
# math being deterministic) and B / A of the medians. Logs in $OUT (default ./gpu-out).
set -uo pipefail
if [[ $# -lt 3 || ! -d "$1" || ! -d "$2" ]]; then
  echo "usage: $0 A_DIR B_DIR {build|bits|speed|offload}..." >&2
  exit 2
fi
A=$(cd "$1" && pwd)
B=$(cd "$2" && pwd)
shift 2
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=${ZERO_PREFIX:+$ZERO_PREFIX/lib:}${LD_LIBRARY_PATH:-}
REPS=${REPS:-2}
ARGS=" $* "
want() { [[ "$ARGS" == *" $1 "* ]]; }
status=0

build_tree() { # $1: tree, $2: jobs
  cmake -S "$1" -B "$1/build/ab" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DZERO_BUILD_EXAMPLES=ON \
    -DZERO_BUILD_TESTS=OFF -DZERO_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH="${ZERO_PREFIX:-}" > "$OUT/configure-$3.log" 2>&1 &&
    cmake --build "$1/build/ab" -j "$2" --target ${TARGETS:-zero-gpt-cuda zero-deep-mlp-cuda} > "$OUT/build-$3.log" 2>&1
}
if want build; then
  start=$(date +%s)
  half=$(($(nproc) / 2))
  build_tree "$A" "$half" A &
  pa=$!
  build_tree "$B" "$half" B
  rb=$?
  wait $pa
  ra=$?
  echo "build: A rc=$ra, B rc=$rb, $(($(date +%s) - start)) s"
  for t in A B; do grep -E "error" -A3 "$OUT/build-$t.log" | head -20; done
  [[ $ra -ne 0 || $rb -ne 0 ]] && exit 1
fi

gpt() { echo "$1/build/ab/examples/gpt/zero-gpt-cuda"; }
mlp() { echo "$1/build/ab/examples/deep_mlp_cuda/zero-deep-mlp-cuda"; }

if want bits; then
  cfg=$OUT/bits-configs
  mkdir -p "$cfg"
  # One config per offload setting; the stage, clipping and accumulation are set per run below.
  write() { # name, zero_optimization's extra keys (JSON object body, may be empty)
    cat > "$cfg/$1.json" <<EOF
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": ACC, "gradient_clipping": CLIP,
 "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
 "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 20, "warmup_num_steps": 2}},
 "zero_optimization": {"stage": STAGE, "stage3_param_persistence_threshold": 0${2:+, $2}}}
EOF
  }
  write device ""
  write cpu '"offload_optimizer": {"device": "cpu"}'
  write overlap '"offload_optimizer": {"device": "cpu", "backward_overlap": 1, "forward_overlap": true}'
  write ratio '"offload_optimizer": {"device": "cpu", "ratio": 0.5}'
  write ratio_overlap '"offload_optimizer": {"device": "cpu", "ratio": 0.5, "backward_overlap": 1, "forward_overlap": true}'
  write both '"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}'
  write both_overlap '"offload_optimizer": {"device": "cpu", "backward_overlap": 1, "forward_overlap": true}, "offload_param": {"device": "cpu"}'
  write nvme '"offload_optimizer": {"device": "nvme"}'
  write nvme_both '"offload_optimizer": {"device": "nvme"}, "offload_param": {"device": "nvme", "max_in_cpu": 0}'
  write qwz '"zero_quantized_weights": true, "zero_quantization_block_size": 256'
  write zeropp '"zero_quantized_weights": true, "zero_quantized_gradients": true, "zero_quantization_block_size": 256'
  runs=()
  for s in 0 1 2 3; do for clip in 0.0 1.0; do for acc in 1 2; do runs+=("device $s $clip $acc"); done; done; done
  for c in cpu overlap ratio nvme; do for s in 2 3; do runs+=("$c $s 1.0 1" "$c $s 0.0 2"); done; done
  # backward_overlap on a share of the state (ratio < 1) is refused with accumulation: clipping off instead
  for s in 2 3; do runs+=("ratio_overlap $s 1.0 1" "ratio_overlap $s 0.0 1"); done
  for c in both both_overlap nvme_both qwz zeropp; do runs+=("$c 3 1.0 1" "$c 3 0.0 2"); done
  same=0
  different=0
  printf "%-14s %5s %5s %4s  %-18s %-18s\n" config stage clip acc A B | tee "$OUT/bits.txt"
  for r in "${runs[@]}"; do
    read -r c s clip acc <<< "$r"
    f=$cfg/$c-$s-$clip-$acc.json
    sed -e "s/STAGE/$s/" -e "s/CLIP/$clip/" -e "s/ACC/$acc/" "$cfg/$c.json" > "$f"
    sums=()
    for t in A B; do
      tree=$A
      [[ $t == B ]] && tree=$B
      dir=${TMPDIR:-/tmp}/zero-ab-nvme-$t
      rm -rf "$dir"
      log=$OUT/bits-$t-$c-$s-$clip-$acc.log
      timeout 120 "$(gpt "$tree")" --text "${CORPUS:?CORPUS names a text file}" --layers 2 --heads 2 --d-model 64 \
        --seq 64 --steps 20 --config "$f" --nvme-path "$dir" --json > "$log" 2>&1
      sums+=("$(grep -o '"params_checksum":[0-9]*' "$log" | cut -d: -f2)")
      [[ -z ${sums[-1]} ]] && sums[-1]="failed"
    done
    verdict=same
    if [[ ${sums[0]} != "${sums[1]}" || ${sums[0]} == failed ]]; then
      verdict=DIFFERENT
      different=$((different + 1))
    else
      same=$((same + 1))
    fi
    printf "%-14s %5s %5s %4s  %-18s %-18s %s\n" "$c" "$s" "$clip" "$acc" "${sums[0]}" "${sums[1]}" "$verdict" |
      tee -a "$OUT/bits.txt"
  done
  echo "bits: $same same, $different different"
  [[ $different -ne 0 ]] && status=1
fi

# $1: label, then zero-deep-mlp-cuda's flags: REPS pairs A B, each run's step median and loss, then B / A.
ab_mlp() {
  local label=$1
  shift
  local a=() b=()
  for ((i = 0; i < REPS; i++)); do
    for t in A B; do
      tree=$A
      [[ $t == B ]] && tree=$B
      line=$(timeout 300 "$(mlp "$tree")" --gpus 1 --json "$@" 2> "$OUT/mlp-$t-$label-$i.err" | grep '"impl"')
      echo "$line" > "$OUT/mlp-$t-$label-$i.json"
      ms=$(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print("%.1f %r" % (j["step_ms"], j["loss_last"]))' \
        "$line" 2> /dev/null || echo "failed -")
      [[ $t == A ]] && a+=("$ms") || b+=("$ms")
    done
  done
  python3 - "$label" "${a[@]}" -- "${b[@]}" <<'PY'
import statistics, sys
label, rest = sys.argv[1], sys.argv[2:]
cut = rest.index("--")
a, b = rest[:cut], rest[cut + 1:]
def parse(v):
    return [float(x.split()[0]) for x in v if not x.startswith("failed")], {x.split()[1] for x in v}
ta, la = parse(a)
tb, lb = parse(b)
if not ta or not tb:
    print(f"{label:34s} failed: A {a} B {b}")
    sys.exit(1)
ma, mb = statistics.median(ta), statistics.median(tb)
loss = "same loss" if la == lb and len(la) == 1 else f"LOSSES DIFFER A {la} B {lb}"
print(f"{label:34s} A {' '.join(f'{x:7.1f}' for x in ta)}  B {' '.join(f'{x:7.1f}' for x in tb)}  ms  "
      f"B/A {mb / ma:.3f}  {loss} ({sorted(la)[0]})")
sys.exit(0 if la == lb else 1)
PY
  [[ $? -ne 0 ]] && status=1
}
cfgs=$B/examples/deep_mlp_cuda
if want speed; then
  for s in ${STAGES:-0 2 3}; do ab_mlp "stage $s" --stage "$s" --steps 10 --warmup 3 | tee -a "$OUT/speed.txt"; done
fi
if want offload; then
  for c in ${OFFLOAD:-offload_cpu offload_overlap offload_partial_overlap offload_both_partial}; do
    ab_mlp "$c" --config "$cfgs/$c.json" --steps 5 --warmup 2 | tee -a "$OUT/speed.txt"
  done
fi
exit $status
