"""The identical GEMM at the trainers' shapes: the text encoder's (bench_encoder.py: 65,536 tokens, hidden 768,
MLP 3072; the weight gradients summed by rows of 1024 tokens, as identical mode sums them) and the byte LM's large
shape (bench_lm.py: 8192 tokens, width 256, MLP 512). Each product timed as ``kernels.gemm`` runs it (the exact
GEMM where its shape rule takes it, the fma chain below), as the fma chain (``kernels.gemm_fma``) and, where the
rule allows it, as the exact GEMM's fused form, against PyTorch fp32 (TF32 off) in the same run. GPU only.
Figure: bench/RESULTS.md."""

import numpy as np

import uform
from common import arguments, median_seconds, write_results
from uform import kernels as K

TOKENS, HIDDEN, MLP, ROW = 65536, 768, 3072, 1024
LM_TOKENS, LM_WIDTH, LM_MLP = 8192, 256, 512
SHAPES = [  # name, m, n, k, transpose_a, transpose_b, k_range
    ("fwd qkvo", TOKENS, HIDDEN, HIDDEN, False, False, 0),
    ("fwd up", TOKENS, MLP, HIDDEN, False, False, 0),
    ("fwd down", TOKENS, HIDDEN, MLP, False, False, 0),
    ("dx qkvo", TOKENS, HIDDEN, HIDDEN, False, True, 0),
    ("dx down", TOKENS, MLP, HIDDEN, False, True, 0),
    ("dx up", TOKENS, HIDDEN, MLP, False, True, 0),
    ("dw qkvo by rows", HIDDEN, HIDDEN, TOKENS, True, False, ROW),
    ("dw down by rows", MLP, HIDDEN, TOKENS, True, False, ROW),
    ("dw up by rows", HIDDEN, MLP, TOKENS, True, False, ROW),
    ("lm fwd qkvo", LM_TOKENS, LM_WIDTH, LM_WIDTH, False, False, 0),
    ("lm fwd down", LM_TOKENS, LM_WIDTH, LM_MLP, False, False, 0),
    ("lm dx up", LM_TOKENS, LM_WIDTH, LM_MLP, False, True, 0),
    ("lm dw up", LM_WIDTH, LM_MLP, LM_TOKENS, True, False, 0),
    ("lm dw down", LM_MLP, LM_WIDTH, LM_TOKENS, True, False, 0),
    ("square 4096", 4096, 4096, 4096, False, False, 0),
]


def main():
    args = arguments(__doc__)
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    device = uform.Device.gpu(0)
    pool = np.random.default_rng(0).standard_normal(max(m * k + k * n for _, m, n, k, *_ in SHAPES), dtype=np.float32)
    rows = []
    for name, m, n, k, ta, tb, k_range in SHAPES:
        a = pool[:m * k].reshape((k, m) if ta else (m, k))  # random operands, one draw for every shape
        b = pool[m * k:m * k + k * n].reshape((n, k) if tb else (k, n))
        ab, bb, cb = device.put(a), device.put(b), device.empty((m, n))
        flops = 2 * m * n * k
        exact = K.gemm_is_exact(m, n, k, k_range)
        row = {"shape": name, "m": m, "n": n, "k": k, "transpose_a": ta, "transpose_b": tb, "k_range": k_range,
               "rule": "exact" if exact else "fma"}
        forms = {"identical": lambda: K.gemm(cb, ab, bb, m, n, k, transpose_a=ta, transpose_b=tb, k_range=k_range),
                 "fma": lambda: K.gemm_fma(cb, ab, bb, m, n, k, transpose_a=ta, transpose_b=tb, k_range=k_range)}
        if exact or not k_range:
            forms["exact_fused"] = lambda: K.gemm_exact(cb, ab, bb, m, n, k, transpose_a=ta, transpose_b=tb,
                                                        k_range=k_range, residues="fused")
        for form, run in forms.items():
            seconds = median_seconds(run, device.synchronize, warmup=1, repeats=5)
            row[f"uform_{form}_tflops"] = round(flops / seconds / 1e12, 2)
        ta_, tb_ = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
        left, right = (ta_.t() if ta else ta_), (tb_.t() if tb else tb_)
        theirs = median_seconds(lambda: torch.matmul(left, right), torch.cuda.synchronize, warmup=1, repeats=5)
        row["torch_fp32_tflops"] = round(flops / theirs / 1e12, 2)
        row["identical_ratio"] = round(row["uform_identical_tflops"] / row["torch_fp32_tflops"], 3)
        rows.append(row)
        del ab, bb, cb, ta_, tb_, left, right
        torch.cuda.empty_cache()
    write_results(args.out, "gemm_shapes", rows)


if __name__ == "__main__":
    main()
