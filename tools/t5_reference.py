#!/usr/bin/env python3
"""Reference values for tests/test_t5.cpp, computed with PyTorch in float32 following Hugging Face
transformers' T5 (transformers/models/t5/modeling_t5.py: T5Attention._relative_position_bucket,
T5ForConditionalGeneration) — written from that description, not copied.

Regenerate the committed fixtures (Debian: apt-get install -y python3-torch) from the repository root:
    /usr/bin/python3 tools/t5_reference.py buckets > tests/data/t5/relative_position_buckets.txt

buckets: one line per relative position rp = key_pos - query_pos in [-300, 300]:
    "rp bidirectional_bucket causal_bucket" for num_buckets 32, max_distance 128.
"""
import math
import sys

import torch


def relative_position_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """HF's bucket function on an int64 tensor, with its float32 log branch."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).to(torch.long) * num_buckets
        distance = torch.abs(relative_position)
    else:
        distance = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    small = distance < max_exact
    # float32 tensor ops with Python scalars, truncated by .to(long), as HF does
    logarithmic = torch.log(distance.float() / max_exact)
    logarithmic = logarithmic / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    large = max_exact + logarithmic.to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(small, distance, large)


def cmd_buckets():
    rp = torch.arange(-300, 301, dtype=torch.long)
    bi = relative_position_bucket(rp, True, 32, 128)
    ca = relative_position_bucket(rp, False, 32, 128)
    print("# rp bidirectional causal (num_buckets 32, max_distance 128; torch %s float32)" % torch.__version__)
    for r, b, c in zip(rp.tolist(), bi.tolist(), ca.tolist()):
        print(r, b, c)


if __name__ == "__main__":
    cmds = {"buckets": cmd_buckets}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit("usage: t5_reference.py {%s}" % "|".join(cmds))
    cmds[sys.argv[1]]()
