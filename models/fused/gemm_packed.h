// BF16 matmul over a weight packed for AVX512-BF16 dot products (without them, on AVX-512
// alone, its pairs widened to float32: packed_tile below): out[m, n] = x[m, k] @ w^T for any
// number of rows of x, float32 accumulated and out.
//
// Why a packed weight: the dot-product kernels in gemv.h hold a vector of partial sums along
// K per (weight row, x row) and reduce it at the end; each of their dot products needs a
// weight load and an x load, so past a few rows of x they wait on loads (Zen 4, 2 cores:
// ~200 GFLOP/s at 16-64 rows, 44% of the ~450 its dot-product units reach). Here the weight
// lies as pairs of K values side by side across 64 output columns, so one dot-product
// instruction multiplies 16 columns' pair by one x pair broadcast from memory: a 6-row x
// 64-column tile keeps 24 sums in registers for 4 weight loads and 6 broadcasts.
//
// Each output is one chain of dot products over K's pairs in order, whatever the rows of x,
// the tile or the thread computing it: a row's result does not depend on what shares its
// step (speculative decoding relies on it), from one row to thousands.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "elementwise.h"
#include "gemm_amx.h"
#include "gemv.h"

namespace edgefire::fused {

constexpr int64_t kPackedCols = 64;  // output columns per packed block: four vectors of 16
// x rows per tile: 24 sums + 4 weight vectors in registers (without BF16 dot products, 5: see
// its packed_tile)
#if defined(__AVX512BF16__)
constexpr int64_t kPackedRows = 6;
#else
constexpr int64_t kPackedRows = 5;
#endif
constexpr int64_t kLinesPerPair = 4;  // a block's pair of K: 64 columns x 2 BF16 = 4 lines

#if defined(__AVX512BF16__) || defined(__AVX512F__)
constexpr bool kHasPacked = true;

// Rows [0, MR) of x against one packed block [k / 2][64][2]: out[r, 0..64). Each pair of K
// also asks for `lines` cache lines of what follows the block (the next block: blocks lie
// one after another) into L2, from `ahead` on: the tiles over a block together fetch the next
// one while they compute, so the first tile over it does not wait on memory.
//
// Without BF16 dot products (AVX-512F, e.g. Ice Lake): x is widened to float32 once per call,
// and each weight vector's pairs are split into its first and second values as float32 (a
// shift and a mask: BF16 is a float32's top half), each multiplied into x's value broadcast
// from memory by one FMA. A 5-row tile keeps 20 sums and a pair's 8 split weight vectors in
// registers (6 rows would spill: 24 + 8 + the broadcasts pass 32), and spends those 8 splits
// on 40 FMAs, where the row-major tiles (gemv.h) widen a weight and an x vector for every 4.
// Each output is one chain of FMAs over K in order (first, then second value of each pair),
// so a row's result does not depend on what shares its step, as with the dot products.
#if defined(__AVX512BF16__)
using PackedX = uint16_t;  // x as BF16 bits: its pairs are the dot products' other operand
#else
using PackedX = float;
#endif

template <int MR>
inline void packed_tile(const PackedX* x, int64_t ldx, const uint16_t* block, int64_t pairs,
                        float* out, int64_t ldo, const char* ahead, int64_t lines) {
  __m512 acc[MR][4];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const uint16_t* wp = block + p * kPackedCols * 2;
    for (int64_t line = 0; line < lines; ++line)
      _mm_prefetch(ahead + (p * lines + line) * 64, _MM_HINT_T1);
#if defined(__AVX512BF16__)
    __m512bh w[4];
    for (int j = 0; j < 4; ++j) w[j] = (__m512bh)_mm512_loadu_si512(wp + j * 32);
    for (int r = 0; r < MR; ++r) {
      int32_t pair;
      __builtin_memcpy(&pair, x + r * ldx + 2 * p, 4);
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], w[j], xb);
    }
