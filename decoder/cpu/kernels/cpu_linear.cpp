// Weight-only int8 and int4 linear layers for x86 CPUs with AVX2 and FMA: y = x @ W^T.
//
// Why not PyTorch's `_weight_int8pack_mm` / `_weight_int4pack_mm_for_cpu`: on this project's
// 2-core AVX2 machine both are compute-bound at decode time. The int8 output head of
// qwen-coder-1.5b (151936 x 1536) took about 24 ms per one-token pass there and 12 ms here; one
// 8960 x 1536 int4 layer 1.1 ms there and 0.7 ms here (docs/quantization.md has the figures).
//
// int8: activations become int16 as for int4 below, and each weight is widened to int16 once per
// block of 4 rows.
// int4: activations are turned into int16 with one scale per row (max |x| -> 32767: finer than
// the bfloat16 they arrive in), the nibbles into int16 lanes by masks and shifts, and vpmaddwd
// multiplies and adds pairs exactly in int32; each group's integer sum is then scaled in float32.
// The zero term uses each row's exact integer group sums. Weight rows are prefetched ahead. The
// bias is added and the result rounded to the activations' dtype in the kernel: at decode time a
// small layer's own work is a few microseconds, and each extra PyTorch operation costs as much.
//
// Row stability: every output y[m, n] is computed by the same sequence of operations whatever
// the number of rows M, the block a row falls in, and the thread split: work is split over output
// columns n only, each row has its own accumulators and its own activation scale, and every
// reduction runs in a fixed order (no -ffast-math, -ffp-contract=off). A verification pass over
// k + 1 tokens therefore gives each token exactly the logits a one-token pass gives it, which
// keeps greedy speculative decoding lossless (tests/decoder/test_kernels.py checks it bit for bit).
//
// Layouts (decoder/kernels/__init__.py and decoder/cpu/quantize.py make them):
//   int8: q (N, K) int8 row-major (the same as `_weight_int8pack_mm`'s), scales (N,) float32;
//         w[n, k] = q[n, k] * scales[n].
//   int4: q (N, K / 2) uint8, 32 bytes per 64 weights read as 16 little-endian uint16 words:
//         word j < 8 holds weights j, 8 + j, 16 + j and 24 + j in its four nibbles, low to high,
//         word 8 + j weights 32 + j, 40 + j, 48 + j and 56 + j. A mask or a shift then gives 16
//         weights whose low 128-bit half lies in the block's first 32 weights and whose high half
//         in its last 32, so at G = 32 one float vector holds two groups' sums, side by side;
//         sz (N, 2, K / G) bfloat16 or float32: each row's group scales, then its group zeros
//         (the value of level 8), with w = (q - 8) * scale + zero, q in 0..15. bfloat16 halves
//         what the scales cost at G = 32: 1 bit per weight instead of 2 (one 8960 x 1536 layer:
//         10.3 MB -> 8.6 MB per pass, the same results bit for bit).

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "simd.h"

