// A whole Llama decode step in one native call: for a few sequences that each add one token,
// every layer's RMSNorm, QKV projection, rotary embedding, K/V write into the paged cache,
// paged attention, output projection, residual, RMSNorm, gate/up projection, SiLU * up and
// down projection, without returning to Python between them.
//
// Why: at one token a step's 30 layers are ~420 small torch operators, and their dispatch
// cost as much as the weight reads they surround (README, "Performance"). Here the neighbours
// of each matmul (norms, rotary, K/V write, activation, residual) are plain loops over a few
// rows, and the matmuls are gemv.h's. The residual stream is kept in float32 between
// layers; the projections' inputs are rounded to BF16, as the BF16 weights require.
#include <torch/extension.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../attention/paged_decode.h"
#include "../attention/paged_prefill.h"
#include "elementwise.h"
#include "gemm_packed.h"
#include "projection.h"

namespace {

namespace prefill = edgefire::attention::prefill;
using edgefire::fused::bf16;
using edgefire::fused::form_rows;
using edgefire::fused::Proj;
using edgefire::fused::projections;
using edgefire::fused::rms_norm;
using edgefire::fused::to_bf16;

// Rotate-half rotary embedding of one head in place (HF Llama's layout).
void rotate(float* x, const float* cos, const float* sin, int64_t dim) {
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cos[i] - b * sin[i];
    x[i + half] = b * cos[i + half] + a * sin[i + half];
  }
}

struct StepBuffers {
  std::vector<float> h, proj, q, attn, xf, xsum;
  std::vector<bf16> x, act;  // a projection's input; the MLP's SiLU(gate) * up
};

