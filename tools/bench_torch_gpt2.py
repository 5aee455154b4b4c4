#!/usr/bin/python3
"""PyTorch eager baseline for the fsdp_train CPU benchmark (tools/bench_cpu.sh).

Trains the same GPT-2 architecture that fsdp_train implements (HF GPT2LMHeadModel without
dropout: learned token and position embeddings, pre-LayerNorm blocks with a fused qkv
Linear(C, 3C), causal softmax attention, c_proj, MLP Linear(C, 4C) -> GELU(tanh) ->
Linear(4C, C), final LayerNorm, LM head tied to the token embedding) on uniformly random
tokens, and times full optimizer steps: zero_grad, forward, cross-entropy, backward,
clip_grad_norm_(1.0), AdamW.step. Single process, torch.set_num_threads(N) (default 2).

Written for Debian's /usr/bin/python3 with python3-torch 1.13, which has no
F.scaled_dot_product_attention, so attention is matmul + causal mask + softmax + matmul.

Output: one line per timed step on stderr (with --verbose) and, on stdout, the median
tokens/s over the timed steps (those after --warmup) as one machine-readable line:
    torch_tokens_per_sec 12345.6
"""

import argparse
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """One pre-LN GPT-2 block. x: [B, T, C] f32 -> [B, T, C]."""

    def __init__(self, n_embd: int, n_head: int, seq_len: int, eps: float):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(n_embd, eps=eps)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd, eps=eps)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd)
        # PyTorch >= 2.0: the fused causal attention (flash / memory-efficient on a GPU), as
        # its users run it; torch 1.13 (Debian's, the CPU benchmark): matmul + mask + softmax.
        self.use_sdpa = hasattr(F, "scaled_dot_product_attention")
        if not self.use_sdpa:
            mask = torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), diagonal=1)
            self.register_buffer("causal_mask", mask, persistent=False)  # [T, T], True = hidden

    def attn(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        hd = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)  # each [B, T, C]
        q = q.view(B, T, self.n_head, hd).transpose(1, 2)  # [B, H, T, hd]
        k = k.view(B, T, self.n_head, hd).transpose(1, 2)
        v = v.view(B, T, self.n_head, hd).transpose(1, 2)
        if self.use_sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, hd]
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))  # [B, H, T, T]
            att = att.masked_fill(self.causal_mask[:T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v  # [B, H, T, hd]
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        h = F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")  # [B, T, 4C]
        return x + self.mlp_proj(h)


class GPT2(nn.Module):
    """GPT2LMHeadModel without dropout. idx: [B, T] int64 -> logits [B, T, V] f32."""

    def __init__(self, vocab: int, n_layer: int, n_head: int, n_embd: int, seq_len: int,
                 eps: float = 1e-5):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(seq_len, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head, seq_len, eps) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, eps=eps)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # [B, T, C]
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        return x @ self.wte.weight.t()  # tied LM head: [B, T, V]


def param_groups(model: nn.Module, weight_decay: float):
    """nanoGPT/HF grouping: decay only the 2-D Linear weights (not biases, LN, embeddings)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        is_linear_weight = p.dim() == 2 and not name.startswith(("wte", "wpe"))
        (decay if is_linear_weight else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def saved_activation_bytes(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                           vocab: int) -> int:
    """Bytes of the tensors autograd saves for backward in one forward + loss (what
    activation memory is in eager PyTorch): each distinct storage once, parameters
    excluded."""
    params = {p.data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr() if hasattr(t, "untyped_storage") \
            else t.storage().data_ptr()
        if ptr not in params and ptr not in seen:
            size = t.untyped_storage().nbytes() if hasattr(t, "untyped_storage") \
                else t.storage().nbytes()
            seen[ptr] = size
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
    del loss, logits
    return sum(seen.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32, help="sequences per step")
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30, help="total steps, warmup included")
    ap.add_argument("--warmup", type=int, default=5, help="untimed leading steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--verbose", action="store_true", help="per-step lines on stderr")
    ap.add_argument("--activation-bytes", action="store_true",
                    help="also print the bytes autograd saves for backward in one step")
    args = ap.parse_args()
    if args.n_embd % args.n_head != 0:
        ap.error(f"--n-embd {args.n_embd} is not divisible by --n-head {args.n_head}")
    if args.steps <= args.warmup:
        ap.error(f"--steps {args.steps} must exceed --warmup {args.warmup}")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = GPT2(args.vocab, args.n_layer, args.n_head, args.n_embd, args.seq_len)
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed)
    tokens_per_step = args.batch * args.seq_len

    rates = []
    for step in range(args.steps):
        # Random tokens; targets are the inputs shifted by one (seq_len + 1 drawn).
        data = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1), generator=gen)
        x, y = data[:, :-1], data[:, 1:]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if step >= args.warmup:
            rates.append(tokens_per_step / dt)
        if args.verbose:
            print(f"step {step + 1}/{args.steps} | loss {loss.item():.4f} | "
                  f"{tokens_per_step / dt:.0f} tok/s", file=sys.stderr)

    print(f"torch_tokens_per_sec {statistics.median(rates):.1f}")
    if args.activation_bytes:
        print(f"torch_activation_bytes {saved_activation_bytes(model, x, y, args.vocab)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