namespace {

using draftwatch::hsum;
using draftwatch::load8;

constexpr int64_t kRowBlock = 4;  // rows sharing one conversion of the weights
constexpr int64_t kParallelRows = 64;  // fewer activation rows than this are converted on one thread

// Up to this many rows (a decode step, a verification pass) the weights' bytes bound a pass: each
// column's weights are streamed once, prefetched ahead. More rows (a prompt's prefill) are bound
// by the arithmetic, and run in chunks and tiles as follows.
constexpr int64_t kStreamRows = 16;

// With more rows than kStreamRows, the columns are taken in chunks of this many,
// and every block of rows passes over a chunk while its weights are in L2 (64 columns of a
// 1536 x 8960 int4 layer: 280 kB). Column by column instead, each column read every row of the
// prompt again (3 MB of int16 for 1,000 rows of 1536), from L3 at best. The rows in turn go in
// tiles of about kTileBytes of int16 activations, so that a long prompt's rows (12 MB at 4,000 x
// 1536, 72 MB at 4,000 x 8960) come from L2 or L3, not from memory, once per chunk.
constexpr int64_t kColumnChunk = 64;
constexpr int64_t kTileBytes = 512 * 1024;

// How many weight rows ahead to fetch, into L2: into L1 they pushed out the activations of wide
// rows (an 1536 x 8960 layer ran 1.3x slower with _MM_HINT_T0).
constexpr int64_t kPrefetchRows = 4;

inline void prefetch_bytes(const void* start, int64_t bytes) {
  const char* p = static_cast<const char*>(start);
  for (int64_t offset = 0; offset < bytes; offset += 64) _mm_prefetch(p + offset, _MM_HINT_T1);
}

// Activation rows are int16 (one scale per row, as for int4) so that vpmaddwd multiplies and adds
// pairs exactly in int32: half the instructions of converting every weight to float (the
// qwen-coder-1.5b head, 151936 x 1536: 8.1 -> 5.2 ms a token). K is summed in chunks of
// kInt8Chunk, in which an int32 lane gathers 2048 / 16 = 128 products of at most 127 * 32767
// (5.3e8 < 2^31); each chunk's sum is then added in float32.
constexpr int64_t kInt8Chunk = 2048;

// Rows [m0, m0 + R) of column n: each 32 weights are widened to int16 once for all R rows.
template <int R>
inline void int8_column(const int16_t* xq, const float* row_scales, const int8_t* q, float scale, float* out,
                        int64_t K) {
  __m256 total[R];
  for (int r = 0; r < R; ++r) total[r] = _mm256_setzero_ps();
  for (int64_t k0 = 0; k0 < K; k0 += kInt8Chunk) {
    const int64_t k1 = std::min(K, k0 + kInt8Chunk);
    __m256i dot[R][2];
    for (int r = 0; r < R; ++r) dot[r][0] = dot[r][1] = _mm256_setzero_si256();
    for (int64_t k = k0; k < k1; k += 32) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + k));
      const __m256i w0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w));       // weights k .. k+15
      const __m256i w1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1));  // k+16 .. k+31
      for (int r = 0; r < R; ++r) {
        const __m256i* xr = reinterpret_cast<const __m256i*>(xq + r * K + k);
        dot[r][0] = _mm256_add_epi32(dot[r][0], _mm256_madd_epi16(w0, _mm256_loadu_si256(xr)));
        dot[r][1] = _mm256_add_epi32(dot[r][1], _mm256_madd_epi16(w1, _mm256_loadu_si256(xr + 1)));
      }
    }
    for (int r = 0; r < R; ++r) total[r] = _mm256_add_ps(total[r], _mm256_cvtepi32_ps(_mm256_add_epi32(dot[r][0], dot[r][1])));
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(total[r]) * row_scales[r] * scale;
}

// out[r] for rows [0, R) of one column from their scaled group sums (two accumulators a row) and
// the zero term: a dot product of the group offsets with each row's exact group sums of xq.
template <int R, typename T>
inline void int4_finish(const __m256* total, const __m256* total_odd, const float* xqsum, const float* row_scales,
                        const float* scales, const T* zeros, float* out, int64_t groups) {
  // offset = zero - 8 * scale, so that w = q * scale + offset (8 * scale is exact).
  const __m256 eight = _mm256_set1_ps(8.0f);
  for (int r = 0; r < R; ++r) {
    __m256 zero_term = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 8 <= groups; g += 8) {
      const __m256 offsets = _mm256_sub_ps(load8(zeros + g), _mm256_mul_ps(eight, _mm256_loadu_ps(scales + g)));
      zero_term = _mm256_fmadd_ps(offsets, _mm256_loadu_ps(xqsum + r * groups + g), zero_term);
    }
    float tail = 0.0f;
    for (; g < groups; ++g) tail += (static_cast<float>(zeros[g]) - 8.0f * scales[g]) * xqsum[r * groups + g];
    out[r] = (hsum(_mm256_add_ps(total[r], total_odd[r])) + (hsum(zero_term) + tail)) * row_scales[r];
  }
}

