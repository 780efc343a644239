"""Decode attention on CPU that reads KV blocks in place: a small C++/OpenMP op, built once
(``make setup`` runs ``python -m kernels.cpu_decode``), and its torch fallback.

The torch reference (``paged_attention_ref``'s decode branch) gathers every row's KV blocks
into new ``[R, ctx, Hk, D]`` tensors and runs SDPA over them: at 100 decodes a layer copies
tens of MB before any math. The op walks each row's block table and reads the cached keys
and values where they are: one task per (row, KV head), scores for the group's query heads,
a max-subtracted softmax, then the weighted sum of values, all in fp32.

Contract: ``paged_decode(q [R, Hq, D], k_cache, v_cache [N, B, Hk, D], block_tables [R, M]
int32, seq_lens [R] int32, scale) -> [R, Hq, D]``, fp32 contiguous CPU tensors; the same
numbers as ``paged_attention_ref`` for one query token per row (up to fp32 rounding).
``available()`` is False when the op was not built (no compiler at set-up): callers keep the
torch path. Nothing is compiled at run time, so a server never stalls on a build.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

import torch

NAME = "carpool_cpu_decode"

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <vector>

torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor block_tables, torch::Tensor seq_lens, double scale) {
  TORCH_CHECK(q.dtype() == torch::kFloat32 && k_cache.dtype() == torch::kFloat32 &&
              v_cache.dtype() == torch::kFloat32, "paged_decode: fp32 only");
  TORCH_CHECK(block_tables.dtype() == torch::kInt32 && seq_lens.dtype() == torch::kInt32,
              "paged_decode: int32 block tables and lengths");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous() &&
              block_tables.is_contiguous() && seq_lens.is_contiguous(),
              "paged_decode: contiguous tensors");
  const int64_t R = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t N = k_cache.size(0), B = k_cache.size(1), Hk = k_cache.size(2);
  const int64_t M = block_tables.size(1), G = Hq / Hk;
  auto out = torch::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kc = k_cache.data_ptr<float>();
  const float* vc = v_cache.data_ptr<float>();
  const int* bt = block_tables.data_ptr<int>();
  const int* lens = seq_lens.data_ptr<int>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK(lens[r] >= 1 && (lens[r] + B - 1) / B <= M, "paged_decode: bad seq_len");
    for (int64_t b = 0; b < (lens[r] + B - 1) / B; ++b) {
      TORCH_CHECK(bt[r * M + b] >= 0 && bt[r * M + b] < N, "paged_decode: block out of range");
    }
  }
  at::parallel_for(0, R * Hk, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s;
    std::vector<float> acc(G * D);
    for (int64_t idx = begin; idx < end; ++idx) {
      const int64_t r = idx / Hk, h = idx % Hk, ctx = lens[r];
      s.assign(G * ctx, 0.f);
      const float* qr = qp + (r * Hq + h * G) * D;
      for (int64_t t = 0; t < ctx; ++t) {
        const float* kp = kc + ((static_cast<int64_t>(bt[r * M + t / B]) * B + t % B) * Hk + h) * D;
        for (int64_t g = 0; g < G; ++g) {
          const float* qg = qr + g * D;
          float dot = 0.f;
          #pragma omp simd reduction(+:dot)
          for (int64_t d = 0; d < D; ++d) dot += qg[d] * kp[d];
          s[g * ctx + t] = dot * sc;
        }
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      std::vector<float> denom(G, 0.f);
      for (int64_t g = 0; g < G; ++g) {
        float* sg = s.data() + g * ctx;
        const float mx = *std::max_element(sg, sg + ctx);
        for (int64_t t = 0; t < ctx; ++t) { sg[t] = std::exp(sg[t] - mx); denom[g] += sg[t]; }
      }
      for (int64_t t = 0; t < ctx; ++t) {
        const float* vp = vc + ((static_cast<int64_t>(bt[r * M + t / B]) * B + t % B) * Hk + h) * D;
        for (int64_t g = 0; g < G; ++g) {
          const float w = s[g * ctx + t];
          float* ag = acc.data() + g * D;
          #pragma omp simd
          for (int64_t d = 0; d < D; ++d) ag[d] += w * vp[d];
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        float* o = op + (r * Hq + h * G + g) * D;
        const float inv = 1.f / denom[g];
        for (int64_t d = 0; d < D; ++d) o[d] = acc[g * D + d] * inv;
      }
    }
  });
  return out;
}
"""

_FLAGS = ["-O3", "-march=native", "-fopenmp"]


def build_dir() -> Path:
    """One folder per source, flags and torch version: a new torch rebuilds, never mixes."""
    key = hashlib.sha256(f"{_SOURCE}{_FLAGS}{torch.__version__}".encode()).hexdigest()[:16]
    return Path.home() / ".cache" / "carpool" / "ext" / f"{NAME}-{key}"


def build(verbose: bool = False) -> ModuleType:
    """Compile the op into ``build_dir()`` (tens of seconds; needs a C++ compiler and ninja)."""
    from torch.utils.cpp_extension import load_inline

    folder = build_dir()
    folder.mkdir(parents=True, exist_ok=True)
    return load_inline(NAME, cpp_sources=_SOURCE, functions=["paged_decode"],
                       extra_cflags=_FLAGS, extra_ldflags=["-fopenmp"],
                       build_directory=str(folder), verbose=verbose)


@functools.cache
def _module() -> ModuleType | None:
    """The built op, loaded from its file; None when it was never built."""
    path = build_dir() / f"{NAME}.so"
    if not path.is_file():
        return None
    with contextlib.suppress(ImportError, OSError):
        loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
        spec = importlib.util.spec_from_file_location(NAME, path, loader=loader)
        if spec is not None:
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            return module
    return None


def available() -> bool:
    return _module() is not None


def paged_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, scale: float,
) -> torch.Tensor:
    """One query token per row (see the module docstring). Raises if the op is not built."""
    module = _module()
    if module is None:
        raise RuntimeError(f"{NAME} is not built (python -m kernels.cpu_decode)")
    out: torch.Tensor = module.paged_decode(
        q.contiguous(), k_cache, v_cache, block_tables.to(torch.int32).contiguous(),
        seq_lens.to(torch.int32).contiguous(), float(scale))
    return out


def usable(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether this call can take the op: fp32 CPU tensors, contiguous caches, op built."""
    return (q.device.type == "cpu" and q.dtype == torch.float32
            and k_cache.dtype == torch.float32 and k_cache.is_contiguous() and available())


if __name__ == "__main__":
    # make setup: build once; a machine with no compiler keeps the torch path.
    try:
        build()
        print(f"{NAME}: built in {build_dir()}")
    except (OSError, RuntimeError, ImportError) as exc:  # no compiler or ninja: torch path
        print(f"{NAME}: not built ({type(exc).__name__}: {exc}); decode attention uses torch")
