// Weight-only int8 and int4 linear layers for x86 CPUs with AVX2 and FMA: y = x @ W^T.
//
// Why not PyTorch's `_weight_int8pack_mm` / `_weight_int4pack_mm_for_cpu`: on this project's
// 2-core AVX2 machine both are compute-bound at decode time. The int8 output head of
// qwen-coder-1.5b (151936 x 1536) took about 24 ms per one-token pass there and 12 ms here; one
// 8960 x 1536 int4 layer 1.1 ms there and 0.7 ms here (docs/quantization.md has the figures).
//
// int8: each weight is converted to float once per block of 4 rows, with 8 FMA chains in flight.
// int4: activations are turned into int16 with one scale per row (max |x| -> 32767: finer than
// the bfloat16 they arrive in), the nibbles into int16 lanes by masks and shifts, and vpmaddwd
// multiplies and adds pairs exactly in int32; each group's integer sum is then scaled in float32.
// The zero term uses each row's exact integer group sums. Weight rows are prefetched ahead.
//
// Row stability: every output y[m, n] is computed by the same sequence of operations whatever
// the number of rows M, the block a row falls in, and the thread split: work is split over output
// columns n only, each row has its own accumulators and its own activation scale, and every
// reduction runs in a fixed order (no -ffast-math, -ffp-contract=off). A verification pass over
// k + 1 tokens therefore gives each token exactly the logits a one-token pass gives it, which
// keeps greedy speculative decoding lossless (tests/decoder/test_kernels.py checks it bit for bit).
//
// Layouts (decoder/kernels/__init__.py and decoder/quantize.py make them):
//   int8: q (N, K) int8 row-major (the same as `_weight_int8pack_mm`'s), scales (N,) float32;
//         w[n, k] = q[n, k] * scales[n].
//   int4: q (N, K / 2) uint8, 32 bytes per 64 weights read as 16 little-endian uint16 words:
//         word j holds weights j, 16 + j, 32 + j and 48 + j in its four nibbles, low to high;
//         so (N, 2, K / G) float32: each row's group scales, then its group offsets, with
//         w = q * scale + offset, q in 0..15.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kRowBlock = 4;  // rows sharing one conversion of the weights (4 x 2 accumulators + 2 weights + x fit 16 registers)

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

constexpr int64_t kPrefetchRows = 4;  // how many weight rows ahead to fetch into cache

inline void prefetch_bytes(const void* start, int64_t bytes) {
  const char* p = static_cast<const char*>(start);
  for (int64_t offset = 0; offset < bytes; offset += 64) _mm_prefetch(p + offset, _MM_HINT_T0);
}

inline __m256 int8x8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Rows [m0, m0 + R) of column n: two accumulators per row over k in steps of 16, so that a
// block of 4 rows keeps 8 FMA chains in flight and converts each weight once for all 4.
template <int R>
inline void int8_column(const float* x, const int8_t* q, float scale, float* y, int64_t K, int64_t N) {
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const __m256 w0 = int8x8(q + k), w1 = int8x8(q + k + 8);
    for (int r = 0; r < R; ++r) {
      const float* xr = x + r * K + k;
      acc[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr), acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr + 8), acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) y[r * N] = hsum(_mm256_add_ps(acc[r][0], acc[r][1])) * scale;
}

