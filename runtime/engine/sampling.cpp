// Tokens from a step's logits, natively: each greedy row's largest logit, and each sampled
// row's draw under temperature, top-k and top-p.
//
// Why: torch did it in a dozen operators a row, each a pass over the vocabulary (49,152
// logits for SmolLM2) and a tensor. On a 2-core Xeon, greedy tokens for a 64-row step took
// 1.63 ms of a 44.8 ms step (torch's max: ~15 GB/s over logits fresh from the LM head), and 16
// sampled rows (random logits) 1.9 ms at temperature 0.7, 4.6-5.6 with top-k 50 and 9.8 with
// top-p 0.9, beside a 16-row step's ~20 ms; here 0.48 ms, and 0.4, 1.0 and 1.3 ms (the
// Sampler called alone, each path twice in turn). Here a row is a few vector passes (division by
// the temperature and its max, then the exponentials), for top-k a scan that keeps the k
// largest in a heap, for top-p the tokens binned by value so that only one bin is sorted, and
// the rows are split between the threads.
//
// The choices are torch's (sampler.py keeps its torch path where this is not built): greedy
// is torch.max(dim=-1).indices (the first of equal logits; a NaN counts as the largest); a
// draw keeps the top-k logits (every one equal to the k-th too) and then the fewest largest
// whose probability reaches top_p (a token stays while the mass before it is below top_p),
// and inverts the kept tokens' cumulative sum, in vocabulary order, at the request's uniform
// number. A logit of -inf (masked by a grammar) or NaN is never drawn.
#include <torch/extension.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "../../models/simd.h"

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The row's largest value (NaN skipped), and whether it holds a NaN.
float row_max(const float* x, int64_t n, bool& nan) {
  int64_t i = 0;
  float best = kNegInf;
  nan = false;
#if defined(__AVX512F__)
  __m512 acc = _mm512_set1_ps(best);
  __mmask16 unordered = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    acc = _mm512_max_ps(v, acc);  // a NaN in v yields acc: NaN lanes are skipped
  }
  best = _mm512_reduce_max_ps(acc);
  nan = unordered != 0;
#elif defined(__AVX2__)
  __m256 acc = _mm256_set1_ps(best), unordered = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    acc = _mm256_max_ps(v, acc);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (const float lane : lanes) best = std::max(best, lane);
  nan = _mm256_movemask_ps(unordered) != 0;
#endif
  for (; i < n; ++i) {
    if (std::isnan(x[i])) nan = true;
    else best = std::max(best, x[i]);
  }
  return best;
}

// The first index whose value is `target` (or, with `nan`, the first NaN).
int64_t first_index(const float* x, int64_t n, float target, bool nan) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 t = _mm512_set1_ps(target);
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __mmask16 hit = nan ? _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)
                              : _mm512_cmp_ps_mask(v, t, _CMP_EQ_OQ);
    if (hit) return i + __builtin_ctz(hit);
  }
#elif defined(__AVX2__)
  const __m256 t = _mm256_set1_ps(target);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const int hit = _mm256_movemask_ps(nan ? _mm256_cmp_ps(v, v, _CMP_UNORD_Q)
                                           : _mm256_cmp_ps(v, t, _CMP_EQ_OQ));
    if (hit) return i + __builtin_ctz(hit);
  }
#endif
  for (; i < n; ++i)
    if (nan ? std::isnan(x[i]) : x[i] == target) return i;
  return 0;  // unreachable: target is one of the row's values
}

int64_t argmax(const float* x, int64_t n) {
  bool nan = false;
  const float best = row_max(x, n, nan);
  return first_index(x, n, best, nan);
}

// x = logits / temperature, and e = exp(x - max x), 0 where x is -inf or NaN (never drawn).
// Returns max x (-inf when every logit is masked).
float scaled_exponentials(const float* logits, int64_t n, float temperature, float* x,
                          float* e) {
  for (int64_t i = 0; i < n; ++i) x[i] = logits[i] / temperature;
  bool nan = false;
  const float top = row_max(x, n, nan);
  if (top == kNegInf) return top;
  // vexp_shifted floors its result at 2^-126 far below the max: a masked logit must get 0.
  constexpr float kFloor = -87.f;
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 shift = _mm512_set1_ps(top), floor = _mm512_set1_ps(kFloor);
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __mmask16 live = _mm512_cmp_ps_mask(_mm512_sub_ps(v, shift), floor, _CMP_GE_OQ);
    _mm512_storeu_ps(e + i, _mm512_maskz_mov_ps(live, edgefire::simd::vexp_shifted(v, shift)));
  }
