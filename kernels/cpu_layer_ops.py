"""A decoder layer's small ops on CPU, each one pass over its rows in C++: RMSNorm (with the
residual add fused), neox rotary on q and k, SiLU-and-mul, the KV-cache write of new tokens. One extension, built by ``make
setup`` (``python -m kernels.build_ops cpu_layer_ops``) like ``kernels.cpu_decode``.

Why: the torch references run each of these as 3-8 separate elementwise ops, every one a pass
over memory and a new tensor (``x + residual``, ``pow``, ``mean``, ``rsqrt``, two ``mul``s for
one norm), about 15% of a decode step at 50-100 rows before this op.

Contract (fp32 CPU tensors whose last dim is contiguous; rows may be strided, as the q and k
views of one qkv projection are; every result is a new contiguous tensor):
- ``rms_norm(x [T, H], w [H], eps)`` and ``add_rms_norm(x, residual, w, eps) -> (norm(x +
  residual), x + residual)``: ``rms_norm_ref``'s numbers up to the order of the sum of
  squares (a few ulp).
- ``rotary(positions [T] int64, q [T, Hq, D], k [T, Hk, D], cos_sin [P, D]) -> (q', k')``:
  ``rotary_embedding_ref``'s numbers bit for bit (the same products and sums, compiled without
  FMA contraction); a position outside the table raises.
- ``silu_mul(x [T, 2I]) -> [T, I]``: ``silu_and_mul_ref`` to ~2 ulp (its exp is
  ``kernels.cpu_ext.VEXP``).
- ``write_kv(k, v [T, Hk, D] (heads packed), k_cache, v_cache [N, B, Hk, D] contiguous,
  fp32 or fp16, slot_mapping [T])``: ``write_kv_cache_ref`` in place, bit for bit (a copy, or
  fp16's round to nearest even); a slot outside the cache raises.
``usable(x)`` says whether a call can take the ops (fp32, CPU, built); callers otherwise keep
the references, which stay what the tests compare against (float64 always takes them).
"""

from __future__ import annotations

import torch

from kernels.cpu_ext import FLAGS, VEXP, CppOps

_SOURCE = VEXP + r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#if defined(__F16C__)
#include <immintrin.h>
#endif
// The combined stack (kernels.cpu_decode_layers) runs these loops on the small-batch op's
// spinning pool instead of OpenMP; alone they are at::parallel_for.
#ifndef CP_PARALLEL_FOR
#define CP_PARALLEL_FOR at::parallel_for
#endif

static void check_rows(const torch::Tensor& x, int64_t dim, const char* what) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.device().is_cpu(), what, ": fp32 CPU only");
  TORCH_CHECK(x.dim() == dim && x.stride(-1) == 1, what, ": last dim must be contiguous");
}

static void norm_rows(const float* x, const float* res, const float* w, float* out, float* sum,
                      int64_t T, int64_t H, int64_t sx, int64_t sr, double eps) {
  CP_PARALLEL_FOR(0, T, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* xr = x + t * sx;
      const float* src = xr;
      if (res != nullptr) {  // the sum is rounded to fp32 first, as `x + residual` is
        float* sr_out = sum + t * H;
        const float* rr = res + t * sr;
        #pragma omp simd
        for (int64_t i = 0; i < H; ++i) sr_out[i] = xr[i] + rr[i];
        src = sr_out;
      }
      float ss = 0.f;
      #pragma omp simd reduction(+:ss)
      for (int64_t i = 0; i < H; ++i) ss += src[i] * src[i];
      const float rstd = 1.f / std::sqrt(ss / static_cast<float>(H) + static_cast<float>(eps));
      float* o = out + t * H;
      #pragma omp simd
      for (int64_t i = 0; i < H; ++i) o[i] = w[i] * (src[i] * rstd);
    }
  });
}

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  check_rows(x, 2, "rms_norm");
  TORCH_CHECK(w.is_contiguous() && w.numel() == x.size(1) && w.dtype() == torch::kFloat32,
              "rms_norm: weight [H] fp32");
  auto out = torch::empty(x.sizes(), x.options());
  norm_rows(x.data_ptr<float>(), nullptr, w.data_ptr<float>(), out.data_ptr<float>(), nullptr,
            x.size(0), x.size(1), x.stride(0), 0, eps);
  return out;
}

