// The attention extension's prefill entry points: paged_prefill.h's kernel, for
// TorchPagedAttention (a chunk a call) and tests (chunks in one call).
#include <torch/extension.h>

#include "paged_prefill.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_prefill", &edgefire::attention::prefill::paged_prefill);
  // A step's chunks in one call, as the fused step runs them.
  m.def("paged_prefill_chunks", &edgefire::attention::prefill::paged_prefill_chunks,
        py::arg("qs"), py::arg("k_cache"), py::arg("v_cache"), py::arg("tables"),
        py::arg("contexts"), py::arg("scale"),
        py::arg("tile_bytes") = edgefire::attention::prefill::kTileBytes);
#if defined(EDGEFIRE_SIMD)
  m.attr("vectorized") = true;
  // A BF16 cache's Q·K and P·V in BF16 dot products (Q and P rounded to BF16), else float32.
  m.attr("bf16_pairs") = edgefire::simd::kHasBf16Pairs;
#else
  m.attr("vectorized") = false;  // SDPA serves prefill: a scalar loop would be slower
  m.attr("bf16_pairs") = false;
#endif
}