// Rows [m0, m0 + R) of column n, int4 weights in groups of G (32 or a multiple of 64),
// activations as int16 in the weights' order (xq, see int16_row; one scale per row in
// row_scales). Per 64 weights: one 32-byte load gives four vectors of 16 weights as int16 lanes
// (mask and shift, no shuffles), vpmaddwd multiplies them with the activations and adds pairs
// exactly in int32 (|q| <= 15, |xq| <= 32767), and the integer sums are scaled in float32: at
// G = 32 one vector of both groups' sums times one vector of both scales, built once for all R
// rows. The zero term is a dot product of the group offsets with each row's exact group sums of
// xq, after the loop.
template <int R, bool kGroup32, typename T>
inline void int4_column(const int16_t* xq, const float* xqsum, const float* row_scales, const uint8_t* q,
                        const float* scales, const T* zeros, float* out, int64_t K, int64_t G) {
  const __m256i nibble = _mm256_set1_epi16(0x000F);
  const int64_t groups = K / G;
  // Two float accumulators per row: at G = 32 each 64 weights end two groups, and one chain would
  // wait on the FMA latency twice per 64 weights (a one-row pass ran at half speed on it).
  __m256 total[R], total_odd[R];
  __m256i dot[R];
  for (int r = 0; r < R; ++r) {
    total[r] = total_odd[r] = _mm256_setzero_ps();
    dot[r] = _mm256_setzero_si256();
  }
  const int64_t blocks_per_group = kGroup32 ? 1 : G / 64;
  // Sum over 64 weights and R rows, into sums[r] (8 int32 lanes: the first 32 weights' in 0-3,
  // the last 32 weights' in 4-7).
  const auto block_sums = [&](int64_t b, __m256i* sums) {
    const int64_t k = b * 64;
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + k / 2));
    const __m256i w0 = _mm256_and_si256(v, nibble);
    const __m256i w1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
    const __m256i w2 = _mm256_and_si256(_mm256_srli_epi16(v, 8), nibble);
    const __m256i w3 = _mm256_srli_epi16(v, 12);
    for (int r = 0; r < R; ++r) {
      const __m256i* xr = reinterpret_cast<const __m256i*>(xq + r * K + k);
      const __m256i first = _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256(xr)),
                                             _mm256_madd_epi16(w1, _mm256_loadu_si256(xr + 1)));
      const __m256i second = _mm256_add_epi32(_mm256_madd_epi16(w2, _mm256_loadu_si256(xr + 2)),
                                              _mm256_madd_epi16(w3, _mm256_loadu_si256(xr + 3)));
      sums[r] = _mm256_add_epi32(first, second);
    }
  };
  __m256i sums[R];
  if (kGroup32) {
    // Groups 2b (lanes 0-3) and 2b + 1 (lanes 4-7) of block b. Even and odd blocks go to their own
    // accumulators, so that one FMA chain does not wait on itself every block.
    const auto scale_pair = [&](int64_t b) {
      return _mm256_set_m128(_mm_broadcast_ss(scales + 2 * b + 1), _mm_broadcast_ss(scales + 2 * b));
    };
    int64_t b = 0;
    for (; b + 2 <= K / 64; b += 2) {
      block_sums(b, sums);
      const __m256 even = scale_pair(b);
      for (int r = 0; r < R; ++r) total[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), even, total[r]);
      block_sums(b + 1, sums);
      const __m256 odd = scale_pair(b + 1);
      for (int r = 0; r < R; ++r) total_odd[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), odd, total_odd[r]);
    }
    if (b < K / 64) {
      block_sums(b, sums);
      const __m256 even = scale_pair(b);
      for (int r = 0; r < R; ++r) total[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), even, total[r]);
    }
  } else {
    for (int64_t b = 0; b < K / 64; ++b) {
      block_sums(b, sums);
      for (int r = 0; r < R; ++r) dot[r] = _mm256_add_epi32(dot[r], sums[r]);
      if ((b + 1) % blocks_per_group == 0) {
        const __m256 scale = _mm256_broadcast_ss(scales + (b + 1) / blocks_per_group - 1);
        for (int r = 0; r < R; ++r) {
          total[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), scale, total[r]);
          dot[r] = _mm256_setzero_si256();
        }
      }
    }
  }
  int4_finish<R>(total, total_odd, xqsum, row_scales, scales, zeros, out, groups);
}

// The AVX-512 VNNI form of int4_column at G = 32, for CPUs that have it, over columns [n0, n1):
// one 512-bit load holds two blocks' weights, vpdpwssd multiplies and adds into the integer sums
// in one instruction instead of two, and one FMA scales both blocks, the first block's lanes into
// the low half of acc (int4_column's `total`), the second's into the high half (`total_odd`). The
// integer sums are exact either way, and each float lane sees the same FMAs in the same order as
// int4_column's, so both forms give every output bit for bit the same (tests/decoder/test_kernels.py
// checks it); xq is in Order::kInt4Pairs. Used only with more than kStreamRows rows, where the
// arithmetic, not the memory, bounds the pass.
#define DRAFTWATCH_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))

