#!/usr/bin/env python3
"""PyTorch counterparts of attograd's benchmark cases, for a side-by-side comparison.

Runs the same cases as build/bench/attograd_bench (same names, shapes, FLOP and
byte formulas, units) in PyTorch on the CPU, float32, and writes the same JSON
layout as Google Benchmark, so that `bench/compare` can put the two side by side:

    /usr/bin/python3 bench/torch_reference.py --threads 2 --benchmark_out=torch.json
    /opt/torch2/bin/python bench/torch_reference.py ...   # PyTorch 2.x from PyPI, in a venv
    bench/compare torch.json attograd.json

Cases (see bench/bench_attention.cpp, bench_gpt.cpp, bench_ops.cpp for the formulas):
  attn_core_{fwd,fwdbwd}/{composed,fused}/{S,M,L}, mha_{fwd,fwdbwd}/{composed,fused}/{S,M,L},
  attn_core_{fwd,fwdbwd}/bf16/{S,M,L,T2048} (scaled_dot_product_attention on bfloat16 tensors),
  gpt_step (and gpt_step/compiled with torch >= 2.0: torch.compile), charlm_step,
  matmul/<n>, matmul/proj/<shape>, softmax_*, layer_norm_*, cross_entropy_*.
(attograd's fma_peak/* cases, the machine's FMA peak, have no counterpart here.)

With --device cuda it runs the GPU cases of bench/bench_cuda.cpp instead, on the
GPU, float32 with TF32 off (so matmul is cuBLAS's float32 SGEMM, the yardstick of
cuda_matmul): cuda_matmul/{1024,2048,4096}, cuda_matmul/gpt_* (the toy GPT's products),
cuda_attn_core_{fwd,fwdbwd}/{composed,fused}/{S..XXL} (no composed XXL),
cuda_mha_fwdbwd/fused/{S..XXL}, cuda_gpt_step; and in bfloat16 cuda_matmul/bf16/* (cuBLAS's
bfloat16 GEMM), cuda_attn_core_{fwd,fwdbwd}/bf16/{S..XXL} (SDPA on bfloat16: FlashAttention-2
or cuDNN), cuda_attn_core_fwdbwd/bf16_dropout/XL (the same with dropout_p 0.1), cuda_gpt_step/bf16
and cuda_gpt2_step[/bf16] (GPT-2 small, batch 8) under autocast; each iteration timed with CUDA
events, as attograd times its GPU cases.
The composed path is the hand-written q k^T, masked_fill, softmax, @ v (the causal
mask is built once per case, as a module's buffer); the fused path is
torch.nn.functional.scaled_dot_product_attention(is_causal=True), which
torch < 2.0 lacks: the fused cases are then not run (and the script says so).
"_fwd" cases run under torch.no_grad(); "_fwdbwd" run forward with grad and a
backward from a fixed random dout, producing every input and parameter gradient.

On a shared machine, run it with OMP_WAIT_POLICY=PASSIVE: torch's OpenMP workers
spin while waiting, and when other processes hold the cores a spinning worker
burns the time slice its partner needs (here, on 2 cores at load ~4, torch at
2 threads ran 5-60x slower than at 1 thread by default, and normally with
PASSIVE). attograd's own pool always sleeps (cpu/parallel.cpp). The script
warns when the load exceeds the cores and the policy is unset.

Timing follows Google Benchmark: wall-clock mean over a run of at least
--benchmark_min_time seconds (or a fixed iteration count for the L cases,
gpt_step and charlm_step, as the C++ suite), after the case's check and one untimed step.
Stdlib + torch only.
"""
import argparse
import datetime
import json
import math
import os
import platform
import re
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# The attention shapes of the design notes (DESIGN.md, "Benchmark shapes"): (B, T, C, H).
SHAPES = {"S": (8, 64, 128, 4), "M": (4, 256, 256, 8), "L": (2, 1024, 512, 8)}
# And on the GPU (bench_cuda.cpp) two more.
GPU_SHAPES = dict(SHAPES, XL=(8, 1024, 768, 12), XXL=(4, 4096, 768, 12))
# Long sequences on the CPU, the fused core attention only (bench_attention.cpp).
LONG_SHAPES = {"T2048": (1, 2048, 512, 8), "T4096": (1, 4096, 512, 8)}
ALL_SHAPES = dict(GPU_SHAPES, **LONG_SHAPES)
DEVICE = torch.device("cpu")  # --device
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")
HAS_COMPILE = hasattr(torch, "compile")


