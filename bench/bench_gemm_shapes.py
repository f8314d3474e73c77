"""fp32 GEMM at the text encoder's shapes (bench_encoder.py: 65,536 tokens, hidden 768, MLP 3072): the
forward products (A·B), the input gradients (A·Bᵀ) and the weight gradients (Aᵀ·B, summed over every
token; 768×768 is split into k ranges), each timed alone with the engine's own tiling and with each tiling
forced (UFORM_GEMM_TILE, ignored by builds without it), against PyTorch fp32 (TF32 off)
in the same run. GPU only. Figure: bench/RESULTS.md."""

import os

import numpy as np

import uform
from common import arguments, median_seconds, write_results
from uform import kernels as K

TOKENS, HIDDEN, MLP = 65536, 768, 3072
SHAPES = [  # name, m, n, k, transpose_a, transpose_b
    ("fwd qkvo", TOKENS, HIDDEN, HIDDEN, False, False),
    ("fwd up", TOKENS, MLP, HIDDEN, False, False),
    ("fwd down", TOKENS, HIDDEN, MLP, False, False),
    ("dx qkvo", TOKENS, HIDDEN, HIDDEN, False, True),
    ("dx down", TOKENS, MLP, HIDDEN, False, True),
    ("dx up", TOKENS, HIDDEN, MLP, False, True),
    ("dw qkvo", HIDDEN, HIDDEN, TOKENS, True, False),
    ("dw down", MLP, HIDDEN, TOKENS, True, False),
    ("dw up", HIDDEN, MLP, TOKENS, True, False),
    ("square 4096", 4096, 4096, 4096, False, False),
]


def main():
    args = arguments(__doc__)
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    device = uform.Device.gpu(0)
    pool = np.random.default_rng(0).standard_normal(max(m * k + k * n for _, m, n, k, _, _ in SHAPES), dtype=np.float32)
    rows = []
    for name, m, n, k, ta, tb in SHAPES:
        a = pool[:m * k].reshape((k, m) if ta else (m, k))  # random operands, one draw for every shape
        b = pool[m * k:m * k + k * n].reshape((n, k) if tb else (k, n))
        ab, bb, cb = device.put(a), device.put(b), device.empty((m, n))
        flops = 2 * m * n * k
        row = {"shape": name, "m": m, "n": n, "k": k, "transpose_a": ta, "transpose_b": tb,
               "k_ranges": K._gemm_chunks(m, n, k)}
        for tile in ("auto", "large", "large-k16", "small", "small-8x8"):
            if tile == "auto":
                os.environ.pop("UFORM_GEMM_TILE", None)
            else:
                os.environ["UFORM_GEMM_TILE"] = tile
            seconds = median_seconds(lambda: K.gemm(cb, ab, bb, m, n, k, transpose_a=ta, transpose_b=tb),
                                     device.synchronize, warmup=1, repeats=5)
            row[f"uform_{tile}_tflops"] = round(flops / seconds / 1e12, 2)
        os.environ.pop("UFORM_GEMM_TILE", None)
        ta_, tb_ = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
        left, right = (ta_.t() if ta else ta_), (tb_.t() if tb else tb_)
        theirs = median_seconds(lambda: torch.matmul(left, right), torch.cuda.synchronize, warmup=1, repeats=5)
        row["torch_fp32_tflops"] = round(flops / theirs / 1e12, 2)
        rows.append(row)
        del ab, bb, cb, ta_, tb_, left, right
        torch.cuda.empty_cache()
    write_results(args.out, "gemm_shapes", rows)


if __name__ == "__main__":
    main()
