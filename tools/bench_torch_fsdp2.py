#!/usr/bin/env python3
"""PyTorch FSDP2 baseline for the fsdp_train GPU benchmark (tools/bench_gpu.sh).

Trains GPT-2 (the architecture fsdp_train implements: HF GPT2LMHeadModel without dropout,
learned token and position embeddings, pre-LayerNorm blocks with a fused qkv Linear(C, 3C),
causal attention, MLP Linear(C, 4C) -> GELU(tanh) -> Linear(4C, C), final LayerNorm, LM head
tied to the token embedding) on uniformly random tokens, on one GPU, with FSDP2:

  - torch.distributed.init_process_group("nccl", init_method="tcp://127.0.0.1:PORT",
    rank=0, world_size=1);
  - torch.distributed.fsdp.fully_shard on every block, then on the root (FULL_SHARD:
    reshard_after_forward=True), MixedPrecisionPolicy(param_dtype=torch.bfloat16,
    reduce_dtype=torch.float32); fp32 master parameters;
  - attention = F.scaled_dot_product_attention(is_causal=True) (PyTorch picks its fused
    flash / memory-efficient kernel), loss = cross-entropy on the logits upcast to fp32;
  - AdamW(fused=True), lr 6e-4 constant, betas (0.9, 0.999), eps 1e-8, weight decay 0.1 on the
    2-D Linear weights only; clip_grad_norm_(1.0);
  - --compile: each block is torch.compile(fullgraph=True)'d before fully_shard (the
    torchtitan recipe); the first --warmup steps include the compilation.

A step (timed with torch.cuda.synchronize() on both ends): zero_grad, forward, loss, backward,
clip_grad_norm_, optimizer step. The batch is drawn on the GPU before the timer.

Output (stdout): one line `RESULT {json}` with tokens_per_sec (median over the steps after
--warmup), step_ms, max_memory_allocated / max_memory_reserved (bytes, whole run),
warmup_s (the warm-up steps' wall time, compilation included), params, losses, versions.
"""

import argparse
import json
import math
import os
import socket
import statistics
import sys
import time

import torch
# Module level on purpose: `import torch._dynamo` inside main() would make `torch` local to
# all of main(), so its first line would raise UnboundLocalError (issue 19;
# tests/check_py_scopes.py flags that).
import torch._dynamo
import torch.distributed as dist
import torch.nn.functional as F


# The model and its AdamW parameter groups are the CPU benchmark's (same architecture; there
# attention uses F.scaled_dot_product_attention whenever PyTorch has it).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_torch_gpt2 import GPT2, param_groups  # noqa: E402



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-head", type=int, default=12)
    ap.add_argument("--n-embd", type=int, default=768)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--steps", type=int, default=30, help="total steps, warm-up included")
    ap.add_argument("--warmup", type=int, default=10, help="untimed leading steps")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--compile", action="store_true", help="torch.compile each block")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--verbose", action="store_true", help="per-step lines on stderr")
    args = ap.parse_args()
    if args.steps <= args.warmup:
        ap.error(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    if not torch.cuda.is_available():
        print("bench_torch_fsdp2.py: no CUDA device visible to torch", file=sys.stderr)
        return 1

    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.cuda.set_device(0)
    device = torch.device("cuda", 0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1, device_id=device)
    try:
        torch.manual_seed(args.seed)
        with torch.device(device):
            model = GPT2(args.vocab, args.n_layer, args.n_head, args.n_embd, args.seq_len)
        n_params = sum(p.numel() for p in model.parameters())
        if args.compile:
            # The blocks share one compiled graph (inline_inbuilt_nn_modules); still, never let
            # the per-code-object recompile limit send some blocks back to eager.
            for name in ("recompile_limit", "cache_size_limit"):
                if hasattr(torch._dynamo.config, name):
                    setattr(torch._dynamo.config, name,
                            max(getattr(torch._dynamo.config, name), 4 * args.n_layer))
                    break
            for i, block in enumerate(model.h):
                model.h[i] = torch.compile(block, fullgraph=True)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.h:
            fully_shard(block, mp_policy=mp, reshard_after_forward=True)
        fully_shard(model, mp_policy=mp, reshard_after_forward=True)
        opt = torch.optim.AdamW(param_groups(model, 0.1), lr=args.lr, betas=(0.9, 0.999),
                                eps=1e-8, fused=True)
        gen = torch.Generator(device=device).manual_seed(args.seed)
        tokens_per_step = args.batch * args.seq_len

        torch.cuda.reset_peak_memory_stats(device)
        rates, losses = [], []
        t_start = time.perf_counter()
        warmup_s = 0.0
        for step in range(args.steps):
            data = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1), device=device,
                                 generator=gen)
            x, y = data[:, :-1], data[:, 1:]
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            logits = model(x)
            loss = F.cross_entropy(logits.float().reshape(-1, args.vocab), y.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            torch.cuda.synchronize(device)
            dt = time.perf_counter() - t0
            losses.append(loss.item())
            if step < args.warmup:
                warmup_s = time.perf_counter() - t_start
            else:
                rates.append(tokens_per_step / dt)
            if args.verbose:
                print(f"step {step + 1}/{args.steps} | loss {losses[-1]:.4f} | "
                      f"{dt * 1e3:.1f} ms | {tokens_per_step / dt:.0f} tok/s", file=sys.stderr)
        if not all(math.isfinite(v) for v in losses):
            print(f"bench_torch_fsdp2.py: non-finite loss: {losses}", file=sys.stderr)
            return 1
        med = statistics.median(rates)
        result = {
            "tokens_per_sec": round(med, 1),
            "step_ms": round(tokens_per_step / med * 1e3, 2),
            "max_memory_allocated": torch.cuda.max_memory_allocated(device),
            "max_memory_reserved": torch.cuda.max_memory_reserved(device),
            "warmup_s": round(warmup_s, 1),
            "params": n_params,
            "tokens_per_step": tokens_per_step,
            "compile": args.compile,
            "first_loss": round(losses[0], 4),
            "last_loss": round(losses[-1], 4),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "gpu": torch.cuda.get_device_name(device),
        }
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
