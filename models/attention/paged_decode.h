// Paged decode attention for CPU: one query token per sequence, K/V read straight from the
// block pool (no gather copy), each K/V row loaded once for all query heads of its group.
// Shared by the attention extension (cpu_paged_decode.cpp) and the fused decode step
// (models/fused/llama_decode.cpp).
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../simd.h"

namespace edgefire::attention {

#if defined(EDGEFIRE_SIMD)
using namespace edgefire::simd;
constexpr int64_t kLanes = kWidth;

inline vf load_row(const float* p) { return vload(p); }
inline vf load_row(const c10::BFloat16* p) { return vload_bf16(reinterpret_cast<const uint16_t*>(p)); }

// scores[g] = scale * <q_g, k> for the `group` queries sharing this K row.
template <typename T>
inline void dot_group(const float* q, const T* k, int64_t group, int64_t head_dim, float scale,
                      float* scores, int64_t stride) {
  for (int64_t g = 0; g < group; ++g) {
    vf acc = vzero();
    for (int64_t d = 0; d < head_dim; d += kLanes)
      acc = vfmadd(load_row(q + g * head_dim + d), load_row(k + d), acc);
    scores[g * stride] = vsum(acc) * scale;
  }
}

// exp over n floats in place, returning their sum (simd.h's vexp_shifted, then the tail).
inline float exp_sum(float* x, int64_t n, float shift) {
  const vf m = vset1(shift);
  vf total = vzero();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const vf e = vexp_shifted(vload(x + i), m);
    vstore(x + i, e);
    total = vadd(total, e);
  }
  float sum = vsum(total);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

// acc_g += p_g * v for each query of the group.
template <typename T>
inline void axpy_group(const float* p, const T* v, int64_t group, int64_t head_dim, float* acc,
                       int64_t stride) {
  for (int64_t d = 0; d < head_dim; d += kLanes) {
    const vf vv = load_row(v + d);
    for (int64_t g = 0; g < group; ++g) {
      float* a = acc + g * head_dim + d;
      vstore(a, vfmadd(vset1(p[g * stride]), vv, vload(a)));
    }
  }
}

constexpr int64_t kTile = 16;  // keys widened to float32 at a time
constexpr int64_t kPrefetchBlocks = 2;  // how far ahead decode_task asks for key blocks

inline void prefetch_lines(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(c + i, _MM_HINT_T1);
}

inline float max_of(const float* x, int64_t n) {
  vf m = vset1(-INFINITY);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) m = vmax(m, vload(x + i));
  float best = vhmax(m);
  for (; i < n; ++i) best = std::max(best, x[i]);
  return best;
}

// Walks one task's key or value rows through its block table without a division per token.
// Walking the keys, it asks for the key row kPrefetchBlocks blocks on and for this row's value
// (read by the second pass) into L2: blocks lie anywhere in the pool, and without it the
// task's time went to waiting on its K and V loads (64 sequences of 320 tokens, 30 layers,
// two threads, Xeon: blocks in random order 44.4 -> 36.1 ms, in order 28.3 -> 25.0).
template <typename T>
struct RowWalker {
  const T* kh;
  const T* vh;
  const int64_t* table;
  int64_t block_stride, block_size, row_len, last_block;
  int64_t block = 0, offset = 0;

  void restart() { block = 0, offset = 0; }

  const T* next(const T* base) {
    if (base == kh) {
      if (block + kPrefetchBlocks <= last_block)
        prefetch_lines(kh + table[block + kPrefetchBlocks] * block_stride + offset * row_len,
                       row_len * static_cast<int64_t>(sizeof(T)));
      prefetch_lines(vh + table[block] * block_stride + offset * row_len,
                     row_len * static_cast<int64_t>(sizeof(T)));
    }
    const T* row = base + table[block] * block_stride + offset * row_len;
    if (++offset == block_size) offset = 0, ++block;
    return row;
  }
};

