#!/usr/bin/env python3
"""The PyTorch reference of zero-gpt: the same GPT-2, data, batches, optimizer and schedule in plain PyTorch
(no zero, no transformers), started from the model.safetensors that `zero-gpt --steps 0 --export DIR` writes.
It prints one JSON line: each step's loss over the global batch and the final validation loss computed as
`zero-gpt --eval-only` computes it. compare_losses.py runs it beside zero-gpt and compares step by step.

    torch_gpt.py --init DIR --text FILE --ranks 4 --batch 4 --steps 50 [--clip 1.0] [--lr 1e-3] [--seed 1337]
                 [--device cpu --dtype fp32 | --device cuda --dtype bf16 [--stage S | --grad-accum-dtype bf16|fp32]]

What it reproduces, and where zero-gpt has it:

- The model (examples/gpt/gpt_model.hpp): wte + wpe; per block x += c_proj(attn(ln_1(x))),
  x += mlp.c_proj(gelu_tanh(c_fc(ln_2(x)))), with LayerNorm eps 1e-5, the fused c_attn of Conv1D layout [C, 3C]
  (y = x @ W + b), causal softmax attention scaled by 1/sqrt(head size); ln_f; logits = ln_f(x) @ wte^T (tied).
  The parameters carry Hugging Face's names and are read by those names from DIR/model.safetensors.
- The data (gpt_data.hpp): load_text_bytes + split_train_val (the last floor(0.1 n) tokens are validation) or
  load_llmc_shard; batch_sampler's sequence_start = splitmix64(splitmix64(splitmix64(seed) ^ step) ^ g) mod
  (tokens - T) for global sequence g. Micro-step k of rank r draws sequences g = (k R + r) B + b (main.cpp's
  train(): sampler "rank" k R + r of R gas), so the global batch is g = 0 .. R B gas - 1 whatever R and gas.
- The loss of a step: the sum of the token losses over the global batch / its tokens; the gradient is that
  mean's. The batch runs in chunks of B sequences (one rank's micro-batch) whose gradients add up.
- The optimizer (main.cpp's default_config; zero/backend/adamw_args.hpp, cpu_backend.hpp "Numerics";
  zero/engine/schedule_from_config.hpp; zero/optim/lr_schedule.hpp): AdamW with decoupled decay as
  torch.optim.AdamW, written out here in zero's order of fp32 operations, each rounded on its own:
      g = grad * clip;  m = b1 m + (1 - b1) g;  v = b2 v + ((1 - b2) g) g;  p = p (1 - lr wd);
      p = p - (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps)
  with bc = 1 - beta^step (step from 1), betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on the 2-D tensors
  (param_spec's decay: wte, wpe and the Conv1D weights) and 0 on the rest; clip = min(1, max_norm / (norm + 1e-6))
  from the global L2 norm of the gradients (DeepSpeed's, 1 without clipping); lr = base_lr * ratio of DeepSpeed's
  WarmupCosineLR with warmup_num_steps max(2, steps / 10), total_num_steps max(steps, warmup + 1), log warmup,
  cos_min_ratio 1e-4, warmup_min_ratio 0: step s runs at iteration s - 2, so the first step has lr 0.
  The scalar factors (lr, bias corrections, clip) are computed on the host in double and rounded to fp32 as
  zero's engine does; every tensor is fp32 (or bf16), none float64.
- bf16 (--dtype bf16, DeepSpeed's bf16 mode): the model's parameters are bf16 for forward and backward, an fp32
  master copy (the bf16-rounded initial values, as DeepSpeed keeps them) is what AdamW updates, and each step ends
  by copying the master back rounded to nearest even. Gradients accumulate over the micro-batches in
  --grad-accum-dtype: by default zero's default_grad_accum_dtype (zero/config/config.hpp): fp32 at stage 0, the
  parameter dtype (bf16) at stages 1-3. The logits are taken to fp32 for the cross-entropy; the attention's
  softmax runs in fp32.
- The validation loss (main.cpp's evaluate(), gpt_data.hpp's eval_windows): every window of T + 1 validation
  tokens starting at 0, T, 2T, ... that fits; the summed token losses over (windows x T).
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

MASK64 = (1 << 64) - 1


# ------------------------------------------------------------------------------------------------ the data


class DataError(Exception):
    pass


def splitmix64(x):
    """gpt_random.hpp's splitmix64 on Python ints (mod 2^64)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def sequence_start(seed, step, global_index, tokens, T):
    """gpt_data.hpp's sequence_start."""
    h = splitmix64(splitmix64(splitmix64(seed & MASK64) ^ (step & MASK64)) ^ (global_index & MASK64))
    return h % (tokens - T)


