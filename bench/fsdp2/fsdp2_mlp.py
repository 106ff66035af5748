#!/usr/bin/env python3
"""The deep residual MLP of examples/deep_mlp_cuda in PyTorch FSDP2, for a side-by-side with zero.

    torchrun --standalone --nproc_per_node=2 bench/fsdp2/fsdp2_mlp.py --stage 3 [--json]

Block l: y = x + gelu(x W_l^T + b_l) (nn.Linear(hidden, hidden), nn.GELU() with erf); the loss
0.5 * mean((y_L - target)^2) against a fixed random target; `rows` rows per GPU and step, inputs and
targets U(-1, 1), parameters nn.Linear's U(-1/sqrt(hidden), 1/sqrt(hidden)), as zero's example.

FSDP2 as a ZeRO user would set it up: one fully_shard per block plus the root, fp32 sharded master
parameters, MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16), AdamW(fused=True) with zero's
hyper-parameters (betas 0.9/0.999, eps 1e-8, weight decay 0.01 on weights and 0 on biases, no
clipping). --stage 2 is reshard_after_forward=False (parameters stay gathered from forward to
backward, as ZeRO-2 keeps them whole), --stage 3 is reshard_after_forward=True.

Timing as zero's example: a CUDA event at the start of every step, nothing synchronizing inside the timed
window, the median of the periods between consecutive starts (steady state, overlap across steps kept). Memory: torch.cuda.max_memory_allocated and
max_memory_reserved over the whole run (initialisation included, as zero's counters). The loss is
rank 0's own rows' loss, in bf16 as F.mse_loss returns it for bf16 inputs.
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # before NCCL starts: NVLink SHARP stays off, as for zero

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402


class Block(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.fc = nn.Linear(hidden, hidden)
        self.act = nn.GELU()  # approximate="none": the erf GELU, as zero's kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.fc(x))


class DeepMLP(nn.Module):
    def __init__(self, hidden: int, blocks: int):
        super().__init__()
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stage", type=int, choices=(2, 3), default=2,
                   help="2: reshard_after_forward=False, 3: reshard_after_forward=True")
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--blocks", type=int, default=24)
    p.add_argument("--rows", type=int, default=8192, help="rows per GPU and step")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device)

    hidden, blocks, rows = args.hidden, args.blocks, args.rows
    # Built on the meta device and sharded before any memory is allocated, so no rank ever holds the
    # whole fp32 model; each rank then fills its own shards.
    with torch.device("meta"):
        model = DeepMLP(hidden, blocks)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    reshard = args.stage == 3
    for block in model.blocks:
        fully_shard(block, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=mp, reshard_after_forward=reshard)
    model.to_empty(device=device)
    torch.manual_seed(1234 + rank)
    bound = 1.0 / hidden**0.5
    with torch.no_grad():
        for param in model.parameters():
            param.to_local().uniform_(-bound, bound)  # nn.Linear's init, shard by shard

    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    opt = torch.optim.AdamW([{"params": weights, "weight_decay": 0.01}, {"params": biases, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.999), eps=1e-8, fused=True)
    params = sum(p.numel() for p in model.parameters())  # DTensor numel: the global count

    gen = torch.Generator(device=device)
    gen.manual_seed(1 + rank)
    x = torch.rand(rows, hidden, device=device, dtype=torch.bfloat16, generator=gen) * 2 - 1
    target = torch.rand(rows, hidden, device=device, dtype=torch.bfloat16, generator=gen) * 2 - 1

    # Step time: the steady-state period between consecutive step starts (an event at each start, nothing
    # synchronizing inside the timed window), as zero-deep-mlp-cuda measures it; one extra step closes the
    # last period. Warm-up steps and the last step synchronize to read the loss.
    total = args.warmup + args.steps + 1
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(total)]
    forward_done = [torch.cuda.Event(enable_timing=True) for _ in range(total)]
    backward_done = [torch.cuda.Event(enable_timing=True) for _ in range(total)]
    host_marks = [0.0] * total
    losses = []
    for step in range(total):
        host_marks[step] = time.perf_counter()
        marks[step].record()
        y = model(x)
        loss = 0.5 * F.mse_loss(y, target)
        forward_done[step].record()
        loss.backward()
        backward_done[step].record()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if args.warmup <= step < total - 1:
            continue
        torch.cuda.synchronize()
        losses.append(float(loss.detach().float().item()))
        if rank == 0 and not args.json:
            tag = " (warm-up)" if step < args.warmup else "          "
            print(f"fsdp2 stage {args.stage} step {step + 1:3d}{tag} loss {losses[-1]:.6f}", flush=True)
    torch.cuda.synchronize()
    event_ms = [marks[i].elapsed_time(marks[i + 1]) for i in range(args.warmup, total - 1)]
    phases = {
        "forward_ms": statistics.median(marks[i].elapsed_time(forward_done[i]) for i in range(args.warmup, total - 1)),
        "backward_ms": statistics.median(
            forward_done[i].elapsed_time(backward_done[i]) for i in range(args.warmup, total - 1)),
        "optimizer_ms": statistics.median(
            backward_done[i].elapsed_time(marks[i + 1]) for i in range(args.warmup, total - 1)),
    }
    wall_ms = [(host_marks[i + 1] - host_marks[i]) * 1e3 for i in range(args.warmup, total - 1)]

    step_ms = statistics.median(event_ms)
    result = {
        "impl": "fsdp2",
        "stage": args.stage,
        "gpus": world,
        "hidden": hidden,
        "blocks": blocks,
        "rows": rows,
        "params": params,
        "steps": args.steps,
        "warmup": args.warmup,
        "lr": args.lr,
        "step_ms": step_ms,
        "step_wall_ms": statistics.median(wall_ms),
        **phases,
        "tflops_per_gpu": 6.0 * params * rows / (step_ms * 1e-3) / 1e12,
        "flops_counted": "6*params*rows per step per GPU: fwd + bwd (dx, dW) GEMMs; block 0's unused dx GEMM "
                         "included; elementwise, optimizer, communication excluded",
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(device),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "torch": torch.__version__,
    }
    if rank == 0:
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            gib = float(1 << 30)
            print(f"fsdp2 stage {args.stage}, {world} GPU(s), hidden {hidden}, {blocks} blocks, {rows} rows/GPU, "
                  f"{params} parameters\n"
                  f"  step {step_ms:.2f} ms median over {args.steps} steps (wall {result['step_wall_ms']:.2f} ms), "
                  f"{result['tflops_per_gpu']:.1f} TFLOP/s per GPU (6 * params * rows)\n"
                  f"  of it forward {phases['forward_ms']:.2f} ms, backward {phases['backward_ms']:.2f} ms, "
                  f"optimizer step to the next start {phases['optimizer_ms']:.2f} ms (medians)\n"
                  f"  loss {losses[0]:.6f} -> {losses[-1]:.6f}\n"
                  f"  peak allocated {result['peak_allocated_bytes'] / gib:.2f} GiB, "
                  f"peak reserved {result['peak_reserved_bytes'] / gib:.2f} GiB", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