// Columns [n, n + C) of rows [0, R): the C columns' weights are unpacked once per pair of blocks
// and each row's activations loaded once for all C (at 8960 inputs, 4 rows of activations are
// 70 kB, more than L1 holds, so every load saved is one from L2).
template <int R, int C, typename T, typename O>
DRAFTWATCH_AVX512 inline void int4_columns_vnni(const int16_t* xq, const float* xqsum, const float* row_scales,
                                                const uint8_t* Q, const T* SZ, const float* const* scales,
                                                const O* bias, O* Y, int64_t n, int64_t K, int64_t N) {
  const int64_t groups = K / 32, blocks = K / 64, pairs = blocks / 2;
  const __m512i nibble = _mm512_set1_epi16(0x000F);
  const __m256i nibble8 = _mm256_set1_epi16(0x000F);
  // lane i of a pair's scales: group i / 4 of its four (4 lanes of each block's sums per group)
  const __m512i scale_index = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  __m512 acc[C][R];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) acc[c][r] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512i w[C][4];
    __m512 pair_scales[C];
    for (int c = 0; c < C; ++c) {
      const __m512i v = _mm512_loadu_si512(Q + (n + c) * (K / 2) + p * 64);
      w[c][0] = _mm512_and_si512(v, nibble);
      w[c][1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
      w[c][2] = _mm512_and_si512(_mm512_srli_epi16(v, 8), nibble);
      w[c][3] = _mm512_srli_epi16(v, 12);
      pair_scales[c] = _mm512_permutexvar_ps(scale_index, _mm512_castps128_ps512(_mm_loadu_ps(scales[c] + 4 * p)));
    }
    for (int r = 0; r < R; ++r) {
      const int16_t* xr = xq + r * K + p * 128;
      const __m512i x0 = _mm512_loadu_si512(xr), x1 = _mm512_loadu_si512(xr + 32);
      const __m512i x2 = _mm512_loadu_si512(xr + 64), x3 = _mm512_loadu_si512(xr + 96);
      for (int c = 0; c < C; ++c) {
        __m512i sum = _mm512_madd_epi16(w[c][0], x0);
        sum = _mm512_dpwssd_epi32(sum, w[c][1], x1);
        sum = _mm512_dpwssd_epi32(sum, w[c][2], x2);
        sum = _mm512_dpwssd_epi32(sum, w[c][3], x3);
        acc[c][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), pair_scales[c], acc[c][r]);
      }
    }
  }
  float out[R];
  for (int c = 0; c < C; ++c) {
    const uint8_t* q = Q + (n + c) * (K / 2);
    __m256 total[R], total_odd[R];
    for (int r = 0; r < R; ++r) {
      total[r] = _mm512_castps512_ps256(acc[c][r]);
      total_odd[r] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[c][r]), 1));
    }
    if (blocks % 2 != 0) {  // the last, unpaired block goes to `total`, as in int4_column
      const int64_t b = blocks - 1, k = b * 64;
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + k / 2));
      const __m256i w0 = _mm256_and_si256(v, nibble8);
      const __m256i w1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble8);
      const __m256i w2 = _mm256_and_si256(_mm256_srli_epi16(v, 8), nibble8);
      const __m256i w3 = _mm256_srli_epi16(v, 12);
      const __m256 even = _mm256_set_m128(_mm_broadcast_ss(scales[c] + 2 * b + 1), _mm_broadcast_ss(scales[c] + 2 * b));
      for (int r = 0; r < R; ++r) {
        const __m256i* xr = reinterpret_cast<const __m256i*>(xq + r * K + k);
        __m256i sum = _mm256_madd_epi16(w0, _mm256_loadu_si256(xr));
        sum = _mm256_dpwssd_epi32(sum, w1, _mm256_loadu_si256(xr + 1));
        sum = _mm256_dpwssd_epi32(sum, w2, _mm256_loadu_si256(xr + 2));
        sum = _mm256_dpwssd_epi32(sum, w3, _mm256_loadu_si256(xr + 3));
        total[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), even, total[r]);
      }
    }
    int4_finish<R>(total, total_odd, xqsum, row_scales, scales[c], SZ + (n + c) * 2 * groups + groups, out, groups);
    const float add = bias != nullptr ? static_cast<float>(bias[n + c]) : 0.0f;
    for (int r = 0; r < R; ++r) Y[r * N + n + c] = static_cast<O>(out[r] + add);
  }
}

