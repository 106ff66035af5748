#!/usr/bin/env python3
"""Checks a zero-gpt --export folder against Hugging Face GPT-2's layout, without transformers: config.json's
sizes, and model.safetensors holding exactly GPT2LMHeadModel's parameter names and shapes (Conv1D weights
[in, out], no lm_head.weight: it is tied to wte), in fp32 and finite.

    check_export.py DIR --layers L --heads H --d-model C --seq T --vocab V
"""
import argparse
import json
import math
import sys

import numpy as np
from safetensors.numpy import load_file


def expected(layers, c, t, v):
    names = {"transformer.wte.weight": (v, c), "transformer.wpe.weight": (t, c)}
    for l in range(layers):
        h = f"transformer.h.{l}."
        names.update({
            h + "ln_1.weight": (c,), h + "ln_1.bias": (c,),
            h + "attn.c_attn.weight": (c, 3 * c), h + "attn.c_attn.bias": (3 * c,),
            h + "attn.c_proj.weight": (c, c), h + "attn.c_proj.bias": (c,),
            h + "ln_2.weight": (c,), h + "ln_2.bias": (c,),
            h + "mlp.c_fc.weight": (c, 4 * c), h + "mlp.c_fc.bias": (4 * c,),
            h + "mlp.c_proj.weight": (4 * c, c), h + "mlp.c_proj.bias": (c,),
        })
    names["transformer.ln_f.weight"] = (c,)
    names["transformer.ln_f.bias"] = (c,)
    return names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    for flag in ("--layers", "--heads", "--d-model", "--seq", "--vocab"):
        ap.add_argument(flag, type=int, required=True)
    a = ap.parse_args()
    problems = []
    cfg = json.load(open(f"{a.dir}/config.json"))
    for key, want in (("n_layer", a.layers), ("n_head", a.heads), ("n_embd", a.d_model), ("n_positions", a.seq),
                      ("vocab_size", a.vocab), ("model_type", "gpt2"), ("activation_function", "gelu_new"),
                      ("tie_word_embeddings", True)):
        if cfg.get(key) != want:
            problems.append(f"config.json: {key} is {cfg.get(key)!r}, expected {want!r}")
    tensors = load_file(f"{a.dir}/model.safetensors")
    want = expected(a.layers, a.d_model, a.seq, a.vocab)
    for name in sorted(set(want) - set(tensors)):
        problems.append(f"model.safetensors: {name} is missing")
    for name in sorted(set(tensors) - set(want)):
        problems.append(f"model.safetensors: {name} is not a GPT2LMHeadModel parameter")
    for name, shape in want.items():
        t = tensors.get(name)
        if t is None:
            continue
        if tuple(t.shape) != shape:
            problems.append(f"model.safetensors: {name} has shape {tuple(t.shape)}, expected {shape}")
        if t.dtype != np.float32 or not np.isfinite(t).all():
            problems.append(f"model.safetensors: {name} is {t.dtype} or not finite, expected finite fp32")
    if problems:
        print("\n".join(problems))
        return 1
    params = sum(math.prod(s) for s in want.values())
    print(f"export ok: {len(want)} tensors, {params} parameters, GPT-2's names and layouts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
