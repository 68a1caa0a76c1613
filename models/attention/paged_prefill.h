// Causal prefill attention for CPU over the paged cache: one prompt chunk whose queries are the
// last n positions of its sequence's context, each attending to every key up to its own
// position. K/V are read from the block pool in place (no gather copy) and key tiles past a
// query block's last position are never read, where SDPA computes them and masks them out.
//
// Why: torch's CPU flash attention ran at 40-55 GFLOP/s on SmolLM2's prompt shapes (9 heads of
// 64, 64-512 tokens, Zen 4, 2 threads) and was a fifth of prefill time beside GEMMs at ~85% of
// the machine's peak; bench/attention.py times the two side by side.
//
// Each KV head's context is first laid out once for the call: a float32 cache widened to
// float32 tiles (K transposed per tile, so a row's scores for a tile are kWidth-wide FMAs with
// no horizontal sums); a BF16 cache, with AVX512-BF16, kept in BF16 as pairs (two dims of a
// key side by side for Q·K, two keys of a dim for P·V), so that one dot-product instruction
// does two FMAs' work: Q and the softmax's weights P are rounded to BF16 for them, as flash
// attention does on GPUs, sums stay float32. (Float32 FMAs ran these tiles at ~95 GFLOP/s on
// Zen 4's two cores, 16% of a 32-prompt prefill beside GEMMs at its BF16 peak.) One task is
// then a block of kQueries consecutive queries of one KV head with the `group` query heads
// sharing it, four rows at a time, with an online softmax (flash attention's running max and
// sum) over the key tiles.
// Shared by the attention extension (cpu_paged_prefill.cpp) and the fused step
// (models/fused/llama_decode.cpp), which runs prompt chunks too.
#pragma once

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../simd.h"