// One (sequence, KV head) task with the group's G queries and head_dim = kLanes * DV held in
// registers: each key tile is widened once, four keys' dot products are reduced together,
// and the weighted sum of values stays in registers over the whole context. The generic loop
// below reduces every dot product alone and keeps its sums in memory (measured: attention
// was a third of a 32-sequence decode step).
template <typename T, int DV, int G>
void decode_task(const float* q, const T* kh, const T* vh, const int64_t* table, int64_t len,
                 int64_t block_size, int64_t block_stride, float scale, float* scores,
                 float* out) {
  constexpr int64_t D = kLanes * DV;
  alignas(64) float keys[kTile][D];
  vf qv[G][DV];
  for (int g = 0; g < G; ++g)
    for (int d = 0; d < DV; ++d) qv[g][d] = vload(q + g * D + d * kLanes);
  RowWalker<T> rows{kh, vh, table, block_stride, block_size, D, (len - 1) / block_size};
  for (int64_t t0 = 0; t0 < len; t0 += kTile) {
    const int64_t n = std::min(kTile, len - t0);
    for (int64_t i = 0; i < kTile; ++i) {
      const T* row = i < n ? rows.next(kh) : nullptr;
      for (int d = 0; d < DV; ++d)
        vstore(keys[i] + d * kLanes, row ? load_row(row + d * kLanes) : vzero());
    }
    for (int g = 0; g < G; ++g)
      for (int64_t i = 0; i < n; i += 4) {
        vf dot[4];
        for (int j = 0; j < 4; ++j) {
          dot[j] = vmul(qv[g][0], vload(keys[i + j]));
          for (int d = 1; d < DV; ++d)
            dot[j] = vfmadd(qv[g][d], vload(keys[i + j] + d * kLanes), dot[j]);
        }
        alignas(16) float four[4];
        _mm_store_ps(four, _mm_mul_ps(reduce4(dot[0], dot[1], dot[2], dot[3]),
                                      _mm_set1_ps(scale)));
        for (int64_t j = 0; j < 4 && i + j < n; ++j) scores[g * len + t0 + i + j] = four[j];
      }
  }
  // Unnormalised weights; the sums divide the outputs at the end instead.
  float inv[G];
  for (int g = 0; g < G; ++g) {
    float* sg = scores + g * len;
    inv[g] = 1.f / exp_sum(sg, len, max_of(sg, len));
  }
  vf acc[G][DV];
  for (auto& row : acc)
    for (auto& a : row) a = vzero();
  rows.restart();
  for (int64_t t = 0; t < len; ++t) {
    const T* v = rows.next(vh);
    for (int d = 0; d < DV; ++d) {
      const vf vv = load_row(v + d * kLanes);
      for (int g = 0; g < G; ++g)
        acc[g][d] = vfmadd(vset1(scores[g * len + t]), vv, acc[g][d]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int d = 0; d < DV; ++d)
      vstore(out + g * D + d * kLanes, vmul(acc[g][d], vset1(inv[g])));
}

#if defined(__AVX512BF16__)
// The same task over a BF16 cache in BF16 dot products (vdpbf16ps: two products a lane),
// with Q (times the scale) and the softmax's weights rounded to BF16 for them, as the prompt
// attention (paged_prefill.h) and flash attention on GPUs do; sums and the softmax stay
// float32. Q·K: a key row is DP vectors of 32 BF16 dims, multiplied as they lie by Q's own
// pairs of dims, so no key is widened or stored; four keys' sums are reduced together. P·V:
// two value rows are interleaved into pairs of keys per dim (unpacklo/hi, 16-bit words) and
// multiplied by the two keys' weights, so the sums hold dims in the unpack's order, put
// back in order once at the end. Why: the float32 task widened each K and V row and spent
// 4 FMAs a dim per key, and SmolLM2's 64-sequence decode attention ran at ~35 GB/s with its
// cache in L3, no faster than memory: it was a third of the step (Zen 4).
template <int DP, int G>
void decode_task_pairs(const float* q, const c10::BFloat16* kh_bf16, const c10::BFloat16* vh_bf16,
                       const int64_t* table, int64_t len, int64_t block_size,
                       int64_t block_stride, float scale, float* scores, float* out) {
  constexpr int64_t D = 32 * DP;
  const auto* kh = reinterpret_cast<const uint16_t*>(kh_bf16);
  const auto* vh = reinterpret_cast<const uint16_t*>(vh_bf16);
  __m512i qb[G][DP];
  for (int g = 0; g < G; ++g)
    for (int d = 0; d < DP; ++d) {
      alignas(64) uint16_t words[32];
      vstore_bf16(words, vmul(vload(q + g * D + d * 32), vset1(scale)));
      vstore_bf16(words + 16, vmul(vload(q + g * D + d * 32 + 16), vset1(scale)));
      qb[g][d] = _mm512_load_si512(words);
    }
  RowWalker<uint16_t> rows{kh, vh, table, block_stride, block_size, D, (len - 1) / block_size};
  for (int64_t t0 = 0; t0 < len; t0 += 4) {
    const int64_t n = std::min<int64_t>(4, len - t0);
    __m512i k[4][DP];
    for (int i = 0; i < 4; ++i) {
      const uint16_t* row = i < n ? rows.next(kh) : nullptr;
      for (int d = 0; d < DP; ++d)
        k[i][d] = row ? _mm512_loadu_si512(row + d * 32) : _mm512_setzero_si512();
    }
    for (int g = 0; g < G; ++g) {
      __m512 dot[4];
      for (int i = 0; i < 4; ++i) {
        dot[i] = _mm512_setzero_ps();
        for (int d = 0; d < DP; ++d)
          dot[i] = _mm512_dpbf16_ps(dot[i], (__m512bh)k[i][d], (__m512bh)qb[g][d]);
      }
      alignas(16) float four[4];
      _mm_store_ps(four, reduce4(dot[0], dot[1], dot[2], dot[3]));
      for (int64_t i = 0; i < n; ++i) scores[g * len + t0 + i] = four[i];
    }
  }
  // Each query's weights e^(score - max) in BF16, a zero after the last so that keys go in
  // pairs; the float32 sums divide the outputs at the end.
  thread_local std::vector<uint16_t> weights;
  const int64_t stride = len + 2;
  weights.resize(G * stride);
  float inv[G];
  for (int g = 0; g < G; ++g) {
    float* sg = scores + g * len;
    inv[g] = 1.f / exp_sum(sg, len, max_of(sg, len));
    uint16_t* wg = weights.data() + g * stride;
    int64_t t = 0;
    for (; t + kLanes <= len; t += kLanes) vstore_bf16(wg + t, vload(sg + t));
    for (; t < len; ++t) wg[t] = c10::BFloat16(sg[t]).x;
    wg[len] = 0;
  }
  __m512 acc[G][2 * DP];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  rows.restart();
  for (int64_t t = 0; t < len; t += 2) {
    const uint16_t* v0 = rows.next(vh);
    const uint16_t* v1 = t + 1 < len ? rows.next(vh) : nullptr;
    __m512i pair[2 * DP];
    for (int d = 0; d < DP; ++d) {
      const __m512i a = _mm512_loadu_si512(v0 + d * 32);
      const __m512i b = v1 ? _mm512_loadu_si512(v1 + d * 32) : _mm512_setzero_si512();
      pair[2 * d] = _mm512_unpacklo_epi16(a, b);
      pair[2 * d + 1] = _mm512_unpackhi_epi16(a, b);
    }
    for (int g = 0; g < G; ++g) {
      int32_t two;
      std::memcpy(&two, weights.data() + g * stride + t, 4);
      const __m512bh w = (__m512bh)_mm512_set1_epi32(two);
      for (int j = 0; j < 2 * DP; ++j) acc[g][j] = _mm512_dpbf16_ps(acc[g][j], (__m512bh)pair[j], w);
    }
  }
  // unpacklo's lane 4L + i holds dim 8L + i of its 32, unpackhi's dim 8L + 4 + i: output
  // vector h (dims 16h..16h + 15 of the 32) takes lanes 8h + 0..3 of lo, then 8h + 0..3 of
  // hi (index 16 + lane), then 8h + 4..7 of each.
  alignas(64) static const int32_t order[2][16] = {
      {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23},
      {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31}};
  for (int g = 0; g < G; ++g)
    for (int d = 0; d < DP; ++d)
      for (int h = 0; h < 2; ++h) {
        const __m512 v = _mm512_permutex2var_ps(acc[g][2 * d], _mm512_load_si512(order[h]),
                                                acc[g][2 * d + 1]);
        _mm512_storeu_ps(out + g * D + d * 32 + h * 16, _mm512_mul_ps(v, _mm512_set1_ps(inv[g])));
      }
}
#endif

using DecodeTask = void (*)(const float*, const void*, const void*, const int64_t*, int64_t,
                            int64_t, int64_t, float, float*, float*);

// Pairs: decode_task_pairs (a BF16 cache, AVX512-BF16), else decode_task.
template <typename T, int DV, int G, bool Pairs>
void decode_task_erased(const float* q, const void* k, const void* v, const int64_t* table,
                        int64_t len, int64_t block_size, int64_t block_stride, float scale,
                        float* scores, float* out) {
#if defined(__AVX512BF16__)
  if constexpr (Pairs) {
    decode_task_pairs<DV * kLanes / 32, G>(q, static_cast<const c10::BFloat16*>(k),
                                           static_cast<const c10::BFloat16*>(v), table, len,
                                           block_size, block_stride, scale, scores, out);
    return;
  }
#endif
  decode_task<T, DV, G>(q, static_cast<const T*>(k), static_cast<const T*>(v), table, len,
                        block_size, block_stride, scale, scores, out);
}

template <typename T, int DV, bool Pairs>
DecodeTask task_for_group(int64_t group) {
  switch (group) {
    case 1: return decode_task_erased<T, DV, 1, Pairs>;
    case 2: return decode_task_erased<T, DV, 2, Pairs>;
    case 3: return decode_task_erased<T, DV, 3, Pairs>;
    case 4: return decode_task_erased<T, DV, 4, Pairs>;
    case 5: return decode_task_erased<T, DV, 5, Pairs>;
    case 6: return decode_task_erased<T, DV, 6, Pairs>;
    case 7: return decode_task_erased<T, DV, 7, Pairs>;
    case 8: return decode_task_erased<T, DV, 8, Pairs>;
    default: return nullptr;
  }
}

// The register-tiled task for this shape, or nullptr (the generic loop serves it).
template <typename T>
DecodeTask fast_task(int64_t head_dim, int64_t group) {
  constexpr bool pairs = kHasBf16Pairs && std::is_same_v<T, c10::BFloat16>;
  if (head_dim == 64) return task_for_group<T, 64 / kLanes, pairs>(group);
  if (head_dim == 128) return task_for_group<T, 128 / kLanes, pairs>(group);
  return nullptr;
}
#else
constexpr int64_t kLanes = 1;

inline float exp_sum(float* x, int64_t n, float shift) {
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

template <typename T>
inline void dot_group(const float* q, const T* k, int64_t group, int64_t head_dim, float scale,
                      float* scores, int64_t stride) {
  for (int64_t g = 0; g < group; ++g) {
    float acc = 0.f;
    for (int64_t d = 0; d < head_dim; ++d) acc += q[g * head_dim + d] * static_cast<float>(k[d]);
    scores[g * stride] = acc * scale;
  }
}

template <typename T>
inline void axpy_group(const float* p, const T* v, int64_t group, int64_t head_dim, float* acc,
                       int64_t stride) {
  for (int64_t g = 0; g < group; ++g)
    for (int64_t d = 0; d < head_dim; ++d)
      acc[g * head_dim + d] += p[g * stride] * static_cast<float>(v[d]);
}

using DecodeTask = void (*)(const float*, const void*, const void*, const int64_t*, int64_t,
                            int64_t, int64_t, float, float*, float*);

template <typename T>
DecodeTask fast_task(int64_t, int64_t) { return nullptr; }
#endif

template <typename T>
inline void decode_kernel(const float* q, const T* k_cache, const T* v_cache, const int64_t* tables,
                   const int64_t* context_lens, float* out, int64_t num_seqs, int64_t num_heads,
                   int64_t num_kv_heads, int64_t num_blocks, int64_t block_size, int64_t head_dim,
                   int64_t max_blocks, float scale) {
  const int64_t group = num_heads / num_kv_heads;
  const int64_t head_stride = num_blocks * block_size * head_dim;  // per KV head in the pool
  const int64_t block_stride = block_size * head_dim;
  const DecodeTask fast = fast_task<T>(head_dim, group);
  // A task costs its sequence's length, and a step's lengths differ several times over
  // (prompts of 64-512 tokens): contiguous halves left one thread waiting on the other (a
  // third of the step's time in attention, an eighth of it threads spinning, SmolLM2 at 32
  // sequences, Zen 4). The threads instead take tasks one at a time, the longest first.
  std::vector<int64_t> order(num_seqs);
  for (int64_t s = 0; s < num_seqs; ++s) order[s] = s;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return context_lens[a] > context_lens[b]; });
  const int64_t tasks = num_seqs * num_kv_heads;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    std::vector<float> scores;
    std::vector<float> acc(group * head_dim);
    for (int64_t task; (task = next.fetch_add(1, std::memory_order_relaxed)) < tasks;) {
      const int64_t s = order[task / num_kv_heads], h = task % num_kv_heads;
      const int64_t len = context_lens[s];
      const int64_t* table = tables + s * max_blocks;
      const float* qs = q + (s * num_heads + h * group) * head_dim;
      const T* kh = k_cache + h * head_stride;
      const T* vh = v_cache + h * head_stride;
      scores.resize(group * len);
      if (fast != nullptr) {
        fast(qs, kh, vh, table, len, block_size, block_stride, scale, scores.data(),
             out + (s * num_heads + h * group) * head_dim);
        continue;
      }
      for (int64_t t0 = 0; t0 < len; t0 += block_size) {
        const T* kb = kh + table[t0 / block_size] * block_stride;
        const int64_t n = std::min(block_size, len - t0);
        for (int64_t i = 0; i < n; ++i)
          dot_group(qs, kb + i * head_dim, group, head_dim, scale, scores.data() + t0 + i, len);
      }
      for (int64_t g = 0; g < group; ++g) {
        float* sg = scores.data() + g * len;
        const float m = *std::max_element(sg, sg + len);
        const float inv = 1.f / exp_sum(sg, len, m);
        for (int64_t t = 0; t < len; ++t) sg[t] *= inv;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t0 = 0; t0 < len; t0 += block_size) {
        const T* vb = vh + table[t0 / block_size] * block_stride;
        const int64_t n = std::min(block_size, len - t0);
        for (int64_t i = 0; i < n; ++i)
          axpy_group(scores.data() + t0 + i, vb + i * head_dim, group, head_dim, acc.data(), len);
      }
      std::copy(acc.begin(), acc.end(), out + (s * num_heads + h * group) * head_dim);
    }
  });
}

}  // namespace edgefire::attention
