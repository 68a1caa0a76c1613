// One projection's weight as the fused decode step reads it: BF16, weight-only INT8 or INT4,
// or a codec's row decoder (row_decoder.h); and its matmul against a few rows of x.
#pragma once

#include <torch/extension.h>

#include <string>
#include <vector>

#include "elementwise.h"
#include "gemm_decoded_amx.h"
#include "gemm_packed.h"
#include "gemm_panels.h"
#include "gemv.h"
#include "gemv_int8.h"
#include "gemv_int4.h"
#include "row_decoder.h"

namespace edgefire::fused {

using bf16 = c10::BFloat16;

inline const uint16_t* bits(const torch::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.data_ptr<bf16>());
}

inline void check_weight(const torch::Tensor& w, int64_t rows, int64_t cols, const char* name) {
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16 && w.is_contiguous() && w.dim() == 2 &&
                  w.size(0) == rows && w.size(1) == cols,
              name, ": expected a contiguous bfloat16 [", rows, ", ", cols, "] weight");
}

// One projection's weight, in one of four forms: {BF16 [n, k]}; {INT8 [n, k], BF16 row scales
// [n]}; {INT4 in torch's CPU packing [n, k / 2], BF16 scales_zeros [k / group, n, 2], rows
// per packing block} (gemv_int4.h); or a codec's RowDecoder (row_decoder.h), from a PyCapsule. The fused step
// reads the tensors the model already holds: no copies.
struct Proj {
  torch::Tensor w, scales;
  torch::Tensor pairs;   // optional: a BF16 w packed for gemm_packed.h (AVX-512)
  torch::Tensor int8_pairs;  // optional: an INT8 w packed for gemm_packed_int8.h (AVX-512)
  torch::Tensor panels;  // optional: a BF16 w packed for gemm_panels.h (AVX2)
  int64_t group = 0, block = 0;  // INT4: columns per scale, rows per packing block
  const RowDecoder* decoder = nullptr;
  pybind11::object keep;  // the decoder's capsule

  Proj(const std::vector<pybind11::object>& form, int64_t rows, int64_t cols, const char* name) {
    TORCH_CHECK(!form.empty() && form.size() <= 3, name, ": one to three items per weight");
    if (pybind11::isinstance<pybind11::capsule>(form[0])) {
      const auto capsule = pybind11::reinterpret_borrow<pybind11::capsule>(form[0]);
      TORCH_CHECK(capsule.name() != nullptr &&
                      std::string(capsule.name()) == kRowDecoderCapsule,
                  name, ": a capsule must hold an edgefire.row_decoder");
      decoder = capsule.get_pointer<RowDecoder>();
      keep = form[0];
      TORCH_CHECK(decoder->rows == rows && decoder->cols == cols &&
                      cols % kChunk == 0,
                  name, ": the row decoder's shape does not match");
      return;
    }
    w = form[0].cast<torch::Tensor>();
    if (form.size() == 1) {
      check_weight(w, rows, cols, name);
      return;
    }
    TORCH_CHECK(form.size() == 2 || form.size() == 3, name,
                ": a quantized weight, its scales (and INT4's rows per packing block)");
    scales = form[1].cast<torch::Tensor>();
    TORCH_CHECK(w.is_contiguous() && scales.is_contiguous() &&
                    scales.scalar_type() == torch::kBFloat16, name, ": contiguous, BF16 scales");
    if (form.size() == 2) {
      TORCH_CHECK(w.scalar_type() == torch::kChar && w.dim() == 2 && w.size(0) == rows &&
                      w.size(1) == cols && scales.numel() == rows,
                  name, ": int8 [rows, cols], one scale per row");
      return;
    }
    block = form[2].cast<int64_t>();
    TORCH_CHECK((block == 32 || block == 64) && w.scalar_type() == torch::kByte &&
                    w.dim() == 2 && w.size(0) == rows && w.size(1) == cols / 2 &&
                    rows % block == 0 && scales.dim() == 3 && scales.size(1) == rows &&
                    scales.size(2) == 2 && cols % scales.size(0) == 0,
                name, ": int4 in torch's CPU packing [rows, cols / 2] in blocks of 32 or 64 rows, "
                      "with scales_zeros [groups, rows, 2]");
    group = cols / scales.size(0);
  }

