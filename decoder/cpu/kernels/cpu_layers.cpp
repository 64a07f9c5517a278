// The small operations around the matrix products of a decode step, fused for x86 CPUs with AVX2
// and FMA: RMSNorm, and attention for one query row over its cache.
//
// Why: on this project's 2-core machines each PyTorch operation on a decode-sized tensor costs
// 5-10 us of dispatch, whatever its arithmetic, and a Qwen2 layer spends about 20 of them on its
// norms and its attention (qwen-coder-1.5b int4: 4.8 ms a token in RMSNorm, 5.7 ms in the
// attention function, of about 80 ms; docs/quantization.md). Each function here is one call.
//
// Row stability: both work on one row at a time, with a fixed order of operations, so a row's
// result does not depend on how many rows share the call (decoder/cpu/attention.py runs a
// verification pass row by row through the same function a one-token pass uses).

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "simd.h"

namespace {

using draftwatch::hsum;
using draftwatch::load8;

// Qwen2 / Llama RMSNorm, as transformers computes it: h = x * rsqrt(mean(x^2) + eps) in float32,
// rounded to the input dtype, then times the weight, rounded again.
template <typename T>
void rms_norm_rows(const T* x, const T* weight, T* y, int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    __m256 squares = _mm256_setzero_ps();
    for (int64_t k = 0; k < n; k += 8) {
      const __m256 v = load8(xr + k);
      squares = _mm256_fmadd_ps(v, v, squares);
    }
    const float inverse = 1.0f / std::sqrt(hsum(squares) / static_cast<float>(n) + eps);
    for (int64_t k = 0; k < n; ++k) {
      const T h = static_cast<T>(static_cast<float>(xr[k]) * inverse);
      y[r * n + k] = static_cast<T>(static_cast<float>(weight[k]) * static_cast<float>(h));
    }
  }
}

// One query row: out (d) = softmax(q . k_j * scale + mask_j) weighted sum of v_j, j < length, in
// float32. k and v rows are `stride` elements apart.
template <typename T>
void attend_row(const T* q, const T* k, const T* v, int64_t stride, const float* mask, int64_t length, int64_t d,
                float scale, float* scores, float* acc, T* out) {
  float largest = -INFINITY;
  for (int64_t j = 0; j < length; ++j) {
    __m256 dot = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) dot = _mm256_fmadd_ps(load8(q + i), load8(k + j * stride + i), dot);
    float s = hsum(dot) * scale;
    if (mask != nullptr) s += mask[j];
    scores[j] = s;
    largest = std::fmax(largest, s);
  }
  float total = 0.0f;
  for (int64_t j = 0; j < length; ++j) {
    scores[j] = std::exp(scores[j] - largest);
    total += scores[j];
  }
  for (int64_t i = 0; i < d; ++i) acc[i] = 0.0f;
  for (int64_t j = 0; j < length; ++j) {
    const __m256 w = _mm256_set1_ps(scores[j] / total);
    for (int64_t i = 0; i < d; i += 8)
      _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(w, load8(v + j * stride + i), _mm256_loadu_ps(acc + i)));
  }
  for (int64_t i = 0; i < d; ++i) out[i] = static_cast<T>(acc[i]);
}

template <typename T>
void attend(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value, const float* mask,
            float scale, torch::Tensor& out) {
  const int64_t batch = query.size(0), heads = query.size(1), d = query.size(3);
  const int64_t heads_kv = key.size(1), length = key.size(2), groups = heads / heads_kv;
  const T* Q = query.data_ptr<T>();
  const T* K = key.data_ptr<T>();
  const T* V = value.data_ptr<T>();
  T* O = out.data_ptr<T>();
  at::parallel_for(0, batch * heads, 1, [&](int64_t h0, int64_t h1) {
    std::vector<float> scores(length), acc(d);
    for (int64_t bh = h0; bh < h1; ++bh) {
      const int64_t b = bh / heads, h = bh % heads, h_kv = h / groups;
      const T* q = Q + (b * heads + h) * d;
      const T* k = K + b * key.stride(0) + h_kv * key.stride(1);
      const T* v = V + b * value.stride(0) + h_kv * value.stride(1);
      attend_row(q, k, v, key.stride(2), mask == nullptr ? nullptr : mask + b * length, length, d, scale,
                 scores.data(), acc.data(), O + (b * heads + h) * d);
    }
  });
}

