"""What uform trains against what a peer trains at the same budget: held-out recall@1 and wall time.

uform runs as its users run it, `python -m uform train` (its defaults but the flags below: JOINT for text, CONTRASTIVE
clipped at norm 1 for images), into a scratch run directory; the peers are uform.reference.clip_torch's CLIP-style
pair trainer (two towers of the same depth and width, SigLIP, AdamW, the same warmup and cosine schedule, bf16
autocast on a GPU; text and images) and sentence-transformers from scratch (text; its
MultipleNegativesRankingLoss, or SigLIP's loss as uform trains), on the same pairs, split, step
draws and pairs a step, evaluated on the same held-out pairs at the same steps, and OpenCLIP (images). Rows:
bench/RESULTS.md.

    python bench/bench_quality.py --data shapes --steps 1000
    python bench/bench_quality.py --quick          # a CPU smoke run: names, 200 steps of 32 pairs, depth 2
"""

from __future__ import annotations

import argparse
import csv
import tempfile
import time
from pathlib import Path

import numpy as np

import uform
from common import parser, write_results
from uform.__main__ import held_out_documents, load_job, split, step_pairs, train
from uform.pairs import retrieval_metrics
from uform.runs import falls_on


def held_out_recall(encode_queries, encode_documents, held_out: list) -> float:
    """Recall@1 of the held-out queries among the distinct held-out documents, as the train program scores it."""
    documents, truth = held_out_documents(held_out)
    return retrieval_metrics(encode_queries([p.query for p in held_out]), encode_documents(documents),
                             truth=truth)["recall_at_1"]


def peer_steps(args, training: list, optimizer):
    """Each step's number and pairs, the optimizer's rate set first to the train program's schedule (peak 1e-3,
    warmup --warmup-steps or min(steps/10, 400), cosine)."""
    from uform.reference.clip_torch import learning_rate

    warmup = warmup_steps(args)
    for step in range(1, args.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps, 1e-3, warmup)
        yield step, step_pairs(training, args.seed, step, args.pairs_per_step)