  // out [m, n] = x [m, k] @ w^T; xf, xsum: room for x widened (and its int4 group sums) or,
  // for a row decoder, x's BF16 words in its column order.
  void apply(const std::vector<bf16>& x, int64_t m, std::vector<float>& xf,
             std::vector<float>& xsum, float* out) const {
    if (decoder != nullptr && decoded_amx_takes(*decoder, m)) {
      gemm_decoded_amx(*decoder, reinterpret_cast<const uint16_t*>(x.data()), m, out);
      return;
    }
    if (decoder != nullptr) {
      apply_decoded(x, m, reinterpret_cast<uint16_t*>(xf.data()), out);
      return;
    }
    const int64_t n = w.size(0), k = group ? w.size(1) * 2 : w.size(1);
    if (pairs.defined()) {
      gemm_packed_bf16(reinterpret_cast<const uint16_t*>(x.data()), m, k, bits(pairs), n, out);
    } else if (!scales.defined()) {
      gemv_bf16(reinterpret_cast<const uint16_t*>(x.data()), m, k, bits(w), n, out);
    } else if (group == 0) {
      gemv_int8(x.data(), m, k, w.data_ptr<int8_t>(), bits(scales), n, out, xf.data(),
                int8_pairs.defined() ? int8_pairs.data_ptr<int8_t>() : nullptr);
    } else {
      gemv_int4(x.data(), m, k, group, block, w.data_ptr<uint8_t>(), bits(scales), n, out,
                xf.data(), xsum.data());
    }
  }

  // A step's matmul: its first `decodes` rows through apply's kernels, the prompt rows after
  // them (if any) over the panels where w has them: a decode row's result is then the same
  // whether or not prompt chunks share its step.
  void apply_step(const std::vector<bf16>& x, int64_t m, int64_t decodes,
                  std::vector<float>& xf, std::vector<float>& xsum, float* out) const {
    if (!panels.defined() || decodes == m) return apply(x, m, xf, xsum, out);
    const int64_t n = w.size(0), k = w.size(1);
    if (decodes) apply(x, decodes, xf, xsum, out);
    gemm_panels_bf16(reinterpret_cast<const uint16_t*>(x.data()) + decodes * k, m - decodes, k,
                     bits(panels), n, out + decodes * n);
  }

  // A gate/up projection's step (w: gate's rows, then up's): out [m, n / 2] =
  // bf16(silu(gate) * up). Over BF16 pairs multiplied by this build's own tiles, in one pass
  // (gemm_packed_swiglu); else apply_step's matmul into gate_up [m, n] float32, then silu_mul.
  // Either way the same values.
  void apply_swiglu(const std::vector<bf16>& x, int64_t m, int64_t decodes,
                    std::vector<float>& xf, std::vector<float>& xsum, float* gate_up,
                    bf16* out) const {
    const int64_t n = rows();
    if (pairs.defined() && n / 2 % kPackedCols == 0 && !amx_usable())
      return gemm_packed_swiglu(reinterpret_cast<const uint16_t*>(x.data()), m, w.size(1),
                                bits(pairs), n, reinterpret_cast<uint16_t*>(out));
    apply_step(x, m, decodes, xf, xsum, gate_up);
    silu_mul(gate_up, m, n / 2, out);
  }

