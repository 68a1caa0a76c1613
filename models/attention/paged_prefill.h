// Causal prefill attention for CPU over the paged cache: prompt chunks whose queries are the
// last n positions of their sequences' contexts, each attending to every key up to its own
// position. K/V are read from the block pool in place (no gather copy) and key tiles past a
// query block's last position are never read, where SDPA computes them and masks them out.
//
// Why: torch's CPU flash attention ran at 40-55 GFLOP/s on SmolLM2's prompt shapes (9 heads of
// 64, 64-512 tokens, Zen 4, 2 threads) and was a fifth of prefill time beside GEMMs at ~85% of
// the machine's peak; bench/attention.py times the two side by side.
//
// A step's chunks are attended in two parallel regions, one that lays out each chunk's key
// tiles (prefill_task.h) and one that runs the tasks, whatever the number of chunks (per
// group of chunks whose tiles fit kTileBytes: one group in ordinary steps).
// Shared by the attention extension (cpu_paged_prefill.cpp), one chunk a call, and the fused
// step (models/fused/llama_decode.cpp), all of a step's chunks in one call per layer.
#pragma once

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "prefill_task.h"

namespace edgefire::attention::prefill {

// One prompt chunk: its n queries are positions context_len - n .. context_len - 1 of a
// sequence whose pages are table[0 .. ceil(context_len / block_size)); q and out are
// [n, heads, head_dim] float32.
struct Span {
  const float* q;
  float* out;
  int64_t n, context_len;
  const int64_t* table;
};

// One layer's paged cache: K and V [kv_heads, blocks, block_size, head_dim], BF16 (bf16) or
// float32 values.
struct Cache {
  const void* k;
  const void* v;
  bool bf16;
  int64_t kv_heads, blocks, block_size, head_dim;
};

// A chunk's block table must cover its context with pages of the pool.
inline void check_pages(const torch::Tensor& table, int64_t context_len, int64_t block_size,
                        int64_t blocks) {
  TORCH_CHECK(table.scalar_type() == torch::kInt64 && table.is_contiguous() && table.dim() == 1,
              "table: contiguous int64 [blocks]");
  TORCH_CHECK(table.numel() * block_size >= context_len, "block table shorter than the context");
  const int64_t* pages = table.data_ptr<int64_t>();
  for (int64_t b = 0; b < (context_len + block_size - 1) / block_size; ++b)
    TORCH_CHECK(pages[b] >= 0 && pages[b] < blocks, "block table entry out of range");
}

// A call's key tiles take 2 * kv_heads * head_dim values a key of context (K and V), for each
// chunk whatever it shares with the others: 32 chunks over one cached 4,000-token prefix lay
// out 94 MiB of SmolLM2's (3 KV heads of 64, BF16). A step's chunks are attended in groups
// whose tiles fit this many bytes, and no more is kept between calls, so a step's buffer is
// not the size of all its contexts.
inline constexpr int64_t kTileBytes = int64_t{16} << 20;

#if defined(EDGEFIRE_SIMD)
// Laid-out tiles kept on the calling thread between calls (one per layer and step): no page
// faults on a fresh buffer. Worker threads see their own thread_locals: they get pointers.
struct TileStore {
  std::vector<uint16_t> key_pairs, value_pairs;
  std::vector<float> keys, values;

