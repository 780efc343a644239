"""fp32 linears for decode-sized batches (a few rows) on CPU: weight streaming near memory
bandwidth, on a small thread pool of our own that spins between a step's linears.

Why: at 1-8 rows a decode step is ~120 linears that each read their whole weight once (SmolLM2:
540 MB a step), so a step costs at least the time to read 540 MB (~17 ms on 2 EPYC cores).
oneDNN's inner product took ~30-40 ms for them, and under ``OMP_WAIT_POLICY=PASSIVE`` (what
``serve`` sets, so that idle OpenMP threads do not steal a busy neighbour's core) each of the
~120 parallel regions also paid for waking the sleeping thread. Here the weight is packed
once into tiles of 32 outputs (``[ceil(N/32), K, 32]``, zero-padded), read front to back
exactly once per call, and each weight vector feeds one FMA per input row (the rows' inputs
are broadcast); threads claim chunks of tiles as they go, so a thread that lost its core to a
neighbour leaves its share to the other. The pool's workers
spin for ``SPIN_US`` after a task before they sleep on a futex: the next linear of the same step
starts tens of microseconds later and finds them awake, while between steps they sleep and
leave the core to Redis, the event loop and clients.

Contract:
- ``pack(weight [N, K]) -> [ceil(N/32), K, 32]`` (fp32, contiguous).
- ``linear(x [M, K], packed, bias [N] | None, n) -> [M, n]``: ``F.linear(x, weight, bias)`` up
  to fp32 rounding (each output sums its K products in order, with FMA: not bit for bit).
  x fp32 CPU with a contiguous last dim; any M works, but beyond ``MAX_ROWS`` oneDNN is faster.
- ``pack_int8(q [N, K] int8) -> [ceil(N/32), K, 32]`` int8 and ``linear_int8(x, packed, scale
  [N], bias, n)``: the same kernel on int8 weights (``kernels.cpu_int8_linear``), each weight
  widened to fp32 exactly and each output's sum multiplied by its scale: a quarter of the bytes
  to stream.
- Threads: torch's count on the calling thread (``torch.set_num_threads``), the caller
  included; 1 runs on the calling thread only. Each output is one thread's sum over k in
  order, so results do not depend on the thread count, nor on the other rows of the batch.
``available()`` is False when the op was not built (``make setup`` builds it).
Vector code is GCC vector extensions as wide as the build machine's widest float vector
(AVX-512, AVX2 or SSE; ``-march=native``).
"""

from __future__ import annotations

import torch

from kernels.cpu_ext import CppOps

TILE = 32  # outputs per packed tile: two AVX-512 vectors, four AVX2 ones
# Rows up to which the engine routes here. Alone these linears match oneDNN's up to 256 rows
# (1.06x at 100), but in the engine 128 lost (offline seed run 339 vs 418 tok/s): past a
# decode-sized batch the step's other ops run OpenMP regions between the linears, so either
# a spinning worker takes their second core or a sleeping one pays a wake per linear.
MAX_ROWS = 32
# How long a worker spins for the next task before sleeping: longer than the gap between two
# linears of one step (tens of us of Python and small ops), far shorter than a step.
SPIN_US = 300
# Calls of up to this many rows leave the workers spinning; after bigger ones they sleep
# (step_profile at 16 and 32 rows: 37.5-43.0 / 62.8-71.1 ms sleeping, 45.3-47.7 / 67.9-73.7
# spinning, two rounds each).
SPIN_ROWS = 8

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <exception>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>
#include <cstdlib>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define CP_PAUSE() _mm_pause()
#else
#define CP_PAUSE() ((void)0)
#endif

#if defined(__AVX512F__)
#define CP_W 16
#define CP_MR 8
#elif defined(__AVX__)
#define CP_W 8
#define CP_MR 3
#else
#define CP_W 4
#define CP_MR 2
#endif
#define CP_TILE 32
#define CP_V (CP_TILE / CP_W)
typedef float vf __attribute__((vector_size(CP_W * 4)));
typedef float vfu __attribute__((vector_size(CP_W * 4), aligned(4), may_alias));