  // Each tile's four rows decoded once into a per-thread buffer, then multiplied as BF16.
  void apply_decoded(const std::vector<bf16>& x, int64_t m, uint16_t* xo, float* out) const {
    const int64_t n = decoder->rows, k = decoder->cols;
    const auto* words = reinterpret_cast<const uint16_t*>(x.data());
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < k; ++c) xo[r * k + c] = words[r * k + decoder->order[c]];
    over_tiles(m, n, [&](int64_t mb, int64_t m0, int64_t n0) {
      // A tile's row groups (m0 = 0, 4, 8) run in turn on one thread: decode at the first.
      thread_local std::vector<uint16_t> store;
      store.resize(kTileRows * k + 32);
      auto* rows = reinterpret_cast<uint16_t*>(
          (reinterpret_cast<uintptr_t>(store.data()) + 63) & ~uintptr_t{63});
      if (m0 == 0) decoder->decode(decoder->self, n0, kTileRows, rows);
      const uint16_t* xm = xo + m0 * k;
      float* o = out + m0 * n + n0;
      with_rows(mb, [&](auto count) { tile<count()>(xm, rows, k, 0, o, n); });
    });
  }

  // Row `row` of the weight (an embedding), in natural column order, widened to float32.
  void row(int64_t index, float* out) const {
    if (decoder == nullptr && !scales.defined()) {
      const bf16* table = w.data_ptr<bf16>() + index * w.size(1);
      for (int64_t c = 0; c < w.size(1); ++c) out[c] = static_cast<float>(table[c]);
      return;
    }
    if (decoder == nullptr) {
      TORCH_CHECK(group == 0, "an embedding table: BF16, INT8 rows or a row decoder");
      const int8_t* table = w.data_ptr<int8_t>() + index * w.size(1);
      const float scale = static_cast<float>(scales.data_ptr<bf16>()[index]);
      for (int64_t c = 0; c < w.size(1); ++c) out[c] = static_cast<float>(table[c]) * scale;
      return;
    }
    const int64_t k = decoder->cols;
    std::vector<uint16_t> store(k + 32);
    auto* words = reinterpret_cast<uint16_t*>(
        (reinterpret_cast<uintptr_t>(store.data()) + 63) & ~uintptr_t{63});
    decoder->decode(decoder->self, index, 1, words);
    for (int64_t c = 0; c < k; ++c)
      out[decoder->order[c]] = static_cast<float>(c10::BFloat16(words[c], c10::BFloat16::from_bits()));
  }

  // p: w as this build's packing lays it out (llama_decode.py): pairs (pack_pairs) with
  // AVX-512, of BF16 or INT8 weights, panels (pack_panels) on AVX2; or an empty tensor for none.
  void set_packed(const torch::Tensor& p) {
    if (p.numel() == 0) return;
    if (p.scalar_type() == torch::kChar) {
      TORCH_CHECK(kHasPackedInt8 && scales.defined() && group == 0 && p.is_contiguous() &&
                      p.dim() == 4 && p.size(0) * p.size(2) == w.size(0) &&
                      p.size(1) * 2 == w.size(1) && w.size(1) % kInt8Line == 0 &&
                      p.size(2) == kPackedCols && p.size(3) == 2,
                  "packed INT8 pairs: contiguous int8 [n / 64, k / 2, 64, 2] of an INT8 "
                  "weight, k % 64 == 0, on CPUs with AVX-512");
      int8_pairs = p;
      return;
    }
    TORCH_CHECK((kHasPacked || kHasPanels) && !scales.defined() && decoder == nullptr &&
                    w.defined() && p.scalar_type() == torch::kBFloat16 && p.is_contiguous(),
                "packed weights: contiguous bfloat16, for BF16 weights, on CPUs with AVX2");
    if (kHasPanels) {
      TORCH_CHECK(p.dim() == 3 && p.size(0) * kPanelCols == w.size(0) &&
                      p.size(1) == w.size(1) && p.size(2) == kPanelCols,
                  "packed panels: contiguous bfloat16 [n / 16, k, 16]");
      panels = p;
      return;
    }
    TORCH_CHECK(p.dim() == 4 && p.size(0) * p.size(2) == w.size(0) &&
                    p.size(1) * 2 == w.size(1) && p.size(2) == kPackedCols && p.size(3) == 2,
                "packed pairs: contiguous bfloat16 [n / 64, k / 2, 64, 2]");
    pairs = p;
  }

  int64_t rows() const { return decoder != nullptr ? decoder->rows : w.size(0); }
};

inline std::vector<Proj> projections(const std::vector<std::vector<pybind11::object>>& forms,
                              int64_t rows, int64_t cols, const char* name) {
  std::vector<Proj> out;
  for (const auto& form : forms) out.emplace_back(form, rows, cols, name);
  return out;
}

inline int64_t form_rows(const std::vector<pybind11::object>& form) {
  TORCH_CHECK(!form.empty(), "embed: a form");
  if (pybind11::isinstance<pybind11::capsule>(form[0]))
    return pybind11::reinterpret_borrow<pybind11::capsule>(form[0])
        .get_pointer<RowDecoder>()->rows;
  return form[0].cast<torch::Tensor>().size(0);
}

}  // namespace edgefire::fused