std::vector<torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor res, torch::Tensor w,
                                        double eps) {
  check_rows(x, 2, "add_rms_norm");
  check_rows(res, 2, "add_rms_norm");
  TORCH_CHECK(res.sizes() == x.sizes(), "add_rms_norm: residual shape");
  TORCH_CHECK(w.is_contiguous() && w.numel() == x.size(1) && w.dtype() == torch::kFloat32,
              "add_rms_norm: weight [H] fp32");
  auto out = torch::empty(x.sizes(), x.options());
  auto sum = torch::empty(x.sizes(), x.options());
  norm_rows(x.data_ptr<float>(), res.data_ptr<float>(), w.data_ptr<float>(),
            out.data_ptr<float>(), sum.data_ptr<float>(), x.size(0), x.size(1), x.stride(0),
            res.stride(0), eps);
  return {out, sum};
}

static void rotate(const torch::Tensor& x, torch::Tensor& out, const int64_t* pos,
                   const float* cs, int64_t P) {
  const int64_t T = x.size(0), Hn = x.size(1), D = x.size(2), half = D / 2;
  const int64_t st = x.stride(0), sh = x.stride(1);
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  CP_PARALLEL_FOR(0, T, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cs + pos[t] * D;
      const float* s = c + half;
      for (int64_t h = 0; h < Hn; ++h) {
        const float* a = xp + t * st + h * sh;
        float* o = op + (t * Hn + h) * D;
        #pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          o[i] = a[i] * c[i] - a[i + half] * s[i];
          o[i + half] = a[i + half] * c[i] + a[i] * s[i];
        }
      }
    }
  });
}

std::vector<torch::Tensor> rotary(torch::Tensor positions, torch::Tensor q, torch::Tensor k,
                                  torch::Tensor cos_sin) {
  check_rows(q, 3, "rotary");
  check_rows(k, 3, "rotary");
  check_rows(cos_sin, 2, "rotary");
  TORCH_CHECK(cos_sin.is_contiguous() && cos_sin.size(1) == q.size(2) && k.size(2) == q.size(2),
              "rotary: cos_sin [P, D] contiguous, q and k of head dim D");
  TORCH_CHECK(positions.dtype() == torch::kInt64 && positions.is_contiguous() &&
              positions.numel() == q.size(0) && k.size(0) == q.size(0), "rotary: positions [T]");
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t P = cos_sin.size(0);
  for (int64_t t = 0; t < q.size(0); ++t) {
    TORCH_CHECK(pos[t] >= 0 && pos[t] < P, "rotary: position ", pos[t], " out of range");
  }
  auto qo = torch::empty(q.sizes(), q.options());
  auto ko = torch::empty(k.sizes(), k.options());
  rotate(q, qo, pos, cos_sin.data_ptr<float>(), P);
  rotate(k, ko, pos, cos_sin.data_ptr<float>(), P);
  return {qo, ko};
}

torch::Tensor silu_mul(torch::Tensor x) {
  check_rows(x, 2, "silu_mul");
  const int64_t T = x.size(0), n = x.size(1) / 2, sx = x.stride(0);
  auto out = torch::empty({T, n}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  CP_PARALLEL_FOR(0, T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* g = xp + t * sx;
      const float* u = g + n;
      float* o = op + t * n;
      #pragma omp simd
      for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.f + carpool_vexp(-g[i])) * u[i];
    }
  });
  return out;
}

// A token's K or V row into an fp16 cache: rounded to nearest even, as `.to(float16)` is
// (F16C's vcvtps2ph where the CPU has it; c10::Half's conversion for the rest).
static inline void store_row(const float* src, at::Half* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<at::Half>(src[i]);
}
static inline void store_row(const float* src, float* dst, int64_t n) {
  std::copy(src, src + n, dst);
}