static inline vf vload(const float* p) { return *reinterpret_cast<const vfu*>(p); }
// fp16 weights (the greedy head's screening copy): F16C widens CP_W halves to floats exactly
#if defined(__F16C__) && CP_W >= 8
#define CP_HALF 1
static inline vf vload(const uint16_t* p) {
#if CP_W == 16
  return reinterpret_cast<vf>(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#else
  return reinterpret_cast<vf>(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#endif
}
#else
#define CP_HALF 0
#endif
// int8 weights (--quantization int8): CP_W of them widened to floats exactly; the tile's
// per-output scales are applied once to the sums (tile_rows), not per product
static inline vf vload(const int8_t* p) {
#if defined(__AVX512F__) && CP_W == 16
  return reinterpret_cast<vf>(_mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))));
#elif defined(__AVX2__) && CP_W == 8
  return reinterpret_cast<vf>(_mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))));
#else
  vf r;
  for (int i = 0; i < CP_W; ++i) r[i] = static_cast<float>(p[i]);
  return r;
#endif
}

// ---- the pool: workers spin SPIN_US after each task, then sleep on a futex ----------------
struct Pool {
  std::vector<std::thread> workers;
  std::atomic<uint32_t> gen{0};        // bumped once per task (the futex word)
  std::atomic<int> pending{0};         // workers still running the current task
  std::atomic<int> sleepers{0};
  std::atomic<bool> spin{true};        // whether workers spin after this task (see run)
  int n = 1;                           // threads a task uses, the caller included
  void (*fn)(void*) = nullptr;
  void* ctx = nullptr;
  pid_t pid = 0;
};
static Pool* g_pool = nullptr;

static void futex_wait(std::atomic<uint32_t>* w, uint32_t v) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAIT_PRIVATE, v, nullptr, nullptr, 0);
}
static void futex_wake(std::atomic<uint32_t>* w) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

static void worker_loop(Pool* p, int index) {
  uint32_t seen = 0;  // the generation at creation: a task posted before this thread ran counts
  bool sleep_now = false;  // the last task said not to spin
  for (;;) {
    auto t0 = std::chrono::steady_clock::now();
    int spins = 0;
    while (p->gen.load(std::memory_order_acquire) == seen) {
      CP_PAUSE();
      if (!sleep_now) {
        if (++spins < 256) continue;
        spins = 0;
        auto us = std::chrono::duration_cast<std::chrono::microseconds>(
            std::chrono::steady_clock::now() - t0).count();
        if (us < CP_SPIN_US) {
          std::this_thread::yield();  // a neighbour waiting for this core gets it
          continue;
        }
      }
      p->sleepers.fetch_add(1, std::memory_order_seq_cst);
      if (p->gen.load(std::memory_order_seq_cst) == seen) futex_wait(&p->gen, seen);
      p->sleepers.fetch_sub(1, std::memory_order_seq_cst);
      t0 = std::chrono::steady_clock::now();
    }
    seen = p->gen.load(std::memory_order_acquire);
    if (index < p->n) p->fn(p->ctx);
    sleep_now = !p->spin.load(std::memory_order_relaxed);  // read before releasing the caller
    p->pending.fetch_sub(1, std::memory_order_acq_rel);
  }
}

static Pool* pool_for(int n) {
  // a forked child inherits the memory but not the threads: start a fresh pool there
  if (g_pool != nullptr && g_pool->pid == getpid() &&
      static_cast<int>(g_pool->workers.size()) + 1 >= n) return g_pool;
  Pool* p = new Pool();  // an outgrown pool is left running idle (asleep): rare, tiny
  p->pid = getpid();
  for (int i = 1; i < n; ++i) p->workers.emplace_back(worker_loop, p, i);
  for (auto& t : p->workers) t.detach();
  g_pool = p;
  return p;
}

static std::atomic<bool> g_busy{false};