def warmup_steps(args) -> int:
    """The warmup every trainer of the run takes: --warmup-steps, or the train program's derived min(steps/10, 400)."""
    return args.warmup_steps or min(args.steps // 10, 400)


def evaluates(args, step: int) -> bool:
    """Whether a peer evaluates after `step`: every --eval-every steps and at the end, as the train program does."""
    return falls_on(step, args.eval_every) or step == args.steps


def descend(optimizer, loss) -> None:
    """One optimizer step down `loss`."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def uform_run(args) -> dict:
    """The train program's held-out recall@1 at each evaluation, and its wall time."""
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = Path(scratch) / "run"
        flags = ["--data", args.data, "--depth", str(args.depth), "--hidden", str(args.hidden),
                 "--steps", str(args.steps), "--pairs-per-step", str(args.pairs_per_step),
                 "--eval-every", str(args.eval_every), "--warmup-steps", str(args.warmup_steps), "--save-every", "0",
                 "--seed", str(args.seed),
                 "--run-dir", str(run_dir)]
        start = time.perf_counter()
        train(flags)
        seconds = time.perf_counter() - start
        with open(run_dir / "metrics.csv") as file:
            curve = {int(row["step"]): float(row["held_out_recall_at_1"]) for row in csv.DictReader(file)
                     if row["held_out_recall_at_1"]}
    return {"trainer": "uform", "curve": curve, "seconds": seconds}


def peer_run(args, shared_blocks: bool = False) -> dict:
    """The CLIP-style PyTorch peer on the same job, split and step draws; ``shared_blocks``: one stack of blocks
    for both sides, as uform's one tower."""
    import torch

    from uform.reference.clip_torch import PairTrainer, TowerShape

    job = load_job(args)
    if job.query_modality not in (uform.Modality.TEXT, uform.Modality.IMAGE):
        raise SystemExit("clip_torch: text or image queries only")
    training, held_out = split(job, args)
    query = "text" if job.query_modality == uform.Modality.TEXT else "image"
    patch = job.image.patch_side if job.image else 8
    device = "cuda" if torch.cuda.is_available() else "cpu"
    peer = PairTrainer(torch, TowerShape(depth=args.depth, width=args.hidden, max_bytes=128, patch_side=patch,
                                         max_patches=128, shared_blocks=shared_blocks), query, steps=args.steps,
                       learning_rate=1e-3, warmup=warmup_steps(args), seed=args.seed, device=device)
    curve = {}
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        pairs = step_pairs(training, args.seed, step, args.pairs_per_step)
        documents = np.asarray([p.document for p in pairs], dtype=object)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            peer.step([p.query for p in pairs], list(documents), same=documents[:, None] == documents[None, :])
        if evaluates(args, step):
            curve[step] = held_out_recall(lambda items: peer.encode(items, "query"),
                                          lambda items: peer.encode(items, "document"), held_out)
    return {"trainer": "clip_torch_one_tower" if shared_blocks else "clip_torch", "curve": curve,
            "seconds": time.perf_counter() - start}


def siglip_loss(torch, model):
    """A sentence-transformers loss module: SigLIP's sigmoid loss over the batch's (anchor, positive) embeddings
    (``uform.reference.clip_torch.sigmoid_loss``: a learned scale from 10 and bias from −10, every other pair a
    negative), the form uform trains."""
    from uform.reference.clip_torch import sigmoid_loss

    class SigLIPLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            self.log_scale = torch.nn.Parameter(torch.tensor(np.log(10.0), dtype=torch.float32))
            self.bias = torch.nn.Parameter(torch.tensor(-10.0))

        def forward(self, sentence_features, labels):
            anchors, positives = (self.model(features)["sentence_embedding"] for features in sentence_features)
            return sigmoid_loss(torch, anchors.float(), positives.float(), self.log_scale, self.bias)

    return SigLIPLoss()


def sentence_transformers_run(args, loss_form: str = "mnrl", tokens: str = "bpe") -> dict:
    """sentence-transformers from scratch on the same text job: a randomly initialised BertModel of the same depth and
    width, a tokenizer trained on the training split with ``tokenizers`` (``tokens`` "bpe": BPE of 8192; "bytes":
    byte-level with no merges, uform's own alphabet of 256, for the bytes-against-BPE ablation), mean pooling,
    MultipleNegativesRankingLoss (``loss_form`` "mnrl") or SigLIP's ("siglip"), AdamW at the same peak, warmup and
    cosine, bf16 autocast on a GPU."""
    import torch
    from sentence_transformers import SentenceTransformer, losses, models
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    job = load_job(args)
    if job.query_modality != uform.Modality.TEXT:
        raise SystemExit("sentence_transformers: text pairs only")
    training, held_out = split(job, args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    start = time.perf_counter()
    tokenizer = Tokenizer(BPE(unk_token="[UNK]"))
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    if tokens == "bytes":  # the 256 byte symbols and the specials, no merges: every byte its own token
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=256 + len(special), special_tokens=special, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:
        tokenizer.normalizer = normalizers.NFKC()
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=special, show_progress=False)
    tokenizer.train_from_iterator([p.query for p in training] + [p.document for p in training], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    torch.manual_seed(args.seed)
    config = BertConfig(vocab_size=len(fast), hidden_size=args.hidden, num_hidden_layers=args.depth,
                        num_attention_heads=args.hidden // 64, intermediate_size=4 * args.hidden,
                        max_position_embeddings=512, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    with tempfile.TemporaryDirectory() as scratch:
        BertModel(config).save_pretrained(scratch)
        fast.save_pretrained(scratch)
        transformer = models.Transformer(scratch, max_seq_length=128 if tokens == "bpe" else 512)
    model = SentenceTransformer(modules=[transformer, models.Pooling(args.hidden, "mean")], device=device)
    loss = losses.MultipleNegativesRankingLoss(model) if loss_form == "mnrl" else siglip_loss(torch, model).to(device)
    optimizer = torch.optim.AdamW(loss.parameters(), lr=1e-3, weight_decay=0.01)  # the model's, and SigLIP's two

    def features(texts):
        return {name: value.to(device) if hasattr(value, "to") else value
                for name, value in model.tokenize(texts).items()}

    curve = {}
    for step, pairs in peer_steps(args, training, optimizer):
        model.train()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            value = loss([features([p.query for p in pairs]), features([p.document for p in pairs])], None)
        descend(optimizer, value)
        if evaluates(args, step):
            model.eval()
            encode = lambda texts: model.encode(texts, batch_size=256, normalize_embeddings=True,  # noqa: E731
                                                convert_to_numpy=True, show_progress_bar=False)
            curve[step] = held_out_recall(encode, encode, held_out)
    name = "sentence_transformers" + ("" if loss_form == "mnrl" else f"_{loss_form}") + \
        ("" if tokens == "bpe" else f"_{tokens}")
    return {"trainer": name, "curve": curve, "seconds": time.perf_counter() - start}


def open_clip_run(args) -> dict:
    """OpenCLIP on the same image job: ``open_clip.CLIP`` with a custom ViT (patches of the job's side, the same
    depth and width, heads of 64) and text tower of the same size (its BPE tokenizer, 32 positions), embed width
    the tower's, its SigLipLoss from log 10 and −10, AdamW at the same peak, warmup and cosine, bf16 autocast on a
    GPU; images normalised with OpenCLIP's mean and std, as its transforms do."""
    import io as bytes_io

    import open_clip
    import torch
    from open_clip.loss import SigLipLoss
    from open_clip.model import CLIPTextCfg, CLIPVisionCfg
    from PIL import Image

    from uform.reference.clip_torch import decayed_adamw

    job = load_job(args)
    if job.query_modality != uform.Modality.IMAGE:
        raise SystemExit("open_clip: image queries only")
    training, held_out = split(job, args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    side = Image.open(bytes_io.BytesIO(training[0].query)).size[0]
    torch.manual_seed(args.seed)
    model = open_clip.CLIP(
        embed_dim=args.hidden,
        vision_cfg=CLIPVisionCfg(layers=args.depth, width=args.hidden, head_width=64, patch_size=job.image.patch_side,
                                 image_size=side),
        text_cfg=CLIPTextCfg(context_length=32, vocab_size=49408, width=args.hidden, heads=args.hidden // 64,
                             layers=args.depth),
        init_logit_scale=float(np.log(10.0)), init_logit_bias=-10.0).to(device)
    mean = torch.tensor(open_clip.OPENAI_DATASET_MEAN, device=device)[:, None, None]
    std = torch.tensor(open_clip.OPENAI_DATASET_STD, device=device)[:, None, None]

    def images(items):
        pixels = np.stack([np.asarray(Image.open(bytes_io.BytesIO(item)).convert("RGB")) for item in items])
        return (torch.as_tensor(pixels, device=device).permute(0, 3, 1, 2).float() / 255 - mean) / std

    def texts(items):
        return open_clip.tokenize(list(items), context_length=32).to(device)

    loss = SigLipLoss()
    optimizer = decayed_adamw(torch, model, learning_rate=1e-3, weight_decay=0.01)
    curve = {}
    start = time.perf_counter()
    for step, pairs in peer_steps(args, training, optimizer):
        model.train()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            value = loss(*model(images([p.query for p in pairs]), texts([p.document for p in pairs])))
        descend(optimizer, value)
        if evaluates(args, step):
            model.eval()

            def encode(items, tower):
                with torch.no_grad():
                    rows = [tower(items[i:i + 256]) for i in range(0, len(items), 256)]
                return torch.nn.functional.normalize(torch.cat(rows).float(), dim=1).cpu().numpy()

            curve[step] = held_out_recall(lambda items: encode(items, lambda part: model.encode_image(images(part))),
                                          lambda items: encode(items, lambda part: model.encode_text(texts(part))),
                                          held_out)
    return {"trainer": "open_clip", "curve": curve, "seconds": time.perf_counter() - start}


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's settings (``argv``; default: the process's), --quick's sizes applied and the train
    program's own defaults filled in, as every runner takes them."""
    options: argparse.ArgumentParser = parser(__doc__)
    options.add_argument("--data", choices=("names", "stdlib", "digits", "shapes", "sounds"), default="names")
    options.add_argument("--steps", type=int, default=1000)
    options.add_argument("--pairs-per-step", type=int, default=128)
    options.add_argument("--depth", type=int, default=4)
    options.add_argument("--hidden", type=int, default=256)
    options.add_argument("--eval-every", type=int, default=250)
    options.add_argument("--warmup-steps", type=int, default=0, help="every trainer's warmup (0: min(steps/10, 400))")
    options.add_argument("--seed", type=int, default=0, help="the split, step draws, masking and every initialisation")
    options.add_argument("--trainers", default="uform,clip_torch",
                         help="which to run, comma-separated: uform, clip_torch, clip_torch_one_tower (one stack of "
                              "blocks for both sides), sentence_transformers and "
                              "sentence_transformers_siglip and sentence_transformers_siglip_bytes (text), "
                              "open_clip (images)")
    args = options.parse_args(argv)
    if args.eval_every < 1:
        raise SystemExit("--eval-every: must be positive")
    if args.quick:
        args.steps, args.pairs_per_step, args.depth, args.hidden, args.eval_every = 200, 32, 2, 128, 100
    args.pairs, args.examples, args.held_out, args.eval_pairs = None, 0, 500, None  # the train program's defaults
    return args


RUNNERS = {"uform": uform_run, "clip_torch": peer_run, "clip_torch_one_tower": lambda args: peer_run(args, True),
           "sentence_transformers": sentence_transformers_run,
           "sentence_transformers_siglip": lambda args: sentence_transformers_run(args, "siglip"),
           "sentence_transformers_siglip_bytes": lambda args: sentence_transformers_run(args, "siglip", "bytes"),
           "open_clip": open_clip_run}
"""Each trainer's run: its held-out recall@1 at each evaluation ("curve") and its wall time ("seconds")."""


def run(args, name: str) -> dict:
    """Trainer `name`'s row: its run, the settings and its final and best recall@1."""
    row = RUNNERS[name](args)
    row.update(data=args.data, steps=args.steps, warmup_steps=warmup_steps(args),
               pairs_per_step=args.pairs_per_step, depth=args.depth, hidden=args.hidden, seed=args.seed,
               final=row["curve"][args.steps], best=max(row["curve"].values()))
    return row


def main():
    args = arguments()
    write_results(args.out, f"quality_{args.data}", [run(args, name) for name in args.trainers.split(",")])


if __name__ == "__main__":
    main()