namespace edgefire::attention::prefill {


constexpr int64_t kQueries = 16;  // query positions per task

#if defined(EDGEFIRE_SIMD)
using namespace edgefire::simd;
// Four rows' scores for a tile (kRows x kVecs sums), its key vectors and a broadcast fit the
// registers: 32 with AVX-512, 16 with AVX2; so do the rows' kOut output vectors each.
constexpr int64_t kRows = 4;                // query rows computed together
constexpr int kVecs = kWidth == 16 ? 4 : 2;  // vectors of scores per row and key tile
constexpr int64_t kKeys = kVecs * kWidth;    // keys per tile: 64 (AVX-512), 16 (AVX2)
constexpr int kOut = kWidth == 16 ? 4 : 2;   // output vectors per row kept in registers

inline float first_lane(vf v) {
  alignas(64) float lanes[kWidth];
  vstore(lanes, v);
  return lanes[0];
}

// Keeps a loaded vector in a register: GCC otherwise folds the load into each of the four
// rows' FMAs, four loads where one does, and the loads become the limit.
template <typename V>
inline void in_register(V& v) { asm("" : "+v"(v)); }

// Key tile `tile` of one KV head, widened to float32 for every task that reads it: keys_t
// [D][kKeys] (transposed) and values [kKeys][D], zero past the context.
template <typename T>
inline void widen_tile(const T* kh, const T* vh, const int64_t* table, int64_t block_size,
                int64_t block_stride, int64_t context_len, int64_t tile, int64_t D,
                float* keys_t, float* values) {
  for (int64_t j = 0; j < kKeys; ++j) {
    const int64_t t = tile * kKeys + j;
    const int64_t at = t < context_len ? table[t / block_size] * block_stride + t % block_size * D
                                       : -1;
    for (int64_t d = 0; d < D; ++d) {
      keys_t[d * kKeys + j] = at >= 0 ? static_cast<float>(kh[at + d]) : 0.f;
      values[j * D + d] = at >= 0 ? static_cast<float>(vh[at + d]) : 0.f;
    }
  }
}

// The same tile of a BF16 cache as pairs for BF16 dot products: keys [D / 2][kKeys][2] (a
// key's dims 2p and 2p + 1 side by side) and values [kKeys / 2][D][2] (keys 2j and 2j + 1 of
// a dim side by side), zero past the context.
inline void pair_tile(const uint16_t* kh, const uint16_t* vh, const int64_t* table,
                      int64_t block_size, int64_t block_stride, int64_t context_len,
                      int64_t tile, int64_t D, uint16_t* keys, uint16_t* values) {
  for (int64_t j = 0; j < kKeys; ++j) {
    const int64_t t = tile * kKeys + j;
    const int64_t at = t < context_len ? table[t / block_size] * block_stride + t % block_size * D
                                       : -1;
    for (int64_t d = 0; d < D; ++d) {
      keys[(d / 2 * kKeys + j) * 2 + d % 2] = at >= 0 ? kh[at + d] : 0;
      values[(j / 2 * D + d) * 2 + j % 2] = at >= 0 ? vh[at + d] : 0;
    }
  }
}

// Each row's online softmax over a quad's scores for the key tile from t0, in place: weights
// [kRows][kKeys] turn from scores into e^(score - the row's running max), zero past the keys
// its position sees; correction[u] is what the row's earlier sums are to be multiplied by.
// Returns the quad's most valid keys.
inline int64_t softmax_tile(float (*weights)[kKeys], int64_t r0, int64_t rows, int64_t group,
                            int64_t first_pos, int64_t i0, int64_t t0, float* run_max,
                            float* run_sum, float* correction) {
  int64_t keys = 0;
  for (int64_t u = 0; u < kRows; ++u) {
    const int64_t r = r0 + u, pos = first_pos + i0 + r / group;
    const int64_t valid = r < rows ? std::clamp<int64_t>(pos - t0 + 1, 0, kKeys) : 0;
    float* w = weights[u];
    correction[u] = 1.f;
    if (valid == 0) {
      std::fill(w, w + kKeys, 0.f);
      continue;
    }
    keys = std::max(keys, valid);
    std::fill(w + valid, w + kKeys, -INFINITY);
    vf top = vload(w);
    for (int v = 1; v < kVecs; ++v) top = vmax(top, vload(w + v * kWidth));
    const float new_max = std::max(run_max[r], vhmax(top));
    // e^(old max - new max): 0 (2^-126) on the row's first tile, where its sums are 0.
    correction[u] = first_lane(vexp_shifted(vset1(run_max[r]), vset1(new_max)));
    for (int v = 0; v < kVecs; ++v)
      vstore(w + v * kWidth, vexp_shifted(vload(w + v * kWidth), vset1(new_max)));
    std::fill(w + valid, w + kKeys, 0.f);
    vf total = vzero();
    for (int v = 0; v < kVecs; ++v) total = vadd(total, vload(w + v * kWidth));
    run_sum[r] = run_sum[r] * correction[u] + vsum(total);
    run_max[r] = new_max;
  }
  return keys;
}

// One task: queries [i0, i1) of the chunk (positions first_pos + i) for the `group` query heads
// from head0, rows r = (i - i0) * group + g. q: [n, heads, D] float32. DV = D / kWidth.
// Pairs: keys and values as pair_tile lays them out (BF16 dot products), else as widen_tile
// does (float32 FMAs).
template <int DV, bool Pairs>
inline void prefill_task(const float* q, const void* keys_in, const void* values_in,
                         int64_t first_pos, int64_t i0, int64_t i1, int64_t heads,
                         int64_t head0, int64_t group, float scale, float* out) {
  constexpr int64_t D = kWidth * DV;
  using Stored = std::conditional_t<Pairs, uint16_t, float>;  // Q's and the tiles' values
  const Stored* keys = static_cast<const Stored*>(keys_in);
  const Stored* values = static_cast<const Stored*>(values_in);
  const int64_t rows = (i1 - i0) * group;
  std::vector<Stored> qs(rows * D);
  std::vector<float> acc(rows * D, 0.f), run_max(rows, -INFINITY), run_sum(rows);
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t g = 0; g < group; ++g) {
      const float* src = q + (i * heads + head0 + g) * D;
      Stored* dst = qs.data() + ((i - i0) * group + g) * D;
      for (int64_t d = 0; d < D; d += kWidth) {
        const vf x = vmul(vload(src + d), vset1(scale));
        if constexpr (Pairs) vstore_bf16(dst + d, x);
        else vstore(dst + d, x);
      }
    }
  const int64_t last_key = first_pos + i1 - 1;  // the block's last query sees keys up to here
  for (int64_t t0 = 0; t0 <= last_key; t0 += kKeys) {
    const Stored* kt = keys + t0 * D;  // this tile
    const Stored* vt = values + t0 * D;
    // Scores of kRows rows at a time: their FMA chains run side by side (one row alone waits
    // on each FMA's latency) and share each key load.
    for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
      vf s[kRows][kVecs];
      for (auto& row : s)
        for (auto& x : row) x = vzero();
      const Stored* qr[kRows];
      for (int64_t u = 0; u < kRows; ++u) qr[u] = qs.data() + std::min(r0 + u, rows - 1) * D;
      if constexpr (Pairs) {
#if defined(__AVX512BF16__)
        for (int64_t p = 0; p < D / 2; ++p) {
          __m512i k[kVecs];
          for (int v = 0; v < kVecs; ++v) {
            k[v] = _mm512_loadu_si512(kt + (p * kKeys + v * kWidth) * 2);
            in_register(k[v]);
          }
          for (int64_t u = 0; u < kRows; ++u) {
            int32_t pair;
            std::memcpy(&pair, qr[u] + 2 * p, 4);
            const __m512bh x = (__m512bh)_mm512_set1_epi32(pair);
            for (int v = 0; v < kVecs; ++v) s[u][v] = _mm512_dpbf16_ps(s[u][v], (__m512bh)k[v], x);
          }
        }
#endif
      } else {
        for (int64_t d = 0; d < D; ++d) {
          vf k[kVecs];
          for (int v = 0; v < kVecs; ++v) {
            k[v] = vload(kt + d * kKeys + v * kWidth);
            in_register(k[v]);
          }
          for (int64_t u = 0; u < kRows; ++u) {
            const vf x = vset1(qr[u][d]);
            for (int v = 0; v < kVecs; ++v) s[u][v] = vfmadd(x, k[v], s[u][v]);
          }
        }
      }
      // Stored once: indexed by a run-time row below, s would live in memory for the loop.
      alignas(64) float weights[kRows][kKeys];
      for (int64_t u = 0; u < kRows; ++u)
        for (int v = 0; v < kVecs; ++v) vstore(weights[u] + v * kWidth, s[u][v]);
      float correction[kRows];
      const int64_t keys_seen = softmax_tile(weights, r0, rows, group, first_pos, i0, t0,
                                             run_max.data(), run_sum.data(), correction);
      // The weights in BF16 for P·V's dot products, rounded once for every d0 below.
      alignas(64) uint16_t pairs[kRows][kKeys];
      if constexpr (Pairs)
        for (int64_t u = 0; u < kRows; ++u)
          for (int v = 0; v < kVecs; ++v)
            vstore_bf16(pairs[u] + v * kWidth, vload(weights[u] + v * kWidth));
      // The quad's weighted values, kOut vectors of each row's output at a time (4 x kOut
      // sums in registers), each value row loaded once for the four rows.
      for (int d0 = 0; d0 < DV; d0 += kOut) {
        vf o[kRows][kOut];
        for (int64_t u = 0; u < kRows; ++u)
          for (int d = 0; d < kOut; ++d)
            o[u][d] = r0 + u < rows ? vmul(vload(acc.data() + (r0 + u) * D + (d0 + d) * kWidth),
                                           vset1(correction[u]))
                                    : vzero();
        if constexpr (Pairs) {
#if defined(__AVX512BF16__)
          // Two keys at a time, their weights as BF16 pairs (a key past keys_seen weighs 0).
          for (int64_t j = 0; j < (keys_seen + 1) / 2; ++j) {
            __m512i vv[kOut];
            for (int d = 0; d < kOut; ++d) {
              vv[d] = _mm512_loadu_si512(vt + (j * D + (d0 + d) * kWidth) * 2);
              in_register(vv[d]);
            }
            for (int64_t u = 0; u < kRows; ++u) {
              int32_t pair;
              std::memcpy(&pair, pairs[u] + 2 * j, 4);
              const __m512bh w = (__m512bh)_mm512_set1_epi32(pair);
              for (int d = 0; d < kOut; ++d) o[u][d] = _mm512_dpbf16_ps(o[u][d], (__m512bh)vv[d], w);
            }
          }
#endif
        } else {
          for (int64_t j = 0; j < keys_seen; ++j) {
            vf vv[kOut];
            for (int d = 0; d < kOut; ++d) {
              vv[d] = vload(vt + j * D + (d0 + d) * kWidth);
              in_register(vv[d]);
            }
            for (int64_t u = 0; u < kRows; ++u) {
              const vf w = vset1(weights[u][j]);
              for (int d = 0; d < kOut; ++d) o[u][d] = vfmadd(w, vv[d], o[u][d]);
            }
          }
        }
        for (int64_t u = 0; u < kRows && r0 + u < rows; ++u)
          for (int d = 0; d < kOut; ++d)
            vstore(acc.data() + (r0 + u) * D + (d0 + d) * kWidth, o[u][d]);
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r / group, g = r % group;
    const vf inv = vset1(1.f / run_sum[r]);
    float* dst = out + (i * heads + head0 + g) * D;
    for (int d = 0; d < DV; ++d)
      vstore(dst + d * kWidth, vmul(vload(acc.data() + r * D + d * kWidth), inv));
  }
}

using Task = void (*)(const float*, const void*, const void*, int64_t, int64_t, int64_t,
                      int64_t, int64_t, int64_t, float, float*);

template <bool Pairs>
inline Task task_for(int64_t head_dim) {
  switch (head_dim) {
    case 64: return prefill_task<64 / kWidth, Pairs>;
    case 128: return prefill_task<128 / kWidth, Pairs>;
    default: return nullptr;
  }
}
#endif

// q [n, heads, head_dim] float32; caches [kv_heads, blocks, block_size, head_dim] (float32 or
// bfloat16); table [>= ceil(context_len / block_size)] int64. The queries are positions
// context_len - n .. context_len - 1. Returns [n, heads, head_dim] float32.
inline torch::Tensor paged_prefill(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                            torch::Tensor table, int64_t context_len, double scale) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && q.is_contiguous() && q.dim() == 3,
              "q: contiguous float32 [n, heads, head_dim]");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() == 4 &&
                  k_cache.sizes() == v_cache.sizes() &&
                  k_cache.scalar_type() == v_cache.scalar_type() && k_cache.size(3) == q.size(2),
              "caches: contiguous [kv_heads, blocks, block_size, head_dim], like q's head_dim");
  TORCH_CHECK(table.scalar_type() == torch::kInt64 && table.is_contiguous() && table.dim() == 1,
              "table: contiguous int64 [blocks]");
  const int64_t n = q.size(0), heads = q.size(1), head_dim = q.size(2);
  const int64_t kv_heads = k_cache.size(0), blocks = k_cache.size(1), bs = k_cache.size(2);
  TORCH_CHECK(heads % kv_heads == 0 && n <= context_len &&
                  table.numel() * bs >= context_len, "shapes: heads, context or table");
  const int64_t* pages = table.data_ptr<int64_t>();
  for (int64_t b = 0; b < (context_len + bs - 1) / bs; ++b)
    TORCH_CHECK(pages[b] >= 0 && pages[b] < blocks, "block table entry out of range");
  auto out = torch::empty_like(q);
