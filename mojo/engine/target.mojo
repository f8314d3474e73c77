"""Compile-time facts about the build: whether accelerator code is compiled in, and for which."""

from std.sys import get_defined_int

# Set by `uform._build` with `-D UFORM_ACCELERATOR=0|1`. The CPU variant compiles no
# GPU launch at all, so it builds on a machine whose Mojo has no accelerator target.
comptime HAS_ACCELERATOR = get_defined_int["UFORM_ACCELERATOR", 0]() == 1

# Set with it for NVIDIA targets, and for NVIDIA Hopper (sm_90a): code that only they run (cuBLAS's int8 products;
# the exact GEMM's fused kernel: warpgroup tensor cores, TMA) is compiled only for them; other accelerators take
# the forms they can run (the same bits).
comptime HAS_NVIDIA = HAS_ACCELERATOR and get_defined_int["UFORM_NVIDIA", 0]() == 1
comptime HAS_HOPPER = HAS_NVIDIA and get_defined_int["UFORM_HOPPER", 0]() == 1