// Columns [n0, n1) of rows [0, R) on the AVX-512 form, two at a time.
template <int R, typename T, typename O>
DRAFTWATCH_AVX512 void int4_chunk_vnni(const int16_t* xq, const float* xqsum, const float* row_scales,
                                       const uint8_t* Q, const T* SZ, const float* const* chunk_scales,
                                       const O* bias, O* Y, int64_t n0, int64_t n1, int64_t K, int64_t N) {
  int64_t n = n0;
  for (; n + 2 <= n1; n += 2) {
    int4_columns_vnni<R, 2>(xq, xqsum, row_scales, Q, SZ, chunk_scales + (n - n0), bias, Y, n, K, N);
  }
  if (n < n1) int4_columns_vnni<R, 1>(xq, xqsum, row_scales, Q, SZ, chunk_scales + (n - n0), bias, Y, n, K, N);
}

bool cpu_has_vnni() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  return has;
}

// Row n's group scales as float32: the stored ones, or a conversion of bfloat16 ones into buffer.
inline const float* float_scales(const float* scales, int64_t, float*) { return scales; }
inline const float* float_scales(const c10::BFloat16* scales, int64_t groups, float* buffer) {
  int64_t g = 0;
  for (; g + 8 <= groups; g += 8) _mm256_storeu_ps(buffer + g, load8(scales + g));
  for (; g < groups; ++g) buffer[g] = static_cast<float>(scales[g]);
  return buffer;
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

// Where the activation of weight i (0..63, a multiple of 8) of a 64-weight block goes, so that
// xq lines up with the int4 words: the runs of 8 of the block's two halves alternate.
constexpr int64_t int4_position(int64_t i) { return i < 32 ? i * 2 : (i - 32) * 2 + 8; }

// The order of a row of int16 activations: x's own, the int4 words' (int4_position in each block),
// or the AVX-512 path's, which reads two blocks in one 512-bit vector: in each pair of blocks the
// 16-value runs of the two blocks alternate, so that run j of both blocks is one load (a last,
// unpaired block keeps the int4 order).
enum class Order { kPlain, kInt4, kInt4Pairs };

// Where the activation of weight k (a multiple of 8) of a row of K goes, in order.
inline int64_t row_position(int64_t k, int64_t K, Order order) {
  if (order == Order::kPlain) return k;
  const int64_t block = k / 64, within = int4_position(k % 64);
  const int64_t paired = (K / 64) / 2 * 2;  // blocks that have a partner
  if (order == Order::kInt4 || block >= paired) return block * 64 + within;
  return block / 2 * 128 + within / 16 * 32 + block % 2 * 16 + within % 16;
}

// One row of activations as int16 with one scale (max |x| -> 32767, returned), and its group
// sums (exact integers) into xqsum when given, in the given order. Per row, in a fixed order, so
// nothing depends on M. The rounding is the CPU's default (to nearest, ties to even), lrintf's.
template <typename T>
float int16_row(const T* x, int64_t K, int64_t G, int16_t* xq, float* xqsum, Order order) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 largest8 = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) largest8 = _mm256_max_ps(largest8, _mm256_and_ps(load8(x + k), magnitude));
  __m128 largest4 = _mm_max_ps(_mm256_castps256_ps128(largest8), _mm256_extractf128_ps(largest8, 1));
  largest4 = _mm_max_ps(largest4, _mm_movehl_ps(largest4, largest4));
  const float largest = _mm_cvtss_f32(_mm_max_ss(largest4, _mm_movehdup_ps(largest4)));
  const float scale = largest > 0.0f ? largest / 32767.0f : 1.0f;
  const __m256 inverse = _mm256_set1_ps(1.0f / scale);
  for (int64_t g = 0; g < K / G; ++g) {
    __m256i sum = _mm256_setzero_si256();
    for (int64_t k = g * G; k < (g + 1) * G; k += 16) {
      const __m256i low = _mm256_cvtps_epi32(_mm256_mul_ps(load8(x + k), inverse));
      const __m256i high = _mm256_cvtps_epi32(_mm256_mul_ps(load8(x + k + 8), inverse));
      sum = _mm256_add_epi32(sum, _mm256_add_epi32(low, high));
      // packs interleaves 128-bit lanes; the permute puts the 16 values back in order
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(low, high), 0xD8);
      if (order != Order::kPlain) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + row_position(k, K, order)), _mm256_castsi256_si128(packed));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + row_position(k + 8, K, order)),
                         _mm256_extracti128_si256(packed, 1));
      } else {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + k), packed);
      }
    }
    if (xqsum == nullptr) continue;
    __m128i sum4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    sum4 = _mm_add_epi32(sum4, _mm_shuffle_epi32(sum4, 0x4E));
    sum4 = _mm_add_epi32(sum4, _mm_shuffle_epi32(sum4, 0xB1));
    xqsum[g] = static_cast<float>(_mm_cvtsi128_si32(sum4));
  }
  return scale;
}

