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

from kernels import cpu_greedy_confirm, cpu_spin_pool, cpu_vectors
from kernels.cpu_ext import CppOps
from kernels.cpu_spin_pool import SPIN_US

TILE = 32  # outputs per packed tile: two AVX-512 vectors, four AVX2 ones
# Rows up to which the engine routes here. Alone these linears match oneDNN's up to 256 rows
# (1.06x at 100), but in the engine 128 lost (offline seed run 339 vs 418 tok/s): past a
# decode-sized batch the step's other ops run OpenMP regions between the linears, so either
# a spinning worker takes their second core or a sleeping one pays a wake per linear.
MAX_ROWS = 32
# Calls of up to this many rows leave the workers spinning; after bigger ones they sleep
# (step_profile at 16 and 32 rows: 37.5-43.0 / 62.8-71.1 ms sleeping, 45.3-47.7 / 67.9-73.7
# spinning, two rounds each).
SPIN_ROWS = 8

_HEADERS = r"""
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
"""

# The tile kernel, packing and the linears. Assembled with the vector loads
# (kernels.cpu_vectors), the pool (kernels.cpu_spin_pool) and the greedy head's confirmation on
# these tiles (kernels.cpu_greedy_confirm), in the order each needs the one before.
_KERNEL = r"""
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
"""

_SOURCE = "\n" + "\n\n".join(part.strip("\n") for part in (
    _HEADERS, cpu_vectors.SOURCE, cpu_spin_pool.POOL, _KERNEL, cpu_greedy_confirm.SOURCE,
    cpu_spin_pool.PARALLEL_FOR)) + "\n"

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

