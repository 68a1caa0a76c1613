// Causal prefill attention for CPU over the paged cache: one prompt chunk whose queries are the
// last n positions of its sequence's context, each attending to every key up to its own
// position. K/V are read from the block pool in place (no gather copy) and key tiles past a
// query block's last position are never read, where SDPA computes them and masks them out.
//
// Why: torch's CPU flash attention ran at 40-55 GFLOP/s on SmolLM2's prompt shapes (9 heads of
// 64, 64-512 tokens, Zen 4, 2 threads) and was a fifth of prefill time beside GEMMs at ~85% of
// the machine's peak; bench/attention.py times the two side by side.
//
// Each KV head's context is first widened to float32 once for the call (K transposed per tile,
// so a row's scores for a tile are kWidth-wide FMAs with no horizontal sums). One task is then
// a block of kQueries consecutive queries of one KV head with the `group` query heads sharing
// it, four rows at a time, with an online softmax (flash attention's running max and sum) over
// the key tiles.
// Shared by the attention extension (cpu_paged_prefill.cpp) and the fused step
// (models/fused/llama_decode.cpp), which runs prompt chunks too.
#pragma once

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
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
inline void in_register(vf& v) { asm("" : "+v"(v)); }

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

// One task: queries [i0, i1) of the chunk (positions first_pos + i) for the `group` query heads
// from head0, rows r = (i - i0) * group + g. q: [n, heads, D] float32. DV = D / kWidth.
template <int DV>
inline void prefill_task(const float* q, const float* keys_t, const float* values, int64_t first_pos,
                  int64_t i0, int64_t i1, int64_t heads, int64_t head0, int64_t group,
                  float scale, float* out) {
  constexpr int64_t D = kWidth * DV;
  const int64_t rows = (i1 - i0) * group;
  std::vector<float> qs(rows * D), acc(rows * D, 0.f), run_max(rows, -INFINITY), run_sum(rows);
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t g = 0; g < group; ++g) {
      const float* src = q + (i * heads + head0 + g) * D;
      float* dst = qs.data() + ((i - i0) * group + g) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = src[d] * scale;
    }
  const int64_t last_key = first_pos + i1 - 1;  // the block's last query sees keys up to here
  for (int64_t t0 = 0; t0 <= last_key; t0 += kKeys) {
    const float* kt = keys_t + t0 * D;  // this tile, transposed
    const float* vt = values + t0 * D;
    // Scores of kRows rows at a time: their FMA chains run side by side (one row alone waits
    // on each FMA's latency) and share each key load.
    for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
      vf s[kRows][kVecs];
      for (auto& row : s)
        for (auto& x : row) x = vzero();
      const float* qr[kRows];
      for (int64_t u = 0; u < kRows; ++u) qr[u] = qs.data() + std::min(r0 + u, rows - 1) * D;
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
      // Stored once: indexed by a run-time row below, s would live in memory for the loop.
      // Each row's online softmax then turns its scores into weights in place; a row past the
      // tile (or past the rows) gets none and keeps its sums.
      alignas(64) float weights[kRows][kKeys];
      for (int64_t u = 0; u < kRows; ++u)
        for (int v = 0; v < kVecs; ++v) vstore(weights[u] + v * kWidth, s[u][v]);
      float correction[kRows];
      int64_t keys = 0;  // the quad's most valid keys
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
      // The quad's weighted values, kOut vectors of each row's output at a time (4 x kOut
      // sums in registers), each value row loaded once for the four rows.
      for (int d0 = 0; d0 < DV; d0 += kOut) {
        vf o[kRows][kOut];
        for (int64_t u = 0; u < kRows; ++u)
          for (int d = 0; d < kOut; ++d)
            o[u][d] = r0 + u < rows ? vmul(vload(acc.data() + (r0 + u) * D + (d0 + d) * kWidth),
                                           vset1(correction[u]))
                                    : vzero();
        for (int64_t j = 0; j < keys; ++j) {
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

using Task = void (*)(const float*, const float*, const float*, int64_t, int64_t, int64_t,
                      int64_t, int64_t, int64_t, float, float*);

inline Task task_for(int64_t head_dim) {
  switch (head_dim) {
    case 64: return prefill_task<64 / kWidth>;
    case 128: return prefill_task<128 / kWidth>;
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
  const Task task = task_for(head_dim);
  TORCH_CHECK(task != nullptr, "head_dim: 64 or 128");
  const int64_t group = heads / kv_heads, first_pos = context_len - n;
  const int64_t query_blocks = (n + kQueries - 1) / kQueries;
  const int64_t tiles = (context_len + kKeys - 1) / kKeys, per_head = tiles * kKeys * head_dim;
  // Reused across calls (one per layer and prompt chunk): no page faults on a fresh buffer.
  // Worker threads see their own thread_locals: they get these pointers instead.
  thread_local std::vector<float> keys_store, values_store;
  keys_store.resize(kv_heads * per_head);
  values_store.resize(kv_heads * per_head);
  float* const keys_t = keys_store.data();
  float* const values = values_store.data();
  auto widen_all = [&](const auto* k, const auto* v) {
    const int64_t head_stride = blocks * bs * head_dim;
    at::parallel_for(0, kv_heads * tiles, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t h = t / tiles, tile = t % tiles;
        widen_tile(k + h * head_stride, v + h * head_stride, pages, bs, bs * head_dim,
                   context_len, tile, head_dim, keys_t + h * per_head + tile * kKeys * head_dim,
                   values + h * per_head + tile * kKeys * head_dim);
      }
    });
  };
  if (k_cache.scalar_type() == torch::kBFloat16) {
    widen_all(k_cache.data_ptr<c10::BFloat16>(), v_cache.data_ptr<c10::BFloat16>());
  } else {
    TORCH_CHECK(k_cache.scalar_type() == torch::kFloat32, "caches: float32 or bfloat16");
    widen_all(k_cache.data_ptr<float>(), v_cache.data_ptr<float>());
  }
  // Later query blocks read more keys: tasks alternate from both ends so that the threads'
  // contiguous shares cost about the same.
  at::parallel_for(0, kv_heads * query_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t h = t % kv_heads, rank = t / kv_heads;
      const int64_t b = rank % 2 ? query_blocks - 1 - rank / 2 : rank / 2;
      task(q.data_ptr<float>(), keys_t + h * per_head, values + h * per_head,
           first_pos, b * kQueries, std::min(n, (b + 1) * kQueries), heads, h * group, group,
           static_cast<float>(scale), out.data_ptr<float>());
    }
  });
#else
  TORCH_CHECK(false, "paged_prefill needs AVX2 or AVX-512");
#endif
  return out;
}

}  // namespace edgefire::attention::prefill