// A pass's activation rows as int16, with each row's scale and, for int4, its group sums and the
// int4 words' order.
struct Int16Rows {
  torch::Tensor xq;             // (M, K) int16
  torch::Tensor xqsum;          // (M, K / G) float32, exact integers; empty without group sums
  std::vector<float> scale;     // (M,)
  torch::ScalarType dtype;      // x's dtype: what the kernels return
};

// x (M, K): bfloat16 rows are read as they are, other dtypes through float32. Rows are independent,
// so many of them (a prompt) are shared out between the threads.
Int16Rows int16_rows(const torch::Tensor& x, int64_t G, Order order) {
  const bool for_int4 = order != Order::kPlain;
  TORCH_CHECK(x.dim() == 2, "x must be (rows, in_features), got ", x.sizes());
  const bool bf16 = x.scalar_type() == torch::kBFloat16;
  const torch::Tensor xf = bf16 ? x.contiguous() : x.to(torch::kFloat).contiguous();
  const int64_t M = xf.size(0), K = xf.size(1);
  const auto options = xf.options().dtype(torch::kFloat);
  Int16Rows rows{torch::empty({M, K}, options.dtype(torch::kShort)),
                 for_int4 ? torch::empty({M, K / G}, options) : torch::Tensor(), std::vector<float>(M),
                 x.scalar_type()};
  at::parallel_for(0, M, kParallelRows, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      int16_t* xq_m = rows.xq.data_ptr<int16_t>() + m * K;
      float* xqsum_m = for_int4 ? rows.xqsum.data_ptr<float>() + m * (K / G) : nullptr;
      rows.scale[m] = bf16 ? int16_row(xf.data_ptr<c10::BFloat16>() + m * K, K, G, xq_m, xqsum_m, order)
                           : int16_row(xf.data_ptr<float>() + m * K, K, G, xq_m, xqsum_m, order);
    }
  });
  return rows;
}

}  // namespace

// The output of a pass over the rows xr: (M, N) in bfloat16 when x was bfloat16, else float32.
// fill(bias, y) writes it, both as O* (the bias converted to O, or nullptr); the result comes back
// in x's dtype.
template <typename Fill>
torch::Tensor linear_output(const Int16Rows& xr, int64_t N, const std::optional<torch::Tensor>& bias, Fill&& fill) {
  TORCH_CHECK(!bias || bias->numel() == N, "bias must have out_features (", N, ") values, got ", bias->numel());
  const bool bf16 = xr.dtype == torch::kBFloat16;
  torch::Tensor y = torch::empty({xr.xq.size(0), N}, xr.xq.options().dtype(bf16 ? torch::kBFloat16 : torch::kFloat));
  std::optional<torch::Tensor> b;
  if (bias) b = bias->to(y.scalar_type()).contiguous();
  if (bf16) {
    fill(b ? b->data_ptr<c10::BFloat16>() : nullptr, y.data_ptr<c10::BFloat16>());
  } else {
    fill(b ? b->data_ptr<float>() : nullptr, y.data_ptr<float>());
  }
  return y.scalar_type() == xr.dtype ? y : y.to(xr.dtype);
}

