"""Independent implementations of both models, which the engine is checked and measured against.

- :mod:`.lm_numpy` -- the byte language model in float64 numpy: forward, hand-written backward, AdamW.
- :mod:`.lm_torch` -- the byte language model in PyTorch (float64 autograd in the tests, the float32
  peer in ``bench/bench_lm.py``).
- :mod:`.encoder_torch` -- the text encoder of ``docs/encoder.md`` and its losses in PyTorch (the tests'
  float64 autograd, the peer in ``bench/bench_encoder.py``).

They share only the parameter layout (the registries) with the engine path; the PyTorch ones need
torch, which uform does not.
"""
