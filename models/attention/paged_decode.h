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
  // The key or value row of token t, walking the block table without a division per token.
  // Walking the keys, it asks for the key row kPrefetchBlocks blocks on and for this row's
  // value (read by the second pass) into L2: blocks lie anywhere in the pool, and without it
  // the task's time went to waiting on its K and V loads (64 sequences of 320 tokens, 30
  // layers, two threads, Xeon: blocks in random order 44.4 -> 36.1 ms, in order 28.3 -> 25.0).
  const int64_t last_block = (len - 1) / block_size;
  int64_t block = 0, offset = 0;
  auto next_row = [&](const T* base) {
    if (base == kh) {
      if (block + kPrefetchBlocks <= last_block)
        prefetch_lines(kh + table[block + kPrefetchBlocks] * block_stride + offset * D,
                       D * static_cast<int64_t>(sizeof(T)));
      prefetch_lines(vh + table[block] * block_stride + offset * D,
                     D * static_cast<int64_t>(sizeof(T)));
    }
    const T* row = base + table[block] * block_stride + offset * D;
    if (++offset == block_size) offset = 0, ++block;
    return row;
  };
  for (int64_t t0 = 0; t0 < len; t0 += kTile) {
    const int64_t n = std::min(kTile, len - t0);
    for (int64_t i = 0; i < kTile; ++i) {
      const T* row = i < n ? next_row(kh) : nullptr;
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
  block = 0, offset = 0;
  for (int64_t t = 0; t < len; ++t) {
    const T* v = next_row(vh);
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

using DecodeTask = void (*)(const float*, const void*, const void*, const int64_t*, int64_t,
                            int64_t, int64_t, float, float*, float*);

template <typename T, int DV, int G>
void decode_task_erased(const float* q, const void* k, const void* v, const int64_t* table,
                        int64_t len, int64_t block_size, int64_t block_stride, float scale,
                        float* scores, float* out) {
  decode_task<T, DV, G>(q, static_cast<const T*>(k), static_cast<const T*>(v), table, len,
                        block_size, block_stride, scale, scores, out);
}

template <typename T, int DV>
DecodeTask task_for_group(int64_t group) {
  switch (group) {
    case 1: return decode_task_erased<T, DV, 1>;
    case 2: return decode_task_erased<T, DV, 2>;
    case 3: return decode_task_erased<T, DV, 3>;
    case 4: return decode_task_erased<T, DV, 4>;
    case 5: return decode_task_erased<T, DV, 5>;
    case 6: return decode_task_erased<T, DV, 6>;
    case 7: return decode_task_erased<T, DV, 7>;
    case 8: return decode_task_erased<T, DV, 8>;
    default: return nullptr;
  }
}

// The register-tiled task for this shape, or nullptr (the generic loop serves it).
template <typename T>
DecodeTask fast_task(int64_t head_dim, int64_t group) {
  if (head_dim == 64) return task_for_group<T, 64 / kLanes>(group);
  if (head_dim == 128) return task_for_group<T, 128 / kLanes>(group);
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