// Columns of y (M, N) for int8 weights, plus the bias when given, rounded once into O.
template <typename O>
void int8_columns(const Int16Rows& xr, const int8_t* Q, const float* S, const O* bias, O* Y, int64_t M, int64_t K,
                  int64_t N) {
  const int16_t* XQ = xr.xq.data_ptr<int16_t>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    float out[kRowBlock];
    for (int64_t n = n0; n < n1; ++n) {
      const int8_t* qn = Q + n * K;
      if (n + kPrefetchRows < n1) prefetch_bytes(qn + kPrefetchRows * K, K);
      const float add = bias != nullptr ? static_cast<float>(bias[n]) : 0.0f;
      in_row_blocks(M, [&](auto rows, int64_t m) {
        constexpr int R = decltype(rows)::value;
        int8_column<R>(XQ + m * K, xr.scale.data() + m, qn, S[n], out, K);
        for (int r = 0; r < R; ++r) Y[(m + r) * N + n] = static_cast<O>(out[r] + add);
      });
    }
  });
}

// y (M, N) = x (M, K) @ (q * scales)^T + bias, in x's dtype, as int4_linear below.
torch::Tensor int8_linear(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& scales,
                          const std::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2, "x must be (rows, in_features), got ", x.sizes());
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
  TORCH_CHECK(q.scalar_type() == torch::kChar && q.is_contiguous() && q.size(1) == K, "q must be (N, K) int8");
  TORCH_CHECK(scales.scalar_type() == torch::kFloat && scales.numel() == N, "scales must be (N,) float32");
  TORCH_CHECK(K % 32 == 0, "in_features must be a multiple of 32, got ", K);
  const Int16Rows xr = int16_rows(x, K, Order::kPlain);
  const int8_t* Q = q.data_ptr<int8_t>();
  const float* S = scales.data_ptr<float>();
  return linear_output(xr, N, bias, [&](auto b, auto y) { int8_columns(xr, Q, S, b, y, M, K, N); });
}

// Columns of y (M, N) for int4 weights with scales and zeros stored as T (float or bfloat16), plus
// the bias when given, rounded once into O (float or bfloat16, the activations' dtype). A pass of
// up to kStreamRows rows streams each column's weights once, prefetched ahead; more rows run in
// column chunks and row tiles, on the AVX-512 form when vnni. Every output is computed the same
// way in all three.
template <typename T, typename O>
void int4_columns(const int16_t* XQ, const float* XS, const float* RS, const uint8_t* Q, const T* SZ, const O* bias,
                  O* Y, int64_t M, int64_t K, int64_t G, int64_t N, bool vnni) {
  const int64_t groups = K / G;
  const auto column = [&](auto rows, int64_t m, int64_t n, const float* scales, float* out) {
    constexpr int R = decltype(rows)::value;
    const uint8_t* qn = Q + n * (K / 2);
    const T* zeros = SZ + n * 2 * groups + groups;
    if (G == 32) {
      int4_column<R, true>(XQ + m * K, XS + m * groups, RS + m, qn, scales, zeros, out, K, G);
    } else {
      int4_column<R, false>(XQ + m * K, XS + m * groups, RS + m, qn, scales, zeros, out, K, G);
    }
    const float add = bias != nullptr ? static_cast<float>(bias[n]) : 0.0f;
    for (int r = 0; r < R; ++r) Y[(m + r) * N + n] = static_cast<O>(out[r] + add);
  };
  if (M <= kStreamRows) {
    at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
      std::vector<float> buffer(groups);
      float out[kRowBlock];
      for (int64_t n = n0; n < n1; ++n) {
        const T* szn = SZ + n * 2 * groups;  // (2, groups): scales, then zeros
        if (n + kPrefetchRows < n1) {  // the hardware prefetcher alone left DRAM half idle (8.8 of about 30 GB/s)
          prefetch_bytes(Q + (n + kPrefetchRows) * (K / 2), K / 2);
          prefetch_bytes(szn + kPrefetchRows * 2 * groups, 2 * groups * sizeof(T));
        }
        const float* scales = float_scales(szn, groups, buffer.data());
        in_row_blocks(M, [&](auto rows, int64_t m) { column(rows, m, n, scales, out); });
      }
    });
    return;
  }
  const int64_t tile = std::max(kRowBlock, kTileBytes / (2 * K) / kRowBlock * kRowBlock);
  at::parallel_for(0, N, kColumnChunk, [&](int64_t n0, int64_t n1) {
    std::vector<float> buffer(kColumnChunk * groups);
    std::vector<const float*> chunk_scales(kColumnChunk);
    float out[kRowBlock];
    for (int64_t t0 = 0; t0 < M; t0 += tile) {
      for (int64_t c0 = n0; c0 < n1; c0 += kColumnChunk) {
        const int64_t c1 = std::min(n1, c0 + kColumnChunk);
        for (int64_t n = c0; n < c1; ++n) {
          chunk_scales[n - c0] = float_scales(SZ + n * 2 * groups, groups, buffer.data() + (n - c0) * groups);
        }
        in_row_blocks(std::min(tile, M - t0), [&](auto rows, int64_t block) {
          constexpr int R = decltype(rows)::value;
          const int64_t m = t0 + block;
          if (vnni) {
            int4_chunk_vnni<R>(XQ + m * K, XS + m * groups, RS + m, Q, SZ, chunk_scales.data(), bias, Y + m * N, c0,
                               c1, K, N);
            return;
          }
          for (int64_t n = c0; n < c1; ++n) column(rows, m, n, chunk_scales[n - c0], out);
        });
      }
    }
  });
}

