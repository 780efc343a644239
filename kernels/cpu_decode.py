"""Decode attention on CPU that reads KV blocks in place: a small C++/OpenMP op, built once
(``make setup`` runs ``python -m kernels.build_ops cpu_decode``), and its torch fallback.

The torch reference (``paged_attention_ref``'s decode branch) gathers every row's KV blocks
into new ``[R, ctx, Hk, D]`` tensors and runs SDPA over them: at 100 decodes a layer copies
tens of MB before any math. The op walks each row's block table and reads the cached keys and
values where they are, each byte once: for every block and KV head, the query heads of that
head's group are held in vector registers while the block's keys stream past (a GQA group
shares every key load), a max-subtracted softmax over the row (a vectorised exp,
``kernels.cpu_ext.VEXP``), then the values, the group's accumulators held in registers. The
next block's lines are prefetched while one block is worked on: a row's blocks sit anywhere in
the cache, so the hardware prefetcher loses the stream at every block edge. Work is split by
KV blocks, not rows, across the threads (a long row is cut between threads and its pieces'
softmaxes merged), and a small batch runs on the calling thread: waking a sleeping OpenMP
thread costs more than a few hundred tokens of attention.

Vector code is GCC/Clang vector extensions, as wide as the build machine's widest float
vector (AVX-512, AVX2 or SSE; ``-march=native``): nothing requires AVX-512 at compile time.

Contract: ``paged_decode(q [R, Hq, D], k_cache, v_cache [N, B, Hk, D], block_tables [R, M]
int32, seq_lens [R] int32, scale) -> [R, Hq, D]``, contiguous CPU tensors, fp32 queries and
fp32 or fp16 caches (an fp16 element is widened exactly as it is loaded: half the bytes of
the KV read, which is what binds this op at large batches); the same numbers as
``paged_attention_ref`` for one query token per row (up to fp32 rounding).
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
#include <cmath>
#include <type_traits>
#include <vector>
#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif
// The combined stack (kernels.cpu_decode_layers) runs this loop on the small-batch op's
// spinning pool instead of OpenMP; alone it is at::parallel_for.
#ifndef CP_PARALLEL_FOR
#define CP_PARALLEL_FOR at::parallel_for
#endif

#if defined(__AVX512F__)
#define CP_W 16
#elif defined(__AVX__)
#define CP_W 8
#else
#define CP_W 4
#endif
typedef float vf __attribute__((vector_size(CP_W * 4)));
typedef float vfu __attribute__((vector_size(CP_W * 4), aligned(4), may_alias));  // unaligned

static inline vf vload(const float* p) { return *reinterpret_cast<const vfu*>(p); }
// An fp16 cache's elements widened to fp32 as they are loaded (F16C / AVX-512's vcvtph2ps:
// exact), so attention reads half the bytes and computes as it does on an fp32 cache.
static inline vf vload(const at::Half* p) {
#if defined(__AVX512F__)
  return (vf)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__AVX__) && defined(__F16C__)
  return (vf)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  vf v;
  for (int l = 0; l < CP_W; ++l) v[l] = static_cast<float>(p[l]);
  return v;
#endif
}
static inline void vstore(float* p, vf v) { *reinterpret_cast<vfu*>(p) = v; }
static inline float hsum(vf v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps((__m512)v);
#elif defined(__AVX__)
  const __m256 x = (__m256)v;
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
#else
  float s = 0.f;
  for (int l = 0; l < CP_W; ++l) s += v[l];
  return s;
#endif
}

// Locality hint 1 (prefetcht2, not into L1): on AMD EPYC (Zen 4), 30 layers of 50 rows x 110
// tokens from a cold cache, 28 ms against 36 with hint 3, whose prefetches hold L1's few miss
// buffers (figures: README, "Decode attention near the KV read's rate").
template <typename KT>
static inline void prefetch(const KT* p, int64_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t o = 0; o < n * static_cast<int64_t>(sizeof(KT)); o += 64)
    __builtin_prefetch(c + o, 0, 1);
}

// A key or value row of the generic (runtime-shaped) path as fp32: an fp32 cache's row where
// it is, an fp16 one widened into ``buf`` (vector loads, then a scalar tail), so the loops
// below stay fp32 loops (a per-element conversion there did not vectorise: 4-8x fp32's time).
static inline const float* wide_row(const float* p, int64_t, float*) { return p; }
static inline const float* wide_row(const at::Half* p, int64_t n, float* buf) {
  int64_t i = 0;
  for (; i + CP_W <= n; i += CP_W) vstore(buf + i, vload(p + i));
  for (; i < n; ++i) buf[i] = static_cast<float>(p[i]);
  return buf;
}

// A block to prefetch while the current one is worked on (nullptr: none).
template <typename KT>
struct Next { const KT* p; int64_t tokens; };

struct Geo { int64_t Hk, G, D, B, tok; float sc; };

// Scores of tokens [t0, t1) of one row (t0 on a block edge): s[hq * n + j] = q_hq . k_(t0+j)
// * scale. Walks (block, KV head, token, query head of the group); DC, GC > 0 fix the head dim
// and group size at compile time so q stays in registers and each dot is a few vector FMAs.
template <int DC, int GC, typename KT>
static void scores(const float* qr, const KT* kc, const int* tab, int64_t t0, int64_t t1,
                   const Geo& g, float* s, Next<KT> after) {
  const int64_t D = DC > 0 ? DC : g.D, G = GC > 0 ? GC : g.G, n = t1 - t0, tok = g.tok;
  // the generic path's widened fp16 row (the fixed-shape path loads halves into registers)
  std::vector<float> row(std::is_same_v<KT, float> || (DC > 0 && GC > 0 && DC % CP_W == 0)
                         ? 0 : D);
  for (int64_t tb = t0; tb < t1; tb += g.B) {
    const int64_t m = std::min(g.B, t1 - tb);
    const KT* kb = kc + static_cast<int64_t>(tab[tb / g.B]) * g.B * tok;
    Next<KT> nx = tb + g.B < t1
        ? Next<KT>{kc + static_cast<int64_t>(tab[tb / g.B + 1]) * g.B * tok, std::min(g.B, t1 - tb - g.B)}
        : after;
    for (int64_t h = 0; h < g.Hk; ++h) {
      float* sh = s + h * G * n + (tb - t0);
      const float* qh = qr + h * G * D;
      const bool pf = h == 0 && nx.p != nullptr;
      if constexpr (DC > 0 && GC > 0 && DC % CP_W == 0) {
        constexpr int NV = DC / CP_W;
        vf qv[GC][NV];
        for (int gg = 0; gg < GC; ++gg)
          for (int j = 0; j < NV; ++j) qv[gg][j] = vload(qh + gg * DC + j * CP_W);
        for (int64_t i = 0; i < m; ++i) {
          if (pf && i < nx.tokens) prefetch(nx.p + i * tok, tok);
          const KT* kp = kb + i * tok + h * DC;
          vf kv[NV];
          for (int j = 0; j < NV; ++j) kv[j] = vload(kp + j * CP_W);
          for (int gg = 0; gg < GC; ++gg) {
            vf p = qv[gg][0] * kv[0];
            for (int j = 1; j < NV; ++j) p += qv[gg][j] * kv[j];
            sh[gg * n + i] = hsum(p) * g.sc;
          }
        }
      } else {
        for (int64_t i = 0; i < m; ++i) {
          if (pf && i < nx.tokens) prefetch(nx.p + i * tok, tok);
          const float* kp = wide_row(kb + i * tok + h * D, D, row.data());
          for (int64_t gg = 0; gg < G; ++gg) {
            const float* qg = qh + gg * D;
            float dot = 0.f;
            #pragma omp simd reduction(+:dot)
            for (int64_t d = 0; d < D; ++d) dot += qg[d] * kp[d];
            sh[gg * n + i] = dot * g.sc;
          }
        }
      }
    }
    if (nx.p != nullptr && nx.tokens > m) prefetch(nx.p + m * tok, (nx.tokens - m) * tok);
  }
}

// acc[hq * D + d] += sum_j s[hq * n + j] * v_(t0+j)[hq's KV head][d], same walk as scores().
template <int DC, int GC, typename KT>
static void values(const KT* vc, const int* tab, int64_t t0, int64_t t1, const Geo& g,
                   const float* s, float* acc, Next<KT> after) {
  const int64_t D = DC > 0 ? DC : g.D, G = GC > 0 ? GC : g.G, n = t1 - t0, tok = g.tok;
  // the generic path's widened fp16 row (the fixed-shape path loads halves into registers)
  std::vector<float> row(std::is_same_v<KT, float> || (DC > 0 && GC > 0 && DC % CP_W == 0)
                         ? 0 : D);
  for (int64_t tb = t0; tb < t1; tb += g.B) {
    const int64_t m = std::min(g.B, t1 - tb);
    const KT* vb = vc + static_cast<int64_t>(tab[tb / g.B]) * g.B * tok;
    Next<KT> nx = tb + g.B < t1
        ? Next<KT>{vc + static_cast<int64_t>(tab[tb / g.B + 1]) * g.B * tok, std::min(g.B, t1 - tb - g.B)}
        : after;
    for (int64_t h = 0; h < g.Hk; ++h) {
      const float* sh = s + h * G * n + (tb - t0);
      float* ah = acc + h * G * D;
      const bool pf = h == 0 && nx.p != nullptr;
      if constexpr (DC > 0 && GC > 0 && DC % CP_W == 0) {
        constexpr int NV = DC / CP_W;
        vf a[GC][NV];
        for (int gg = 0; gg < GC; ++gg)
          for (int j = 0; j < NV; ++j) a[gg][j] = vload(ah + gg * DC + j * CP_W);
        for (int64_t i = 0; i < m; ++i) {
          if (pf && i < nx.tokens) prefetch(nx.p + i * tok, tok);
          const KT* vp = vb + i * tok + h * DC;
          vf vv[NV];
          for (int j = 0; j < NV; ++j) vv[j] = vload(vp + j * CP_W);
          for (int gg = 0; gg < GC; ++gg) {
            const float w = sh[gg * n + i];
            for (int j = 0; j < NV; ++j) a[gg][j] += w * vv[j];
          }
        }
        for (int gg = 0; gg < GC; ++gg)
          for (int j = 0; j < NV; ++j) vstore(ah + gg * DC + j * CP_W, a[gg][j]);
      } else {
        for (int64_t i = 0; i < m; ++i) {
          if (pf && i < nx.tokens) prefetch(nx.p + i * tok, tok);
          const float* vp = wide_row(vb + i * tok + h * D, D, row.data());
          for (int64_t gg = 0; gg < G; ++gg) {
            const float w = sh[gg * n + i];
            float* ag = ah + gg * D;
            #pragma omp simd
            for (int64_t d = 0; d < D; ++d) ag[d] += w * vp[d];
          }
        }
      }
    }
    if (nx.p != nullptr && nx.tokens > m) prefetch(nx.p + m * tok, (nx.tokens - m) * tok);
  }
}

// One piece of a row, tokens [t0, t1): per query head the max score mx, the sum of exps l and
// the unnormalised sum of exp-weighted values acc (zeroed here).
template <int DC, int GC, typename KT>
static void piece(const float* qr, const KT* kc, const KT* vc, const int* tab, int64_t t0,
                  int64_t t1, const Geo& g, std::vector<float>& s, float* acc, float* mx,
                  float* l, Next<KT> after) {
  const int64_t n = t1 - t0, Hq = g.Hk * g.G;
  s.resize(Hq * n);
  float* sp = s.data();
  // the first V block is next after the keys
  scores<DC, GC, KT>(qr, kc, tab, t0, t1, g, sp,
                     Next<KT>{vc + static_cast<int64_t>(tab[t0 / g.B]) * g.B * g.tok, std::min(g.B, n)});
  for (int64_t hq = 0; hq < Hq; ++hq) {
    float* sh = sp + hq * n;
    float m = sh[0];
    #pragma omp simd reduction(max:m)
    for (int64_t t = 0; t < n; ++t) m = sh[t] > m ? sh[t] : m;
    float sum = 0.f;
    #pragma omp simd reduction(+:sum)
    for (int64_t t = 0; t < n; ++t) { sh[t] = carpool_vexp(sh[t] - m); sum += sh[t]; }
    mx[hq] = m;
    l[hq] = sum;
  }
  std::fill(acc, acc + Hq * g.D, 0.f);
  values<DC, GC, KT>(vc, tab, t0, t1, g, sp, acc, after);
}

// Partials of one row sit next to each other in (task, slot) order: fold them with the
// rescaled softmax sums (flash-decoding's merge) and write the row.
static void merge_partials(const std::vector<float>& part, const std::vector<int64_t>& rows,
                           float* op, int64_t Hq, int64_t D) {
  const int64_t P = Hq * (D + 2);
  std::vector<double> mx(Hq), l(Hq), acc(Hq * D);
  int64_t cur = -1;
  auto flush = [&]() {
    if (cur < 0) return;
    for (int64_t hq = 0; hq < Hq; ++hq)
      for (int64_t d = 0; d < D; ++d)
        op[(cur * Hq + hq) * D + d] = static_cast<float>(acc[hq * D + d] / l[hq]);
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0) continue;
    const float* pp = part.data() + i * P;
    const bool first = rows[i] != cur;
    if (first) { flush(); cur = rows[i]; }
    for (int64_t hq = 0; hq < Hq; ++hq) {
      const double pm = pp[hq], m = first ? pm : std::max(mx[hq], pm);
      const double a = first ? 0.0 : std::exp(mx[hq] - m), b = std::exp(pm - m);
      l[hq] = (first ? 0.0 : l[hq] * a) + pp[Hq + hq] * b;
      for (int64_t d = 0; d < D; ++d)
        acc[hq * D + d] = (first ? 0.0 : acc[hq * D + d] * a) + pp[2 * Hq + hq * D + d] * b;
      mx[hq] = m;
    }
  }
  flush();
}

// Rows laid end to end as KV blocks; task k of T takes blocks [NB*k/T, NB*(k+1)/T). A row
// wholly inside a task is written to out; a row cut at a task's edge leaves a partial (at most
// two a task: its first and its last row), merged after the parallel region.
template <int DC, int GC, typename KT>
static void decode_all(const float* qp, const KT* kc, const KT* vc, const int* bt,
                       const int* lens, float* op, int64_t R, int64_t M, const Geo& g) {
  const int64_t Hq = g.Hk * g.G, D = g.D, P = Hq * (D + 2);
  std::vector<int64_t> start(R + 1, 0);
  int64_t tokens = 0;
  for (int64_t r = 0; r < R; ++r) {
    start[r + 1] = start[r] + (lens[r] + g.B - 1) / g.B;
    tokens += lens[r];
  }
  const int64_t NB = start[R];
  // below this many tokens, one thread: waking another (a futex under OMP_WAIT_POLICY=PASSIVE,
  // 50-100 us on a VM) costs more than it saves
  const int64_t T = tokens < 1024 ? 1 : std::min<int64_t>(at::get_num_threads(), NB);
  std::vector<float> part(T * 2 * P);
  std::vector<int64_t> part_row(T * 2, -1);
  CP_PARALLEL_FOR(0, T, 1, [&](int64_t k0, int64_t k1) {
    std::vector<float> s;
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t g0 = NB * k / T, g1 = NB * (k + 1) / T;
      int64_t r = std::upper_bound(start.begin(), start.end(), g0) - start.begin() - 1;
      for (int slot = 0; r < R && start[r] < g1; ++r) {
        const int64_t b0 = std::max(g0, start[r]) - start[r];
        const int64_t b1 = std::min(g1, start[r + 1]) - start[r];
        const int64_t t0 = b0 * g.B, t1 = std::min<int64_t>(b1 * g.B, lens[r]);
        const int* tab = bt + r * M;
        Next<KT> after{nullptr, 0};
        if (r + 1 < R && start[r + 1] < g1)
          after = Next<KT>{kc + static_cast<int64_t>(bt[(r + 1) * M]) * g.B * g.tok,
                       std::min<int64_t>(g.B, lens[r + 1])};
        const bool whole = b0 == 0 && b1 == start[r + 1] - start[r];
        float* pp = part.data() + (k * 2 + slot) * P;
        float* acc = whole ? op + r * Hq * D : pp + 2 * Hq;
        piece<DC, GC, KT>(qp + r * Hq * D, kc, vc, tab, t0, t1, g, s, acc, pp, pp + Hq, after);
        if (whole) {
          for (int64_t hq = 0; hq < Hq; ++hq) {
            const float inv = 1.f / pp[Hq + hq];
            #pragma omp simd
            for (int64_t d = 0; d < D; ++d) acc[hq * D + d] *= inv;
          }
        } else {
          part_row[k * 2 + slot] = r;
          slot = 1;
        }
      }
    }
  });
  merge_partials(part, part_row, op, Hq, D);
}

template <typename KT>
static void decode_typed(const float* qp, const KT* kc, const KT* vc, const int* bt,
                         const int* lens, float* op, int64_t R, int64_t M, const Geo& g) {
  const int64_t D = g.D;
#define CP_CASE(DV, GV) \
  if (D == DV && g.G == GV) { decode_all<DV, GV, KT>(qp, kc, vc, bt, lens, op, R, M, g); return; }
#define CP_GROUPS(DV) CP_CASE(DV, 1) CP_CASE(DV, 2) CP_CASE(DV, 3) CP_CASE(DV, 4) \
  CP_CASE(DV, 5) CP_CASE(DV, 6) CP_CASE(DV, 7) CP_CASE(DV, 8)
  CP_GROUPS(64)
  CP_GROUPS(128)
#undef CP_GROUPS
#undef CP_CASE
  decode_all<0, 0, KT>(qp, kc, vc, bt, lens, op, R, M, g);
}

torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor block_tables, torch::Tensor seq_lens, double scale) {
  const bool half = k_cache.dtype() == torch::kFloat16;
  TORCH_CHECK(q.dtype() == torch::kFloat32 && (half || k_cache.dtype() == torch::kFloat32) &&
              v_cache.dtype() == k_cache.dtype(),
              "paged_decode: fp32 queries, fp32 or fp16 caches");
  TORCH_CHECK(block_tables.dtype() == torch::kInt32 && seq_lens.dtype() == torch::kInt32,
              "paged_decode: int32 block tables and lengths");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous() &&
              block_tables.is_contiguous() && seq_lens.is_contiguous(),
              "paged_decode: contiguous tensors");
  const int64_t R = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t N = k_cache.size(0), B = k_cache.size(1), Hk = k_cache.size(2);
  const int64_t M = block_tables.size(1);
  TORCH_CHECK(Hk > 0 && Hq % Hk == 0 && k_cache.size(3) == D && v_cache.sizes() == k_cache.sizes()
              && block_tables.size(0) == R && seq_lens.size(0) == R, "paged_decode: shapes");
  auto out = torch::empty_like(q);
  const int* bt = block_tables.data_ptr<int>();
  const int* lens = seq_lens.data_ptr<int>();
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK(lens[r] >= 1 && (lens[r] + B - 1) / B <= M, "paged_decode: bad seq_len");
    for (int64_t b = 0; b < (lens[r] + B - 1) / B; ++b) {
      TORCH_CHECK(bt[r * M + b] >= 0 && bt[r * M + b] < N, "paged_decode: block out of range");
    }
  }
  if (R == 0) return out;
  const Geo g{Hk, Hq / Hk, D, B, Hk * D, static_cast<float>(scale)};
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  if (half)
    decode_typed<at::Half>(qp, k_cache.data_ptr<at::Half>(), v_cache.data_ptr<at::Half>(), bt,
                           lens, op, R, M, g);
  else
    decode_typed<float>(qp, k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), bt, lens, op,
                        R, M, g);
  return out;
}
"""

OPS = CppOps("carpool_cpu_decode", _SOURCE, ("paged_decode",))
# what the op reads a cache in: fp32, or fp16 widened as it is loaded (half the KV bytes)
CACHE_DTYPES = (torch.float32, torch.float16)
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
        raise RuntimeError(f"{NAME} is not built (python -m kernels.build_ops cpu_decode)")
    out: torch.Tensor = module.paged_decode(
        q.contiguous(), k_cache, v_cache, block_tables.to(torch.int32).contiguous(),
        seq_lens.to(torch.int32).contiguous(), float(scale))
    return out


def usable(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether this call can take the op: fp32 CPU queries, contiguous fp32 or fp16 caches,
    op built."""
    return (q.device.type == "cpu" and q.dtype == torch.float32
            and k_cache.dtype in CACHE_DTYPES and k_cache.is_contiguous() and available())

