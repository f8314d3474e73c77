"""GEMM throughput, measured in the same run as its peers. Identical mode: the engine's identical GEMM
(``kernels.gemm``: the exact GEMM where its shape rule takes the product, the fma chain below it) against
PyTorch fp32 (TF32 off) on the GPU and against numpy on the CPU. Fast mode (GPU): the engine's bf16
tensor-core GEMM on fp32 operands against PyTorch's bf16 matmul, timed with the casts of fp32 operands
to bf16 (as under autocast) and without them. The exact GEMM (GPU): its residue form (and the limb form where
affordable) against PyTorch fp32 (TF32 off) and the fma chain (``kernels.gemm_fma``) at the same shapes; on the
CPU both forms against the fma chain and numpy. `--exact-only` runs the exact rows alone. The GPU's exact rows are
also timed sustained (back-to-back calls for seconds: common.sustained_seconds), the rate a training loop sees: the
exact GEMM draws the board's power limit there (the H200's 700 W) and slows, where PyTorch's fp32 product does not
reach it. Figure: bench/RESULTS.md."""

import time

import numpy as np

import uform
from common import median_seconds, parser, sustained_seconds, write_results
from uform import kernels as K


def tflops(n: int, seconds: float) -> float:
    return 2 * n**3 / seconds / 1e12


def operands(device, n: int):
    """Two random n×n float32 matrices on the host and on `device`, and C's buffer there."""
    rng = np.random.default_rng(n)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    return a, b, device.put(a), device.put(b), device.empty((n, n))


def gpu_rows(sizes):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    device = uform.Device.gpu(0)
    rows = []
    for n in sizes:
        a, b, ab, bb, cb = operands(device, n)
        ours = median_seconds(lambda: K.gemm(cb, ab, bb, n, n, n), device.synchronize, repeats=5)
        ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
        theirs = median_seconds(lambda: torch.matmul(ta, tb), torch.cuda.synchronize, repeats=5)
        rows.append({"device": "gpu", "n": n, "uform_tflops": round(tflops(n, ours), 2),
                     "torch_fp32_tflops": round(tflops(n, theirs), 2), "ratio": round(theirs / ours, 3)})
    return rows


def fast_rows(shapes):
    import torch

    device = uform.Device.gpu(0)
    uform.executor.run_numerics("fast", uform.Executor([device]))
    rows = []
    for m, n, k in shapes:
        rng = np.random.default_rng(m + n + k)
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        ab, bb, cb = device.put(a), device.put(b), device.empty((m, n))
        ours = median_seconds(lambda: K.gemm(cb, ab, bb, m, n, k, fast=True), device.synchronize, repeats=5)
        ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
        cast = median_seconds(lambda: torch.matmul(ta.bfloat16(), tb.bfloat16()), torch.cuda.synchronize, repeats=5)
        ha, hb = ta.bfloat16(), tb.bfloat16()
        bare = median_seconds(lambda: torch.matmul(ha, hb), torch.cuda.synchronize, repeats=5)
        flops = 2 * m * n * k / 1e12
        rows.append({"device": "gpu", "mode": "fast", "m": m, "n": n, "k": k, "uform_tflops": round(flops / ours, 1),
                     "torch_bf16_with_casts_tflops": round(flops / cast, 1), "torch_bf16_tflops": round(flops / bare, 1),
                     "ratio_with_casts": round(cast / ours, 3)})
    return rows


# The exact GEMM's shapes: m, n, k and whether A is stored transposed (k×m, a weight gradient's layout).
EXACT_SHAPES = [(4096, 4096, 4096, False), (8192, 8192, 8192, False), (65536, 768, 768, False),
                (65536, 3072, 768, False), (65536, 768, 3072, False), (768, 768, 65536, True)]
LIMB_FORM_MAX_FLOPS = 2 * 4096**3  # the limb form (SIMT, about 0.2 TFLOP/s) is timed up to this much work