// Rows [m0, m0 + R) of column n, int4 weights in groups of G (32 or a multiple of 64),
// activations as int16 (xq, one scale per row applied by the caller). Per 64 weights: one 32-byte
// load gives four runs of 16 weights as int16 lanes (mask and shift, no shuffles), vpmaddwd
// multiplies them with the activations and adds pairs exactly in int32 (|q| <= 15,
// |xq| <= 32767), and each group's integer sum is scaled in float32. The zero term is a dot
// product of the group offsets with each row's exact group sums of xq, after the loop.
template <int R, bool kGroup32>
inline void int4_column(const int16_t* xq, const float* xqsum, const uint8_t* q, const float* so, float* y,
                        int64_t K, int64_t G, int64_t N) {
  const __m256i nibble = _mm256_set1_epi16(0x000F);
  const int64_t groups = K / G;
  const float* scales = so;            // (groups,)
  const float* offsets = so + groups;  // (groups,)
  __m256 total[R];
  __m256i dot[R];
  for (int r = 0; r < R; ++r) {
    total[r] = _mm256_setzero_ps();
    dot[r] = _mm256_setzero_si256();
  }
  const int64_t blocks_per_group = kGroup32 ? 1 : G / 64;
  for (int64_t b = 0; b < K / 64; ++b) {
    const int64_t k = b * 64;
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + k / 2));
    const __m256i w0 = _mm256_and_si256(v, nibble);                         // weights k .. k+15
    const __m256i w1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);   // k+16 .. k+31
    const __m256i w2 = _mm256_and_si256(_mm256_srli_epi16(v, 8), nibble);   // k+32 .. k+47
    const __m256i w3 = _mm256_srli_epi16(v, 12);                            // k+48 .. k+63
    for (int r = 0; r < R; ++r) {
      const __m256i* xr = reinterpret_cast<const __m256i*>(xq + r * K + k);
      const __m256i first = _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256(xr)),
                                             _mm256_madd_epi16(w1, _mm256_loadu_si256(xr + 1)));
      const __m256i second = _mm256_add_epi32(_mm256_madd_epi16(w2, _mm256_loadu_si256(xr + 2)),
                                              _mm256_madd_epi16(w3, _mm256_loadu_si256(xr + 3)));
      if (kGroup32) {  // G == 32: k .. k+31 is group 2b, k+32 .. k+63 group 2b + 1
        total[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(first), _mm256_broadcast_ss(scales + 2 * b), total[r]);
        total[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(second), _mm256_broadcast_ss(scales + 2 * b + 1), total[r]);
      } else {
        dot[r] = _mm256_add_epi32(dot[r], _mm256_add_epi32(first, second));
      }
    }
    if (!kGroup32 && (b + 1) % blocks_per_group == 0) {
      const __m256 scale = _mm256_broadcast_ss(scales + (b + 1) / blocks_per_group - 1);
      for (int r = 0; r < R; ++r) {
        total[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), scale, total[r]);
        dot[r] = _mm256_setzero_si256();
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    __m256 zero_term = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 8 <= groups; g += 8)
      zero_term = _mm256_fmadd_ps(_mm256_loadu_ps(offsets + g), _mm256_loadu_ps(xqsum + r * groups + g), zero_term);
    float tail = 0.0f;
    for (; g < groups; ++g) tail += offsets[g] * xqsum[r * groups + g];
    y[r * N] = hsum(total[r]) + (hsum(zero_term) + tail);
  }
}

// Calls column(rows, m) for blocks of kRowBlock rows, then once for the last 1 to 3 rows, with rows
// a compile-time row count: each weight is converted once per block, and a row's arithmetic is
// the same in whichever block it falls.
template <typename Column>
inline void in_row_blocks(int64_t M, Column&& column) {
  int64_t m = 0;
  for (; m + kRowBlock <= M; m += kRowBlock) column(std::integral_constant<int, kRowBlock>{}, m);
  switch (M - m) {
    case 3: column(std::integral_constant<int, 3>{}, m); break;
    case 2: column(std::integral_constant<int, 2>{}, m); break;
    case 1: column(std::integral_constant<int, 1>{}, m); break;
    default: break;
  }
}

torch::Tensor as_float_rows(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, "x must be (rows, in_features), got ", x.sizes());
  return x.to(torch::kFloat).contiguous();
}

}  // namespace