def load_text_bytes(path):
    """gpt_data.hpp's load_text_bytes: one token per byte of a regular, non-empty file."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such regular file; expected a text file")
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        raise DataError(f"{path}: the file is empty; expected text, one token per byte")
    return np.frombuffer(data, dtype=np.uint8).astype(np.int64)


def load_llmc_shard(path, vocab):
    """gpt_data.hpp's load_llmc_shard: 256 little-endian int32 (magic 20240520, version 1, count), then exactly
    count little-endian uint16 tokens, each below vocab."""
    if not 1 <= vocab <= 65536:
        raise DataError(f"{path}: vocab {vocab} cannot be read from a uint16 shard; expected 1 to 65536")
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such regular file; expected an llm.c token shard")
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 1024:
        raise DataError(f"{path}: the file is {len(data)} bytes, shorter than the 1024-byte header")
    magic, version, count = struct.unpack("<3i", data[:12])
    if magic != 20240520:
        raise DataError(f"{path}: magic number {magic} in header[0]; expected 20240520")
    if version != 1:
        raise DataError(f"{path}: version {version} in header[1]; expected 1")
    if count < 0:
        raise DataError(f"{path}: token count {count} in header[2] is negative")
    if len(data) != 1024 + 2 * count:
        raise DataError(f"{path}: {len(data)} bytes; header[2] says {count} tokens, expected {1024 + 2 * count}")
    tokens = np.frombuffer(data, dtype="<u2", offset=1024, count=count).astype(np.int64)
    if count and int(tokens.max()) >= vocab:
        i = int(np.argmax(tokens >= vocab))
        raise DataError(f"{path}: token {i} is id {int(tokens[i])}, outside the model's vocab of {vocab}")
    return tokens


def split_train_val(tokens, val_fraction=0.1):
    """gpt_data.hpp's split_train_val: validation is the last floor(n * fraction) tokens."""
    n = len(tokens)
    n_val = math.floor(n * val_fraction)
    if n_val == 0 or n_val == n:
        raise DataError(f"{n} tokens cannot be split {val_fraction} for validation with both parts non-empty")
    return tokens[: n - n_val], tokens[n - n_val:]


def global_batch(train, step, sequences, T, seed):
    """The step's global batch, sequences g = 0 .. sequences - 1 in order: inputs and targets [sequences, T]."""
    n = len(train)
    if n < sequences * (T + 1):
        raise DataError(f"{n} training tokens, fewer than one global batch needs: {sequences * (T + 1)}")
    starts = [sequence_start(seed, step, g, n, T) for g in range(sequences)]
    idx = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(T + 1, dtype=np.int64)[None, :]
    w = torch.from_numpy(train[idx])
    return w[:, :T].contiguous(), w[:, 1:].contiguous()


def eval_windows(tokens, T):
    """gpt_data.hpp's eval_windows: the starts 0, T, 2T, ... of every window of T + 1 tokens that fits."""
    return list(range(0, tokens - T, T)) if tokens >= T + 1 else []


# ------------------------------------------------------------------------------------------------ the model


