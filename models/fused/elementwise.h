// The fused decode step's work between its matmuls: RMSNorm (with the residual add before
// it), SiLU(gate) * up and the rounding of a projection's input to BF16, vectorized and split
// between the threads.
//
// Why: written as scalar loops on one thread they were a sixth of a 32-row step (AVX2, 2
// cores: SiLU's scalar exp alone 10%), while the matmuls beside them use every core. Each
// value (each row, for a norm) is computed the same way whatever the split and whatever else
// is in the step, so a row's result still never depends on the rows beside it.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "../simd.h"

namespace edgefire::fused {

// Elementwise loops split into pieces of at least this many values (a piece's cost must
// cover waking the other threads).
constexpr int64_t kGrain = 4096;

inline uint16_t* words(c10::BFloat16* p) { return reinterpret_cast<uint16_t*>(p); }

#if defined(EDGEFIRE_SIMD)
using namespace edgefire::simd;

// fn(i) for each vector's first index i over [0, n) (n % kWidth == 0), split between threads.
template <typename F>
inline void each_vector(int64_t n, F fn) {
  at::parallel_for(0, n / kWidth, kGrain / kWidth, [&](int64_t begin, int64_t end) {
    for (int64_t v = begin; v < end; ++v) fn(v * kWidth);
  });
}

// out = bf16(x / rms(x) * weight), per row of n (n % kWidth == 0), after x += d where d is
// given: the residual add in the norm's own pass over the row, as its first loop (one pass
// and one split between the threads where there were two; the same values).
inline void rms_norm(float* x, const c10::BFloat16* weight, int64_t rows, int64_t n, float eps,
                     c10::BFloat16* out, const float* d = nullptr) {
  const auto* w = reinterpret_cast<const uint16_t*>(weight);
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* xr = x + r * n;
      vf sq = vzero();
      for (int64_t i = 0; i < n; i += kWidth) {
        const vf v = d ? vadd(vload(xr + i), vload(d + r * n + i)) : vload(xr + i);
        if (d) vstore(xr + i, v);
        sq = vfmadd(v, v, sq);
      }
      const vf inv = vset1(1.f / std::sqrt(vsum(sq) / static_cast<float>(n) + eps));
      for (int64_t i = 0; i < n; i += kWidth)
        vstore_bf16(words(out + r * n + i), vmul(vmul(vload(xr + i), inv), vload_bf16(w + i)));
    }
  });
}

// silu(g) * up of one vector: silu_mul's and the gate/up matmul's own (gemm_packed.h), one
// expression so that either gives the same bits.
inline vf swiglu(vf g, vf u) { return vmul(vmul(g, vsigmoid(g)), u); }

// out[r] = bf16(silu(gate) * up) for rows of [gate | up], each `inter` wide (% kWidth == 0).
inline void silu_mul(const float* gate_up, int64_t rows, int64_t inter, c10::BFloat16* out) {
  each_vector(rows * inter, [&](int64_t i) {
    const int64_t r = i / inter, c = i % inter;
    const vf g = vload(gate_up + r * 2 * inter + c), u = vload(gate_up + r * 2 * inter + inter + c);
    vstore_bf16(words(out + i), swiglu(g, u));
  });
}

// out = bf16(x) over n values (n % kWidth == 0).
inline void to_bf16(const float* x, int64_t n, c10::BFloat16* out) {
  each_vector(n, [&](int64_t i) { vstore_bf16(words(out + i), vload(x + i)); });
}

#else
inline void rms_norm(float* x, const c10::BFloat16* weight, int64_t rows, int64_t n, float eps,
                     c10::BFloat16* out, const float* d = nullptr) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * n;
    float sq = 0.f;
    for (int64_t i = 0; i < n; ++i) {
      if (d) xr[i] += d[r * n + i];
      sq += xr[i] * xr[i];
    }
    const float inv = 1.f / std::sqrt(sq / static_cast<float>(n) + eps);
    for (int64_t i = 0; i < n; ++i) out[r * n + i] = xr[i] * inv * static_cast<float>(weight[i]);
  }
}

inline void silu_mul(const float* gate_up, int64_t rows, int64_t inter, c10::BFloat16* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < inter; ++c) {
      const float g = gate_up[r * 2 * inter + c], u = gate_up[r * 2 * inter + inter + c];
      out[r * inter + c] = g / (1.f + std::exp(-g)) * u;
    }
}

inline void to_bf16(const float* x, int64_t n, c10::BFloat16* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i];
}
#endif

}  // namespace edgefire::fused