#elif defined(EDGEFIRE_SIMD)  // AVX2 with FMA: simd.h's vexp_shifted
  const __m256 shift = _mm256_set1_ps(top), floor = _mm256_set1_ps(kFloor);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 live = _mm256_cmp_ps(_mm256_sub_ps(v, shift), floor, _CMP_GE_OQ);
    _mm256_storeu_ps(e + i, _mm256_and_ps(live, edgefire::simd::vexp_shifted(v, shift)));
  }
#endif
  for (; i < n; ++i) e[i] = x[i] - top >= kFloor ? std::exp(x[i] - top) : 0.f;
  return top;
}

// The sum of 16 values of e, in double.
inline double block_sum(const float* e) {
#if defined(__AVX512F__)
  const __m512d a = _mm512_cvtps_pd(_mm256_loadu_ps(e));
  const __m512d b = _mm512_cvtps_pd(_mm256_loadu_ps(e + 8));
  return _mm512_reduce_add_pd(_mm512_add_pd(a, b));
#elif defined(__AVX2__)
  const __m256d a =
      _mm256_add_pd(_mm256_cvtps_pd(_mm_loadu_ps(e)), _mm256_cvtps_pd(_mm_loadu_ps(e + 4)));
  const __m256d b =
      _mm256_add_pd(_mm256_cvtps_pd(_mm_loadu_ps(e + 8)), _mm256_cvtps_pd(_mm_loadu_ps(e + 12)));
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(a, b));
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#else
  double sum = 0;
  for (int j = 0; j < 16; ++j) sum += e[j];
  return sum;
#endif
}

// The k-th largest of x (k < n; -inf and NaN are never among them unless nothing else is).
float kth_largest(const float* x, int64_t n, int64_t k) {
  // A min-heap of the k largest so far: its top, the least of them, is the answer at the end.
  std::vector<float> heap;
  heap.reserve(k);
  for (int64_t i = 0; i < n; ++i) {
    if (!(x[i] > kNegInf)) continue;
    if (static_cast<int64_t>(heap.size()) < k) {
      heap.push_back(x[i]);
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    } else if (x[i] > heap.front()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      heap.back() = x[i];
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  }
  return static_cast<int64_t>(heap.size()) < k ? kNegInf : heap.front();
}

// The token of `kept` (ascending indices) where the cumulative sum of e passes u times their
// total: the draw.
int64_t invert(const float* e, const std::vector<int64_t>& kept, double u) {
  double total = 0;
  for (const int64_t i : kept) total += e[i];
  const double target = u * total;
  double sum = 0;
  int64_t last = kept.front();
  for (const int64_t i : kept) {
    if (e[i] == 0.f) continue;
    sum += e[i];
    last = i;
    if (sum > target) return i;
  }
  return last;  // u * total rounded past the sum
}

// The same over the whole row, 16 values at a time up to the block where the sum passes: a
// scalar chain of double additions over 49,152 values was most of a sampled row's time.
int64_t invert_all(const float* e, int64_t n, double u) {
  constexpr int64_t kBlock = 16;
  double total = 0;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) total += block_sum(e + i);
  for (; i < n; ++i) total += e[i];
  const double target = u * total;
  double sum = 0;
  for (i = 0; i + kBlock <= n; i += kBlock) {
    const double block = block_sum(e + i);
    if (sum + block > target) break;
    sum += block;
  }
  for (; i < n; ++i) {
    if (e[i] == 0.f) continue;
    sum += e[i];
    if (sum > target) return i;
  }
  for (i = n - 1; i > 0 && e[i] == 0.f; --i) {}
  return i;  // u * total rounded past the sum: the last token that can be drawn
}

