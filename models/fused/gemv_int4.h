// Decode-sized INT4 matmul over torch's own CPU packing (torch._convert_weight_to_int4pack_for_cpu,
// which the quant plugin keeps for prefill), so the fused step needs no copy of its own. In
// integers where AVX512-BW and VBMI are, or AVX2 without AVX-512 (gemv_int4_q16.h), else
// widened to float32.
//
// That packing takes output rows in blocks of B (64 where torch runs AVX-512, 32 on AVX2:
// plugins/quant/linear.py reads which) and, per block, per input column k, B / 2 bytes: byte
// d holds row d's value in its low nibble and row d + B / 2's in its high one. So a block is
// multiplied as an outer product, a column at a time: the rows' weights for column k widened
// to vectors, times x[k] broadcast, with no horizontal sums. Groups of `group` columns
// along k share a scale and a zero per row (torch's [groups, n, 2] BF16 `scales_zeros`, read
// as it is): w = (q - 8) * scale + zero, so a row's sum is
//   sum_g scale_g * (q . x)_g + (zero_g - 8 * scale_g) * sum_{k in g} x_k.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../simd.h"
#include "gemm_int4_amx.h"
#include "gemv.h"
#include "gemv_int4_q16.h"
#include "x_integers.h"

namespace edgefire::fused {

inline float bf16_bits_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, 4);
  return f;
}

#if defined(EDGEFIRE_SIMD)
using namespace edgefire::simd;
// x rows per pass: each column's nibbles are widened once for all of them, which is most of
// the work (a widened column costs more than its multiply-adds). Their sums live in registers
// beside the widened column: 2 x rows' 4 vectors each on AVX2 (16 registers), 4 rows' 2 each
// on AVX-512. Measured on AVX2 (2 cores, SmolLM2's qkv/gate_up/down streamed from memory):
// widened once per row, 4 rows (a verify step with 3 drafts) cost 2.6x one row, which ate most
// of what drafts gain on INT4; in pairs, 2, 4 and 8 rows run 1.4-1.5x faster than that. (The
// AVX-512 count is by register budget, compiled but not yet timed.)
constexpr int64_t kInt4Tokens = kWidth == 16 ? 4 : 2;
// Columns in flight, each into sums of its own (added at the group's end): one x row's V sums
// wait on each FMA's latency, column after column, and were the limit at one row (Xeon,
// weight hot in cache: 17-21 GB/s at one row, 20-27 with two sets; four rows within this
// machine's noise). AVX2 has no registers to spare for a second set.
constexpr int kInt4Chains = kWidth == 16 ? 2 : 1;

// The block of `block` rows starting at row r0 against MB rows of x (float32 [MB][k]) with
// xsum [MB][groups], 16 bytes of each column at a time: bytes [16h, 16h + 16) hold rows
// 16h.. (low nibbles) and block / 2 + 16h.. (high), V = 32 / kWidth vectors of sums. Each
// group's scaled sum is added into out, so a row's result is the same sequence of operations
// whatever MB is: a row does not depend on the rows beside it (speculative decoding relies on
// it).
template <int MB>
inline void block_int4(const float* x, const float* xsum, const uint8_t* w,
                       const uint16_t* scales_zeros, int64_t k, int64_t group, int64_t block,
                       int64_t n, int64_t r0, float* out, int64_t n_out) {
  constexpr int V = 32 / kWidth, S = V / 2;
  const int64_t groups = k / group, col_bytes = block / 2;
  const uint8_t* wb = w + r0 * k / 2;
  for (int64_t h = 0; h < col_bytes / 16; ++h) {
    auto row_of = [&](int r) { return (r < S ? 0 : col_bytes) + 16 * h + (r % S) * kWidth; };
    for (int j = 0; j < MB; ++j)
      for (int r = 0; r < V; ++r) vstore(out + j * n_out + r0 + row_of(r), vzero());
    for (int64_t g = 0; g < groups; ++g) {
      vf acc[kInt4Chains][MB][V];
      for (auto& chain : acc)
        for (auto& row : chain)
          for (auto& a : row) a = vzero();
      for (int64_t c0 = g * group; c0 < (g + 1) * group; c0 += kInt4Chains) {
        for (int p = 0; p < kInt4Chains; ++p) {
          const int64_t c = c0 + p;
          const uint8_t* col = wb + c * col_bytes + 16 * h;
          // The first pass over the block walks it in address order: it asks for the bytes
          // kInt4Ahead on, so the next blocks stream in while this one is multiplied.
          if (h == 0) _mm_prefetch(reinterpret_cast<const char*>(col) + kInt4Ahead, _MM_HINT_T1);
          vf q[V];
          for (int s = 0; s < S; ++s) vnibbles(col + s * kWidth, q[s], q[S + s]);
          for (int j = 0; j < MB; ++j) {
            const vf xv = vset1(x[j * k + c]);
            for (int r = 0; r < V; ++r) acc[p][j][r] = vfmadd(q[r], xv, acc[p][j][r]);
          }
        }
      }
      for (int p = 1; p < kInt4Chains; ++p)
        for (int j = 0; j < MB; ++j)
          for (int r = 0; r < V; ++r) acc[0][j][r] = vadd(acc[0][j][r], acc[p][j][r]);
      const uint16_t* sz = scales_zeros + (g * n + r0) * 2;
      for (int r = 0; r < V; ++r) {
        vf scale, zero;
        vload_bf16_pairs(sz + row_of(r) * 2, scale, zero);
        const vf offset = vsub(zero, vmul(vset1(8.f), scale));
        for (int j = 0; j < MB; ++j) {
          float* total = out + j * n_out + r0 + row_of(r);
          vstore(total, vfmadd(acc[0][j][r], scale,
                               vfmadd(offset, vset1(xsum[j * groups + g]), vload(total))));
        }
      }
    }
  }
}
#else
constexpr int64_t kInt4Tokens = 1;