// Run fn(ctx) on the caller and n - 1 workers; returns when all are done (fn claims its work
// as it goes, so any number of runners finishes it). One caller at a time owns the pool; a
// second thread calling meanwhile (two engines in one process) runs fn alone instead of waiting.
static void run(int n, void (*fn)(void*), void* ctx, bool spin) {
  if (n <= 1 || g_busy.exchange(true, std::memory_order_acquire)) { fn(ctx); return; }
  struct Release { ~Release() { g_busy.store(false, std::memory_order_release); } } release;
  Pool* p = pool_for(n);
  p->fn = fn; p->ctx = ctx; p->n = n;
  p->spin.store(spin, std::memory_order_relaxed);
  p->pending.store(static_cast<int>(p->workers.size()), std::memory_order_relaxed);
  p->gen.fetch_add(1, std::memory_order_seq_cst);
  if (p->sleepers.load(std::memory_order_seq_cst) > 0) futex_wake(&p->gen);
  fn(ctx);
  int spins = 0;
  while (p->pending.load(std::memory_order_acquire) > 0) {
    CP_PAUSE();
    if (++spins > 4096) { std::this_thread::yield(); spins = 0; }  // a worker lost its core
  }
}

// torch's count on the calling thread, read every call: the engine's adaptive threads
// (engine/runner/step_threads.py) change it between steps
static int threads_now() { return std::max(1, at::get_num_threads()); }

// ---- the kernel ---------------------------------------------------------------------------
// MR rows of x against one tile: acc[m][v] holds outputs tile*32 + v*CP_W .. of row m.
// T: float, uint16_t for fp16 weights or int8_t (widened by vload); the arithmetic is the same.
// scale: the outputs' int8 scales (each sum times its output's scale), else nullptr.
template <int MR, class T = float>
static inline void tile_rows(const float* x, int64_t sx, const T* w, int64_t K,
                             const float* bias, float* out, int64_t so, int64_t n0, int64_t N,
                             const float* scale = nullptr) {
  vf acc[MR][CP_V];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < CP_V; ++v) acc[m][v] = vf{};
  // no software prefetch: a tile is one sequential stream the hardware prefetcher follows;
  // prefetching 2-16 KB ahead measured 5-30% slower on AMD EPYC (README, "Small-batch linears")
  for (int64_t k = 0; k < K; ++k) {
    const T* wk = w + k * CP_TILE;
    vf wv[CP_V];
    for (int v = 0; v < CP_V; ++v) wv[v] = vload(wk + v * CP_W);
    for (int m = 0; m < MR; ++m) {
      const float xs = x[m * sx + k];
      for (int v = 0; v < CP_V; ++v) acc[m][v] += wv[v] * xs;
    }
  }
  const int64_t valid = std::min<int64_t>(CP_TILE, N - n0);
  for (int m = 0; m < MR; ++m) {
    float tmp[CP_TILE];
    for (int v = 0; v < CP_V; ++v) *reinterpret_cast<vfu*>(tmp + v * CP_W) = acc[m][v];
    float* o = out + m * so + n0;
    if (scale != nullptr) {
      for (int64_t j = 0; j < valid; ++j) tmp[j] *= scale[n0 + j];
    }
    if (bias != nullptr) {
      for (int64_t j = 0; j < valid; ++j) o[j] = tmp[j] + bias[n0 + j];
    } else {
      for (int64_t j = 0; j < valid; ++j) o[j] = tmp[j];
    }
  }
}

template <class T>
static void rows_any(int mr, const float* x, int64_t sx, const T* w, int64_t K,
                     const float* bias, float* out, int64_t so, int64_t n0, int64_t N,
                     const float* scale) {
  switch (mr) {
#define CP_CASE(R) case R: tile_rows<(R <= CP_MR ? R : 1), T>(x, sx, w, K, bias, out, so, n0, N, scale); break;
    CP_CASE(1) CP_CASE(2) CP_CASE(3) CP_CASE(4) CP_CASE(5) CP_CASE(6) CP_CASE(7) CP_CASE(8)
#undef CP_CASE
    default: break;
  }
}