template <typename KT>
static void write_rows(const torch::Tensor& k, const torch::Tensor& v, torch::Tensor& kc,
                       torch::Tensor& vc, const int64_t* sp, int64_t T, int64_t row) {
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  KT* kcp = kc.data_ptr<KT>();
  KT* vcp = vc.data_ptr<KT>();
  for (int64_t t = 0; t < T; ++t) {
    store_row(kp + t * k.stride(0), kcp + sp[t] * row, row);
    store_row(vp + t * v.stride(0), vcp + sp[t] * row, row);
  }
}

// One copy a token, on the calling thread: 2 x Hk x D floats a row is far less work than
// waking a second thread (index_copy_ took ~40-70 us a layer at 50-100 rows, 30 layers a step).
void write_kv(torch::Tensor k, torch::Tensor v, torch::Tensor kc, torch::Tensor vc,
              torch::Tensor slots) {
  check_rows(k, 3, "write_kv");
  check_rows(v, 3, "write_kv");
  const bool half = kc.dtype() == torch::kFloat16;
  TORCH_CHECK(kc.is_contiguous() && vc.is_contiguous() && vc.dtype() == kc.dtype() &&
              (half || kc.dtype() == torch::kFloat32) && kc.dim() == 4 &&
              vc.sizes() == kc.sizes(), "write_kv: caches [N, B, Hk, D] fp32 or fp16 contiguous");
  const int64_t T = k.size(0), Hk = kc.size(2), D = kc.size(3), n = kc.size(0) * kc.size(1);
  TORCH_CHECK(k.size(1) == Hk && k.size(2) == D && v.sizes() == k.sizes() &&
              k.stride(1) == D && v.stride(1) == D, "write_kv: k, v [T, Hk, D], heads packed");
  TORCH_CHECK(slots.dtype() == torch::kInt64 && slots.is_contiguous() && slots.numel() == T,
              "write_kv: slot_mapping [T] int64");
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(sp[t] >= 0 && sp[t] < n, "write_kv: slot ", sp[t], " out of range");
  }
  if (half)
    write_rows<at::Half>(k, v, kc, vc, sp, T, Hk * D);
  else
    write_rows<float>(k, v, kc, vc, sp, T, Hk * D);
}
"""

# no FMA contraction: rotary's products and sums round like the reference's separate ops
OPS = CppOps("carpool_cpu_layer_ops", _SOURCE,
             ("rms_norm", "add_rms_norm", "rotary", "silu_mul", "write_kv"),
             (*FLAGS, "-ffp-contract=off"))


def available() -> bool:
    return OPS.available()


def cache_usable(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Caches ``write_kv`` takes: CPU, contiguous, fp32 or fp16 (both the same)."""
    return (k_cache.device.type == "cpu" and k_cache.dtype in (torch.float32, torch.float16)
            and v_cache.dtype == k_cache.dtype and k_cache.is_contiguous()
            and v_cache.is_contiguous())


def usable(*tensors: torch.Tensor) -> bool:
    """fp32 CPU tensors with a contiguous last dim, and the ops built; anything else keeps the
    torch reference."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 and t.stride(-1) == 1
               for t in tensors) and available()


def _ops():  # type: ignore[no-untyped-def]
    module = OPS.module()
    if module is None:
        raise RuntimeError(f"{OPS.name} is not built (python -m kernels.build_ops cpu_layer_ops)")
    return module


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    out: torch.Tensor = _ops().rms_norm(x, weight.contiguous(), float(eps))
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    out, summed = _ops().add_rms_norm(x, residual, weight.contiguous(), float(eps))
    return out, summed


def rotary(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
           cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    qo, ko = _ops().rotary(positions.to(torch.int64).contiguous(), q, k, cos_sin.contiguous())
    return qo, ko


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = _ops().silu_mul(x)
    return out


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    _ops().write_kv(k, v, k_cache, v_cache, slot_mapping.to(torch.int64).contiguous())