class LlamaDecode {
 public:
  // forms[p][layer]: projection p's (qkv, o, gate_up, down) weight in each layer, as Proj's
  // tensors.
  // embed: the embedding table as a Proj form (BF16, or a codec's row decoder).
  // packed[p][layer]: BF16 and INT8 weights as this build's packing lays them out
  // (Proj::set_packed: pairs for gemm_packed.h and gemm_packed_int8.h, panels for
  // gemm_panels.h; empty tensors where none), or no lists.
  LlamaDecode(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t hidden, int64_t inter,
              double eps, std::vector<pybind11::object> embed,
              std::vector<torch::Tensor> attn_norm, std::vector<torch::Tensor> mlp_norm,
              std::vector<std::vector<std::vector<pybind11::object>>> forms,
              torch::Tensor final_norm, torch::Tensor cos, torch::Tensor sin,
              std::vector<std::vector<torch::Tensor>> packed)
      : heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), eps_(static_cast<float>(eps)),
        hidden_(hidden), inter_(inter), embed_(embed, form_rows(embed), hidden, "embed"),
        attn_norm_(std::move(attn_norm)),
        mlp_norm_(std::move(mlp_norm)), final_norm_(final_norm), cos_(cos), sin_(sin) {
    const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
    TORCH_CHECK(hidden_ % edgefire::fused::kChunk == 0 && inter_ % edgefire::fused::kChunk == 0,
                "hidden and intermediate sizes must be multiples of 32");
    TORCH_CHECK(head_dim % edgefire::attention::kLanes == 0, "head_dim: a multiple of 16");
    TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "heads: a multiple of kv_heads");
    TORCH_CHECK(forms.size() == 4, "weights: qkv, o, gate_up, down");
    TORCH_CHECK(cos.scalar_type() == torch::kFloat32 && cos.is_contiguous() &&
                    cos.size(1) == head_dim && sin.sizes() == cos.sizes(),
                "rotary tables: contiguous float32 [positions, head_dim]");
    qkv_ = projections(forms[0], q + 2 * kv, hidden_, "qkv");
    o_ = projections(forms[1], hidden_, q, "o");
    gate_up_ = projections(forms[2], 2 * inter_, hidden_, "gate_up");
    down_ = projections(forms[3], hidden_, inter_, "down");
    const size_t layers = qkv_.size();
    TORCH_CHECK(layers > 0, "at least one layer");  // forward norms layer 0's input first
    TORCH_CHECK(o_.size() == layers && gate_up_.size() == layers && down_.size() == layers &&
                    attn_norm_.size() == layers && mlp_norm_.size() == layers,
                "one weight of each kind per layer");
    std::vector<Proj>* kinds[] = {&qkv_, &o_, &gate_up_, &down_};
    TORCH_CHECK(packed.empty() || packed.size() == 4,
                "packed: none, or qkv, o, gate_up, down");
    for (size_t p = 0; p < packed.size(); ++p) {
      TORCH_CHECK(packed[p].size() == layers, "packed: one weight per layer");
      for (size_t l = 0; l < layers; ++l) (*kinds[p])[l].set_packed(packed[p][l]);
    }
    for (size_t l = 0; l < layers; ++l)
      for (const auto* norm : {&attn_norm_[l], &mlp_norm_[l]})
        TORCH_CHECK(norm->scalar_type() == torch::kBFloat16 && norm->numel() == hidden_, "norm");
  }

  // ids, positions, slots [m] int64; kv_cache [layers, 2, kv_heads, blocks, block_size,
  // head_dim] bfloat16. The first d = tables.size(0) rows are decodes: tables [d, max_blocks]
  // int64, lens [d] int64 (the new token included). The rest are prompt chunks, one span each:
  // span_tokens[i] rows, ending its sequence's context of span_context[i] tokens, whose pages
  // are span_tables[i] (int64); their queries attend causally (paged_prefill.h).
  // Returns the final-normed hidden states [m, hidden] bfloat16.
  torch::Tensor forward(torch::Tensor ids, torch::Tensor positions, torch::Tensor slots,
                        torch::Tensor tables, torch::Tensor lens, torch::Tensor kv_cache,
                        std::vector<int64_t> span_tokens, std::vector<int64_t> span_context,
                        std::vector<torch::Tensor> span_tables) {
    const int64_t m = ids.numel(), layers = static_cast<int64_t>(qkv_.size());
    const int64_t decodes = tables.size(0);
    const int64_t hd = head_dim_, q_size = heads_ * hd, kv_size = kv_heads_ * hd;
    const int64_t qkv_size = q_size + 2 * kv_size;
    for (const auto* t : {&ids, &positions, &slots})
      TORCH_CHECK(t->scalar_type() == torch::kInt64 && t->is_contiguous() && t->numel() == m,
                  "ids, positions and slots: contiguous int64 [m]");
    TORCH_CHECK(tables.scalar_type() == torch::kInt64 && tables.is_contiguous() &&
                    tables.dim() == 2 && lens.scalar_type() == torch::kInt64 &&
                    lens.is_contiguous() && lens.numel() == decodes,
                "tables: int64 [decodes, max_blocks], lens: int64 [decodes]");
    TORCH_CHECK(span_context.size() == span_tokens.size() &&
                    span_tables.size() == span_tokens.size(),
                "spans: a context length and a block table for each");
    int64_t rows = decodes;
    for (size_t i = 0; i < span_tokens.size(); ++i) {
      TORCH_CHECK(span_tokens[i] > 0 && span_tokens[i] <= span_context[i], "span: tokens");
      rows += span_tokens[i];
    }
    TORCH_CHECK(rows == m, "decodes and spans: one row each of the step's tokens");
    TORCH_CHECK(kv_cache.scalar_type() == torch::kBFloat16 && kv_cache.is_contiguous() &&
                    kv_cache.dim() == 6 && kv_cache.size(0) == layers &&
                    kv_cache.size(2) == kv_heads_ && kv_cache.size(5) == hd,
                "kv_cache: contiguous bfloat16 [layers, 2, kv_heads, blocks, block_size, dim]");
    const int64_t* id = ids.data_ptr<int64_t>();
    const int64_t* pos = positions.data_ptr<int64_t>();
    const int64_t* slot = slots.data_ptr<int64_t>();
    const int64_t blocks = kv_cache.size(3), block_size = kv_cache.size(4);
    const int64_t head_stride = blocks * block_size * hd;  // one KV head's pages
    for (int64_t r = 0; r < m; ++r)
      TORCH_CHECK(id[r] >= 0 && id[r] < embed_.rows() && pos[r] >= 0 && pos[r] < cos_.size(0) &&
                      slot[r] >= 0 && slot[r] < blocks * block_size,
                  "token id, position or slot out of range");

    const int64_t h_size = hidden_;
    // The step's buffers stay with the calling thread (a node's one compute thread runs every
    // step): allocated per call, a prompt chunk's ~30 MB came as fresh pages the kernel zeroed
    // each time, 5% of a prefill (AVX2, 1,024-token chunks). Every row is written before read.
    // References, which the parallel loops' lambdas capture: a thread_local named inside one
    // would be the worker thread's own.
    thread_local StepBuffers buffers;
    std::vector<float> &h = buffers.h, &proj = buffers.proj, &q = buffers.q, &attn = buffers.attn,
        &xf = buffers.xf, &xsum = buffers.xsum;
    std::vector<bf16> &x = buffers.x, &act = buffers.act;
    const int64_t widest = std::max({h_size, inter_, q_size});
    for (auto [buffer, size] : {std::pair{&h, m * h_size},
                                {&proj, m * std::max({qkv_size, 2 * inter_, h_size})},
                                {&q, m * q_size}, {&attn, m * q_size}, {&xf, m * widest},
                                {&xsum, m * widest}})
      if (static_cast<int64_t>(buffer->size()) < size) buffer->resize(size);
    for (auto [buffer, size] : {std::pair{&x, m * std::max(h_size, q_size)}, {&act, m * inter_}})
      if (static_cast<int64_t>(buffer->size()) < size) buffer->resize(size);
    for (int64_t r = 0; r < m; ++r) embed_.row(id[r], h.data() + r * h_size);
    bf16* cache = kv_cache.data_ptr<bf16>();
    const float scale = 1.f / std::sqrt(static_cast<float>(hd));
    // The prompt chunks' queries and outputs: each span's rows of q and attn.
    std::vector<prefill::Span> spans;
    for (int64_t i = 0, row = decodes; i < static_cast<int64_t>(span_tokens.size());
         row += span_tokens[i++]) {
      prefill::check_pages(span_tables[i], span_context[i], block_size, blocks);
      spans.push_back({q.data() + row * q_size, attn.data() + row * q_size, span_tokens[i],
                       span_context[i], span_tables[i].data_ptr<int64_t>()});
    }

    auto out = torch::empty({m, h_size}, torch::kBFloat16);
    rms_norm(h.data(), attn_norm_[0].data_ptr<bf16>(), m, h_size, eps_, x.data());
    for (int64_t l = 0; l < layers; ++l) {
      bf16* k_cache = cache + (2 * l) * kv_heads_ * head_stride;
      bf16* v_cache = cache + (2 * l + 1) * kv_heads_ * head_stride;
      qkv_[l].apply_step(x, m, decodes, xf, xsum, proj.data());
      at::parallel_for(0, m, 1, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          float* row = proj.data() + r * qkv_size;
          const float* c = cos_.data_ptr<float>() + pos[r] * hd;
          const float* s = sin_.data_ptr<float>() + pos[r] * hd;
          for (int64_t head = 0; head < heads_ + kv_heads_; ++head) rotate(row + head * hd, c, s, hd);
          std::copy(row, row + q_size, q.data() + r * q_size);
          for (int64_t head = 0; head < kv_heads_; ++head) {
            to_bf16(row + q_size + head * hd, hd, k_cache + head * head_stride + slot[r] * hd);
            to_bf16(row + q_size + kv_size + head * hd, hd,
                    v_cache + head * head_stride + slot[r] * hd);
          }
        }
      });
      if (decodes)
        edgefire::attention::decode_kernel(
            q.data(), k_cache, v_cache, tables.data_ptr<int64_t>(), lens.data_ptr<int64_t>(),
            attn.data(), decodes, heads_, kv_heads_, blocks, block_size, hd, tables.size(1),
            scale);
      if (!spans.empty())
        prefill::prefill_spans(
            spans, {k_cache, v_cache, true, kv_heads_, blocks, block_size, hd}, heads_, scale);
      to_bf16(attn.data(), m * q_size, x.data());
      o_[l].apply_step(x, m, decodes, xf, xsum, proj.data());
      // Each residual add goes with the norm after it: the MLP's, the next layer's or the last.
      rms_norm(h.data(), mlp_norm_[l].data_ptr<bf16>(), m, h_size, eps_, x.data(), proj.data());
      gate_up_[l].apply_swiglu(x, m, decodes, xf, xsum, proj.data(), act.data());
      down_[l].apply_step(act, m, decodes, xf, xsum, proj.data());
      const bool last = l + 1 == layers;
      rms_norm(h.data(), (last ? final_norm_ : attn_norm_[l + 1]).data_ptr<bf16>(), m, h_size,
               eps_, last ? out.data_ptr<bf16>() : x.data(), proj.data());
    }
    return out;
  }

 private:
  int64_t heads_, kv_heads_, head_dim_;
  float eps_;
  int64_t hidden_, inter_;
  Proj embed_;
  std::vector<torch::Tensor> attn_norm_, mlp_norm_;
  std::vector<Proj> qkv_, o_, gate_up_, down_;
  torch::Tensor final_norm_, cos_, sin_;
};