  int64_t bytes() const {
    return static_cast<int64_t>((key_pairs.capacity() + value_pairs.capacity()) *
                                    sizeof(uint16_t) +
                                (keys.capacity() + values.capacity()) * sizeof(float));
  }
};

inline TileStore& tile_store() {
  thread_local TileStore store;
  return store;
}

// `buffer` holding `values` values: reserved first, since resize alone may double the
// capacity, past what the group needs and the budget.
template <typename T>
char* sized(std::vector<T>& buffer, size_t values) {
  buffer.reserve(values);
  buffer.resize(values);
  return reinterpret_cast<char*>(buffer.data());
}

// Values of K (and as many of V) a span's key tiles take for one KV head.
inline int64_t tile_values(const Span& span, int64_t head_dim) {
  return (span.context_len + kKeys - 1) / kKeys * kKeys * head_dim;
}

// spans[0 .. count)'s attention over one layer's cache, in two parallel regions.
inline void attend_group(const Span* spans, int64_t count, const Cache& cache, int64_t heads,
                         float scale, Task task, bool pairs) {
  const int64_t D = cache.head_dim, kv_heads = cache.kv_heads, group = heads / kv_heads;
  const int64_t bs = cache.block_size, head_stride = cache.blocks * bs * D;
  // Span s's tiles for KV head h start at base[s] + h * tiles[s] * kKeys * D values.
  std::vector<int64_t> base(count + 1, 0), tiles(count);
  struct Item {
    int64_t span, head, index;  // index: a key tile (layout) or a query block (tasks)
  };
  std::vector<Item> layout, tasks;
  for (int64_t s = 0; s < count; ++s) {
    tiles[s] = (spans[s].context_len + kKeys - 1) / kKeys;
    base[s + 1] = base[s] + kv_heads * tile_values(spans[s], D);
    for (int64_t h = 0; h < kv_heads; ++h) {
      for (int64_t t = 0; t < tiles[s]; ++t) layout.push_back({s, h, t});
      for (int64_t b = 0; b * kQueries < spans[s].n; ++b) tasks.push_back({s, h, b});
    }
  }
  TileStore& store = tile_store();
  const auto needed = static_cast<size_t>(base[count]);
  char* keys = pairs ? sized(store.key_pairs, needed) : sized(store.keys, needed);
  char* values = pairs ? sized(store.value_pairs, needed) : sized(store.values, needed);
  const int64_t elem = pairs ? sizeof(uint16_t) : sizeof(float);
  at::parallel_for(0, static_cast<int64_t>(layout.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const auto [s, h, t] = layout[i];
      const Span& span = spans[s];
      const int64_t at = (base[s] + (h * tiles[s] + t) * kKeys * D) * elem;
      const int64_t from = h * head_stride;
      if (pairs) {
        pair_tile(static_cast<const uint16_t*>(cache.k) + from,
                  static_cast<const uint16_t*>(cache.v) + from, span.table, bs, bs * D,
                  span.context_len, t, D, reinterpret_cast<uint16_t*>(keys + at),
                  reinterpret_cast<uint16_t*>(values + at));
      } else if (cache.bf16) {
        widen_tile(static_cast<const c10::BFloat16*>(cache.k) + from,
                   static_cast<const c10::BFloat16*>(cache.v) + from, span.table, bs, bs * D,
                   span.context_len, t, D, reinterpret_cast<float*>(keys + at),
                   reinterpret_cast<float*>(values + at));
      } else {
        widen_tile(static_cast<const float*>(cache.k) + from,
                   static_cast<const float*>(cache.v) + from, span.table, bs, bs * D,
                   span.context_len, t, D, reinterpret_cast<float*>(keys + at),
                   reinterpret_cast<float*>(values + at));
      }
    }
  });
  // A task's cost grows with the keys its last query sees, and a step's chunks differ in
  // length, so no fixed split of the tasks is even: the longest go first, each to whichever
  // thread is free. Which thread runs a task does not change its result.
  auto last = [&](const Item& item) {
    return std::min(spans[item.span].n, (item.index + 1) * kQueries);
  };
  auto cost = [&](const Item& item) {
    const Span& span = spans[item.span];
    return (span.context_len - span.n + last(item)) * (last(item) - item.index * kQueries);
  };
  std::stable_sort(tasks.begin(), tasks.end(),
                   [&](const Item& a, const Item& b) { return cost(a) > cost(b); });
  std::atomic<int64_t> next{0};
  const auto total = static_cast<int64_t>(tasks.size());
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), total), 1, [&](int64_t, int64_t) {
    for (int64_t i = next.fetch_add(1); i < total; i = next.fetch_add(1)) {
      const auto [s, h, b] = tasks[i];
      const Span& span = spans[s];
      const int64_t at = (base[s] + h * tiles[s] * kKeys * D) * elem;
      task(span.q, keys + at, values + at, span.context_len - span.n, b * kQueries,
           last(tasks[i]), heads, h * group, group, scale, span.out);
    }
  });
}