#else
    __m512 first[4], second[4];
    for (int j = 0; j < 4; ++j) simd::vload_bf16_pairs(wp + j * 32, first[j], second[j]);
    for (int r = 0; r < MR; ++r) {
      const __m512 x0 = _mm512_set1_ps(x[r * ldx + 2 * p]);
      const __m512 x1 = _mm512_set1_ps(x[r * ldx + 2 * p + 1]);
      for (int j = 0; j < 4; ++j)
        acc[r][j] = _mm512_fmadd_ps(second[j], x1, _mm512_fmadd_ps(first[j], x0, acc[r][j]));
    }
#endif
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(out + r * ldo + j * 16, acc[r][j]);
}

inline void packed_rows(int64_t mr, const PackedX* x, int64_t ldx, const uint16_t* block,
                        int64_t pairs, float* out, int64_t ldo, const char* ahead,
                        int64_t lines) {
  switch (mr) {
#if defined(__AVX512BF16__)
    case 6: packed_tile<6>(x, ldx, block, pairs, out, ldo, ahead, lines); break;
#endif
    case 5: packed_tile<5>(x, ldx, block, pairs, out, ldo, ahead, lines); break;
    case 4: packed_tile<4>(x, ldx, block, pairs, out, ldo, ahead, lines); break;
    case 3: packed_tile<3>(x, ldx, block, pairs, out, ldo, ahead, lines); break;
    case 2: packed_tile<2>(x, ldx, block, pairs, out, ldo, ahead, lines); break;
    default: packed_tile<1>(x, ldx, block, pairs, out, ldo, ahead, lines); break;
  }
}

// Runs tiles(mr, r, b, block, ahead, lines) over a packed weight's n / 64 blocks (each
// block_bytes long, `pairs` pairs of K) and m rows of x, in tiles of at most kPackedRows rows
// starting at row r: the threads split the blocks and, with many rows, the rows too. A work
// item's rows go in tiles of as even a size as kPackedRows allow (32 rows in tiles of six:
// 6 x 5 + 2 x 1 would leave two-row tiles, which wait on their weight loads; 4 x 5 + 2 x 6
// does not). `ahead` is where the tile's prefetches start and `lines` how many cache lines
// past it each pair of K asks for (packed_tile).
template <typename Tiles>
inline void over_packed_tiles(int64_t m, int64_t n, int64_t pairs, const char* packed,
                              int64_t block_bytes, int64_t lines_per_pair, Tiles tiles) {
  const int64_t blocks = n / kPackedCols;
  // Rows per work item: all of them up to 8 tiles' worth (48; 40 with 5-row tiles: a block's
  // weight stays in L2 between tiles), else chunks of at most that, so prompt-sized steps
  // spread over the threads however few blocks.
  constexpr int64_t kChunkRows = 8 * kPackedRows;
  int64_t chunks = (m + kChunkRows - 1) / kChunkRows;
  // Fewer blocks than make an even share each (SmolLM2's o and down: 9, qkv: 15, on two
  // threads): with rows enough for two tiles a thread, rows are split too, so that every
  // thread gets as many items; the block's weight is then read by each (the second time
  // from the shared L3).
  const int64_t threads = at::get_num_threads();
  if (blocks % threads && m >= threads * kPackedRows) chunks = std::max(chunks, threads);
  const int64_t chunk_rows = (m + chunks - 1) / chunks;
  at::parallel_for(0, blocks * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / chunks, r0 = (item % chunks) * chunk_rows;
      const int64_t rows = std::min(m, r0 + chunk_rows) - r0;
      if (rows <= 0) continue;
      const int64_t count = (rows + kPackedRows - 1) / kPackedRows;
      const int64_t lines = (lines_per_pair + count - 1) / count;
      const char* block = packed + b * block_bytes;
      // One tile streams its block from memory: it asks for what it reads kStreamAhead BF16
      // values' bytes on (gemv.h); several fetch the next block between them.
      const char* next = count == 1 ? block + kStreamAhead * 2 : block + block_bytes;
      for (int64_t t = 0, r = r0; t < count; ++t) {
        const int64_t mr = rows / count + (t < rows % count);
        tiles(mr, r, b, block, next + t * pairs * lines * 64, lines);
        r += mr;
      }
    }
  });
}

