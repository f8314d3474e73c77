"""Compile the Mojo engine into the extension module ``uform._engine``.

One build per *variant*: ``cpu`` (no accelerator code at all) or an accelerator
name that ``mojo build --target-accelerator`` accepts (``sm_90a``, ``sm_80``,
``gfx942``). Each lands in ``python/uform/_engine/<variant>/_engine.so``.

A build is skipped when the stamp file beside the module records the same key:
a SHA-256 over every ``.mojo`` source, the compiler's version and the flags.
So a rebuild with no change costs the time to hash the sources.

    python python/uform/_build.py                 # the CPU variant
    python python/uform/_build.py --target sm_90a # an NVIDIA Hopper variant
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_DIR = PACKAGE_DIR.parents[1] / "mojo"
ENTRY_POINT = "uform_engine.mojo"
VARIANTS_DIR = PACKAGE_DIR / "_engine"

# The four runtime libraries every Mojo-built module loads.
RUNTIME_LIBRARIES = (
    "libKGENCompilerRTShared.so",
    "libMSupportGlobals.so",
    "libAsyncRTRuntimeGlobals.so",
    "libAsyncRTMojoBindings.so",
)


def mojo_executable() -> str:
    beside_python = Path(sys.executable).with_name("mojo")
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("mojo")
    if found is None:
        raise RuntimeError("the Mojo compiler was not found: install the 'mojo' package (see README.md)")
    return found


def compiler_flags(target: str) -> list[str]:
    """Flags shared by every variant: portable host code and no implicit FMA contraction."""
    flags = ["--target-cpu", "x86-64-v3", "--fp-mode", "contract=off", "-O3"]
    if target == "cpu":
        flags += ["-D", "UFORM_ACCELERATOR=0"]
    else:
        flags += [f"--target-accelerator={target}", "-D", "UFORM_ACCELERATOR=1"]
        # mojo/engine/target.mojo; Hopper's warpgroup tensor cores and TMA are sm_90a's alone (not plain sm_90's)
        nvidia, hopper = target.startswith("sm_"), target == "sm_90a"
        flags += ["-D", f"UFORM_NVIDIA={int(nvidia)}", "-D", f"UFORM_HOPPER={int(hopper)}"]
    return flags


def source_files() -> list[Path]:
    return sorted(SOURCE_DIR.rglob("*.mojo"))


def build_key(mojo: str, flags: list[str]) -> str:
    digest = hashlib.sha256()
    version = subprocess.run([mojo, "--version"], capture_output=True, text=True, check=True).stdout
    digest.update(version.encode())
    digest.update("\0".join(flags).encode())
    for path in source_files():
        digest.update(str(path.relative_to(SOURCE_DIR)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def runtime_library_dir() -> Path:
    import modular  # the package that the 'mojo' and 'max' wheels install into

    for root in modular.__path__:
        candidate = Path(root) / "lib"
        if (candidate / RUNTIME_LIBRARIES[0]).exists():
            return candidate
    raise RuntimeError("the Mojo runtime libraries were not found under the 'modular' package")


def build(target: str = "cpu", *, force: bool = False, quiet: bool = False) -> Path:
    """Build one variant unless its stamp is current; return the module's path."""
    mojo = mojo_executable()
    flags = compiler_flags(target)
    key = build_key(mojo, flags)
    out_dir = VARIANTS_DIR / target
    module = out_dir / "_engine.so"
    stamp = out_dir / "build.key"
    if not force and module.exists() and stamp.exists() and stamp.read_text() == key:
        if not quiet:
            print(f"uform engine [{target}]: up to date ({module})")
        return module
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    partial = out_dir / "_engine.so.partial"
    command = [mojo, "build", "--emit", "shared-lib", *flags, str(SOURCE_DIR / ENTRY_POINT), "-o", str(partial)]
    if not quiet:
        print(f"uform engine [{target}]: building ...", flush=True)
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"mojo build for target {target} failed:\n{result.stdout}\n{result.stderr}")
    os.replace(partial, module)
    # The runtime libraries travel with the module, so a copied variant folder loads anywhere.
    libraries = runtime_library_dir()
    for name in RUNTIME_LIBRARIES:
        shutil.copy2(libraries / name, out_dir / name)
    stamp.write_text(key)
    if not quiet:
        print(f"uform engine [{target}]: built in {time.monotonic() - started:.1f} s ({module})")
    return module


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", action="append", help="cpu, sm_90a, sm_80, gfx942 (repeatable; default cpu)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the stamp is current")
    args = parser.parse_args(argv)
    for target in args.target or ["cpu"]:
        build(target, force=args.force)


if __name__ == "__main__":
    main()
