"""C++ text shared by the CPU ops that stream weights (``kernels.cpu_small_linear``, and
through it ``kernels.cpu_decode_layers``): the float vector type as wide as the build machine's
widest (AVX-512, AVX2 or SSE; GCC vector extensions, ``-march=native``) and the loads that widen
a vector's worth of fp32, fp16 (F16C) or int8 weights to floats exactly.

Defines ``CP_W`` (floats a vector), ``CP_MR`` (rows a tile kernel holds in registers),
``CP_TILE`` (outputs per packed tile, 32), ``CP_V`` (vectors a tile), ``vf`` and ``vload``;
``CP_HALF`` says whether fp16 loads exist. Text only: the op that includes it compiles it.
"""

SOURCE = r"""
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
"""