// x [m, k] bfloat16 @ one weight in any of Proj's forms -> [m, n] float32: the LM head's
// logits, and each form's matmul alone for tests and bench/kernels.py; packed: the weight's
// packing (Proj::set_packed), if any.
torch::Tensor linear(torch::Tensor x, std::vector<pybind11::object> form,
                     std::optional<torch::Tensor> packed) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.is_contiguous() && x.dim() == 2,
              "x: contiguous bfloat16 [m, k]");
  const int64_t m = x.size(0), k = x.size(1), n = form_rows(form);
  TORCH_CHECK(n % edgefire::fused::kTileRows == 0 && k % edgefire::fused::kChunk == 0,
              "weight rows % 4 == 0, k % 32 == 0");
  Proj proj(form, n, k, "w");
  if (packed) proj.set_packed(*packed);
  std::vector<bf16> rows(x.data_ptr<bf16>(), x.data_ptr<bf16>() + m * k);
  std::vector<float> xf(m * k), xsum(m * k);
  auto out = torch::empty({m, n}, x.options().dtype(torch::kFloat32));
  proj.apply(rows, m, xf, xsum, out.data_ptr<float>());
  return out;
}

// x [m, k] bfloat16 @ each of several weights of one shape in turn, in one call, as the fused
// step runs its matmuls: the seconds the matmuls took, with no Python call between them
// (bench/kernels.py's read rate per shape beside the one-call-per-matmul rate). pairs: none,
// or each weight's packing (Proj::set_packed).
double time_linears(torch::Tensor x, std::vector<std::vector<pybind11::object>> forms,
                    std::vector<torch::Tensor> pairs) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.is_contiguous() && x.dim() == 2 &&
                  !forms.empty() && (pairs.empty() || pairs.size() == forms.size()),
              "x: contiguous bfloat16 [m, k]; one or more weights, pairs for none or each");
  const int64_t m = x.size(0), k = x.size(1), n = form_rows(forms[0]);
  TORCH_CHECK(n % edgefire::fused::kTileRows == 0 && k % edgefire::fused::kChunk == 0,
              "weight rows % 4 == 0, k % 32 == 0");
  std::vector<Proj> projs = projections(forms, n, k, "w");
  for (size_t i = 0; i < pairs.size(); ++i) projs[i].set_packed(pairs[i]);
  std::vector<bf16> rows(x.data_ptr<bf16>(), x.data_ptr<bf16>() + m * k);
  std::vector<float> xf(m * k), xsum(m * k), out(m * n);
  const auto start = std::chrono::steady_clock::now();
  for (const Proj& proj : projs) proj.apply(rows, m, xf, xsum, out.data());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// x [m, k] bfloat16 @ a weight packed by pack_bf16 ([n / 64, k / 2, 64, 2] bfloat16) -> [m, n]
