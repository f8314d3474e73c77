"""Compile-time facts about the build: whether accelerator code is compiled in."""

from std.sys import get_defined_int

# Set by `uform._build` with `-D UFORM_ACCELERATOR=0|1`. The CPU variant compiles no
# GPU launch at all, so it builds on a machine whose Mojo has no accelerator target.
comptime HAS_ACCELERATOR = get_defined_int["UFORM_ACCELERATOR", 0]() == 1
