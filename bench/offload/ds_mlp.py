#!/usr/bin/env python3
"""The deep residual MLP of examples/deep_mlp_cuda under DeepSpeed ZeRO-Offload or DeepSpeed's ZenFlow, for a
side-by-side with zero-deep-mlp-cuda in the same call (docs/offload.md, "Exact, delayed, selective").

    python3 bench/offload/ds_mlp.py --mode offload|zenflow [--stage 2] [--hidden 8192 --blocks 24 --rows 8192]
                                    [--topk 0.05 --update-interval 4 --select-interval 400] [--json]

One process, one GPU (DeepSpeed's single-rank setup: RANK 0 of WORLD_SIZE 1 over NCCL). The model, data, loss,
initialisation and timing are bench/fsdp2/fsdp2_mlp.py's (imported from there): a CUDA event at the start of
every step, the median and the mean of the periods between consecutive starts (ZenFlow's host update every
update_interval steps makes its steps differ: compare means over a multiple of the interval). DeepSpeed as a user
sets it up: bf16, AdamW (lr 1e-4, betas 0.9/0.999, eps 1e-8, weight decay 0.01 on weights, 0 on biases), no
clipping, stage 2 (or 3) with offload_optimizer cpu and pinned memory, overlap_comm, contiguous_gradients, a
reduce bucket of hidden^2 elements; --mode zenflow adds zero_optimization.zenflow with DeepSpeed's keys (ZenFlow
spawns a process for its host update when overlap_step is on: the __main__ guard below is required). DeepSpeed's
CPUAdam is JIT-built on first use (TORCH_CUDA_ARCH_LIST=9.0 on Hopper).
"""

import argparse
import json
import os
import statistics
import sys
import time


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("offload", "zenflow"), required=True)
    p.add_argument("--stage", type=int, choices=(1, 2, 3), default=2)
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--blocks", type=int, default=24)
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--steps", type=int, default=8, help="timed steps (a multiple of --update-interval)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--topk", type=float, default=0.05)
    p.add_argument("--update-interval", type=int, default=4)
    p.add_argument("--select-interval", type=int, default=400)
    p.add_argument("--overlap-step", action="store_true", help="ZenFlow's overlap_step (a process of its own)")
    p.add_argument("--json", action="store_true")
    return p.parse_args()


def ds_config(args: argparse.Namespace) -> dict:
    zero = {
        "stage": args.stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": args.hidden * args.hidden,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
    }
    if args.mode == "zenflow":
        zero["zenflow"] = {
            "topk_ratio": args.topk,
            "select_strategy": "step",
            "select_interval": args.select_interval,
            "update_interval": args.update_interval,
            "full_warm_up_rounds": 0,
            "overlap_step": args.overlap_step,
        }
    return {
        "train_micro_batch_size_per_gpu": 1,  # the step feeds its own rows; DeepSpeed only checks the product
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW",
                      "params": {"lr": args.lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}},
        "zero_optimization": zero,
        "steps_per_print": 1 << 30,
    }


def main() -> int:
    args = parse_args()
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", "29517"), ("NCCL_NVLS_ENABLE", "0")):
        os.environ.setdefault(k, v)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fsdp2"))
    import deepspeed  # noqa: E402
    import torch  # noqa: E402
    import torch.nn.functional as F  # noqa: E402
    from fsdp2_mlp import DeepMLP  # noqa: E402

    deepspeed.init_distributed(dist_backend="nccl")
    torch.cuda.set_device(0)
    device = torch.device("cuda", 0)
    torch.manual_seed(1234)
    model = DeepMLP(args.hidden, args.blocks)  # on the host, fp32: DeepSpeed moves and casts it
    bound = 1.0 / args.hidden**0.5
    with torch.no_grad():
        for param in model.parameters():
            param.uniform_(-bound, bound)
    groups = [{"params": [p for n, p in model.named_parameters() if n.endswith("weight")], "weight_decay": 0.01},
              {"params": [p for n, p in model.named_parameters() if n.endswith("bias")], "weight_decay": 0.0}]
    params = sum(p.numel() for p in model.parameters())
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=ds_config(args))

    gen = torch.Generator(device=device)
    gen.manual_seed(1)
    x = torch.rand(args.rows, args.hidden, device=device, dtype=torch.bfloat16, generator=gen) * 2 - 1
    target = torch.rand(args.rows, args.hidden, device=device, dtype=torch.bfloat16, generator=gen) * 2 - 1

    total = args.warmup + args.steps + 1
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(total)]
    host_marks = [0.0] * total
    losses = []
    for step in range(total):
        host_marks[step] = time.perf_counter()
        marks[step].record()
        loss = 0.5 * F.mse_loss(engine(x), target)
        engine.backward(loss)
        engine.step()
        if args.warmup <= step < total - 1:
            continue
        torch.cuda.synchronize()
        losses.append(float(loss.detach().float().item()))
        if not args.json:
            print(f"deepspeed {args.mode} stage {args.stage} step {step + 1:3d} loss {losses[-1]:.6f}", flush=True)
    torch.cuda.synchronize()
    event_ms = [marks[i].elapsed_time(marks[i + 1]) for i in range(args.warmup, total - 1)]
    wall_ms = [(host_marks[i + 1] - host_marks[i]) * 1e3 for i in range(args.warmup, total - 1)]
    result = {
        "impl": "deepspeed-" + args.mode,
        "deepspeed": deepspeed.__version__,
        "torch": torch.__version__,
        "stage": args.stage,
        "hidden": args.hidden,
        "blocks": args.blocks,
        "rows": args.rows,
        "params": params,
        "steps": args.steps,
        "step_ms": statistics.median(event_ms),
        "step_mean_ms": statistics.fmean(event_ms),
        "step_wall_ms": statistics.median(wall_ms),
        "step_ms_each": event_ms,
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "config": ds_config(args),
    }
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        print(f"deepspeed {args.mode} stage {args.stage}, hidden {args.hidden}, {args.blocks} blocks, {args.rows} rows, "
              f"{params} parameters\n  step {result['step_ms']:.2f} ms median over {args.steps} steps (mean "
              f"{result['step_mean_ms']:.2f} ms, wall {result['step_wall_ms']:.2f} ms)\n  each "
              f"{', '.join(f'{t:.1f}' for t in event_ms)} ms\n  loss {losses[0]:.6f} -> {losses[-1]:.6f}\n"
              f"  peak allocated {result['peak_allocated_bytes'] / float(1 << 30):.2f} GiB", flush=True)
    return 0


if __name__ == "__main__":  # DeepSpeed's ZenFlow spawns a process (overlap_step): nothing may run on import
    sys.exit(main())
