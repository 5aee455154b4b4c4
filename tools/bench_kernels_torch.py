#!/usr/bin/env python3
"""tools/bench_kernels_torch.py: PyTorch's eager kernels at tools/bench_kernels.cpp's shapes.

    python3 tools/bench_kernels_torch.py [CALLS]      (default 50; needs torch with CUDA)

Times, in bf16 on cuda:0 with torch.cuda.Event around CALLS calls after 3 warm-up calls:
torch.nn.functional.layer_norm forward and backward (dx, dweight, dbias), RMSNorm forward
and backward (torch.nn.functional.rms_norm where this torch has it, else HF T5LayerNorm's
composite: x * rsqrt(mean(x^2) + eps) * weight with the variance in fp32), and
gelu(x + b, approximate="tanh") forward and backward (dx, dbias) on [R, 4C]. Backward runs
torch.autograd.grad on a graph kept across calls, so no .grad accumulation is timed. The
bytes per call are bench_kernels' (each [R, C] operand once), so the GB/s columns of the two
tables compare directly, and "within 1.3x of PyTorch" reads off the microsecond columns.

A second table matches bench_kernels' epilogue GEMMs with what eager PyTorch runs for the
same work: F.linear with its bias (cuBLASLt's bias epilogue inside torch), F.linear then
gelu(tanh) (the c_fc forward), the c_fc backward through gelu to (fc, bias) from the next
linear's output gradient (d gelu GEMM, gelu backward, bias sum), the weight and bias
gradients of a linear (mlp c_proj: dW = dY^T X, db = sum dY), and T5's relu(F.linear(x, wi)).
"""
import sys

import torch
import torch.nn.functional as F

MODELS = [("gpt2-124M", 8 * 1024, 768), ("gpt2-1.5B", 4 * 1024, 1600), ("t5-small", 32 * 462, 512)]


def seconds_per_call(f, calls):
    for _ in range(3):
        f()
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(calls):
        f()
    t1.record()
    torch.cuda.synchronize()
    return t0.elapsed_time(t1) / 1e3 / calls


def row(name, op, R, C, nbytes, s):
    print(f"| {name} | {op} | {R} x {C} | {s * 1e6:.1f} | {nbytes / 1e6:.1f} | {nbytes / s / 1e9:.0f} |")


def rms_norm(x, w, eps):
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    var = x.float().pow(2).mean(-1, keepdim=True)
    return w * (x.float() * torch.rsqrt(var + eps)).to(x.dtype)


def bench(name, R, C, calls):
    dev, dt, e = "cuda", torch.bfloat16, 2
    n = R * C
    g = torch.Generator(device=dev).manual_seed(1)

    def rand(*shape, lo=-1.0, hi=1.0, grad=False):
        t = (torch.rand(*shape, device=dev, generator=g) * (hi - lo) + lo).to(dt)
        return t.requires_grad_(grad)

    x = rand(R, C, lo=-2.0, hi=3.0, grad=True)
    w = rand(C, lo=0.5, hi=1.5, grad=True)
    b = rand(C, grad=True)
    dout = rand(R, C)
    with torch.no_grad():
        row(name, "layernorm_forward", R, C, 2 * n * e,
            seconds_per_call(lambda: F.layer_norm(x, (C,), w, b, 1e-5), calls))
    y = F.layer_norm(x, (C,), w, b, 1e-5)
    row(name, "layernorm_backward", R, C, 4 * n * e,
        seconds_per_call(lambda: torch.autograd.grad(y, (x, w, b), dout, retain_graph=True), calls))
    with torch.no_grad():
        row(name, "rmsnorm_forward", R, C, 2 * n * e,
            seconds_per_call(lambda: rms_norm(x, w, 1e-6), calls))
    y = rms_norm(x, w, 1e-6)
    row(name, "rmsnorm_backward", R, C, 4 * n * e,
        seconds_per_call(lambda: torch.autograd.grad(y, (x, w), dout, retain_graph=True), calls))

    Fc = 4 * C
    nf = R * Fc
    fc = rand(R, Fc, lo=-3.0, hi=3.0, grad=True)
    fb = rand(Fc, lo=-0.01, hi=0.01, grad=True)
    dg = rand(R, Fc)
    with torch.no_grad():
        row(name, "bias_gelu_forward", R, Fc, 3 * nf * e,
            seconds_per_call(lambda: F.gelu(fc + fb, approximate="tanh"), calls))
    y = F.gelu(fc + fb, approximate="tanh")
    row(name, "gelu_bias_backward", R, Fc, 3 * nf * e,
        seconds_per_call(lambda: torch.autograd.grad(y, (fc, fb), dg, retain_graph=True), calls))


