"""Decode attention on CPU that reads KV blocks in place: a small C++/OpenMP op, built once
(``make setup`` runs ``python -m kernels.cpu_decode``), and its torch fallback.

The torch reference (``paged_attention_ref``'s decode branch) gathers every row's KV blocks
into new ``[R, ctx, Hk, D]`` tensors and runs SDPA over them: at 100 decodes a layer copies
tens of MB before any math. The op walks each row's block table and reads the cached keys
and values where they are: one task per row, its tokens' keys (all KV heads, contiguous in the
cache) read front to back for every query head's score, a max-subtracted softmax (a vectorised
exp, ``kernels.cpu_ext.VEXP``), then the weighted sum of values, all in fp32.

Contract: ``paged_decode(q [R, Hq, D], k_cache, v_cache [N, B, Hk, D], block_tables [R, M]
int32, seq_lens [R] int32, scale) -> [R, Hq, D]``, fp32 contiguous CPU tensors; the same
numbers as ``paged_attention_ref`` for one query token per row (up to fp32 rounding).
``available()`` is False when the op was not built (no compiler at set-up): callers keep the
torch path. Nothing is compiled at run time, so a server never stalls on a build.
"""

from __future__ import annotations

import torch

from kernels.cpu_ext import VEXP, CppOps

_SOURCE = VEXP + r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <vector>

// One task per row: its blocks are read front to back, each token's keys (all KV heads,
// Hk * D floats) contiguous, which the prefetcher streams; scores for all query heads. Loops
// walk (block, token in block, KV head, query head of its group): no integer division in the
// inner loops (they cost more than the dot products), and DC > 0 fixes the head dim at compile
// time so each dot is a few unrolled vector FMAs (DC = 0: any head dim).
template <int64_t DC>
static void decode_rows(const float* qp, const float* kc, const float* vc, const int* bt,
                        const int* lens, float* op, int64_t R, int64_t Hq, int64_t Hk,
                        int64_t Drt, int64_t B, int64_t M, float sc) {
  const int64_t D = DC > 0 ? DC : Drt, G = Hq / Hk, tok = Hk * D;
  at::parallel_for(0, R, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s, acc(Hq * D);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t ctx = lens[r];
      s.resize(Hq * ctx);
      float* sp = s.data();
      const float* qr = qp + r * Hq * D;
      const int* tab = bt + r * M;
      for (int64_t t0 = 0, b = 0; t0 < ctx; t0 += B, ++b) {
        const int64_t n = std::min(B, ctx - t0);
        const float* kb = kc + static_cast<int64_t>(tab[b]) * B * tok;
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t h = 0; h < Hk; ++h) {
            const float* kp = kb + i * tok + h * D;
            for (int64_t hq = h * G; hq < (h + 1) * G; ++hq) {
              const float* qh = qr + hq * D;
              float dot = 0.f;
              #pragma omp simd reduction(+:dot)
              for (int64_t d = 0; d < D; ++d) dot += qh[d] * kp[d];
              sp[hq * ctx + t0 + i] = dot * sc;
            }
          }
        }
      }
      for (int64_t hq = 0; hq < Hq; ++hq) {
        float* sh = sp + hq * ctx;
        float mx = sh[0];
        #pragma omp simd reduction(max:mx)
        for (int64_t t = 0; t < ctx; ++t) mx = sh[t] > mx ? sh[t] : mx;
        float sum = 0.f;
        #pragma omp simd reduction(+:sum)
        for (int64_t t = 0; t < ctx; ++t) { sh[t] = carpool_vexp(sh[t] - mx); sum += sh[t]; }
        const float inv = 1.f / sum;
        #pragma omp simd
        for (int64_t t = 0; t < ctx; ++t) sh[t] *= inv;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t0 = 0, b = 0; t0 < ctx; t0 += B, ++b) {
        const int64_t n = std::min(B, ctx - t0);
        const float* vb = vc + static_cast<int64_t>(tab[b]) * B * tok;
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t h = 0; h < Hk; ++h) {
            const float* vp = vb + i * tok + h * D;
            for (int64_t hq = h * G; hq < (h + 1) * G; ++hq) {
              const float w = sp[hq * ctx + t0 + i];
              float* ah = acc.data() + hq * D;
              #pragma omp simd
              for (int64_t d = 0; d < D; ++d) ah[d] += w * vp[d];
            }
          }
        }
      }
      std::copy(acc.begin(), acc.end(), op + r * Hq * D);
    }
  });
}

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
  if (D == 64) {
    decode_rows<64>(qp, kc, vc, bt, lens, op, R, Hq, Hk, D, B, M, sc);
  } else if (D == 128) {
    decode_rows<128>(qp, kc, vc, bt, lens, op, R, Hq, Hk, D, B, M, sc);
  } else {
    decode_rows<0>(qp, kc, vc, bt, lens, op, R, Hq, Hk, D, B, M, sc);
  }
  return out;
}
"""

OPS = CppOps("carpool_cpu_decode", _SOURCE, ("paged_decode",))
NAME = OPS.name


def available() -> bool:
    return OPS.available()


def paged_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, scale: float,
) -> torch.Tensor:
    """One query token per row (see the module docstring). Raises if the op is not built."""
    module = OPS.module()
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
    OPS.main("decode attention")  # make setup: build once
