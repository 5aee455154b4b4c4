#!/usr/bin/env python3
"""Reference values for tests/test_t5.cpp, computed with PyTorch in float32 following Hugging Face
transformers' T5 (transformers/models/t5/modeling_t5.py: T5Attention._relative_position_bucket,
T5ForConditionalGeneration) — written from that description, not copied.

Regenerate the committed fixtures (Debian: apt-get install -y python3-torch) from the repository root:
    /usr/bin/python3 tools/t5_reference.py buckets > tests/data/t5/relative_position_buckets.txt
    for ff in relu gated-gelu; do for tie in tied untied; do
      /usr/bin/python3 tools/t5_reference.py model $ff $tie > tests/data/t5/reference_${ff}_${tie}.txt
    done; done

buckets: one line per relative position rp = key_pos - query_pos in [-300, 300]:
    "rp bidirectional_bucket causal_bucket" for num_buckets 32, max_distance 128.
model FF TIE: a tiny T5ForConditionalGeneration (3 encoder, 2 decoder blocks, num_buckets 8 and
    max_distance 20 so that short sequences reach the logarithmic buckets) with seeded float32
    weights, run in float64 on one padded batch. Lines:
      config <HF config.json, one line>
      batch B L target_len
      inputs <B*L ids>            (0 = pad)
      targets <B*target_len ids>  (-100 = ignored)
      loss <summed cross-entropy>
      param <name> <numel> <float32 values, row-major, HF state-dict layout [out, in]>
      grad <name> <numel> <d(summed loss)/d(param)>
"""
import json
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


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def t5_layer_norm(x, weight, eps):
    """T5LayerNorm: RMS over the last dim, no mean, no bias."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


class TinyT5:
    """T5ForConditionalGeneration's forward (dropout off) on a dict of named parameters."""

    def __init__(self, cfg, params):
        self.cfg = cfg
        self.p = params
        self.H = cfg["num_heads"]
        self.dkv = cfg["d_kv"]
        self.eps = cfg["layer_norm_epsilon"]

    def bias(self, prefix, Tq, Tk, bidirectional):
        ctx = torch.arange(Tq, dtype=torch.long)[:, None]
        mem = torch.arange(Tk, dtype=torch.long)[None, :]
        buckets = relative_position_bucket(mem - ctx, bidirectional, self.cfg["relative_attention_num_buckets"],
                                           self.cfg["relative_attention_max_distance"])
        table = self.p[prefix + "relative_attention_bias.weight"]  # [NB, H]
        return table[buckets].permute(2, 0, 1).unsqueeze(0)  # [1, H, Tq, Tk]

    def attention(self, prefix, x, kv, bias):
        B, Tq, _ = x.shape
        Tk = kv.shape[1]

        def heads(t, T):
            return t.view(B, T, self.H, self.dkv).transpose(1, 2)

        q = heads(x @ self.p[prefix + "q.weight"].T, Tq)
        k = heads(kv @ self.p[prefix + "k.weight"].T, Tk)
        v = heads(kv @ self.p[prefix + "v.weight"].T, Tk)
        scores = q @ k.transpose(3, 2) + bias  # no 1/sqrt(d_kv)
        probs = torch.softmax(scores, dim=-1)
        out = (probs @ v).transpose(1, 2).reshape(B, Tq, self.H * self.dkv)
        return out @ self.p[prefix + "o.weight"].T

    def feed_forward(self, prefix, x):
        p = prefix + "DenseReluDense."
        if self.cfg["feed_forward_proj"] == "relu":
            h = torch.relu(x @ self.p[p + "wi.weight"].T)
        else:
            h = gelu_new(x @ self.p[p + "wi_0.weight"].T) * (x @ self.p[p + "wi_1.weight"].T)
        return h @ self.p[p + "wo.weight"].T

    def loss(self, input_ids, labels):
        cfg, p = self.cfg, self.p
        B, Te = input_ids.shape
        Td = labels.shape[1]
        neg = torch.finfo(p["shared.weight"].dtype).min
        enc_mask = (1.0 - (input_ids != 0).to(p["shared.weight"].dtype))[:, None, None, :] * neg
        # encoder
        h = p["shared.weight"][input_ids]
        bias = None
        for i in range(cfg["num_layers"]):
            pre = "encoder.block.%d.layer." % i
            if i == 0:
                bias = self.bias(pre + "0.SelfAttention.", Te, Te, True) + enc_mask
            h = h + self.attention(pre + "0.SelfAttention.", t5_layer_norm(h, p[pre + "0.layer_norm.weight"], self.eps),
                                   t5_layer_norm(h, p[pre + "0.layer_norm.weight"], self.eps), bias)
            h = h + self.feed_forward(pre + "1.", t5_layer_norm(h, p[pre + "1.layer_norm.weight"], self.eps))
        enc = t5_layer_norm(h, p["encoder.final_layer_norm.weight"], self.eps)
        # decoder: labels shifted right, decoder_start_token_id = pad = 0, -100 -> pad
        dec_ids = torch.zeros_like(labels)
        dec_ids[:, 1:] = labels[:, :-1]
        dec_ids = dec_ids.masked_fill(dec_ids == -100, 0)
        causal = torch.triu(torch.ones(Td, Td, dtype=torch.bool), diagonal=1)
        causal_add = causal.to(enc.dtype)[None, None] * neg
        h = p["shared.weight"][dec_ids]
        for i in range(cfg["num_decoder_layers"]):
            pre = "decoder.block.%d.layer." % i
            if i == 0:
                bias = self.bias(pre + "0.SelfAttention.", Td, Td, False) + causal_add
            x = t5_layer_norm(h, p[pre + "0.layer_norm.weight"], self.eps)
            h = h + self.attention(pre + "0.SelfAttention.", x, x, bias)
            x = t5_layer_norm(h, p[pre + "1.layer_norm.weight"], self.eps)
            h = h + self.attention(pre + "1.EncDecAttention.", x, enc, enc_mask)
            h = h + self.feed_forward(pre + "2.", t5_layer_norm(h, p[pre + "2.layer_norm.weight"], self.eps))
        x = t5_layer_norm(h, p["decoder.final_layer_norm.weight"], self.eps)
        if cfg["tie_word_embeddings"]:
            logits = (x * cfg["d_model"] ** -0.5) @ p["shared.weight"].T
        else:
            logits = x @ p["lm_head.weight"].T
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                 ignore_index=-100, reduction="sum")


