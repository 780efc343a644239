"""C++ text of the greedy LM head's decision on the small-batch linear's tiles
(``kernels.cpu_small_linear.greedy``; the Python side, with the bound it is given, is
``kernels.greedy_head``): every logit screened on an fp16 copy of the head, only the candidate
tiles recomputed in fp32 by the very tile kernel ``linear`` runs, so a decided token is the
first argmax of the fp32 logits, bit for bit.

Needs ``tile_rows``, ``Job``, ``job_part``, ``run`` and ``threads_now`` before it (text only:
``kernels.cpu_small_linear`` assembles and compiles it).
"""

SOURCE = r"""
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
"""
