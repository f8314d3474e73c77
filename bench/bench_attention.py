"""Attention kernels alone, at the text encoder benchmark's shape: the spans of its packing (64 rows × 1024
positions, 256 items of 64–512 bytes), 12 heads of 64, random q, k, v and dO. Times uform's forward and
backward, and PyTorch's fp32 SDPA (TF32 off) with the segment mask on the same data as the peer, in the
same run; with a GPU, also checks that the GPU's outputs have the CPU's bits on the first rows.
Figure: bench/RESULTS.md."""

import numpy as np

import uform
from uform import kernels as K
from bench_encoder import GEOMETRY, QUICK, corpus_items
from common import arguments, median_seconds, write_results
from uform.training.packing import pack_items

HEADS, HEAD_DIM = 12, 64
CHECK_ROWS = 4  # rows whose outputs are compared bit for bit between the CPU and the GPU


def inputs(tokens: int, seed: int = 3):
    rng = np.random.default_rng(seed)
    shape = (tokens, HEADS * HEAD_DIM)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]  # q, k, v, dO


def run(device: uform.Device, q, k, v, d_out, spans):
    """The buffers of one forward and backward on device, and the two calls."""
    b = dict(q=device.put(q), k=device.put(k), v=device.put(v), d_out=device.put(d_out), spans=device.put(spans),
             o=device.empty(q.shape), lse=device.empty((q.shape[0], HEADS)), dq=device.empty(q.shape),
             dk=device.empty(k.shape), dv=device.empty(v.shape), delta=device.empty((q.shape[0], HEADS)))
    geometry = dict(heads=HEADS, kv_heads=HEADS, head_dim=HEAD_DIM, causal=False, spans=b["spans"])

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
    spans = K.attention_spans(tokens, g["columns"], segments)
    q, k, v, d_out = inputs(tokens)
    device = uform.Device.gpu(0) if uform.gpu_count() else uform.Device.cpu()
    b, forward, backward = run(device, q, k, v, d_out, spans)
    row = {"tokens": tokens, "heads": HEADS, "head_dim": HEAD_DIM,
           "useful_pairs_per_head": int(np.sum(spans[:, 1] - spans[:, 0])),
           "forward_seconds": round(median_seconds(forward, device.synchronize), 5),
           "backward_seconds": round(median_seconds(backward, device.synchronize), 5)}
    if uform.gpu_count():
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
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = q.shape[0] // columns
    shape = lambda x: torch.tensor(x, device="cuda").view(rows, columns, HEADS, HEAD_DIM).transpose(1, 2)  # noqa: E731
    tq, tk, tv = (shape(x).requires_grad_() for x in (q, k, v))
    tdo = shape(d_out)
    s = torch.tensor(segments, device="cuda").view(rows, columns)
    mask = ((s[:, :, None] == s[:, None, :]) & (s[:, :, None] >= 0))[:, None]
    mask = mask | torch.eye(columns, dtype=torch.bool, device="cuda")  # padding sees itself: no empty row

    def forward():
        return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask)

    out = forward()

    def backward():
        torch.autograd.grad(out, (tq, tk, tv), tdo, retain_graph=True)

    return {"torch_forward_seconds": round(median_seconds(forward, torch.cuda.synchronize), 5),
            "torch_backward_seconds": round(median_seconds(backward, torch.cuda.synchronize), 5)}


if __name__ == "__main__":
    main()