template <class T>
struct Job {
  const float* x; int64_t sx; const T* w; const float* bias; float* out;
  int64_t M, K, N, tiles, chunk;
  const float* scale = nullptr;  // int8 weights' per-output scales
  std::atomic<int64_t> next{0};
};

// From CP_WIDEN_ROWS rows an int8 tile is widened once for all its row groups: per group the
// conversions bind the kernel there (the model's int8 linears, widened / per group, 2 AVX2
// cores: 32 rows 0.87, 64 rows 0.81, 96 rows 0.90; but 8 rows 1.27, 16 rows 1.12-1.48, 24 rows
// 1.26). Widening is exact, so each output keeps the bits the int8 kernel gives it at any row
// count.
#define CP_WIDEN_ROWS 32
static const float* widened(const int8_t* w, int64_t K) {
  static thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(K * CP_TILE));
  for (int64_t i = 0; i < K * CP_TILE; i += CP_W)
    *reinterpret_cast<vfu*>(buf.data() + i) = vload(w + i);
  return buf.data();
}

template <class T>
static void run_tiles(const Job<T>& j, int64_t t0, int64_t t1) {
  if constexpr (std::is_same<T, int8_t>::value) {
    if (j.M >= CP_WIDEN_ROWS) {
      for (int64_t t = t0; t < t1; ++t) {
        const float* w = widened(j.w + t * j.K * CP_TILE, j.K);
        for (int64_t m = 0; m < j.M; m += CP_MR) {
          const int mr = static_cast<int>(std::min<int64_t>(CP_MR, j.M - m));
          rows_any(mr, j.x + m * j.sx, j.sx, w, j.K, j.bias, j.out + m * j.N, j.N, t * CP_TILE,
                   j.N, j.scale);
        }
      }
      return;
    }
  }
  for (int64_t t = t0; t < t1; ++t) {
    const T* w = j.w + t * j.K * CP_TILE;
    // every row group over the same tile while it sits in L2: the weight leaves memory once
    for (int64_t m = 0; m < j.M; m += CP_MR) {
      const int mr = static_cast<int>(std::min<int64_t>(CP_MR, j.M - m));
      rows_any(mr, j.x + m * j.sx, j.sx, w, j.K, j.bias, j.out + m * j.N, j.N, t * CP_TILE, j.N,
               j.scale);
    }
  }
}

// Threads claim chunks of tiles as they go, not fixed halves: when a neighbour holds one core,
// the thread that runs takes over the other's share instead of waiting for it.
template <class T>
static void job_part(void* ctx) {
  Job<T>& j = *static_cast<Job<T>*>(ctx);
  for (;;) {
    const int64_t t0 = j.next.fetch_add(j.chunk, std::memory_order_relaxed);
    if (t0 >= j.tiles) return;
    run_tiles(j, t0, std::min(t0 + j.chunk, j.tiles));
  }
}

// fp32 [tiles, K, 32] on 2 MB pages where the kernel allows (transparent huge pages in
// "madvise" mode only back advised ranges): streaming 540 MB a step through 4 KB pages costs a
// TLB miss every 4 KB, a nested page walk on a VM (one forward's linears at 1 / 8 rows, 2 EPYC
// cores, same run: 16.0 / 27.0-27.5 ms against 16.8-16.9 / 28.5-29.0 on 4 KB pages). Where THP
// is off madvise fails and the pages stay 4 KB: same numbers, as before.
static torch::Tensor huge_empty(int64_t tiles, int64_t K,
                                torch::ScalarType dtype = torch::kFloat32) {
  const size_t align = size_t(2) << 20;
  const size_t bytes = static_cast<size_t>(tiles * K * CP_TILE) * c10::elementSize(dtype);
  if (bytes < align / 2)  // a small weight would waste most of a huge page
    return torch::empty({tiles, K, CP_TILE}, dtype);
  // whole 2 MB pages (up to 2 MB more a weight, ~120 MB for SmolLM2): rounded to 4 KB instead,
  // only 300 of its 540 MB got huge pages and the gain was gone
  const size_t size = (bytes + align - 1) / align * align;
  void* p = nullptr;
  if (posix_memalign(&p, align, size) != 0)
    return torch::empty({tiles, K, CP_TILE}, dtype);
  madvise(p, size, MADV_HUGEPAGE);  // before the first touch: faults then take 2 MB pages
  return torch::from_blob(p, {tiles, K, CP_TILE}, [](void* q) { free(q); },
                          torch::TensorOptions().dtype(dtype));
}