def fixed_iterations(shape_name):
    """The C++ suite runs the attention cases of T >= 1024 a fixed 3 times on the CPU
    (bench_attention.cpp); its GPU cases run for a minimum time."""
    return 3 if ALL_SHAPES[shape_name][1] >= 1024 and DEVICE.type == "cpu" else None


def randn(*sizes, seed, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*sizes, generator=g, dtype=torch.float32).to(DEVICE)
    return t.requires_grad_(requires_grad)


class CheckFailed(Exception):
    pass


def check_close(what, got, want, atol=1e-4, rtol=1e-3):
    """got and want agree elementwise within atol + rtol |want| (compared in float64)."""
    got, want = got.detach().double(), want.detach().double()
    if got.shape != want.shape or not torch.allclose(got, want, atol=atol, rtol=rtol):
        worst = ((got - want).abs() / (atol + rtol * want.abs())).max().item() if got.shape == want.shape else math.inf
        raise CheckFailed(f"check failed: {what} differs from its reference by {worst:.3g}x the tolerance")


# ---- attention --------------------------------------------------------------------


def causal_hidden(T):
    return torch.triu(torch.ones(T, T, dtype=torch.bool, device=DEVICE), diagonal=1)  # (T, T), True above the diagonal


def attention_composed(q, k, v, hidden, dropout_p=0.0):
    scale = 1.0 / math.sqrt(q.size(-1))
    att = (q @ k.transpose(-2, -1)) * scale  # (B, H, T, T)
    att = att.masked_fill(hidden, float("-inf"))
    att = F.softmax(att, dim=-1)
    if dropout_p > 0:
        att = F.dropout(att, dropout_p)
    return att @ v  # (B, H, T, D)


def attention_fused(q, k, v, hidden, dropout_p=0.0):
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)


ATTENTION = {"composed": attention_composed, "fused": attention_fused}