torch::Tensor int8_linear(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& scales) {
  const torch::Tensor xf = as_float_rows(x);
  const int64_t M = xf.size(0), K = xf.size(1), N = q.size(0);
  TORCH_CHECK(q.scalar_type() == torch::kChar && q.is_contiguous() && q.size(1) == K, "q must be (N, K) int8");
  TORCH_CHECK(scales.scalar_type() == torch::kFloat && scales.numel() == N, "scales must be (N,) float32");
  TORCH_CHECK(K % 16 == 0, "in_features must be a multiple of 16, got ", K);
  torch::Tensor y = torch::empty({M, N}, xf.options());
  const float* X = xf.data_ptr<float>();
  const int8_t* Q = q.data_ptr<int8_t>();
  const float* S = scales.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int8_t* qn = Q + n * K;
      if (n + kPrefetchRows < n1) prefetch_bytes(qn + kPrefetchRows * K, K);
      in_row_blocks(M, [&](auto rows, int64_t m) {
        int8_column<decltype(rows)::value>(X + m * K, qn, S[n], Y + m * N + n, K, N);
      });
    }
  });
  return y;
}

torch::Tensor int4_linear(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& so, int64_t G) {
  const torch::Tensor xf = as_float_rows(x);
  const int64_t M = xf.size(0), K = xf.size(1), N = q.size(0);
  TORCH_CHECK((G == 32 || G % 64 == 0) && K % G == 0 && K % 64 == 0,
              "group size must be 32 or a multiple of 64, dividing in_features (a multiple of 64); got ", G, ", ", K);
  TORCH_CHECK(q.scalar_type() == torch::kByte && q.is_contiguous() && q.size(1) == K / 2, "q must be (N, K/2) uint8");
  TORCH_CHECK(so.scalar_type() == torch::kFloat && so.is_contiguous() && so.numel() == N * 2 * (K / G),
              "so must be (N, 2, K/G) float32 (scales, then offsets)");
  const int64_t groups = K / G;
  // Each row's activations as int16 with one scale per row (max |x| -> 32767), and their group
  // sums (exact integers): computed per row in a fixed order, so they do not depend on M either.
  torch::Tensor xq = torch::empty({M, K}, xf.options().dtype(torch::kShort));
  torch::Tensor xqsum = torch::empty({M, groups}, xf.options());  // exact: |sum| <= 32767 * 256 < 2^24
  std::vector<float> row_scale(M);
  const float* X = xf.data_ptr<float>();
  int16_t* XQ = xq.data_ptr<int16_t>();
  float* XS = xqsum.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    float largest = 0.0f;
    for (int64_t k = 0; k < K; ++k) largest = std::fmax(largest, std::fabs(X[m * K + k]));
    row_scale[m] = largest > 0.0f ? largest / 32767.0f : 1.0f;
    const float inverse = 1.0f / row_scale[m];
    for (int64_t g = 0; g < groups; ++g) {
      int32_t sum = 0;
      for (int64_t i = g * G; i < (g + 1) * G; ++i) {
        const auto v = static_cast<int16_t>(std::lrintf(X[m * K + i] * inverse));
        XQ[m * K + i] = v;
        sum += v;
      }
      XS[m * groups + g] = static_cast<float>(sum);
    }
  }
  torch::Tensor y = torch::empty({M, N}, xf.options());
  const uint8_t* Q = q.data_ptr<uint8_t>();
  const float* SO = so.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* qn = Q + n * (K / 2);
      const float* son = SO + n * 2 * groups;
      if (n + kPrefetchRows < n1) {  // the hardware prefetcher alone left DRAM half idle (8.8 of about 30 GB/s)
        prefetch_bytes(qn + kPrefetchRows * (K / 2), K / 2);
        prefetch_bytes(son + kPrefetchRows * 2 * groups, 2 * groups * sizeof(float));
      }
      in_row_blocks(M, [&](auto rows, int64_t m) {
        constexpr int R = decltype(rows)::value;
        if (G == 32) {
          int4_column<R, true>(XQ + m * K, XS + m * groups, qn, son, Y + m * N + n, K, G, N);
        } else {
          int4_column<R, false>(XQ + m * K, XS + m * groups, qn, son, Y + m * N + n, K, G, N);
        }
      });
    }
  });
  return y.mul_(torch::from_blob(row_scale.data(), {M, 1}, xf.options()));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int8_linear", &int8_linear, "y (M, N) float32 = x (M, K) @ (q * scales)^T");
  m.def("int4_linear", &int4_linear, "y (M, N) float32 = x (M, K) @ W^T, W int4 in groups (draftwatch layout)");
}
