"""Build and load the engine's small C++/OpenMP CPU ops (torch's extension tooling).

A ``CppOps`` is one extension: its C++ source, the functions it binds, and its build folder
``~/.cache/carpool/ext/<name>-<hash of source, flags, torch and Python versions>``: a new
source or torch builds a new folder and never loads a stale one. ``build()`` compiles (tens of
seconds; ``make setup`` runs it). ``module()`` only loads a built file and is None otherwise: nothing is
compiled at run time, so a server never stalls on a build and a machine with no compiler keeps
the torch references. ``VEXP`` is a vectorisable fp32 exp the ops share (libm's ``expf`` does
not vectorise without -ffast-math).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.machinery
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

# -fno-trapping-math: with FP traps assumed possible GCC keeps VEXP's clamping selects as
# branches and leaves every loop calling it scalar ("control flow in loop"): SiLU-mul took
# 84 us at 8 rows of SmolLM2, decode attention's softmax as long. No reassociation or
# contraction beyond what each op's flags and `omp simd` reductions already allow (a loop that
# now vectorises sums in vector lanes: same numbers up to rounding, as the tests allow).
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-trapping-math")

# exp(x) = 2^n * e^r, |r| <= ln2/2, r's Taylor series to degree 7: within ~2 ulp of expf for
# |x| < 87; below -87 it flushes to 0 (as expf underflows), above 88 it saturates. Plain
# arithmetic so `#pragma omp simd` loops vectorise it.
VEXP = r"""
#pragma omp declare simd notinbranch
static inline float carpool_vexp(float x) {
  x = x < -87.f ? -87.f : (x > 88.f ? 88.f : x);
  const float n = __builtin_rintf(x * 1.44269504088896341f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int e = (static_cast<int>(n) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &e, sizeof scale);
  return x <= -87.f ? 0.f : p * scale;
}
"""


@dataclass(frozen=True)
class CppOps:
    name: str
    source: str
    functions: tuple[str, ...]
    flags: tuple[str, ...] = FLAGS

    def build_dir(self) -> Path:
        return _build_dir(self.name, self.source, self.flags)

    def build(self, verbose: bool = False) -> ModuleType:
        """Compile into ``build_dir()`` (needs a C++ compiler and ninja)."""
        from torch.utils.cpp_extension import load_inline

        folder = self.build_dir()
        folder.mkdir(parents=True, exist_ok=True)
        module = load_inline(self.name, cpp_sources=self.source,
                             # none listed: the source binds its own (PYBIND11_MODULE)
                             functions=list(self.functions) or None,
                             extra_cflags=list(self.flags), extra_ldflags=["-fopenmp"],
                             build_directory=str(folder), verbose=verbose)
        _load.cache_clear()
        return module

    def module(self) -> ModuleType | None:
        """The built op, loaded from its file; None when it was never built."""
        return _load(self.name, _so_path(self.name, self.source, self.flags))

    def available(self) -> bool:
        return self.module() is not None

    def main(self, what: str) -> None:
        """``python -m kernels.build_ops <op>``: build once; a machine with no compiler keeps torch.
        A folder that already holds this op loads as it is, whichever venv built it (its key
        has the source, the flags, torch's and Python's versions): a fresh clone's ``make
        setup`` does not compile again what this machine has built."""
        if self.module() is not None:
            print(f"{self.name}: found built in {self.build_dir()}")
            return
        try:
            self.build()
            print(f"{self.name}: built in {self.build_dir()}")
        except (OSError, RuntimeError, ImportError) as exc:  # no compiler or ninja
            print(f"{self.name}: not built ({type(exc).__name__}: {exc}); {what} uses torch")


@functools.cache
def _build_dir(name: str, source: str, flags: tuple[str, ...]) -> Path:
    # cached: the ops ask on every call whether they are built, and hashing costs ~10 us
    key = f"{source}{list(flags)}{torch.__version__}{sys.version_info[:2]}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path.home() / ".cache" / "carpool" / "ext" / f"{name}-{digest}"


@functools.cache
def _so_path(name: str, source: str, flags: tuple[str, ...]) -> str:
    # cached: every op call asks for its module (~10 a layer); the Path join cost ~3 us each
    return str(_build_dir(name, source, flags) / f"{name}.so")


@functools.cache
def _load(name: str, path: str) -> ModuleType | None:
    if not Path(path).is_file():
        return None
    with contextlib.suppress(ImportError, OSError):
        loader = importlib.machinery.ExtensionFileLoader(name, path)
        spec = importlib.util.spec_from_file_location(name, path, loader=loader)
        if spec is not None:
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            return module
    return None