def param_shapes(cfg):
    """(name, shape, init std) in our declaration order; norms get None (1 + noise)."""
    D, I, F, V = cfg["d_model"], cfg["num_heads"] * cfg["d_kv"], cfg["d_ff"], cfg["vocab_size"]
    out = [("shared.weight", (V, D), 1.0)]

    def attn(pre):
        return [(pre + "q.weight", (I, D), (D * cfg["d_kv"]) ** -0.5), (pre + "k.weight", (I, D), D ** -0.5),
                (pre + "v.weight", (I, D), D ** -0.5), (pre + "o.weight", (D, I), I ** -0.5)]

    def ff(pre):
        names = ["wi"] if cfg["feed_forward_proj"] == "relu" else ["wi_0", "wi_1"]
        return ([(pre + "DenseReluDense.%s.weight" % n, (F, D), D ** -0.5) for n in names] +
                [(pre + "DenseReluDense.wo.weight", (D, F), F ** -0.5), (pre + "layer_norm.weight", (D,), None)])

    for stack, n in (("encoder", cfg["num_layers"]), ("decoder", cfg["num_decoder_layers"])):
        for i in range(n):
            pre = "%s.block.%d.layer." % (stack, i)
            out += attn(pre + "0.SelfAttention.")
            if i == 0:
                out.append((pre + "0.SelfAttention.relative_attention_bias.weight",
                            (cfg["relative_attention_num_buckets"], cfg["num_heads"]), 0.5))
            out.append((pre + "0.layer_norm.weight", (D,), None))
            if stack == "decoder":
                out += attn(pre + "1.EncDecAttention.") + [(pre + "1.layer_norm.weight", (D,), None)]
            out += ff(pre + ("2." if stack == "decoder" else "1."))
        out.append(("%s.final_layer_norm.weight" % stack, (D,), None))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, D), 1.0))
    return out


def cmd_model(ff, tie):
    cfg = {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "vocab_size": 40,
           "d_model": 8, "d_kv": 4, "d_ff": 12, "num_layers": 3, "num_decoder_layers": 2, "num_heads": 2,
           "relative_attention_num_buckets": 8, "relative_attention_max_distance": 20, "dropout_rate": 0.0,
           "layer_norm_epsilon": 1e-6, "initializer_factor": 1.0, "feed_forward_proj": ff,
           "is_encoder_decoder": True, "tie_word_embeddings": tie == "tied", "pad_token_id": 0,
           "eos_token_id": 1, "decoder_start_token_id": 0, "torch_dtype": "float32"}
    gen = torch.Generator().manual_seed(1234 + (ff == "relu") * 2 + (tie == "tied"))
    params32 = {}
    for name, shape, std in param_shapes(cfg):
        noise = torch.randn(shape, generator=gen, dtype=torch.float32)
        params32[name] = 1.0 + 0.3 * noise if std is None else std * noise
    inputs = torch.tensor([[5, 17, 9, 30, 12, 7, 22, 3, 18, 11, 26, 1],
                           [8, 14, 33, 6, 21, 1, 0, 0, 0, 0, 0, 0]], dtype=torch.long)
    labels = torch.tensor([[13, 4, 27, 35, 19, 10, 24, 31, 1],
                           [16, 29, 2, 1, -100, -100, -100, -100, -100]], dtype=torch.long)
    params = {n: t.double().requires_grad_(True) for n, t in params32.items()}
    loss = TinyT5(cfg, params).loss(inputs, labels)
    loss.backward()
    print("config", json.dumps(cfg, separators=(",", ":")))
    print("batch", inputs.shape[0], inputs.shape[1], labels.shape[1])
    print("inputs", " ".join(str(x) for x in inputs.flatten().tolist()))
    print("targets", " ".join(str(x) for x in labels.flatten().tolist()))
    print("loss", repr(loss.item()))
    for name, t in params32.items():
        print("param", name, t.numel(), " ".join("%.9g" % x for x in t.flatten().tolist()))
    for name, t in params.items():
        print("grad", name, t.numel(), " ".join("%.12g" % x for x in t.grad.flatten().tolist()))


def cmd_buckets():
    rp = torch.arange(-300, 301, dtype=torch.long)
    bi = relative_position_bucket(rp, True, 32, 128)
    ca = relative_position_bucket(rp, False, 32, 128)
    print("# rp bidirectional causal (num_buckets 32, max_distance 128; torch %s float32)" % torch.__version__)
    for r, b, c in zip(rp.tolist(), bi.tolist(), ca.tolist()):
        print(r, b, c)


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "buckets":
        cmd_buckets()
    elif (len(sys.argv) == 4 and sys.argv[1] == "model" and sys.argv[2] in ("relu", "gated-gelu")
          and sys.argv[3] in ("tied", "untied")):
        cmd_model(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: t5_reference.py buckets | model {relu|gated-gelu} {tied|untied}")
