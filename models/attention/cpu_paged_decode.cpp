// The paged decode attention kernel (paged_decode.h) as a torch extension.
#include <torch/extension.h>

#include "paged_decode.h"

using edgefire::attention::decode_kernel;
using edgefire::attention::kLanes;

// q [seqs, heads, head_dim] float32; caches [kv_heads, blocks, block_size, head_dim];
// block_tables [seqs, max_blocks] int64; context_lens [seqs] int64 -> [seqs, heads, head_dim].
torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor block_tables, torch::Tensor context_lens, double scale) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && q.is_contiguous(), "q: contiguous float32");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt64 && block_tables.is_contiguous());
  TORCH_CHECK(context_lens.scalar_type() == torch::kInt64 && context_lens.is_contiguous());
  TORCH_CHECK(q.size(2) % kLanes == 0, "head_dim must be a multiple of the SIMD width");
  auto out = torch::empty_like(q);
  const int64_t seqs = q.size(0), heads = q.size(1), head_dim = q.size(2);
  const int64_t kv_heads = k_cache.size(0), blocks = k_cache.size(1), bs = k_cache.size(2);
  const int64_t max_blocks = block_tables.size(1);
  auto run = [&](auto* k, auto* v) {
    decode_kernel(q.data_ptr<float>(), k, v, block_tables.data_ptr<int64_t>(),
                  context_lens.data_ptr<int64_t>(), out.data_ptr<float>(), seqs, heads, kv_heads,
                  blocks, bs, head_dim, max_blocks, static_cast<float>(scale));
  };
  if (k_cache.scalar_type() == torch::kBFloat16) {
    run(k_cache.data_ptr<c10::BFloat16>(), v_cache.data_ptr<c10::BFloat16>());
  } else {
    TORCH_CHECK(k_cache.scalar_type() == torch::kFloat32, "caches: float32 or bfloat16");
    run(k_cache.data_ptr<float>(), v_cache.data_ptr<float>());
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode);
  // A BF16 cache's Q·K and P·V in BF16 dot products (Q and P rounded to BF16), else float32.
#if defined(EDGEFIRE_SIMD)
  m.attr("bf16_pairs") = edgefire::simd::kHasBf16Pairs;
#else
  m.attr("bf16_pairs") = false;
#endif
}