// y (M, N) = x (M, K) @ W^T + bias, in x's dtype: bfloat16 rows are read and written as they are,
// other dtypes go through float32.
// isa "auto" takes the AVX-512 form where the CPU has it and it applies (G = 32, more than
// kStreamRows rows); "avx2" never does (the tests compare the two).
torch::Tensor int4_linear(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& sz, int64_t G,
                          const std::optional<torch::Tensor>& bias, const std::string& isa) {
  TORCH_CHECK(isa == "auto" || isa == "avx2", "isa must be auto or avx2, got ", isa);
  TORCH_CHECK(x.dim() == 2, "x must be (rows, in_features), got ", x.sizes());
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
  TORCH_CHECK((G == 32 || G % 64 == 0) && K % G == 0 && K % 64 == 0,
              "group size must be 32 or a multiple of 64, dividing in_features (a multiple of 64); got ", G, ", ", K);
  TORCH_CHECK(q.scalar_type() == torch::kByte && q.is_contiguous() && q.size(1) == K / 2, "q must be (N, K/2) uint8");
  TORCH_CHECK((sz.scalar_type() == torch::kFloat || sz.scalar_type() == torch::kBFloat16) && sz.is_contiguous() &&
                  sz.numel() == N * 2 * (K / G),
              "sz must be (N, 2, K/G) float32 or bfloat16 (scales, then zeros)");
  const bool vnni = isa == "auto" && G == 32 && M > kStreamRows && cpu_has_vnni();
  // group sums exact: |sum| <= 32767 * 256 < 2^24
  const Int16Rows xr = int16_rows(x, G, vnni ? Order::kInt4Pairs : Order::kInt4);
  const int16_t* XQ = xr.xq.data_ptr<int16_t>();
  const float* XS = xr.xqsum.data_ptr<float>();
  const float* RS = xr.scale.data();
  const uint8_t* Q = q.data_ptr<uint8_t>();
  return linear_output(xr, N, bias, [&](auto b, auto y) {
    if (sz.scalar_type() == torch::kBFloat16) {
      int4_columns(XQ, XS, RS, Q, sz.data_ptr<c10::BFloat16>(), b, y, M, K, G, N, vnni);
    } else {
      int4_columns(XQ, XS, RS, Q, sz.data_ptr<float>(), b, y, M, K, G, N, vnni);
    }
  });
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);  // cpu_layers.cpp
torch::Tensor attend_one_row(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                             const std::optional<torch::Tensor>& mask, double scale);  // cpu_layers.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int8_linear", &int8_linear, "y (M, N) = x (M, K) @ (q * scales)^T + bias in x's dtype", py::arg("x"),
        py::arg("q"), py::arg("scales"), py::arg("bias") = py::none());
  m.def("int4_linear", &int4_linear, "y (M, N) = x (M, K) @ W^T + bias in x's dtype, W int4 in groups (draftwatch layout)",
        py::arg("x"), py::arg("q"), py::arg("sz"), py::arg("group_size"), py::arg("bias") = py::none(),
        py::arg("isa") = "auto");
  m.def("rms_norm", &rms_norm, "RMSNorm over the last dimension, as transformers' Qwen2 / Llama compute it");
  m.def("attend_one_row", &attend_one_row, "attention of one query row (B, H, 1, d) over its cache -> (B, 1, H, d)");
}