def exact_operands(device, m, n, k, transpose_a):
    """An exact product's operands, seeded by its shape: A (stored k × m if transpose_a) and B as arrays, then on
    `device` with an m × n output."""
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((k, m) if transpose_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    return a, b, device.put(a), device.put(b), device.empty((m, n))


def exact_rows(shapes):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    device = uform.Device.gpu(0)
    rows = []
    for m, n, k, transpose_a in shapes:
        a, b, ab, bb, cb = exact_operands(device, m, n, k, transpose_a)
        flops = 2 * m * n * k / 1e12

        def exact(residues):
            return lambda: K.gemm_exact(cb, ab, bb, m, n, k, transpose_a=transpose_a, residues=residues)

        residues = median_seconds(exact(True), device.synchronize, repeats=5)
        residue_bits = cb.numpy().view(np.uint32).copy()
        fused = median_seconds(exact("fused"), device.synchronize, repeats=5)
        row = {"device": "gpu", "mode": "exact", "m": m, "n": n, "k": k, "transpose_a": transpose_a,
               "exact_residues_tflops": round(flops / residues, 2), "exact_fused_tflops": round(flops / fused, 2),
               "fused_same_bits": bool(np.array_equal(residue_bits, cb.numpy().view(np.uint32)))}
        if 2 * m * n * k <= LIMB_FORM_MAX_FLOPS:
            row["exact_limbs_tflops"] = round(flops / median_seconds(exact(False), device.synchronize, warmup=1,
                                                                     repeats=3), 2)
            row["forms_same_bits"] = bool(np.array_equal(residue_bits, cb.numpy().view(np.uint32)))
        fma = median_seconds(lambda: K.gemm_fma(cb, ab, bb, m, n, k, transpose_a=transpose_a), device.synchronize,
                             repeats=5)
        ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
        torch_a = ta.T if transpose_a else ta
        theirs = median_seconds(lambda: torch.matmul(torch_a, tb), torch.cuda.synchronize, repeats=5)
        row.update({"uform_fma_tflops": round(flops / fma, 2), "torch_fp32_tflops": round(flops / theirs, 2),
                    "ratio": round(theirs / residues, 3), "fused_ratio": round(theirs / fused, 3)})
        fused_sustained = sustained_seconds(exact("fused"), device.synchronize)
        theirs_sustained = sustained_seconds(lambda: torch.matmul(torch_a, tb), torch.cuda.synchronize)
        row.update({"exact_fused_sustained_tflops": round(flops / fused_sustained, 2),
                    "torch_fp32_sustained_tflops": round(flops / theirs_sustained, 2),
                    "fused_sustained_ratio": round(theirs_sustained / fused_sustained, 3)})
        rows.append(row)
        del ab, bb, cb, ta, tb, torch_a
    return rows


# The CPU exact GEMM's shapes: m, n, k and whether A is stored transposed.
CPU_EXACT_SHAPES = [(256, 256, 256, False), (512, 512, 512, False), (1024, 128, 512, False), (512, 512, 512, True)]


def settled(run, synchronize):
    """median_seconds after a pause: the engine's and OpenBLAS's worker threads spin for a while after a call
    (OpenBLAS's about 0.1 s), which on a small machine takes the cores from whatever runs next."""
    time.sleep(0.3)
    return median_seconds(run, synchronize, repeats=5)


def cpu_exact_rows(shapes):
    """GFLOP/s of the exact GEMM's two forms, the fma GEMM and numpy's float32 product on the CPU, each the median of
    5 runs, and whether the forms gave the same bits."""
    device = uform.Device.cpu()
    rows = []
    for m, n, k, transpose_a in shapes:
        a, b, ab, bb, cb = exact_operands(device, m, n, k, transpose_a)
        gflop = 2 * m * n * k / 1e9
        row = {"device": "cpu", "mode": "exact", "m": m, "n": n, "k": k, "transpose_a": transpose_a}
        bits = []
        for name, residues in (("exact_limbs_gflops", False), ("exact_residues_gflops", True)):
            seconds = settled(lambda: K.gemm_exact(cb, ab, bb, m, n, k, transpose_a=transpose_a, residues=residues),
                              device.synchronize)
            row[name] = round(gflop / seconds, 2)
            bits.append(cb.numpy().view(np.uint32).copy())
        row["forms_same_bits"] = bool(np.array_equal(bits[0], bits[1]))
        fma = settled(lambda: K.gemm_fma(cb, ab, bb, m, n, k, transpose_a=transpose_a), device.synchronize)
        op_a = a.T if transpose_a else a
        theirs = settled(lambda: op_a @ b, lambda: None)
        row.update({"uform_fma_gflops": round(gflop / fma, 1), "numpy_gflops": round(gflop / theirs, 1)})
        rows.append(row)
    return rows


def cpu_rows(sizes):
    device = uform.Device.cpu()
    rows = []
    for n in sizes:
        a, b, ab, bb, cb = operands(device, n)
        ours = median_seconds(lambda: K.gemm(cb, ab, bb, n, n, n), device.synchronize, repeats=3)
        theirs = median_seconds(lambda: a @ b, lambda: None, repeats=3)
        rows.append({"device": "cpu", "n": n, "uform_gflops": round(tflops(n, ours) * 1e3, 1),
                     "numpy_gflops": round(tflops(n, theirs) * 1e3, 1), "ratio": round(theirs / ours, 3)})
    return rows


def main():
    options = parser(__doc__)
    options.add_argument("--exact-only", action="store_true", help="the exact GEMM's rows alone")
    args = options.parse_args()
    rows = cpu_exact_rows(CPU_EXACT_SHAPES[:1] if args.quick else CPU_EXACT_SHAPES)
    if args.exact_only:
        if uform.gpu_count() > 0:
            rows += exact_rows(EXACT_SHAPES[:1] if args.quick else EXACT_SHAPES)
        write_results(args.out, "gemm_exact", rows)
        return
    rows += cpu_rows([256, 512] if args.quick else [512, 1024, 2048])
    if uform.gpu_count() > 0:
        rows += exact_rows(EXACT_SHAPES[:1] if args.quick else EXACT_SHAPES)
        rows += gpu_rows([1024] if args.quick else [4096, 8192])
        rows += fast_rows([(1024, 1024, 1024)] if args.quick else
                          [(4096, 4096, 4096), (8192, 8192, 8192), (65536, 768, 768), (65536, 3072, 768),
                           (65536, 768, 3072)])
    write_results(args.out, "gemm", rows)


if __name__ == "__main__":
    main()
