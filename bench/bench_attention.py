"""Attention kernels alone, at the text encoder benchmark's shape: the spans of its packing (64 rows × 1024
positions, 256 items of 64–512 bytes), 12 heads of 64, random q, k, v and dO. Times uform's forward and
backward in identical mode and in fast mode (bf16 tensor cores, GPU only), and as peers in the same run on the
same data PyTorch's SDPA with the segment mask in fp32 (TF32 off) and in bf16, and bf16 SDPA over whole rows
(no mask: the flash kernel, every 1024² pair) beside uform's fast mode over whole rows; with a GPU, also checks
that the GPU's identical outputs have the CPU's bits on the first rows. Figure: bench/RESULTS.md."""

import numpy as np

import uform
from uform import kernels as K
from uform import layouts
from bench_encoder import GEOMETRY, QUICK, corpus_items
from common import arguments, median_seconds, write_results
from uform.training.packing import pack_items

HEADS, HEAD_DIM = 12, 64
CHECK_ROWS = 4  # rows whose outputs are compared bit for bit between the CPU and the GPU


def inputs(tokens: int, seed: int = 3):
    rng = np.random.default_rng(seed)
    shape = (tokens, HEADS * HEAD_DIM)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]  # q, k, v, dO


def run(device: uform.Device, q, k, v, d_out, spans, fast: bool = False, tiles: bool = True):
    """The buffers of one forward and backward on device (fast: the fast-mode kernels; tiles: the identical
    kernels' tiles aligned to the spans, layouts.attention_tiles, as the encoder runs them), and the two calls."""
    table = layouts.attention_tiles(spans) if tiles else np.empty((0, 2), np.int32)
    layout = device.put(np.concatenate([spans, table]))  # the tile table right after the spans
    b = dict(q=device.put(q), k=device.put(k), v=device.put(v), d_out=device.put(d_out),
             spans=layout.view(0, spans.shape), o=device.empty(q.shape), lse=device.empty((q.shape[0], HEADS)),
             dq=device.empty(q.shape), dk=device.empty(k.shape), dv=device.empty(v.shape),
             delta=device.empty((q.shape[0], HEADS)))
    geometry = dict(heads=HEADS, kv_heads=HEADS, head_dim=HEAD_DIM, causal=False, spans=b["spans"], fast=fast,
                    tiles=layout.view(spans.size, table.shape) if tiles else None)

    def forward():
        K.attention_forward(b["o"], b["lse"], b["q"], b["k"], b["v"], **geometry)

    def backward():
        K.attention_backward(b["dq"], b["dk"], b["dv"], b["d_out"], b["o"], b["lse"], b["q"], b["k"], b["v"],
                             delta=b["delta"], **geometry)

    return b, forward, backward


def main():
    args = arguments(__doc__)
    g = QUICK if args.quick or not uform.gpu_count() else GEOMETRY
    packed = pack_items(corpus_items(g["segments"], seed=1), None, g["rows"], g["columns"], g["segments"])
    segments = packed.segment_ids.reshape(-1)
    tokens = segments.size
    spans = layouts.attention_spans(tokens, g["columns"], segments)
    q, k, v, d_out = inputs(tokens)
    device = uform.Device.gpu(0) if uform.gpu_count() else uform.Device.cpu()
    b, forward, backward = run(device, q, k, v, d_out, spans)
    row = {"tokens": tokens, "heads": HEADS, "head_dim": HEAD_DIM,
           "useful_pairs_per_head": int(np.sum(spans[:, 1] - spans[:, 0])),
           "forward_seconds": round(median_seconds(forward, device.synchronize), 5),
           "backward_seconds": round(median_seconds(backward, device.synchronize), 5)}
    if uform.gpu_count():
        whole_rows = layouts.attention_spans(tokens, g["columns"])
        for label, fast_spans in (("fast", spans), ("fast_whole_rows", whole_rows)):
            _, fast_forward, fast_backward = run(device, q, k, v, d_out, fast_spans, fast=True)
            row[f"{label}_forward_seconds"] = round(median_seconds(fast_forward, device.synchronize), 5)
            row[f"{label}_backward_seconds"] = round(median_seconds(fast_backward, device.synchronize), 5)
        n = CHECK_ROWS * g["columns"]
        parts = [x[:n] for x in (q, k, v, d_out)] + [spans[:n]]
        outputs = []
        for where in (uform.Device.cpu(), device):
            c, f, bw = run(where, *parts)
            f()
            bw()
            outputs.append([c[name].numpy() for name in ("o", "lse", "dq", "dk", "dv")])
        row["gpu_bits_equal_cpu"] = all(np.array_equal(a.view(np.uint32), c.view(np.uint32))
                                        for a, c in zip(*outputs))
        row.update(torch_peer(q, k, v, d_out, segments, g["columns"]))
    write_results(args.out, "attention", [row])


def torch_peer(q, k, v, d_out, segments, columns) -> dict:
    """PyTorch SDPA's forward and backward seconds: fp32 (TF32 off) and bf16 with the segment mask, and bf16
    over whole rows without a mask."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = q.shape[0] // columns
    s = torch.tensor(segments, device="cuda").view(rows, columns)
    mask = ((s[:, :, None] == s[:, None, :]) & (s[:, :, None] >= 0))[:, None]
    mask = mask | torch.eye(columns, dtype=torch.bool, device="cuda")  # padding sees itself: no empty row
    figures = {}
    for label, dtype, attn_mask in (("torch", torch.float32, mask), ("torch_bf16", torch.bfloat16, mask),
                                    ("torch_bf16_whole_rows", torch.bfloat16, None)):
        def shape(x):
            return torch.tensor(x, device="cuda").view(rows, columns, HEADS, HEAD_DIM).transpose(1, 2).to(dtype)

        tq, tk, tv = (shape(x).requires_grad_() for x in (q, k, v))
        tdo = shape(d_out)

        def forward():
            return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=attn_mask)

        out = forward()

        def backward():
            torch.autograd.grad(out, (tq, tk, tv), tdo, retain_graph=True)

        figures[f"{label}_forward_seconds"] = round(median_seconds(forward, torch.cuda.synchronize), 5)
        figures[f"{label}_backward_seconds"] = round(median_seconds(backward, torch.cuda.synchronize), 5)
    return figures


if __name__ == "__main__":
    main()