// weight [N, K] -> [ceil(N/32), K, 32] of dtype (zero-padded): the 32 outputs' weights for one
// k sit together
static torch::Tensor pack_tiles(const torch::Tensor& weight, torch::ScalarType dtype) {
  const int64_t N = weight.size(0), K = weight.size(1), tiles = (N + CP_TILE - 1) / CP_TILE;
  auto padded = torch::zeros({tiles * CP_TILE, K}, weight.options().dtype(dtype));
  padded.narrow(0, 0, N).copy_(weight);
  auto packed = huge_empty(tiles, K, dtype);
  packed.copy_(padded.view({tiles, CP_TILE, K}).transpose(1, 2));
  return packed;
}

// weight [N, K] fp32 -> [ceil(N/32), K, 32] of fp32, or of fp16 (the greedy head's screen)
torch::Tensor pack_as(torch::Tensor weight, bool half) {
  TORCH_CHECK(weight.dim() == 2 && weight.dtype() == torch::kFloat32 && weight.device().is_cpu(),
              "pack: weight [N, K] fp32 CPU");
  return pack_tiles(weight, half ? torch::kHalf : torch::kFloat32);
}

torch::Tensor pack(torch::Tensor weight) { return pack_as(weight, false); }

// q [N, K] int8 (already quantized: kernels.cpu_int8_linear) -> [ceil(N/32), K, 32] int8
torch::Tensor pack_int8(torch::Tensor q) {
  TORCH_CHECK(q.dim() == 2 && q.dtype() == torch::kChar && q.device().is_cpu(),
              "pack_int8: q [N, K] int8 CPU");
  return pack_tiles(q, torch::kChar);
}

static void check_linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t N,
                         torch::ScalarType dtype) {
  TORCH_CHECK(x.dim() == 2 && x.dtype() == torch::kFloat32 && x.device().is_cpu() &&
              x.stride(1) == 1, "small linear: x [M, K] fp32 CPU, contiguous rows");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == CP_TILE && packed.is_contiguous() &&
              packed.dtype() == dtype && packed.size(1) == x.size(1) &&
              packed.size(0) * CP_TILE >= N && N > packed.size(0) * CP_TILE - CP_TILE,
              "small linear: packed [ceil(N/32), K, 32] for this x and N");
}

static const float* fp32_vector(const c10::optional<torch::Tensor>& t, int64_t N,
                                const char* what) {
  if (!t.has_value() || !t->defined()) return nullptr;
  TORCH_CHECK(t->numel() == N && t->is_contiguous() && t->dtype() == torch::kFloat32, what);
  return t->data_ptr<float>();
}

// Every tile of w against x's rows, on the pool: out [M, N] fp32.
template <class T>
static torch::Tensor run_linear(const torch::Tensor& x, const T* w, int64_t tiles,
                                const float* bias, const float* scale, int64_t N, bool spin) {
  const int64_t M = x.size(0), K = x.size(1);
  auto out = torch::empty({M, N}, x.options());
  if (M == 0) return out;
  const int n = static_cast<int>(std::min<int64_t>(threads_now(), tiles));
  // ~4 chunks a thread: enough to even out a slow thread, few enough atomics
  const int64_t chunk = std::max<int64_t>(1, tiles / (4 * n));
  Job<T> job{x.data_ptr<float>(), x.stride(0), w, bias, out.data_ptr<float>(), M, K, N, tiles,
             chunk, scale};
  run(n, job_part<T>, &job, spin);
  return out;
}

