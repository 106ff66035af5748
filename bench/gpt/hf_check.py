#!/usr/bin/env python3
"""Loads a zero-gpt --export folder with Hugging Face transformers' GPT2LMHeadModel and computes the validation
loss exactly as `zero-gpt --eval-only` defines it: the text's bytes (one token each), the last 10% (floor) as the
validation part, every window of n_positions + 1 tokens starting at 0, T, 2T, ... that fits (inputs the first T,
targets the last T), the mean next-token cross-entropy over all predicted tokens. Prints one JSON line with
transformers' loss beside zero's (`--zero-val-loss`) and their relative difference, and exits 1 when it exceeds
--tolerance.

With `--zero-logits FILE` (what `zero-gpt --logits FILE` writes: the first validation window's T x V logits, fp32)
it also compares transformers' logits on the same T tokens, element by element: the relative L2 error
||zero - hf|| / ||hf|| must be at most --logits-tolerance, and the largest absolute difference is reported.

    hf_check.py DIR TEXT --zero-val-loss 2.81 [--tolerance 1e-4] [--zero-logits F --logits-tolerance 1e-5]
                [--device cuda]
"""
import argparse
import json
import sys

import torch
from transformers import GPT2LMHeadModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("text")
    ap.add_argument("--zero-val-loss", type=float, required=True)
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--zero-logits", help="zero-gpt --logits FILE: the first validation window's logits")
    ap.add_argument("--logits-tolerance", type=float, default=1e-5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = GPT2LMHeadModel.from_pretrained(a.dir, torch_dtype=torch.float32).to(a.device).eval()
    tied = model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    data = open(a.text, "rb").read()
    val = data[len(data) - len(data) // 10:]
    T = model.config.n_positions
    tokens = torch.tensor(list(val), dtype=torch.long)
    total, count, windows = 0.0, 0, 0
    with torch.no_grad():
        for start in range(0, len(tokens) - T, T):
            w = tokens[start:start + T + 1].to(a.device)
            logits = model(w[None, :T]).logits[0].double()
            total += torch.nn.functional.cross_entropy(logits, w[1:], reduction="sum").item()
            count += T
            windows += 1
    hf = total / count
    rel = abs(hf - a.zero_val_loss) / abs(a.zero_val_loss)
    out = {"transformers_val_loss": hf, "zero_val_loss": a.zero_val_loss, "relative_difference": rel,
           "windows": windows, "lm_head_tied": tied, "params": sum(p.numel() for p in model.parameters()),
           "device": a.device}
    ok = rel <= a.tolerance and tied
    if a.zero_logits:
        V = model.config.vocab_size
        with torch.no_grad():
            hf_logits = model(tokens[None, :T].to(a.device)).logits[0].double().cpu()
        raw = open(a.zero_logits, "rb").read()
        if len(raw) != T * V * 4:
            print(f"{a.zero_logits}: {len(raw)} bytes; expected T x V x 4 = {T * V * 4} (T {T}, V {V})")
            return 1
        zl = torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(T, V).double()
        l2 = ((zl - hf_logits).norm() / hf_logits.norm()).item()
        out.update({"logits_relative_l2": l2, "logits_max_abs_difference": (zl - hf_logits).abs().max().item(),
                    "logits_max_abs": hf_logits.abs().max().item(), "logits_tolerance": a.logits_tolerance})
        ok = ok and l2 <= a.logits_tolerance
    print(json.dumps(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