#if defined(EDGEFIRE_SIMD)
  const bool pairs = kHasBf16Pairs && k_cache.scalar_type() == torch::kBFloat16;
  const Task task = pairs ? task_for<true>(head_dim) : task_for<false>(head_dim);
  TORCH_CHECK(task != nullptr, "head_dim: 64 or 128");
  const int64_t group = heads / kv_heads, first_pos = context_len - n;
  const int64_t query_blocks = (n + kQueries - 1) / kQueries;
  const int64_t tiles = (context_len + kKeys - 1) / kKeys, per_head = tiles * kKeys * head_dim;
  const int64_t head_stride = blocks * bs * head_dim;
  // Reused across calls (one per layer and prompt chunk): no page faults on a fresh buffer.
  // Worker threads see their own thread_locals: they get these pointers instead.
  thread_local std::vector<float> keys_store, values_store;
  thread_local std::vector<uint16_t> key_pairs_store, value_pairs_store;
  const void* keys;
  const void* values;
  auto each_tile = [&](auto lay_out) {
    at::parallel_for(0, kv_heads * tiles, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) lay_out(t / tiles, t % tiles);
    });
  };
  if (pairs) {
    key_pairs_store.resize(kv_heads * per_head);
    value_pairs_store.resize(kv_heads * per_head);
    uint16_t* const kp = key_pairs_store.data();
    uint16_t* const vp = value_pairs_store.data();
    const auto* k = reinterpret_cast<const uint16_t*>(k_cache.data_ptr<c10::BFloat16>());
    const auto* v = reinterpret_cast<const uint16_t*>(v_cache.data_ptr<c10::BFloat16>());
    each_tile([&](int64_t h, int64_t tile) {
      const int64_t at = h * per_head + tile * kKeys * head_dim;
      pair_tile(k + h * head_stride, v + h * head_stride, pages, bs, bs * head_dim, context_len,
                tile, head_dim, kp + at, vp + at);
    });
    keys = kp;
    values = vp;
  } else {
    keys_store.resize(kv_heads * per_head);
    values_store.resize(kv_heads * per_head);
    float* const kt = keys_store.data();
    float* const vt = values_store.data();
    auto widen_all = [&](const auto* k, const auto* v) {
      each_tile([&](int64_t h, int64_t tile) {
        const int64_t at = h * per_head + tile * kKeys * head_dim;
        widen_tile(k + h * head_stride, v + h * head_stride, pages, bs, bs * head_dim,
                   context_len, tile, head_dim, kt + at, vt + at);
      });
    };
    if (k_cache.scalar_type() == torch::kBFloat16) {
      widen_all(k_cache.data_ptr<c10::BFloat16>(), v_cache.data_ptr<c10::BFloat16>());
    } else {
      TORCH_CHECK(k_cache.scalar_type() == torch::kFloat32, "caches: float32 or bfloat16");
      widen_all(k_cache.data_ptr<float>(), v_cache.data_ptr<float>());
    }
    keys = kt;
    values = vt;
  }
  const int64_t elem = pairs ? sizeof(uint16_t) : sizeof(float);
  // Later query blocks read more keys: tasks alternate from both ends so that the threads'
  // contiguous shares cost about the same.
  at::parallel_for(0, kv_heads * query_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t h = t % kv_heads, rank = t / kv_heads;
      const int64_t b = rank % 2 ? query_blocks - 1 - rank / 2 : rank / 2;
      task(q.data_ptr<float>(), static_cast<const char*>(keys) + h * per_head * elem,
           static_cast<const char*>(values) + h * per_head * elem, first_pos, b * kQueries,
           std::min(n, (b + 1) * kQueries), heads, h * group, group, static_cast<float>(scale),
           out.data_ptr<float>());
    }
  });
#else
  TORCH_CHECK(false, "paged_prefill needs AVX2 or AVX-512");
#endif
  return out;
}

}  // namespace edgefire::attention::prefill
