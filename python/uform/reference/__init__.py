"""Independent implementations of both models and of span corruption, which the engine and the host are checked
and measured against.

- :mod:`.lm_numpy` -- the byte language model in float64 numpy: forward, hand-written backward, AdamW.
- :mod:`.lm_torch` -- the byte language model in PyTorch (float64 autograd in the tests, the float32
  peer in ``bench/bench_lm.py``).
- :mod:`.encoder_torch` -- the text encoder of ``docs/encoder.md`` and its losses in PyTorch (the tests'
  float64 autograd, the peer in ``bench/bench_encoder.py``).
- :mod:`.clip_torch` -- a plain CLIP-style pair trainer in PyTorch (two towers, learned positions, SigLIP): the
  quality peer of ``bench/bench_quality.py`` and the image quality test.
- :mod:`.masking` -- span corruption read from its module doc, a segment and a draw at a time, its words from
  numpy's Philox.

They share only the parameter layout (the registries) with the engine path; the PyTorch ones need
torch, which uform does not.
"""