def core_fwd_flops(B, T, C, H):
    # q k^T and P v over the causal lower triangle, diagonal included (bench_attention.cpp).
    return 2.0 * B * H * (C // H) * T * (T + 1)


def attn_core_case(shape_name, impl, backward_too, dtype=torch.float32, dropout_p=0.0):
    """attn_core_*/<impl>/<shape>, or with dtype bfloat16 attn_core_*/bf16/<shape> (the fused path
    on bfloat16 q, k, v and dout); with dropout_p, dropout on the weights, unchecked (the masks are
    torch's own draws; bench_cuda.cpp checks attograd's against its float32 path on the same masks)."""
    B, T, C, H = ALL_SHAPES[shape_name]
    D = C // H
    q, k, v = (randn(B, H, T, D, seed=s).to(dtype).requires_grad_(True) for s in (11, 12, 13))
    dout = randn(B, H, T, D, seed=14).to(dtype)
    hidden = causal_hidden(T)
    attend = ATTENTION[impl]
    if dropout_p > 0:
        attend = lambda q, k, v, hidden: ATTENTION[impl](q, k, v, hidden, dropout_p)

    def run(fn, dtype):
        qq, kk, vv = (x.detach().to(dtype).requires_grad_(backward_too) for x in (q, k, v))
        if not backward_too:
            with torch.no_grad():
                return fn(qq, kk, vv, hidden), None
        out = fn(qq, kk, vv, hidden)
        out.backward(dout.to(dtype))
        return out, (qq.grad, kk.grad, vv.grad)

    # Check: float32 against the composed path in float64; bfloat16 against the fused path in
    # float32 on the same values, within a few bfloat16 roundings (2^-6, as the C++ case).
    if dropout_p == 0:
        out, grads = run(attend, dtype)
        if dtype == torch.float32:
            want, want_grads = run(attention_composed, torch.float64)
            tolerances = lambda w: {}
        else:
            want, want_grads = run(attention_fused, torch.float32)
            tolerances = lambda w: {"atol": 2.0 ** -6 * w.abs().max().item(), "rtol": 2.0 ** -6}
        check_close(f"{impl} attention output", out, want, **tolerances(want))
        if backward_too:
            for name, g, w in zip(("dq", "dk", "dv"), grads, want_grads):
                check_close(f"{impl} attention {name}", g, w, **tolerances(w))

    def step():
        if not backward_too:
            with torch.no_grad():
                return attend(q, k, v, hidden)
        for x in (q, k, v):
            x.grad = None
        out = attend(q, k, v, hidden)
        out.backward(dout)
        return out

    btd = float(B * H * T * D) * torch.tensor([], dtype=dtype).element_size() / 4  # float32 bytes, halved in bfloat16
    flops = (3 if backward_too else 1) * core_fwd_flops(B, T, C, H)
    return step, flops, (48 if backward_too else 16) * btd, fixed_iterations(shape_name)


class MultiHeadAttention(nn.Module):
    """attograd's nn::MultiHeadAttention: q, k, v packed as one (C, 3C) Linear, then out_proj;
    `dropout` on the attention weights in training mode."""

    def __init__(self, C, H, impl, dropout=0.0):
        super().__init__()
        self.H, self.attend, self.dropout = H, ATTENTION[impl], dropout
        self.qkv = nn.Linear(C, 3 * C)
        self.out_proj = nn.Linear(C, C)

    def forward(self, x, hidden):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # (B, T, C) each
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        y = self.attend(q, k, v, hidden, self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.out_proj(y)


def mha_case(shape_name, impl, backward_too):
    B, T, C, H = GPU_SHAPES[shape_name]
    x = randn(B, T, C, seed=21, requires_grad=backward_too)
    dout = randn(B, T, C, seed=22)
    hidden = causal_hidden(T)
    torch.manual_seed(23)
    mha = MultiHeadAttention(C, H, impl).to(DEVICE)
    reference = MultiHeadAttention(C, H, "composed").double().to(DEVICE)
    reference.load_state_dict({n: p.double() for n, p in mha.state_dict().items()})

    def run(module, dtype):
        xx = x.detach().to(dtype).requires_grad_(backward_too)
        if not backward_too:
            with torch.no_grad():
                return module(xx, hidden), []
        module.zero_grad(set_to_none=True)
        y = module(xx, hidden)
        y.backward(dout.to(dtype))
        return y, [xx.grad] + [p.grad for p in module.parameters()]

    # Check: against the composed module in float64 with the same weights.
    y, grads = run(mha, torch.float32)
    want, want_grads = run(reference, torch.float64)
    check_close(f"{impl} mha output", y, want)
    for i, (g, w) in enumerate(zip(grads, want_grads)):
        check_close(f"{impl} mha gradient #{i}", g, w, 1e-3, 1e-3)

    def step():
        if not backward_too:
            with torch.no_grad():
                return mha(x, hidden)
        x.grad = None
        mha.zero_grad(set_to_none=True)
        y = mha(x, hidden)
        y.backward(dout)
        return y

    fwd = core_fwd_flops(B, T, C, H) + 8.0 * B * T * C * C
    btc, params = float(B * T * C), 4.0 * C * C + 4.0 * C
    bytes_ = 4 * (4 * btc + 3 * params) if backward_too else 4 * (2 * btc + params)
    return step, (3 if backward_too else 1) * fwd, bytes_, fixed_iterations(shape_name)


# ---- the GPT (nn/gpt.h): nanoGPT's layout and GPT-2's init ---------------------------


class Block(nn.Module):
    def __init__(self, C, H, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.attn = MultiHeadAttention(C, H, "fused" if HAS_SDPA else "composed", dropout)
        self.ln_2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.proj = nn.Linear(4 * C, C)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x, hidden):
        x = x + self.resid_dropout(self.attn(self.ln_1(x), hidden))
        return x + self.resid_dropout(self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh")))


class GPT(nn.Module):
    """Dropout, as attograd's GPTConfig::dropout, on the embeddings, the attention weights and
    the residual branches (training mode, torch's default for a new module)."""

    def __init__(self, vocab=65, block=128, n_layer=4, n_head=4, C=128, dropout=0.0):
        super().__init__()
        self.wte = nn.Embedding(vocab, C)
        self.wpe = nn.Embedding(block, C)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(C, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(C)
        self.register_buffer("hidden", causal_hidden(block), persistent=False)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:  # Linear weights and both embeddings
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("out_proj.weight", "proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def loss(self, tokens, targets):
        B, T = tokens.shape
        x = self.drop(self.wte(tokens) + self.wpe(torch.arange(T, device=tokens.device)))
        hidden = self.hidden[:T, :T]
        for block in self.blocks:
            x = block(x, hidden)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head, (B, T, V)
        return F.cross_entropy(logits.view(B * T, -1), targets.view(-1))


def gpt_step_case(compiled=False, B=32, T=128, dropout=0.0, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01,
                  clip_norm=0.0, n_layer=4, C=128, n_head=4, bf16=False, initial_loss_tolerance=0.1, V=65):
    """A training step of the GPT (vocab 65, 4 layers, 4 heads, width 128, block T) on a batch
    of B x T tokens, in attograd's trainer's order: loss, backward, clip (clip_norm > 0),
    update, zero_grad. The defaults are gpt_step's (the toy GPT); see charlm_step_case.
    `compiled`: its loss (forward and, through AOTAutograd, backward) under torch.compile,
    whose first calls compile and are not timed."""
    torch.manual_seed(1337)
    model = GPT(vocab=V, block=T, n_layer=n_layer, n_head=n_head, C=C, dropout=dropout).to(DEVICE)
    loss_of = torch.compile(model.loss) if compiled else model.loss
    # AdamW as attograd's: weight decay on Linear weights only (not biases, norms, embeddings).
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and not n.startswith(("wte", "wpe"))]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() == 2 and not n.startswith(("wte", "wpe")))]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=betas, eps=1e-8)
    params = list(model.parameters())
    g = torch.Generator().manual_seed(31)
    tokens = torch.randint(0, V, (B, T), generator=g).to(DEVICE)
    targets = torch.randint(0, V, (B, T), generator=g).to(DEVICE)

    def step():
        # bf16: the forward under autocast, float32 master weights, as nanoGPT's dtype='bfloat16'
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_of(tokens, targets)
        loss.backward()
        if clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    # Checks, as bench_gpt.cpp: initial loss near ln(V); 4 steps on one batch lower it.
    first = step()
    if not abs(first - math.log(V)) < initial_loss_tolerance:
        raise CheckFailed(f"check failed: initial loss {first:.4f} is not near ln(V) = {math.log(V):.4f}")
    for _ in range(3):
        last = step()
    if not last < first - 0.01:
        raise CheckFailed(f"check failed: 4 AdamW steps on one batch did not lower its loss ({first} -> {last})")

    BT = float(B * T)
    layer = 24 * BT * C * C + 2.0 * B * C * T * (T + 1)
    flops = 3 * (n_layer * layer + 2 * BT * C * V)
    n_params = sum(p.numel() for p in params)
    return step, flops, 40.0 * n_params, 5 if DEVICE.type == "cpu" else None, {"tokens": BT}


def real_size_case(n_layer, C, n_head, T, B, bf16, V=65):
    """bench_gpt.cpp's shakespeare_step, gpt2_step (vocab 65) and gpt2_124m_step (vocab 50304): AdamW lr 1e-5,
    weight decay 0.1, clipping at 1.0; bf16 under torch.autocast."""
    return gpt_step_case(B=B, T=T, lr=1e-5, betas=(0.9, 0.999), weight_decay=0.1, clip_norm=1.0, n_layer=n_layer,
                         C=C, n_head=n_head, bf16=bf16, initial_loss_tolerance=0.3, V=V)


def charlm_step_case():
    """`attograd train --data FILE --layers 4 --width 128 --heads 4 --block 64 --batch 64`'s step
    (bench_gpt.cpp): the --data preset's dropout 0.1, lr 3e-3, betas (0.9, 0.99) and weight decay
    0.1, gradients clipped to a global norm of 1.0."""
    return gpt_step_case(B=64, T=64, dropout=0.1, lr=3e-3, betas=(0.9, 0.99), weight_decay=0.1, clip_norm=1.0)


# ---- single ops (bench_ops.cpp) ------------------------------------------------------


def matmul_case(M, K, N, a_transposed=False):
    a = randn(K, M, seed=1).t() if a_transposed else randn(M, K, seed=1)
    b = randn(K, N, seed=2)
    r, c = min(M, 16), min(N, 16)
    check_close("matmul", (a @ b)[:r, :c], a[:r].double() @ b[:, :c].double(), 1e-4 * math.sqrt(K), 0)

    def step():
        return a @ b

    return step, 2.0 * M * K * N, 4.0 * (M * K + K * N + M * N), None


def matmul_bf16_case(M, K, N, a_transposed=False, b_transposed=False):
    """bfloat16 operands and result (oneDNN's kernels: AMX or AVX512_BF16 where the CPU has them;
    cuBLAS on the GPU)."""
    a = (randn(K, M, seed=1).t() if a_transposed else randn(M, K, seed=1)).bfloat16()
    b = (randn(N, K, seed=2).t() if b_transposed else randn(K, N, seed=2)).bfloat16()
    check_close("matmul_bf16", (a @ b)[:16, :16].double(), a[:16].double() @ b[:, :16].double(),
                1e-3 * math.sqrt(K), 1.0 / 128)

    def step():
        return a @ b

    return step, 2.0 * M * K * N, 2.0 * (M * K + K * N + M * N), None


def softmax_case(shape_name, backward_too):
    B, T, C, H = SHAPES[shape_name]
    x = randn(B, H, T, T, seed=3, requires_grad=backward_too)
    dy = randn(B, H, T, T, seed=4)
    check_close("softmax", F.softmax(x, -1), F.softmax(x.double(), -1), 1e-6, 1e-4)

    def step():
        x.grad = None
        y = F.softmax(x, -1)
        if backward_too:
            y.backward(dy)
        return y

    n = float(B * H * T * T)
    return step, (9 if backward_too else 5) * n, (20 if backward_too else 8) * n, None


def layer_norm_case(N, C, backward_too):
    x = randn(N, C, seed=5, requires_grad=backward_too)
    w, b = randn(C, seed=6, requires_grad=backward_too), randn(C, seed=7, requires_grad=backward_too)
    dy = randn(N, C, seed=8)
    check_close("layer_norm", F.layer_norm(x, (C,), w, b), F.layer_norm(x.double(), (C,), w.double(), b.double()))

    def step():
        for t in (x, w, b):
            t.grad = None
        y = F.layer_norm(x, (C,), w, b)
        if backward_too:
            y.backward(dy)
        return y

    n = float(N * C)
    return step, (19 if backward_too else 8) * n, (20 if backward_too else 8) * n, None


def gelu_case(N, C, backward_too):
    x = randn(N, C, seed=10, requires_grad=backward_too)
    dy = randn(N, C, seed=11)
    check_close("gelu", F.gelu(x, approximate="tanh"), F.gelu(x.double(), approximate="tanh"))

    def step():
        x.grad = None
        y = F.gelu(x, approximate="tanh")
        if backward_too:
            y.backward(dy)
        return y

    n = float(N * C)
    return step, (27 if backward_too else 9) * n, (20 if backward_too else 8) * n, None


def sum_rows_case(N, C):
    g = randn(N, C, seed=12)
    check_close("sum over rows", g.sum(0), g.double().sum(0))
    return (lambda: g.sum(0)), float(N * C), 4.0 * (N * C + C), None


def cross_entropy_case(N, V, backward_too):
    logits = randn(N, V, seed=9, requires_grad=backward_too)
    targets = torch.tensor([(i * 7919) % V for i in range(N)])
    check_close("cross_entropy", F.cross_entropy(logits, targets), F.cross_entropy(logits.double(), targets), 1e-5, 1e-5)

    def step():
        logits.grad = None
        loss = F.cross_entropy(logits, targets)
        if backward_too:
            loss.backward()
        return loss

    n = float(N * V)
    return step, (7 if backward_too else 4) * n, (12 if backward_too else 4) * n, None


def all_cases():
    """(name, make) in the C++ suite's order of families; make() -> (step, flops, bytes, iterations[, extra])."""
    cases = []
    for bwd in (False, True):
        for impl in ("composed", "fused"):
            for s in SHAPES:
                tail = f"/{impl}/{s}"
                cases.append(("attn_core_" + ("fwdbwd" if bwd else "fwd") + tail,
                              lambda s=s, impl=impl, bwd=bwd: attn_core_case(s, impl, bwd)))
                cases.append(("mha_" + ("fwdbwd" if bwd else "fwd") + tail,
                              lambda s=s, impl=impl, bwd=bwd: mha_case(s, impl, bwd)))
    for bwd in (False, True):
        for s in ("S", "M", "L", "T2048"):
            cases.append(("attn_core_" + ("fwdbwd" if bwd else "fwd") + f"/bf16/{s}",
                          lambda s=s, bwd=bwd: attn_core_case(s, "fused", bwd, torch.bfloat16)))
    for bwd in (False, True):
        for s in LONG_SHAPES:
            cases.append(("attn_core_" + ("fwdbwd" if bwd else "fwd") + f"/fused/{s}",
                          lambda s=s, bwd=bwd: attn_core_case(s, "fused", bwd)))
    cases.append(("gpt_step", gpt_step_case))
    if HAS_COMPILE:  # torch >= 2.0: the same step under torch.compile (attograd has no such case; see side_by_side)
        cases.append(("gpt_step/compiled", lambda: gpt_step_case(compiled=True)))
    cases.append(("charlm_step", charlm_step_case))
    cases.append(("gpt_step/bf16", lambda: gpt_step_case(bf16=True)))
    for name, (n_layer, C, n_head, T, B, V) in (("shakespeare_step", (6, 384, 6, 256, 16, 65)),
                                                ("gpt2_step", (12, 768, 12, 1024, 2, 65)),
                                                ("gpt2_124m_step", (12, 768, 12, 1024, 2, 50304))):
        for bf16 in (False, True):
            cases.append((name + ("/bf16" if bf16 else ""),
                          lambda a=(n_layer, C, n_head, T, B), bf16=bf16, V=V: real_size_case(*a, bf16, V=V)))
    for n in (256, 512, 1024, 2048):
        cases.append((f"matmul/{n}", lambda n=n: matmul_case(n, n, n)))
    for n in (768, 2048):
        cases.append((f"matmul_bf16/{n}", lambda n=n: matmul_bf16_case(n, n, n)))
    # The shakespeare_char MLP's products, as bench_ops.cpp's.
    cases.append(("matmul_bf16/mlp_up", lambda: matmul_bf16_case(4096, 384, 1536)))
    cases.append(("matmul_bf16/mlp_down", lambda: matmul_bf16_case(4096, 1536, 384)))
    for s, (B, T, C, H) in SHAPES.items():
        cases.append((f"matmul/proj/{s}", lambda B=B, T=T, C=C: matmul_case(B * T, C, C)))
    for bwd in (False, True):
        suffix = "_fwdbwd/" if bwd else "_fwd/"
        for s, (B, T, C, H) in SHAPES.items():
            cases.append(("softmax" + suffix + s, lambda s=s, bwd=bwd: softmax_case(s, bwd)))
            cases.append(("layer_norm" + suffix + s, lambda B=B, T=T, C=C, bwd=bwd: layer_norm_case(B * T, C, bwd)))
        cases.append(("layer_norm" + suffix + "gpt", lambda bwd=bwd: layer_norm_case(4096, 128, bwd)))
        cases.append(("cross_entropy" + suffix + "gpt", lambda bwd=bwd: cross_entropy_case(4096, 65, bwd)))
        cases.append(("cross_entropy" + suffix + "V8192", lambda bwd=bwd: cross_entropy_case(1024, 8192, bwd)))
        cases.append(("gelu" + suffix + "gpt", lambda bwd=bwd: gelu_case(4096, 512, bwd)))
    cases.append(("sum_rows/gpt", lambda: sum_rows_case(4096, 384)))
    return cases


# bench_cuda.cpp's kGptGemms: the toy GPT's products (M, K, N, A read transposed).
GPT_GEMMS = [(4096, 128, 128, False), (4096, 128, 512, False), (4096, 512, 128, False), (128, 4096, 512, True)]
# bench_cuda.cpp's kGpt2Gemms: GPT-2 small's (M, K, N, A read transposed, B read transposed).
GPT2_GEMMS = [(8192, 768, 2304, False, True), (8192, 768, 3072, False, True), (8192, 3072, 768, False, True),
              (8192, 768, 50304, False, True), (8192, 3072, 768, False, False), (3072, 8192, 768, True, False),
              (50304, 8192, 768, True, False)]


def gpu_cases():
    """bench_cuda.cpp's cases, in its order; make() as in all_cases()."""
    cases = [(f"cuda_matmul/{n}", lambda n=n: matmul_case(n, n, n)) for n in (1024, 2048, 4096)]
    for M, K, N, a_transposed in GPT_GEMMS:
        name = f"cuda_matmul/gpt_{M}x{K}x{N}" + ("_at" if a_transposed else "")
        cases.append((name, lambda M=M, K=K, N=N, t=a_transposed: matmul_case(M, K, N, t)))
    cases += [(f"cuda_matmul/bf16/{n}", lambda n=n: matmul_bf16_case(n, n, n)) for n in (1024, 2048, 4096)]
    for M, K, N, a_transposed in GPT_GEMMS:
        name = f"cuda_matmul/bf16/gpt_{M}x{K}x{N}" + ("_at" if a_transposed else "")
        cases.append((name, lambda M=M, K=K, N=N, t=a_transposed: matmul_bf16_case(M, K, N, t)))
    for M, K, N, a_transposed, b_transposed in GPT2_GEMMS:
        name = f"cuda_matmul/bf16/gpt2_{M}x{K}x{N}" + ("_at" if a_transposed else "") + ("_bt" if b_transposed else "")
        cases.append((name, lambda M=M, K=K, N=N, ta=a_transposed, tb=b_transposed: matmul_bf16_case(M, K, N, ta, tb)))
    for bwd in (False, True):
        for impl in ("fused", "composed"):
            for s, (B, T, C, H) in GPU_SHAPES.items():
                if impl == "composed" and T > 1024:
                    continue  # as bench_cuda.cpp: its (T, T) matrices alone are 3 GiB
                cases.append((f"cuda_attn_core_{'fwdbwd' if bwd else 'fwd'}/{impl}/{s}",
                              lambda s=s, impl=impl, bwd=bwd: attn_core_case(s, impl, bwd)))
    for bwd in (False, True):
        for s in GPU_SHAPES:
            cases.append((f"cuda_attn_core_{'fwdbwd' if bwd else 'fwd'}/bf16/{s}",
                          lambda s=s, bwd=bwd: attn_core_case(s, "fused", bwd, torch.bfloat16)))
    cases.append(("cuda_attn_core_fwdbwd/bf16_dropout/XL",
                  lambda: attn_core_case("XL", "fused", True, torch.bfloat16, dropout_p=0.1)))
    for s in GPU_SHAPES:
        cases.append((f"cuda_mha_fwdbwd/fused/{s}", lambda s=s: mha_case(s, "fused", True)))
    cases.append(("cuda_gpt_step", gpt_step_case))
    cases.append(("cuda_gpt_step/bf16", lambda: gpt_step_case(bf16=True)))
    for bf16 in (False, True):  # GPT-2 small at batch 8, as bench_cuda.cpp
        cases.append(("cuda_gpt2_step" + ("/bf16" if bf16 else ""),
                      lambda bf16=bf16: real_size_case(12, 768, 12, 1024, 8, bf16)))
    cases.append(("cuda_gpt2_124m_step/bf16", lambda: real_size_case(12, 768, 12, 1024, 8, True, V=50304)))
    return cases


def full_name(name, iterations):
    """Google Benchmark's run name: the case plus the attributes it appends (fixed iterations, wall-clock time)."""
    return name + (f"/iterations:{iterations}" if iterations else "") + "/real_time"


def run_case(name, make, min_time):
    made = make()
    step, flops, bytes_, iterations = made[:4]
    extra_rates = made[4] if len(made) > 4 else {}
    # One untimed step first: a case's check may run the forward only, and the first backward
    # of a process starts autograd's engine (0.5 s once, timed into a whole repetition before).
    step()
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    n, real0, cpu0, gpu_seconds = 0, time.perf_counter(), time.thread_time(), 0.0
    while (iterations and n < iterations) or (not iterations and time.perf_counter() - real0 < min_time):
        if DEVICE.type == "cuda":  # the GPU's time for this iteration's work, as attograd's cuda::time_gpu_ms
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            gpu_seconds += start.elapsed_time(end) / 1e3
        else:
            step()
        n += 1
    real, cpu = time.perf_counter() - real0, time.thread_time() - cpu0
    if DEVICE.type == "cuda":
        real = gpu_seconds
    run = {
        "name": full_name(name, iterations), "run_name": full_name(name, iterations), "run_type": "iteration",
        "repetitions": 1, "repetition_index": 0, "threads": 1, "iterations": n,
        "real_time": real / n * 1e3, "cpu_time": cpu / n * 1e3, "time_unit": "ms",
        "bytes": bytes_ * n / real, "flops": flops * n / real, "num_threads": float(torch.get_num_threads()),
    }
    for key, per_iter in extra_rates.items():
        run[key] = per_iter * n / real
    return run


def si(x):
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.4g}{unit}"
    return f"{x:.4g}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_threads = int(os.environ.get("ATTOGRAD_THREADS", "0") or 0)
    parser.add_argument("--threads", type=int, default=default_threads,
                        help="torch.set_num_threads (default: $ATTOGRAD_THREADS, else torch's default)")
    parser.add_argument("--benchmark_filter", default=".", help="regex on case names (searched, as Google Benchmark)")
    parser.add_argument("--benchmark_out", help="write the results here as Google Benchmark JSON")
    parser.add_argument("--benchmark_out_format", default="json", choices=["json"])
    parser.add_argument("--benchmark_min_time", type=float, default=0.5, help="seconds per case without a fixed count")
    parser.add_argument("--benchmark_repetitions", type=int, default=1,
                        help="run each case this many times; adds mean and median aggregates, as Google Benchmark")
    parser.add_argument("--benchmark_list_tests", action="store_true")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cuda: bench_cuda.cpp's cases on GPU 0 instead of the CPU suite")
    args = parser.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda" and not args.benchmark_list_tests:
        if not torch.cuda.is_available():
            print("torch_reference.py: --device cuda: torch sees no CUDA device", file=sys.stderr)
            return 2
        # float32 as attograd computes it: no TF32 in matmul (cuBLAS's SGEMM) or in cuDNN.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")

    # torch.set_num_threads sizes torch's own pool but not OpenBLAS's, which
    # starts one thread per core unless told otherwise before it loads: "1
    # thread" then ran its GEMMs on 2 (matmul/2048 at 196 GFLOP/s, above one
    # core's peak). So the script runs itself again with OpenBLAS limited too.
    if args.threads > 0 and os.environ.get("OPENBLAS_NUM_THREADS") != str(args.threads):
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads))
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    pattern = re.compile(args.benchmark_filter)
    selected = []
    for name, make in (gpu_cases() if DEVICE.type == "cuda" else all_cases()):
        if "/fused/" in name and not HAS_SDPA:
            continue
        if pattern.search(full_name(name, None)):
            selected.append((name, make))
    if args.benchmark_list_tests:
        print("\n".join(name for name, _ in selected))
        return 0
    if os.getloadavg()[0] > (os.cpu_count() or 1) and "OMP_WAIT_POLICY" not in os.environ:
        print(f"warning: load average {os.getloadavg()[0]:.1f} exceeds the {os.cpu_count()} cores and "
              "OMP_WAIT_POLICY is unset: torch's spinning OpenMP threads may be much slower than they should "
              "(set OMP_WAIT_POLICY=PASSIVE)", file=sys.stderr)
    if not HAS_SDPA:
        print(f"note: torch {torch.__version__} has no scaled_dot_product_attention: only the composed attention "
              "cases are run, and gpt_step uses the composed attention", file=sys.stderr)

    context = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host_name": platform.node(), "executable": " ".join(sys.argv), "num_cpus": os.cpu_count(),
        "load_avg": list(os.getloadavg()), "library_build_type": "release",
        "framework": f"torch {torch.__version__}", "threads": str(torch.get_num_threads()),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
        "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS", "(unset)"),
        "device": torch.cuda.get_device_name(0) if DEVICE.type == "cuda" else "cpu",
    }
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {context['load_avg']}")
    print(f"{'Benchmark':<52}{'Time':>14}{'Iterations':>12}  Counters")
    runs, failed = [], 0
    for name, make in selected:
        repeats = []
        try:
            for repetition in range(args.benchmark_repetitions):
                run = run_case(name, make, args.benchmark_min_time)
                run.update(repetitions=args.benchmark_repetitions, repetition_index=repetition)
                repeats.append(run)
                counters = " ".join(f"{k}={si(run[k])}/s" for k in ("bytes", "flops", "tokens") if k in run)
                print(f"{run['name']:<52}{run['real_time']:>11.3f} ms{run['iterations']:>12}  {counters}", flush=True)
        except CheckFailed as e:
            failed += 1
            run = {"name": full_name(name, None), "run_name": full_name(name, None), "run_type": "iteration",
                   "error_occurred": True, "error_message": str(e)}
            print(f"{run['name']:<52} ERROR OCCURRED: '{e}'", flush=True)
            runs.append(run)
            continue
        runs.extend(repeats)
        if len(repeats) > 1:
            for aggregate, fn in (("mean", statistics.mean), ("median", statistics.median)):
                agg = dict(repeats[0], run_type="aggregate", aggregate_name=aggregate,
                           name=repeats[0]["run_name"] + "_" + aggregate, iterations=len(repeats))
                agg.pop("repetition_index")
                for key in ("real_time", "cpu_time", "bytes", "flops", "tokens"):
                    if key in agg:
                        agg[key] = fn(r[key] for r in repeats)
                runs.append(agg)
                print(f"{agg['name']:<52}{agg['real_time']:>11.3f} ms", flush=True)
    if args.benchmark_out:
        for i, run in enumerate(runs):
            run.setdefault("family_index", i)
            run.setdefault("per_family_instance_index", 0)
        with open(args.benchmark_out, "w") as f:
            json.dump({"context": context, "benchmarks": runs}, f, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