// Each span's attention over one layer's cache (spans' tables checked by check_pages), for
// `heads` query heads sharing the cache's KV heads in groups, into the spans' outputs; in
// groups of consecutive spans whose key tiles fit tile_bytes (a span alone may pass it).
inline void prefill_spans(const std::vector<Span>& spans, const Cache& cache, int64_t heads,
                          float scale, int64_t tile_bytes = kTileBytes) {
  const bool pairs = kHasBf16Pairs && cache.bf16;
  const Task task = pairs ? task_for<true>(cache.head_dim) : task_for<false>(cache.head_dim);
  TORCH_CHECK(task != nullptr, "head_dim: 64 or 128");
  const int64_t value_bytes = 2 * cache.kv_heads * (pairs ? sizeof(uint16_t) : sizeof(float));
  const auto count = static_cast<int64_t>(spans.size());
  int64_t first = 0, bytes = 0;
  for (int64_t s = 0; s < count; ++s) {
    const int64_t need = tile_values(spans[s], cache.head_dim) * value_bytes;
    if (s > first && bytes + need > tile_bytes) {
      attend_group(spans.data() + first, s - first, cache, heads, scale, task, pairs);
      first = s;
      bytes = 0;
    }
    bytes += need;
  }
  if (count > first)
    attend_group(spans.data() + first, count - first, cache, heads, scale, task, pairs);
  if (tile_store().bytes() > tile_bytes) tile_store() = TileStore{};
}
#else
inline void prefill_spans(const std::vector<Span>&, const Cache&, int64_t, float,
                          int64_t = kTileBytes) {
  TORCH_CHECK(false, "paged_prefill needs AVX2 or AVX-512");
}
#endif

// Chunks over one cache in one call: qs[i] [n_i, heads, head_dim] float32, the positions
// contexts[i] - n_i .. contexts[i] - 1 of a sequence with pages tables[i]
// [>= ceil(contexts[i] / block_size)] int64; caches [kv_heads, blocks, block_size, head_dim]
// (float32 or bfloat16); chunks in groups whose key tiles fit tile_bytes (prefill_spans).
// Returns each chunk's [n_i, heads, head_dim] float32.
inline std::vector<torch::Tensor> paged_prefill_chunks(std::vector<torch::Tensor> qs,
                                                       torch::Tensor k_cache,
                                                       torch::Tensor v_cache,
                                                       std::vector<torch::Tensor> tables,
                                                       std::vector<int64_t> contexts,
                                                       double scale, int64_t tile_bytes) {
  TORCH_CHECK(!qs.empty() && tables.size() == qs.size() && contexts.size() == qs.size(),
              "chunks: a block table and a context length for each");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() == 4 &&
                  k_cache.sizes() == v_cache.sizes() &&
                  k_cache.scalar_type() == v_cache.scalar_type(),
              "caches: contiguous [kv_heads, blocks, block_size, head_dim]");
  TORCH_CHECK(k_cache.scalar_type() == torch::kBFloat16 ||
                  k_cache.scalar_type() == torch::kFloat32, "caches: float32 or bfloat16");
  const Cache cache{k_cache.data_ptr(), v_cache.data_ptr(),
                    k_cache.scalar_type() == torch::kBFloat16, k_cache.size(0), k_cache.size(1),
                    k_cache.size(2), k_cache.size(3)};
  const int64_t heads = qs[0].dim() == 3 ? qs[0].size(1) : 0;
  TORCH_CHECK(heads > 0 && heads % cache.kv_heads == 0, "q: [n, heads, head_dim], heads a "
              "multiple of the cache's KV heads");
  std::vector<torch::Tensor> outs;
  std::vector<Span> spans;
  for (size_t i = 0; i < qs.size(); ++i) {
    const auto& q = qs[i];
    TORCH_CHECK(q.scalar_type() == torch::kFloat32 && q.is_contiguous() && q.dim() == 3 &&
                    q.size(1) == heads && q.size(2) == cache.head_dim,
                "q: contiguous float32 [n, heads, head_dim], like the cache's head_dim");
    TORCH_CHECK(q.size(0) <= contexts[i], "a chunk longer than its context");
    check_pages(tables[i], contexts[i], cache.block_size, cache.blocks);
    outs.push_back(torch::empty_like(q));
    spans.push_back({q.data_ptr<float>(), outs.back().data_ptr<float>(), q.size(0), contexts[i],
                     tables[i].data_ptr<int64_t>()});
  }
  prefill_spans(spans, cache, heads, static_cast<float>(scale), tile_bytes);
  return outs;
}

// One chunk: q [n, heads, head_dim] float32, positions context_len - n .. context_len - 1.
inline torch::Tensor paged_prefill(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                   torch::Tensor table, int64_t context_len, double scale) {
  return paged_prefill_chunks({q}, k_cache, v_cache, {table}, {context_len}, scale,
                              kTileBytes)[0];
}

}  // namespace edgefire::attention::prefill