// spin: whether the workers spin for the next task after this call (false: they sleep at once).
// Called from Python (linear_spin) that is only after decode-sized calls; the combined stack
// (kernels.cpu_decode_layers), whose ops between linears run on this pool too, spins at any
// row count but after its last linear, which work on another pool follows.
torch::Tensor linear_on_pool(torch::Tensor x, torch::Tensor packed,
                             c10::optional<torch::Tensor> bias, int64_t N, bool spin) {
  check_linear(x, packed, N, torch::kFloat32);
  return run_linear(x, packed.data_ptr<float>(), packed.size(0),
                    fp32_vector(bias, N, "small linear: bias [N] fp32"), nullptr, N, spin);
}

// int8 weights (pack_int8) with their per-output scale [N]: out = (x . q) * scale + bias
torch::Tensor linear_int8_on_pool(torch::Tensor x, torch::Tensor packed, torch::Tensor scale,
                                  c10::optional<torch::Tensor> bias, int64_t N, bool spin) {
  check_linear(x, packed, N, torch::kChar);
  const float* sp = fp32_vector(scale, N, "int8 linear: scale [N] fp32");
  TORCH_CHECK(sp != nullptr, "int8 linear: scale [N] fp32");
  return run_linear(x, packed.data_ptr<int8_t>(), packed.size(0),
                    fp32_vector(bias, N, "small linear: bias [N] fp32"), sp, N, spin);
}

torch::Tensor linear_int8(torch::Tensor x, torch::Tensor packed, torch::Tensor scale,
                          c10::optional<torch::Tensor> bias, int64_t N) {
  return linear_int8_on_pool(x, packed, scale, bias, N, x.size(0) <= CP_SPIN_ROWS);
}

// may_spin false: the workers sleep at once after this call
torch::Tensor linear_spin(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias,
                          int64_t N, bool may_spin) {
  // Spin only after decode-sized calls: in a step of more rows the ops between two linears
  // (norms, SiLU-mul, attention) run OpenMP regions of their own, and a spinning worker took
  // the core their second thread needed (offline seed run: 429 -> 174 tok/s).
  return linear_on_pool(x, packed, bias, N, may_spin && x.size(0) <= CP_SPIN_ROWS);
}

torch::Tensor linear(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias,
                     int64_t N) {
  return linear_spin(x, packed, bias, N, true);
}

// ---- greedy LM head: every logit screened on an fp16 copy, the candidates confirmed in fp32 --
// One row's token: the first index of the maximum of the fp32 logits linear() would give.
// a: the row's screened logits; bound: C with |fp32 logit - screened logit| <= C * ||x||_2
// for every output while no partial sum overflows, which ||x||_2 <= max_norm guarantees
// (kernels.greedy_head derives both), plus K * 2^-149 a dot product where sums are subnormal.
// The row's maximizers all lie within twice that of the screened maximum, so only their tiles
// are computed in fp32, by the very tile kernel linear() runs (the same bits). -1: not
// decided here (a non-finite value, a norm past max_norm, or more than max_tiles candidate
// tiles, where the full head on every thread is quicker).
static int64_t confirm(const float* x, const float* packed, const float* a, int64_t K,
                       int64_t N, double bound, double max_norm, int64_t max_tiles,
                       float* exact) {
  double ss = 0.0;
  for (int64_t k = 0; k < K; ++k) ss += static_cast<double>(x[k]) * x[k];
  const double norm = std::sqrt(ss);
  if (!(norm <= max_norm)) return -1;  // also a NaN or infinite input
  float top = -INFINITY;
  bool finite = true;
  for (int64_t j = 0; j < N; ++j) {
    top = a[j] > top ? a[j] : top;
    finite &= std::isfinite(a[j]);
  }
  if (!finite) return -1;
  const double floor = static_cast<double>(top) -
                       2.0 * (bound * norm + static_cast<double>(K) * std::ldexp(1.0, -149));
  int64_t best = -1, done = -1, tiles = 0;
  float best_v = 0.0f;
  for (int64_t j = 0; j < N; ++j) {
    if (static_cast<double>(a[j]) < floor) continue;
    const int64_t t = j / CP_TILE;
    if (t != done) {
      if (++tiles > max_tiles) return -1;
      tile_rows<1>(x, K, packed + t * K * CP_TILE, K, nullptr, exact, 0, t * CP_TILE, N);
      done = t;
    }
    const float v = exact[j];
    if (std::isnan(v)) return -1;
    if (best < 0 || v > best_v) { best = j; best_v = v; }  // strict: the first maximum stays
  }
  return best;
}