class Conv1D(nn.Module):
    """GPT-2's Conv1D: y = x @ weight + bias, weight [in, out]."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.empty(n_out))

    def forward(self, x):
        return torch.matmul(x, self.weight) + self.bias


class Attention(nn.Module):
    def __init__(self, C, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = Conv1D(C, 3 * C)
        self.c_proj = Conv1D(C, C)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.heads
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, hs).transpose(1, 2) for t in (q, k, v))
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf"))
        att = F.softmax(att, dim=-1, dtype=torch.float32).to(v.dtype)
        y = torch.matmul(att, v).transpose(1, 2).reshape(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = Conv1D(C, 4 * C)
        self.c_proj = Conv1D(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = Attention(C, heads)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, vocab, seq, layers, heads, C):
        super().__init__()
        self.wte = nn.Embedding(vocab, C)
        self.wpe = nn.Embedding(seq, C)
        self.h = nn.ModuleList([Block(C, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)


class GPT(nn.Module):
    """GPT-2 with Hugging Face's parameter names (transformer.wte.weight, transformer.h.0.attn.c_attn.weight, ...)
    and its LM head tied to wte (no parameter of its own)."""

    def __init__(self, vocab, seq, layers, heads, C):
        super().__init__()
        if C % heads != 0:
            raise ValueError(f"--d-model {C} does not divide by --heads {heads}")
        self.transformer = Transformer(vocab, seq, layers, heads, C)

    def forward(self, idx):
        t = self.transformer
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = t.wte(idx) + t.wpe(pos)
        for block in t.h:
            x = block(x)
        return torch.matmul(t.ln_f(x), t.wte.weight.t())

    def token_losses_sum(self, idx, targets):
        logits = self(idx).float()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")


def load_init(model, path):
    """Every parameter from the safetensors file, by name and shape; the file must hold exactly the model's."""
    from safetensors.torch import load_file

    tensors = load_file(path)
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(tensors))
    extra = sorted(set(tensors) - set(params))
    if missing or extra:
        raise ValueError(f"{path}: missing {missing}, unexpected {extra}")
    with torch.no_grad():
        for name, p in params.items():
            src = tensors[name]
            if tuple(src.shape) != tuple(p.shape):
                raise ValueError(f"{path}: {name} has shape {tuple(src.shape)}; the model's is {tuple(p.shape)}")
            if src.dtype != torch.float32:
                raise ValueError(f"{path}: {name} is {src.dtype}; expected float32 (zero-gpt --export)")
            p.copy_(src)


# ------------------------------------------------------------------------------------------------ the optimizer


def f32(x):
    """A host scalar rounded to fp32 (as zero's static_cast<float>)."""
    return float(np.float32(x))


class WarmupCosineLR:
    """zero/optim/lr_schedule.hpp's warmup_cosine_lr (DeepSpeed's WarmupCosineLR), in double as zero computes it."""

    def __init__(self, total_num_steps, warmup_num_steps, warmup_min_ratio=0.0, cos_min_ratio=0.0001):
        self.w = max(2, warmup_num_steps)
        self.total = total_num_steps
        self.warmup_min_ratio = warmup_min_ratio
        self.cos_min_ratio = cos_min_ratio
        if total_num_steps <= self.w:
            raise ValueError(f"total_num_steps {total_num_steps} must exceed the warmup {self.w}")

    def ratio(self, i):
        if i < 0:
            return 0.0
        if i < self.w:
            gamma = (1.0 / math.log(self.w)) * math.log(i + 1)
            return self.warmup_min_ratio + gamma * (1.0 - self.warmup_min_ratio)
        real_last_step = float(i - self.w + 1)
        real_total_steps = float(self.total - self.w)
        ratio = (1.0 + math.cos(math.pi * real_last_step / real_total_steps)) / 2.0
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * ratio)


