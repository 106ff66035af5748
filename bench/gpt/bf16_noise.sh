#!/usr/bin/env bash
# How far apart two PyTorch runs of one GPT are by their arithmetic alone: torch_gpt.py on the GPU in fp32, in bf16
# with fp32 gradient accumulation (zero's stage 0) and with bf16 gradients (stages 1-3), from the same weights and
# batches. The step-loss differences between them bound what bf16 alone does to a trajectory, the yardstick for
# zero-gpt-cuda's own difference from the reference (docs/gpt.md, "A wider model").
#   bench/gpt/bf16_noise.sh INIT_DIR TEXT [torch_gpt.py flags, e.g. --layers 4 --heads 4 --d-model 256 --seq 128
#                            --batch 8 --steps 50 --clip 1.0]
# INIT_DIR: a `zero-gpt --steps 0 --export DIR` folder of that shape. DEVICE=cpu runs it on the CPU instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
init=$1 text=$2
shift 2
out=$(mktemp -d)
for run in "fp32" "bf16 --stage 0" "bf16 --stage 3"; do
  read -r dtype extra <<< "$run"
  # shellcheck disable=SC2086 # $extra is a flag and its value
  python3 bench/gpt/torch_gpt.py --init "$init" --text "$text" --device "${DEVICE:-cuda}" --dtype "$dtype" $extra "$@" \
    > "$out/$(echo "$run" | tr -c 'a-z0-9\n' '_').json"
done
python3 - "$out" <<'PY'
import json, pathlib, sys
runs = {p.stem: json.loads(p.read_text().strip().splitlines()[-1]) for p in pathlib.Path(sys.argv[1]).glob("*.json")}
def diff(a, b):
    la, lb = runs[a]["losses"], runs[b]["losses"]
    d = [abs(x - y) / abs(y) for x, y in zip(la, lb)]
    k = max(range(len(d)), key=d.__getitem__)
    return {"max_rel_diff": d[k], "at_step": k + 1,
            "val_rel_diff": abs(runs[a]["val_loss"] - runs[b]["val_loss"]) / runs[b]["val_loss"]}
names = sorted(runs)
for i, a in enumerate(names):
    for b in names[i + 1:]:
        print(json.dumps({"a": a, "b": b, **diff(a, b)}))
PY
rm -rf "$out"
