// The causal prefill attention's pieces (paged_prefill.h runs them): a key tile of the paged
// cache laid out for the task's products, and the task, a block of kQueries consecutive
// queries of one KV head with the `group` query heads sharing it, over every key tile up to
// its last position.
//
// A BF16 cache, with AVX512-BF16, is kept in BF16 as pairs (two dims of a key side by side for
// Q·K, two keys of a dim for P·V), so that one dot-product instruction does two FMAs' work: Q
// and the softmax's weights P are rounded to BF16 for them, as flash attention does on GPUs,
// sums stay float32. (Float32 FMAs ran these tiles at ~95 GFLOP/s on Zen 4's two cores, 16% of
// a 32-prompt prefill beside GEMMs at its BF16 peak.) Otherwise the cache is widened to float32
// tiles, K transposed per tile, so that a row's scores for a tile are kWidth-wide FMAs with no
// horizontal sums. The task computes four rows at a time, with an online softmax (flash
// attention's running max and sum) over the key tiles.
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
// a dim side by side), zero past the context. Moved as 32-bit words (a key's pair of dims is
// one; two keys' values of a dim make one), with no per-value index arithmetic: an element
// at a time, this layout was a seventh of the kernel's time (Zen 4, 1,024-token prompts).
inline void pair_tile(const uint16_t* kh, const uint16_t* vh, const int64_t* table,
                      int64_t block_size, int64_t block_stride, int64_t context_len,
                      int64_t tile, int64_t D, uint16_t* keys, uint16_t* values) {
  static const uint16_t kZeros[256] = {};  // a key past the context (D <= 256)
  auto* key_words = reinterpret_cast<uint32_t*>(keys);
  auto* value_words = reinterpret_cast<uint32_t*>(values);
  const uint16_t* rows[2][2];  // [key of the pair][K, V]
  for (int64_t j = 0; j < kKeys; j += 2) {
    for (int64_t e = 0; e < 2; ++e) {
      const int64_t t = tile * kKeys + j + e;
      const int64_t at =
          t < context_len ? table[t / block_size] * block_stride + t % block_size * D : -1;
      rows[e][0] = at >= 0 ? kh + at : kZeros;
      rows[e][1] = at >= 0 ? vh + at : kZeros;
      uint32_t pair;
      for (int64_t p = 0; p < D / 2; ++p) {
        std::memcpy(&pair, rows[e][0] + 2 * p, 4);
        key_words[p * kKeys + j + e] = pair;
      }
    }
    uint32_t* out = value_words + j / 2 * D;
    for (int64_t d = 0; d < D; ++d)
      out[d] = rows[0][1][d] | static_cast<uint32_t>(rows[1][1][d]) << 16;
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
    // e^(old max - new max): 0 (2^-126) on the row's first tile, where its sums are 0; exactly
    // 1 (what vexp_shifted gives for a zero shift) where the max holds, as past the first few
    // tiles it mostly does.
    if (new_max != run_max[r])
      correction[u] = first_lane(vexp_shifted(vset1(run_max[r]), vset1(new_max)));
    vf total = vzero();
    if (valid == kKeys) {  // every key seen: the sum in the same pass, in the same order
      for (int v = 0; v < kVecs; ++v) {
        const vf e = vexp_shifted(vload(w + v * kWidth), vset1(new_max));
        vstore(w + v * kWidth, e);
        total = vadd(total, e);
      }
    } else {
      for (int v = 0; v < kVecs; ++v)
        vstore(w + v * kWidth, vexp_shifted(vload(w + v * kWidth), vset1(new_max)));
      std::fill(w + valid, w + kKeys, 0.f);
      for (int v = 0; v < kVecs; ++v) total = vadd(total, vload(w + v * kWidth));
    }
    run_sum[r] = run_sum[r] * correction[u] + vsum(total);
    run_max[r] = new_max;
  }
  return keys;
}

// The scores of kRows query rows (qr, scaled Q rows) for the first NV vectors of keys of the
// tile kt, into out's first NV * kWidth columns. Pairs (uint16_t): BF16 dot products over
// pair_tile's layout; float: FMAs over widen_tile's. The sums stay in registers (NV is a
// constant) and are stored once.
template <int NV, int64_t D, typename Stored>
inline void tile_scores(const Stored* kt, const Stored* const* qr, float (*out)[kKeys]) {
  vf s[kRows][NV];
  for (auto& row : s)
    for (auto& x : row) x = vzero();
  if constexpr (std::is_same_v<Stored, uint16_t>) {
#if defined(__AVX512BF16__)
    for (int64_t p = 0; p < D / 2; ++p) {
      __m512i k[NV];
      for (int v = 0; v < NV; ++v) {
        k[v] = _mm512_loadu_si512(kt + (p * kKeys + v * kWidth) * 2);
        in_register(k[v]);
      }
      for (int64_t u = 0; u < kRows; ++u) {
        int32_t pair;
        std::memcpy(&pair, qr[u] + 2 * p, 4);
        const __m512bh x = (__m512bh)_mm512_set1_epi32(pair);
        for (int v = 0; v < NV; ++v) s[u][v] = _mm512_dpbf16_ps(s[u][v], (__m512bh)k[v], x);
      }
    }
#endif
  } else {
    for (int64_t d = 0; d < D; ++d) {
      vf k[NV];
      for (int v = 0; v < NV; ++v) {
        k[v] = vload(kt + d * kKeys + v * kWidth);
        in_register(k[v]);
      }
      for (int64_t u = 0; u < kRows; ++u) {
        const vf x = vset1(qr[u][d]);
        for (int v = 0; v < NV; ++v) s[u][v] = vfmadd(x, k[v], s[u][v]);
      }
    }
  }
  for (int64_t u = 0; u < kRows; ++u)
    for (int v = 0; v < NV; ++v) vstore(out[u] + v * kWidth, s[u][v]);
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
      // On the tile the quad's last position ends in, only the vectors of keys it sees are
      // scored (the rest are masked by softmax_tile before they are read).
      const int64_t seen = std::clamp<int64_t>(
          first_pos + i0 + (std::min(r0 + kRows, rows) - 1) / group - t0 + 1, 0, kKeys);
      const Stored* qr[kRows];
      for (int64_t u = 0; u < kRows; ++u) qr[u] = qs.data() + std::min(r0 + u, rows - 1) * D;
      alignas(64) float weights[kRows][kKeys];
      switch ((seen + kWidth - 1) / kWidth) {
        case 0: break;  // no row sees this tile: softmax_tile zeroes their weights
        case 1: tile_scores<1, D>(kt, qr, weights); break;
        case 2: tile_scores<std::min(2, kVecs), D>(kt, qr, weights); break;
        case 3: tile_scores<std::min(3, kVecs), D>(kt, qr, weights); break;
        default: tile_scores<kVecs, D>(kt, qr, weights); break;
      }
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

}  // namespace edgefire::attention::prefill