template <int MB>
inline void block_int4(const float* x, const float* xsum, const uint8_t* w,
                       const uint16_t* scales_zeros, int64_t k, int64_t group, int64_t block,
                       int64_t n, int64_t r0, float* out, int64_t n_out) {
  const int64_t groups = k / group, col_bytes = block / 2;
  for (int j = 0; j < MB; ++j)
    for (int64_t i = 0; i < block; ++i) {
      const int64_t row = r0 + i;
      float total = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        float acc = 0.f;
        for (int64_t c = g * group; c < (g + 1) * group; ++c) {
          const uint8_t byte = w[r0 * k / 2 + c * col_bytes + i % col_bytes];
          acc += static_cast<float>(i < col_bytes ? byte & 15 : byte >> 4) * x[j * k + c];
        }
        const float scale = bf16_bits_to_float(scales_zeros[(g * n + row) * 2]);
        const float zero = bf16_bits_to_float(scales_zeros[(g * n + row) * 2 + 1]);
        total += acc * scale + (zero - 8.f * scale) * xsum[j * groups + g];
      }
      out[j * n_out + row] = total;
    }
}
#endif

// x [m, k] -> float32 xf [m, k] and xsum [m, k / group].
template <typename X>
inline void widen_with_group_sums(const X* x, int64_t m, int64_t k, int64_t group, float* xf,
                                  float* xsum) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t g = 0; g < k / group; ++g) {
      float total = 0.f;
      for (int64_t c = g * group; c < (g + 1) * group; ++c) {
        xf[r * k + c] = static_cast<float>(x[r * k + c]);
        total += xf[r * k + c];
      }
      xsum[r * (k / group) + g] = total;
    }
}

// x [m, k] BF16, w torch's packing of an [n, k] weight in blocks of `block` rows,
// scales_zeros [k / group, n, 2] BF16 bits, out [m, n] float32; n % block == 0; scratch and
// sums: room for m * k floats each. Blocks are split between the threads; x rows go
// kInt4Tokens at a time, a block's packed bytes staying in L1 for the next ones.
inline void gemv_int4(const c10::BFloat16* x, int64_t m, int64_t k, int64_t group,
                      int64_t block, const uint8_t* w, const uint16_t* scales_zeros, int64_t n,
                      float* out, float* scratch, float* sums) {
  const int64_t groups = k / group;
  auto over_blocks = [&](auto block_for) {
    at::parallel_for(0, n / block, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b)
        for (int64_t m0 = 0; m0 < m; m0 += kInt4Tokens)
          with_rows(std::min<int64_t>(kInt4Tokens, m - m0),
                    [&](auto rows) { block_for(rows, m0, b * block); });
    });
  };
#if defined(EDGEFIRE_INT4_INTEGERS)
  if (block == kInt4IntegerBlock && group % 2 == 0 && group <= 256 && k % 16 == 0) {
    // m * k words, then m scales: within m * k floats; each group's sum of x's integers
    auto* xq = reinterpret_cast<int16_t*>(scratch);
    float* xscale = scratch + (m * k + 1) / 2;
    quantize_rows(x, m, k, xq, xscale);
    for (int64_t r = 0; r < m * groups; ++r) {
      int32_t total = 0;  // at most 256 * 32767: exact as a float (below 2^24)
      for (int64_t c = r * group; c < (r + 1) * group; ++c) total += xq[c];
      sums[r] = static_cast<float>(total);
    }
#if defined(EDGEFIRE_INT4_AMX)
    if (m >= kInt4AmxFromRows && group % kInt4AmxCols == 0 && amx_int8_usable())
      return gemm_int4_amx(xq, xscale, sums, m, k, group, w, scales_zeros, n, out);
#endif
    over_blocks([&](auto rows, int64_t m0, int64_t r0) {
      block_int4_q16<rows()>(xq + m0 * k, xscale + m0, sums + m0 * groups, w, scales_zeros, k,
                             group, n, r0, out + m0 * n, n);
    });
    return;
  }
#endif
  widen_with_group_sums(x, m, k, group, scratch, sums);
  over_blocks([&](auto rows, int64_t m0, int64_t r0) {
    block_int4<rows()>(scratch + m0 * k, sums + m0 * groups, w, scales_zeros, k, group, block,
                       n, r0, out + m0 * n, n);
  });
}

}  // namespace edgefire::fused