// tokens [M] int64: each row's greedy token (confirm), -1 where the caller must run the full
// head; all -1 where this build has no fp16 loads (no F16C).
torch::Tensor greedy(torch::Tensor x, torch::Tensor packed, torch::Tensor half, int64_t N,
                     double bound, double max_norm) {
  TORCH_CHECK(x.dim() == 2 && x.dtype() == torch::kFloat32 && x.device().is_cpu() &&
              x.is_contiguous(), "greedy head: x [M, K] fp32 CPU, contiguous");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == CP_TILE && packed.is_contiguous() &&
              packed.dtype() == torch::kFloat32 && packed.size(1) == x.size(1) && N > 0 &&
              packed.size(0) * CP_TILE >= N && N > packed.size(0) * CP_TILE - CP_TILE,
              "greedy head: packed [ceil(N/32), K, 32] for this x and N");
  TORCH_CHECK(half.dtype() == torch::kHalf && half.is_contiguous() &&
              half.sizes() == packed.sizes(), "greedy head: half like packed, fp16");
  const int64_t M = x.size(0), K = x.size(1), tiles = packed.size(0);
  auto tokens = torch::full({M}, -1, torch::kLong);
#if CP_HALF
  if (M == 0) return tokens;
  auto approx = torch::empty({M, N}, x.options());
  const int n = static_cast<int>(std::min<int64_t>(threads_now(), tiles));
  const int64_t chunk = std::max<int64_t>(1, tiles / (4 * n));
  Job<uint16_t> job{x.data_ptr<float>(), K,
                    reinterpret_cast<const uint16_t*>(half.data_ptr<at::Half>()), nullptr,
                    approx.data_ptr<float>(), M, K, N, tiles, chunk};
  run(n, job_part<uint16_t>, &job, M <= CP_SPIN_ROWS);
  std::unique_ptr<float[]> exact(new float[static_cast<size_t>(tiles * CP_TILE)]);
  auto* out = tokens.data_ptr<int64_t>();
  // past an eighth of the head, the one-thread confirmation costs more than the full head
  const int64_t max_tiles = std::max<int64_t>(4, tiles / 8);
  for (int64_t m = 0; m < M; ++m)
    out[m] = confirm(x.data_ptr<float>() + m * K, packed.data_ptr<float>(),
                     approx.data_ptr<float>() + m * N, K, N, bound, max_norm, max_tiles,
                     exact.get());
#endif
  return tokens;
}

bool has_half() { return CP_HALF != 0; }

// ---- at::parallel_for's contract on this pool (kernels.cpu_decode_layers) ------------------
// f(begin, end) over chunks of [begin, end) of at least `grain`, inline when the range is one
// grain, one thread runs, or the calling thread asked for serial loops (SerialLoops). Chunks
// are claimed as in job_part; f must not care which thread runs a chunk (the layer ops' loops
// do not: each index is computed alike wherever it runs). An exception thrown by f, on any
// thread, stops the other chunks and is rethrown to the caller once every runner is done.
static thread_local bool t_serial = false;

// While alive, pool_parallel_for runs inline on this thread: the stack's final norm, after
// its last linear let the workers sleep, must not wake them (the LM head's pool follows).
struct SerialLoops {
  SerialLoops() { t_serial = true; }
  ~SerialLoops() { t_serial = false; }
};

template <class F>
struct ForJob {
  const F* f;
  int64_t end, chunk;
  std::atomic<int64_t> next;
  std::atomic<bool> failed{false};
  std::exception_ptr error;
};