// float32 (gemm_packed.h).
torch::Tensor linear_packed(torch::Tensor x, torch::Tensor packed) {
  TORCH_CHECK(edgefire::fused::kHasPacked, "packed BF16 weights need AVX512-BF16");
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.is_contiguous() && x.dim() == 2,
              "x: contiguous bfloat16 [m, k]");
  TORCH_CHECK(packed.scalar_type() == torch::kBFloat16 && packed.is_contiguous() &&
                  packed.dim() == 4 && packed.size(1) * 2 == x.size(1) &&
                  packed.size(2) == edgefire::fused::kPackedCols && packed.size(3) == 2,
              "packed: contiguous bfloat16 [n / 64, k / 2, 64, 2]");
  const int64_t m = x.size(0), k = x.size(1), n = packed.size(0) * packed.size(2);
  auto out = torch::empty({m, n}, x.options().dtype(torch::kFloat32));
  edgefire::fused::gemm_packed_bf16(edgefire::fused::bits(x), m, k,
                                    edgefire::fused::bits(packed), n, out.data_ptr<float>());
  return out;
}

// x [m, k] bfloat16 @ a weight packed by pack_panels ([n / 16, k, 16] bfloat16) -> [m, n]
// float32 (gemm_panels.h).
torch::Tensor linear_panels(torch::Tensor x, torch::Tensor panels) {
  TORCH_CHECK(edgefire::fused::kHasPanels, "BF16 panels are the AVX2 build's");
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.is_contiguous() && x.dim() == 2,
              "x: contiguous bfloat16 [m, k]");
  TORCH_CHECK(panels.scalar_type() == torch::kBFloat16 && panels.is_contiguous() &&
                  panels.dim() == 3 && panels.size(1) == x.size(1) &&
                  panels.size(2) == edgefire::fused::kPanelCols,
              "panels: contiguous bfloat16 [n / 16, k, 16]");
  const int64_t m = x.size(0), k = x.size(1), n = panels.size(0) * panels.size(2);
  auto out = torch::empty({m, n}, x.options().dtype(torch::kFloat32));
  edgefire::fused::gemm_panels_bf16(edgefire::fused::bits(x), m, k,
                                    edgefire::fused::bits(panels), n, out.data_ptr<float>());
  return out;
}