class ZeroAdamW:
    """zero's AdamW step over fp32 master weights, each fp32 operation rounded on its own in zero's order (the
    CPU kernels' "Numerics"): separate torch ops, never a fused multiply-add."""

    def __init__(self, named_params, decay_of, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
        self.params = named_params  # [(name, param)]: the model's (bf16 or fp32) tensors
        self.master = [p.detach().float().clone() for _, p in named_params]
        self.m = [torch.zeros_like(w) for w in self.master]
        self.v = [torch.zeros_like(w) for w in self.master]
        self.wd = [weight_decay if decay_of(name, p) else 0.0 for name, p in named_params]
        self.beta1, self.beta2, self.eps = f32(betas[0]), f32(betas[1]), f32(eps)
        self.step_count = 0

    def step(self, grads, lr, grad_scale):
        """grads: fp32 (or bf16) gradients of the step's mean loss; lr: this step's lr (double); grad_scale: the
        clip coefficient (double)."""
        self.step_count += 1
        dev = self.master[0].device
        t = lambda x: torch.tensor(x, dtype=torch.float32, device=dev)  # noqa: E731 (an fp32 scalar operand)
        lr32 = np.float32(lr)
        # adamw_args.hpp set_step: 1 - float(pow(double(beta), step)), in float.
        bc1 = np.float32(1.0) - np.float32(math.pow(self.beta1, self.step_count))
        bc2 = np.float32(1.0) - np.float32(math.pow(self.beta2, self.step_count))
        step_size = t(float(lr32 / bc1))
        sqrt_bc2 = t(float(np.sqrt(bc2)))
        beta1, beta2 = t(self.beta1), t(self.beta2)
        omb1 = t(float(np.float32(1.0) - np.float32(self.beta1)))
        omb2 = t(float(np.float32(1.0) - np.float32(self.beta2)))
        eps, gs = t(self.eps), t(f32(grad_scale))
        with torch.no_grad():
            for k, (_, p) in enumerate(self.params):
                w, m, v = self.master[k], self.m[k], self.v[k]
                g = torch.mul(grads[k].float(), gs)
                m.copy_(torch.add(torch.mul(m, beta1), torch.mul(g, omb1)))
                v.copy_(torch.add(torch.mul(v, beta2), torch.mul(torch.mul(g, omb2), g)))
                decay = t(float(np.float32(1.0) - lr32 * np.float32(self.wd[k])))
                w.copy_(torch.mul(w, decay))
                denom = torch.add(torch.div(torch.sqrt(v), sqrt_bc2), eps)
                w.copy_(torch.sub(w, torch.div(torch.mul(step_size, m), denom)))
                p.copy_(w.to(p.dtype))  # round to nearest even for bf16


# ------------------------------------------------------------------------------------------------ training


def evaluate(model, val, T, chunk, device):
    """main.cpp's evaluate(): the mean token loss over every eval window of the validation tokens."""
    starts = eval_windows(len(val), T)
    if not starts:
        raise DataError(f"{len(val)} validation tokens hold no window of T + 1 = {T + 1}")
    total = torch.zeros((), dtype=torch.float32, device=device)
    with torch.no_grad():
        for i in range(0, len(starts), chunk):
            s = np.asarray(starts[i:i + chunk], dtype=np.int64)
            w = torch.from_numpy(val[s[:, None] + np.arange(T + 1)[None, :]]).to(device)
            total += model.token_losses_sum(w[:, :T], w[:, 1:])
    return total.item() / (len(starts) * T)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--init", required=True, help="a zero-gpt --export folder: model.safetensors, config.json")
    ap.add_argument("--text", help="a text file, one token per byte, split 90/10 (zero-gpt --text)")
    ap.add_argument("--train", help="llm.c token shard for training (zero-gpt --train)")
    ap.add_argument("--val", help="llm.c token shard for validation (zero-gpt --val)")
    ap.add_argument("--layers", type=int, help="checked against DIR/config.json")
    ap.add_argument("--heads", type=int, help="checked against DIR/config.json")
    ap.add_argument("--d-model", type=int, help="checked against DIR/config.json")
    ap.add_argument("--seq", type=int, help="checked against DIR/config.json")
    ap.add_argument("--ranks", type=int, default=1, help="zero-gpt's ranks: the global batch is ranks x batch x gas")
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank and micro-step")
    ap.add_argument("--gas", type=int, default=1, help="gradient accumulation steps (zero-gpt's built-in config: 1)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--clip", type=float, default=1.0, help="gradient clipping's global norm, 0 for none")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--stage", type=int, default=None, help="zero's stage: only picks bf16's grad-accum dtype")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--grad-accum-dtype", choices=["fp32", "bf16"], default=None,
                    help="default: fp32 for fp32; for bf16, fp32 at --stage 0, else bf16 (zero's default)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch's CPU threads (default 1: the model is small, and torch's spinning thread pool slows "
                         "down many times over on a core another process holds; 0: torch's default)")
    ap.add_argument("--export", help="write the final fp32 master weights here as model.safetensors")
    a = ap.parse_args()

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("torch_gpt.py: --device cuda but torch sees no GPU")
    dev = torch.device(a.device)

    with open(os.path.join(a.init, "config.json")) as f:
        hf = json.load(f)
    V, T, L, NH, C = (hf[k] for k in ("vocab_size", "n_positions", "n_layer", "n_head", "n_embd"))
    for flag, mine, theirs in (("--layers", a.layers, L), ("--heads", a.heads, NH), ("--d-model", a.d_model, C),
                               ("--seq", a.seq, T)):
        if mine is not None and mine != theirs:
            raise SystemExit(f"torch_gpt.py: {flag} {mine}, but {a.init}/config.json has {theirs}")

    if a.text:
        train, val = split_train_val(load_text_bytes(a.text))
    else:
        if not a.val:
            raise SystemExit("torch_gpt.py: give --text FILE, or --train FILE and --val FILE")
        val = load_llmc_shard(a.val, V)
        train = load_llmc_shard(a.train, V) if a.train else val
    if int(train.max()) >= V or int(val.max()) >= V:
        raise SystemExit(f"torch_gpt.py: a token id is outside the vocab of {V}")

    model = GPT(V, T, L, NH, C)
    load_init(model, os.path.join(a.init, "model.safetensors"))
    pdtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    model.to(device=dev, dtype=pdtype)
    accum = a.grad_accum_dtype or ("bf16" if a.dtype == "bf16" and (a.stage or 0) != 0 else "fp32")
    adtype = torch.bfloat16 if accum == "bf16" else torch.float32
    if a.dtype == "fp32" and accum == "bf16":
        raise SystemExit("torch_gpt.py: bf16 gradients need --dtype bf16")

    named = list(model.named_parameters())
    opt = ZeroAdamW(named, lambda name, p: p.dim() == 2)
    warmup = max(2, a.steps // 10)
    sched = WarmupCosineLR(max(a.steps, warmup + 1), warmup)

    sequences = a.ranks * a.batch * a.gas
    tokens = sequences * T
    losses, norms, lrs = [], [], []
    start = time.perf_counter()
    for step in range(a.steps):
        inputs, targets = global_batch(train, step, sequences, T, a.seed)
        inputs, targets = inputs.to(dev), targets.to(dev)
        grads = [torch.zeros(p.shape, dtype=adtype, device=dev) for _, p in named]
        step_loss = torch.zeros((), dtype=torch.float32, device=dev)
        # One chunk per (micro-step, rank), in zero's order of global sequences; each chunk's gradient of
        # (its token losses / the global batch's tokens) adds into the accumulator.
        for c0 in range(0, sequences, a.batch):
            for _, p in named:
                p.grad = None
            loss = model.token_losses_sum(inputs[c0:c0 + a.batch], targets[c0:c0 + a.batch])
            (loss / tokens).backward()
            step_loss += loss.detach()
            for k, (_, p) in enumerate(named):
                grads[k].add_(p.grad.to(adtype))
        losses.append(step_loss.item() / tokens)
        sq = torch.zeros((), dtype=torch.float32, device=dev)
        for g in grads:
            gf = g.float()
            sq += torch.sum(gf * gf)
        norm = math.sqrt(sq.item())
        clip = min(1.0, a.clip / (norm + 1e-6)) if a.clip > 0 else 1.0
        lr = a.lr * sched.ratio(step - 1)
        opt.step(grads, lr, clip)
        norms.append(norm)
        lrs.append(f32(lr))
    seconds = time.perf_counter() - start
    val_loss = evaluate(model, val, T, a.batch * a.ranks, dev)
    if a.export:
        from safetensors.torch import save_file

        os.makedirs(a.export, exist_ok=True)
        save_file({name: w.cpu().contiguous() for (name, _), w in zip(named, opt.master)},
                  os.path.join(a.export, "model.safetensors"))
    print(json.dumps({"losses": losses, "val_loss": val_loss, "grad_norms": norms, "lrs": lrs, "steps": a.steps,
                      "ranks": a.ranks, "batch": a.batch, "gas": a.gas, "device": a.device, "dtype": a.dtype,
                      "grad_accum_dtype": accum, "torch": torch.__version__, "seconds": seconds}))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except DataError as e:
        print(f"torch_gpt.py: {e}", file=sys.stderr)
        sys.exit(1)