template <class F>
static void for_part(void* ctx) {
  ForJob<F>& j = *static_cast<ForJob<F>*>(ctx);
  for (;;) {
    const int64_t b = j.next.fetch_add(j.chunk, std::memory_order_relaxed);
    if (b >= j.end) return;
    try {
      (*j.f)(b, std::min(b + j.chunk, j.end));
    } catch (...) {
      if (!j.failed.exchange(true)) j.error = std::current_exception();
      j.next.store(j.end, std::memory_order_relaxed);  // the others stop at their next claim
      return;
    }
  }
}

template <class F>
void pool_parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (end <= begin) return;
  const int n = threads_now();
  if (t_serial || n <= 1 || end - begin <= std::max<int64_t>(grain, 1)) {
    f(begin, end);
    return;
  }
  const int64_t chunk = std::max<int64_t>(std::max<int64_t>(grain, 1),
                                          (end - begin + 4 * n - 1) / (4 * n));
  ForJob<F> job{&f, end, chunk, {begin}};
  run(n, for_part<F>, &job, true);  // the stack's workers spin between its ops
  if (job.error) std::rethrow_exception(job.error);  // every runner is done with job here
}
"""

OPS = CppOps("carpool_cpu_small_linear",
             f"#define CP_SPIN_US {SPIN_US}\n#define CP_SPIN_ROWS {SPIN_ROWS}\n" + _SOURCE,
             ("pack", "pack_as", "pack_int8", "linear", "linear_on_pool", "linear_int8",
              "linear_int8_on_pool", "greedy", "has_half"))


def available() -> bool:
    return OPS.available()


def _ops():  # type: ignore[no-untyped-def]
    module = OPS.module()
    if module is None:
        raise RuntimeError(f"{OPS.name} is not built (python -m kernels.build_ops cpu_small_linear)")
    return module


def pack(weight: torch.Tensor) -> torch.Tensor:
    packed: torch.Tensor = _ops().pack(weight.detach().contiguous())
    return packed


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n: int) -> torch.Tensor:
    out: torch.Tensor = _ops().linear(x, packed, bias, n)
    return out


def linear_on_pool(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n: int,
                   spin: bool) -> torch.Tensor:
    """``linear`` with the workers' spin chosen by the caller at any row count (the
    whole-stack op's linears, for benchmarks that time them as it runs them)."""
    out: torch.Tensor = _ops().linear_on_pool(x, packed, bias, n, spin)
    return out


def linear_int8_on_pool(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor,
                        bias: torch.Tensor | None, n: int, spin: bool) -> torch.Tensor:
    """``linear_int8`` with the workers' spin chosen by the caller (as ``linear_on_pool``)."""
    out: torch.Tensor = _ops().linear_int8_on_pool(x, packed, scale, bias, n, spin)
    return out


def pack_int8(q: torch.Tensor) -> torch.Tensor:
    """``pack`` of an already quantized int8 weight [N, K] (``kernels.cpu_int8_linear``)."""
    packed: torch.Tensor = _ops().pack_int8(q.detach().contiguous())
    return packed


def linear_int8(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None, n: int) -> torch.Tensor:
    """``linear`` on int8 tiles (``pack_int8``): each output's sum times its ``scale``."""
    out: torch.Tensor = _ops().linear_int8(x, packed, scale, bias, n)
    return out


def pack_as(weight: torch.Tensor, half: bool) -> torch.Tensor:
    """``pack``, in fp16 when ``half`` (rounded to nearest)."""
    packed: torch.Tensor = _ops().pack_as(weight, half)
    return packed


def has_half() -> bool:
    """Whether this build widens fp16 weights (F16C); without it ``greedy`` decides nothing."""
    return bool(_ops().has_half())


def greedy(x: torch.Tensor, packed: torch.Tensor, half: torch.Tensor, n: int,
           bound: float, max_norm: float) -> torch.Tensor:
    """Each row's first argmax of ``linear(x, packed, None, n)``, screened on ``half``
    (``kernels.greedy_head``); -1 for a row it cannot decide."""
    out: torch.Tensor = _ops().greedy(x, packed, half, n, bound, max_norm)
    return out