def gemm_row(name, op, M, N, K, s):
    print(f"| {name} | {op} | {M} x {N} x {K} | {s * 1e6:.1f} | {2.0 * M * N * K / s / 1e12:.1f} |")


def bench_epilogues(name, R, C, calls, dev="cuda"):
    """bench_kernels.cpp's bench_epilogues rows, PyTorch eager (same M x N x K)."""
    dt = torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(2)

    def rand(*shape, lo=-1.0, hi=1.0, grad=False):
        t = (torch.rand(*shape, device=dev, generator=g) * (hi - lo) + lo).to(dt)
        return t.requires_grad_(grad)

    Fc = 4 * C
    x = rand(R, C)
    w = rand(Fc, C, lo=-0.05, hi=0.05)
    if C == 512:  # t5-small: wi, ReLU
        with torch.no_grad():
            gemm_row(name, "relu(linear(x, wi))", R, Fc, C,
                     seconds_per_call(lambda: F.relu(F.linear(x, w)), calls))
        return
    bias = rand(Fc, lo=-0.1, hi=0.1)
    with torch.no_grad():
        gemm_row(name, "linear(x, W, b) (c_fc shape)", R, Fc, C,
                 seconds_per_call(lambda: F.linear(x, w, bias), calls))
        gemm_row(name, "gelu(linear(x, W, b), tanh)", R, Fc, C,
                 seconds_per_call(lambda: F.gelu(F.linear(x, w, bias), approximate="tanh"), calls))
    # c_fc backward: z = linear(gelu(fc + b), W_proj [C, 4C]); grad to (fc, b) from dres
    fc = rand(R, Fc, lo=-2.0, hi=2.0, grad=True)
    fb = rand(Fc, lo=-0.1, hi=0.1, grad=True)
    wp = rand(C, Fc, lo=-0.05, hi=0.05)
    dres = rand(R, C)
    z = F.linear(F.gelu(fc + fb, approximate="tanh"), wp)
    gemm_row(name, "d(linear(gelu(fc + b)))/d(fc, b)", R, Fc, C,
             seconds_per_call(lambda: torch.autograd.grad(z, (fc, fb), dres, retain_graph=True),
                              calls))
    # mlp c_proj's weight and bias gradients: y = linear(h [R, 4C], W [C, 4C], b [C])
    h = rand(R, Fc)
    wc = rand(C, Fc, lo=-0.05, hi=0.05, grad=True)
    bc = rand(C, grad=True)
    y = F.linear(h, wc, bc)
    gemm_row(name, "d(linear(h, W, b))/d(W, b)", C, Fc, R,
             seconds_per_call(lambda: torch.autograd.grad(y, (wc, bc), dres, retain_graph=True),
                              calls))


def main():
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    if calls < 1 or not torch.cuda.is_available():
        sys.exit("usage: bench_kernels_torch.py [CALLS >= 1] (needs a CUDA device)")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    print("| model | op | R x C | us per call | MB moved | GB/s |")
    print("|---|---|---:|---:|---:|---:|")
    for name, R, C in MODELS:
        bench(name, R, C, calls)
    print()
    print("| model | op | M x N x K | us per call | TFLOP/s |")
    print("|---|---|---:|---:|---:|")
    for name, R, C in MODELS:
        bench_epilogues(name, R, C, calls)


if __name__ == "__main__":
    main()