// x float32 -> bfloat16 as the step rounds its values (elementwise.h), for tests.
torch::Tensor round_bf16(torch::Tensor x) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.is_contiguous() &&
                  x.numel() % edgefire::attention::kLanes == 0,
              "x: contiguous float32, a multiple of the vector width");
  auto out = torch::empty(x.sizes(), x.options().dtype(torch::kBFloat16));
  to_bf16(x.data_ptr<float>(), x.numel(), out.data_ptr<bf16>());
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear", &linear, pybind11::arg("x"), pybind11::arg("form"),
        pybind11::arg("packed") = pybind11::none());
  m.def("round_bf16", &round_bf16);
  m.def("linear_packed", &linear_packed);
  m.def("linear_panels", &linear_panels);
  m.def("time_linears", &time_linears);
  m.attr("isa") = edgefire::fused::kIsa;
  m.attr("amx") = edgefire::fused::amx_usable();
  pybind11::class_<LlamaDecode>(m, "LlamaDecode")
      .def(pybind11::init<int64_t, int64_t, int64_t, int64_t, int64_t, double,
                          std::vector<pybind11::object>, std::vector<torch::Tensor>,
                          std::vector<torch::Tensor>,
                          std::vector<std::vector<std::vector<pybind11::object>>>, torch::Tensor,
                          torch::Tensor, torch::Tensor,
                          std::vector<std::vector<torch::Tensor>>>())
      .def("forward", &LlamaDecode::forward, pybind11::call_guard<pybind11::gil_scoped_release>());
}