// Of the tokens with x >= floor (the top-k's) and e > 0, the nucleus: the fewest largest
// whose mass reaches top_p of theirs (a token stays while the mass before it is below that),
// in ascending order. Rather than sorting the vocabulary, the tokens are binned by how far
// below the largest their x lies (bins are ordered by value); the bins above the one where
// the mass reaches top_p are in whole, and only that bin's tokens are sorted.
std::vector<int64_t> nucleus(const float* x, const float* e, int64_t n, float floor, float top,
                             double top_p, std::vector<uint16_t>& bin) {
  constexpr int kBins = 2048;
  constexpr float kSpan = 87.f;  // e is 0 past this far below the largest (scaled_exponentials)
  constexpr uint16_t kOut = kBins, kIn = kBins + 1;
  std::vector<double> mass(kBins, 0.0);
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!(x[i] >= floor) || e[i] == 0.f) {
      bin[i] = kOut;
      continue;
    }
    bin[i] = static_cast<uint16_t>(std::min<float>(kBins - 1, (top - x[i]) * (kBins / kSpan)));
    mass[bin[i]] += e[i];
    total += e[i];
  }
  const double target = top_p * total;
  double before = 0;
  int edge = 0;
  while (edge < kBins - 1 && before + mass[edge] < target) before += mass[edge++];
  std::vector<int64_t> members;
  for (int64_t i = 0; i < n; ++i)
    if (bin[i] == edge) members.push_back(i);
  std::sort(members.begin(), members.end(),
            [x](int64_t a, int64_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  for (const int64_t i : members) {
    if (before >= target) break;
    bin[i] = kIn;
    before += e[i];
  }
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < n; ++i)
    if (bin[i] < edge || bin[i] == kIn) kept.push_back(i);
  return kept;
}

int64_t sample_row(const float* logits, int64_t n, float temperature, int64_t top_k,
                   double top_p, double u, float* x, float* e, std::vector<uint16_t>& bin) {
  const float top = scaled_exponentials(logits, n, temperature, x, e);
  if (top == kNegInf) return argmax(logits, n);  // nothing can be drawn: the greedy token
  // top-k keeps every logit equal to the k-th largest too
  const float floor = top_k > 0 && top_k < n ? kth_largest(x, n, top_k) : kNegInf;
  if (top_p < 1.0) {
    return invert(e, nucleus(x, e, n, floor, top, top_p, bin), u);
  }
  if (floor == kNegInf) return invert_all(e, n, u);
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < n; ++i)
    if (x[i] >= floor && e[i] > 0.f) kept.push_back(i);
  return invert(e, kept, u);
}

// logits [rows, vocab] float32 -> [rows] int64.
torch::Tensor row_argmax(torch::Tensor logits) {
  TORCH_CHECK(logits.scalar_type() == torch::kFloat32 && logits.is_contiguous() &&
                  logits.dim() == 2 && logits.size(1) > 0,
              "logits: contiguous float32 [rows, vocab]");
  const int64_t rows = logits.size(0), n = logits.size(1);
  auto out = torch::empty({rows}, logits.options().dtype(torch::kInt64));
  const float* x = logits.data_ptr<float>();
  int64_t* index = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) index[r] = argmax(x + r * n, n);
  });
  return out;
}

// One draw for each of `rows` (rows of logits [., vocab] float32), with that row's
// temperature (> 0), top_k (0: all), top_p (1: all) and uniform number u in [0, 1).
std::vector<int64_t> sample_rows(torch::Tensor logits, std::vector<int64_t> rows,
                                 std::vector<double> temperature, std::vector<int64_t> top_k,
                                 std::vector<double> top_p, std::vector<double> u) {
  TORCH_CHECK(logits.scalar_type() == torch::kFloat32 && logits.is_contiguous() &&
                  logits.dim() == 2 && logits.size(1) > 0,
              "logits: contiguous float32 [rows, vocab]");
  const size_t count = rows.size();
  TORCH_CHECK(temperature.size() == count && top_k.size() == count && top_p.size() == count &&
                  u.size() == count,
              "one temperature, top_k, top_p and u per row");
  const int64_t n = logits.size(1);
  for (size_t j = 0; j < count; ++j)
    TORCH_CHECK(rows[j] >= 0 && rows[j] < logits.size(0) && temperature[j] > 0 &&
                    top_p[j] > 0 && top_p[j] <= 1 && u[j] >= 0 && u[j] < 1,
                "row, temperature, top_p or u out of range");
  std::vector<int64_t> tokens(count);
  const float* all = logits.data_ptr<float>();
  at::parallel_for(0, static_cast<int64_t>(count), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> x(n), e(n);
    std::vector<uint16_t> bin(n);
    for (int64_t j = begin; j < end; ++j)
      tokens[j] = sample_row(all + rows[j] * n, n, static_cast<float>(temperature[j]),
                             top_k[j], top_p[j], u[j], x.data(), e.data(), bin);
  });
  return tokens;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("row_argmax", &row_argmax);
  m.def("sample_rows", &sample_rows);
}