bool supported(const torch::Tensor& t) {
  return t.scalar_type() == torch::kBFloat16 || t.scalar_type() == torch::kFloat;
}

}  // namespace

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const int64_t n = x.size(-1);
  TORCH_CHECK(supported(x) && weight.scalar_type() == x.scalar_type(),
              "rms_norm takes bfloat16 or float32 input with a weight of the same dtype, got ", x.scalar_type(),
              " and ", weight.scalar_type());
  TORCH_CHECK(n % 8 == 0 && weight.numel() == n, "rms_norm: the last dimension (", n,
              ") must be a multiple of 8 and match the weight (", weight.numel(), ")");
  const torch::Tensor xc = x.contiguous(), wc = weight.contiguous();
  torch::Tensor y = torch::empty_like(xc);
  const int64_t rows = xc.numel() / n;
  if (x.scalar_type() == torch::kBFloat16) {
    rms_norm_rows(xc.data_ptr<c10::BFloat16>(), wc.data_ptr<c10::BFloat16>(), y.data_ptr<c10::BFloat16>(), rows, n,
                  static_cast<float>(eps));
  } else {
    rms_norm_rows(xc.data_ptr<float>(), wc.data_ptr<float>(), y.data_ptr<float>(), rows, n, static_cast<float>(eps));
  }
  return y;
}

// query (B, H, 1, d), key / value (B, H_kv, L, d), mask (B, 1, 1, L) additive or None; returns
// (B, 1, H, d) in the query's dtype: the layout transformers expects from an attention function.
torch::Tensor attend_one_row(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                             const std::optional<torch::Tensor>& mask, double scale) {
  TORCH_CHECK(query.dim() == 4 && query.size(2) == 1, "query must be (B, H, 1, d), got ", query.sizes());
  TORCH_CHECK(key.dim() == 4 && value.sizes() == key.sizes() && key.size(0) == query.size(0) &&
                  key.size(3) == query.size(3) && query.size(1) % key.size(1) == 0,
              "key and value must be (B, H_kv, L, d) with H a multiple of H_kv, got ", key.sizes(), " and ",
              value.sizes(), " for a query of ", query.sizes());
  TORCH_CHECK(supported(query) && key.scalar_type() == query.scalar_type() &&
                  value.scalar_type() == query.scalar_type() && query.size(3) % 8 == 0,
              "attend_one_row takes bfloat16 or float32 tensors of one dtype with d a multiple of 8");
  const torch::Tensor q = query.contiguous();
  // Rows of a head must be contiguous; narrowed caches (a verification row's prefix) keep that.
  const torch::Tensor k = key.stride(3) == 1 && key.stride(2) == key.size(3) ? key : key.contiguous();
  const torch::Tensor v = value.strides() == k.strides() ? value : value.contiguous();
  TORCH_CHECK(v.strides() == k.strides(), "key and value must share a layout");
  torch::Tensor m;
  if (mask) {
    TORCH_CHECK(mask->numel() == key.size(0) * key.size(2), "mask must be (B, 1, 1, L), got ", mask->sizes());
    m = mask->to(torch::kFloat).contiguous();
  }
  const float* mask_ptr = mask ? m.data_ptr<float>() : nullptr;
  torch::Tensor out = torch::empty({query.size(0), 1, query.size(1), query.size(3)}, q.options());
  if (q.scalar_type() == torch::kBFloat16) {
    attend<c10::BFloat16>(q, k, v, mask_ptr, static_cast<float>(scale), out);
  } else {
    attend<float>(q, k, v, mask_ptr, static_cast<float>(scale), out);
  }
  return out;
}