// x [m, k] BF16 bits as packed_tile reads it: as they are for BF16 dot products, else widened
// to float32 once (into a buffer of the calling thread's, valid until its next call).
inline const PackedX* packed_x(const uint16_t* x, int64_t m, int64_t k) {
#if defined(__AVX512BF16__)
  return x;
#else
  thread_local std::vector<float> widened;  // grows to the largest step's
  widened.resize(m * k);
  for (int64_t i = 0; i < m * k; i += simd::kWidth)
    simd::vstore(widened.data() + i, simd::vload_bf16(x + i));
  return widened.data();
#endif
}

// x [m, k] BF16 bits, packed: [n / 64][k / 2][64][2] BF16 bits (pack_pairs in
// llama_decode.py), out [m, n] float32.
inline void gemm_packed_bf16(const uint16_t* x, int64_t m, int64_t k, const uint16_t* packed,
                             int64_t n, float* out) {
  if (k % 32 == 0 && amx_usable()) return gemm_packed_amx(x, m, k, packed, n, out);
  const PackedX* xs = packed_x(x, m, k);
  const int64_t pairs = k / 2;
  over_packed_tiles(m, n, pairs, reinterpret_cast<const char*>(packed), pairs * kPackedCols * 4,
                    kLinesPerPair,
                    [&](int64_t mr, int64_t r, int64_t b, const char* block, const char* ahead,
                        int64_t lines) {
                      packed_rows(mr, xs + r * k, k, reinterpret_cast<const uint16_t*>(block),
                                  pairs, out + r * n + b * kPackedCols, n, ahead, lines);
                    });
}

// The MLP's gate/up matmul with SiLU(gate) * up applied to each tile as it comes out: out
// [m, n / 2] BF16 bits = bf16(silu(x @ gate^T) * (x @ up^T)), where gate is the packed
// weight's first n / 2 columns and up the rest (n / 2 % 64 == 0). Each item multiplies a
// block of gate's and the block of up's 64 columns against the same rows, into tiles on the
// stack, and rounds their product (silu_mul's expression, `swiglu`). Why: as a matmul then
// silu_mul, a 1,024-token prompt chunk's gate/up product (3,072 float32 columns a row, 12.6
// MB) went to memory and back for a pass of its own, with a wait between the two on each
// thread. Each value is the same as the two steps' (the same chains over K, the same rounding).
inline void gemm_packed_swiglu(const uint16_t* x, int64_t m, int64_t k, const uint16_t* packed,
                               int64_t n, uint16_t* out) {
  const PackedX* xs = packed_x(x, m, k);
  const int64_t pairs = k / 2, inter = n / 2, block_bytes = pairs * kPackedCols * 4;
  const int64_t to_up = inter / kPackedCols * block_bytes;  // a gate block to its up block
  over_packed_tiles(
      m, inter, pairs, reinterpret_cast<const char*>(packed), block_bytes, kLinesPerPair,
      [&](int64_t mr, int64_t r, int64_t b, const char* block, const char* ahead, int64_t lines) {
        alignas(64) float gate[kPackedRows][kPackedCols], up[kPackedRows][kPackedCols];
        packed_rows(mr, xs + r * k, k, reinterpret_cast<const uint16_t*>(block), pairs,
                    gate[0], kPackedCols, ahead, lines);
        packed_rows(mr, xs + r * k, k, reinterpret_cast<const uint16_t*>(block + to_up), pairs,
                    up[0], kPackedCols, ahead + to_up, lines);
        for (int64_t i = 0; i < mr; ++i)
          for (int64_t c = 0; c < kPackedCols; c += simd::kWidth)
            simd::vstore_bf16(out + (r + i) * inter + b * kPackedCols + c,
                              swiglu(simd::vload(gate[i] + c), simd::vload(up[i] + c)));
      });
}
#else
constexpr bool kHasPacked = false;

// Never reached: Proj::set_packed and linear_packed refuse pairs where kHasPacked is false.
inline void gemm_packed_bf16(const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t,
                             float*) {
  TORCH_CHECK(false, "packed BF16 pairs need a build with AVX-512");
}

inline void gemm_packed_swiglu(const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t,
                               uint16_t*) {
  TORCH_CHECK(false, "packed BF16 pairs need a build with AVX-512");
}
#endif

}  // namespace edgefire::fused
