#!/usr/bin/env python3
"""GPT-2 training speed in PyTorch, as a PyTorch user would write it: the model of zero-gpt (examples/gpt) with
torch's own fast paths (scaled_dot_product_attention, which picks flash attention on the GPU; fused AdamW) and
its mixed precision: fp32 weights and AdamW, bf16 compute (autocast; with FSDP2 its MixedPrecisionPolicy, bf16
parameters gathered, gradients reduced in fp32), the counterpart of zero's bf16 with an fp32 master and of llm.c's
bf16 with master weights (--dtype bf16 trains in bf16 alone, no fp32 copy), in one of three ways: eager, torch.compile, or FSDP2 (fully_shard, parameters resharded after forward) on the
ranks torchrun starts (one is enough: FSDP2 then pays its all-gathers and reduce-scatters on one GPU).
It prints one JSON line: tokens/s and step time (the mean step after the warm-up steps, and the median), model TFLOP/s and MFU with
zero-gpt's FLOP count (gpt_model.hpp's flops_per_token: 6 N + 6 L C T per token), and the peak memory torch
allocated and reserved. bench/gpt/compare.sh runs it beside zero-gpt-cuda and llm.c.

    torch_speed.py --preset d12 --batch 32 --seq 1024 --steps 20 --mode eager|compile|fsdp2 [--device cuda]
    torchrun --standalone --nproc_per_node=1 torch_speed.py --mode fsdp2 ...

The data are random token ids (speed does not depend on them); the initial weights N(0, 0.02), as GPT-2's.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

PRESETS = {"d12": (12, 12, 768), "d24": (24, 16, 1024), "d36": (36, 20, 1280), "d48": (48, 25, 1600)}
# Dense bf16 peaks by device name, as zero-gpt's gpt_cuda_engine.hpp names them (FLOP/s).
PEAKS = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}


class Block(nn.Module):
    def __init__(self, heads, C):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, seq, layers, heads, C):
        super().__init__()
        self.wte = nn.Embedding(vocab, C)
        self.wpe = nn.Embedding(seq, C)
        self.h = nn.ModuleList(Block(heads, C) for _ in range(layers))
        self.ln_f = nn.LayerNorm(C)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # the LM head tied to the token embedding
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def flops_per_token(model, layers, C, T):
    return 6.0 * sum(p.numel() for p in model.parameters()) + 6.0 * layers * C * T


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), help="GPT-2's sizes (vocab 50257, context 1024)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq", type=int, default=1024, help="T, the tokens of a sequence")
    ap.add_argument("--batch", type=int, default=4, help="B, sequences per step")
    ap.add_argument("--steps", type=int, default=20, help="steps timed")
    ap.add_argument("--warmup", type=int, default=3, help="steps run before the timed ones (compile happens here)")
    ap.add_argument("--mode", choices=["eager", "compile", "fsdp2"], default="eager")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--dtype", choices=["amp", "bf16", "fp32"], default="amp",
                    help="amp: fp32 weights, bf16 compute (default); bf16: bf16 weights; fp32: fp32 throughout")
    a = ap.parse_args()
    layers, heads, C = PRESETS[a.preset] if a.preset else (a.layers, a.heads, a.d_model)
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("torch_speed.py: --device cuda but torch sees no GPU")
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device(f"cuda:{rank}" if a.device == "cuda" else "cpu")
    if a.device == "cuda":
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(1337)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    model = GPT(a.vocab, a.seq, layers, heads, C).to(device=dev, dtype=dtype)
    autocast = a.dtype == "amp" and a.mode != "fsdp2"  # FSDP2 casts through its policy instead
    fpt = flops_per_token(model, layers, C, a.seq)
    if a.mode == "fsdp2":
        import torch.distributed as dist
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        if not dist.is_initialized():
            if "RANK" not in os.environ:  # one process without torchrun: a group of one
                os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"),
                                  RANK="0", WORLD_SIZE="1")
            dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if a.dtype == "amp" else None
        kw = {"reshard_after_forward": True, **({"mp_policy": mp} if mp else {})}
        for block in model.h:
            fully_shard(block, **kw)
        fully_shard(model, **kw)
    fused = a.device == "cuda" and a.mode != "fsdp2"
    decay = [p for p in model.parameters() if p.dim() == 2]
    other = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, fused=fused or None)
    step_fn = torch.compile(model) if a.mode == "compile" else model
    gen = torch.Generator(device="cpu").manual_seed(rank)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    times, losses = [], []
    for step in range(a.warmup + a.steps):
        idx = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen).to(dev)
        sync()
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            loss = step_fn(idx[:, :-1], idx[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
    step_s = statistics.fmean(times)  # as zero-gpt times it: the mean step after the first (here after --warmup)
    tokens_per_s = a.batch * a.seq / step_s
    name = torch.cuda.get_device_name(dev) if a.device == "cuda" else "cpu"
    peak = next((v for k, v in PEAKS.items() if k in name), 0.0)
    out = {"impl": f"torch {a.mode}", "dtype": a.dtype, "torch": torch.__version__, "device": name, "layers": layers, "d_model": C,
           "batch": a.batch, "seq": a.seq, "steps": a.steps, "step_ms": step_s * 1e3, "step_median_ms": statistics.median(times) * 1e3, "tokens_per_s": tokens_per_s,
           "flops_per_token": fpt, "model_tflops_per_s": tokens_per_s * fpt / 1e12,
           "mfu": tokens_per_s * fpt / peak if peak else None, "loss_last": losses[-1],
           "finite": all(math.isfinite(x) for x in losses)}
    if a.device == "cuda":
        out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
        out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(dev)
    if rank == 0:
        print(json.dumps(out))
    if a.mode == "fsdp2":
        torch.distributed.destroy_process_group()
    return 0 if out["finite"] else 1


if __name__ == "__main__":
    sys.exit(main())
