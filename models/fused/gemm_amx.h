// The packed-pairs matmul (gemm_packed.h) on AMX tiles, where the CPU has them and the kernel
// lets this process use them.
//
// Why: a 2-core Xeon's AVX512-BF16 dot products reach ~0.4 TFLOP/s, its AMX tiles ~2.3 (torch's
// oneDNN GEMM, bench/results). The pairs layout [n / 64][k / 2][64][2] is already what a tile
// multiply reads as its B operand: 16 pairs of K by 16 columns are 16 rows of 64 bytes, 256
// bytes apart. So the same packed copy serves both kernels, and no oneDNN layout is kept.
//
// Each output is one chain of tile multiplies over K's 32-value steps in order; a tile
// multiply computes each output from its own x row and weight column alone. So a row's result
// does not depend on how many rows share the step, on the tile arrangement or on the thread:
// the step stays batch-invariant from one row to a prompt chunk (speculative decoding relies
// on it). The products round as the tiles round them, which is not bit-for-bit the AVX512
// kernel's: a machine uses one of the two for every row count.
//
// Built with AMX off for the rest of the file (models/native.py: some VMs advertise AMX and
// fault on it); these functions enable it for themselves and run only after the kernel
// granted the process the tile state (amx_usable).
#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <cstring>

namespace edgefire::fused {

#if defined(__x86_64__)
// Linux asks a process to request the 8 KiB of tile state before its first tile instruction
// (arch/x86 XFEATURE_XTILEDATA); where the CPU or the VM lacks it the request fails, and the
// AVX512 kernel runs instead, as it does with EDGEFIRE_AMX_TILES=0 (to compare the two).
// CPUID leaf 7's EDX: the AMX feature bits (22 BF16, 24 tiles, 25 INT8).
inline unsigned cpuid7_edx() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  __asm__("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(7), "c"(0));
  return edx;
}

inline bool amx_usable() {
  static const bool usable = [] {
    const char* env = std::getenv("EDGEFIRE_AMX_TILES");
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
    const unsigned edx = cpuid7_edx();
    const bool tile = (edx >> 24) & 1, bf16 = (edx >> 22) & 1;
    constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
    return tile && bf16 && syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
  }();
  return usable;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

constexpr int64_t kAmxRows = 16;   // x rows per A tile
constexpr int64_t kAmxPairs = 16;  // K pairs per tile multiply: 32 BF16 values, 64 bytes a row
constexpr int64_t kPairValues = 64 * 2;  // BF16 values from one pair of K to the next in a block
constexpr int64_t kPairStride = kPairValues * 2;  // the same in bytes: a weight tile's row stride
constexpr int64_t kAmxStep = kAmxPairs * kPairStride;  // bytes of a block one K step reads: 4 KiB
// A block's first pass asks for its weight this far ahead into L2: a tile load's 16 rows lie
// 256 bytes apart, which the hardware prefetcher does not run ahead of.
constexpr int64_t kAmxAhead = 2 * kAmxStep;

// The next K steps' weight (what follows the block is the next block: blocks lie in order).
inline void prefetch_step(const uint16_t* w) {
  const char* ahead = reinterpret_cast<const char*>(w) + kAmxAhead;
  for (int64_t line = 0; line < kAmxStep; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T1);
}

// Four float32 sums of 16 columns (tmm0-3), x tiles (tmm4, 5) and weight tiles (tmm6, 7),
// rows of 64 bytes: the sums and x tiles `rows` rows (a step's last rows, short of 16: a tile
// loads and multiplies only those), the weight tiles 16.
__attribute__((target("amx-tile,amx-bf16"))) inline void configure_tiles(int rows) {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = t < 6 ? rows : 16;
  }
  // Not _tile_loadconfig: GCC 12's declares it reads 8 bytes, and the rest of the stores into
  // `config` can be dropped as dead; this asm reads all 64.
  __asm__ volatile("ldtilecfg %0" : : "m"(config));
}

// 16 rows of x [.., k] (ldx values apart) against one packed block: out 16 x 64 (ldo apart).
// Each 32-value step of K: one x tile, four weight tiles of 16 columns.
__attribute__((target("amx-tile,amx-bf16"))) inline void amx_rows16(
    const uint16_t* x, int64_t ldx, const uint16_t* block, int64_t pairs, float* out,
    int64_t ldo, bool fetch) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t p = 0; p < pairs; p += kAmxPairs) {
    const uint16_t* w = block + p * kPairValues;
    if (fetch) prefetch_step(w);
    _tile_loadd(4, x + 2 * p, ldx * 2);
    _tile_loadd(6, w, kPairStride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, w + 32, kPairStride);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(6, w + 64, kPairStride);
    _tile_dpbf16ps(2, 4, 6);
    _tile_loadd(7, w + 96, kPairStride);
    _tile_dpbf16ps(3, 4, 7);
  }
  _tile_stored(0, out, ldo * 4);
  _tile_stored(1, out + 16, ldo * 4);
  _tile_stored(2, out + 32, ldo * 4);
  _tile_stored(3, out + 48, ldo * 4);
}

// 32 rows of x against 32 of a block's columns (col0: 0 or 32): each weight tile serves two x
// tiles and each x tile two weight tiles, half the loads per multiply of amx_rows16, for
// prompt-sized steps where the tiles' multiplies, not memory, bound the step.
__attribute__((target("amx-tile,amx-bf16"))) inline void amx_rows32(
    const uint16_t* x, int64_t ldx, const uint16_t* block, int64_t pairs, int64_t col0,
    float* out, int64_t ldo, bool fetch) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t p = 0; p < pairs; p += kAmxPairs) {
    if (fetch) prefetch_step(block + p * kPairValues);
    const uint16_t* w = block + p * kPairValues + col0 * 2;
    _tile_loadd(4, x + 2 * p, ldx * 2);
    _tile_loadd(5, x + 16 * ldx + 2 * p, ldx * 2);
    _tile_loadd(6, w, kPairStride);
    _tile_loadd(7, w + 32, kPairStride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out + col0, ldo * 4);
  _tile_stored(1, out + col0 + 16, ldo * 4);
  _tile_stored(2, out + 16 * ldo + col0, ldo * 4);
  _tile_stored(3, out + 16 * ldo + col0 + 16, ldo * 4);
}

// x [m, k] BF16 bits, packed [n / 64][k / 2][64][2], out [m, n] float32; k a multiple of 32.
// Rows go in groups of 16, two full groups at a time where there are; the last m % 16 rows in
// tiles of that many rows. Threads split the blocks and, for prompt-sized steps, the groups in
// chunks of two.
__attribute__((target("amx-tile,amx-bf16"))) inline void gemm_packed_amx(
    const uint16_t* x, int64_t m, int64_t k, const uint16_t* packed, int64_t n, float* out) {
  const int64_t blocks = n / 64, pairs = k / 2, block_len = pairs * kPairValues;
  const int64_t groups = (m + kAmxRows - 1) / kAmxRows;
  // Row chunks of 2 groups when the blocks alone would leave a thread idle or the rows are
  // many (each chunk reads its block again, from L2 or L3).
  const int64_t threads = at::get_num_threads();
  int64_t chunk_groups = groups;
  if (groups > 2 && (blocks % threads || groups > 4)) chunk_groups = 2;
  const int64_t chunks = (groups + chunk_groups - 1) / chunk_groups;
  at::parallel_for(0, blocks * chunks, 1, [&](int64_t begin, int64_t end) {
    int configured = 0;  // the rows the thread's tiles are configured for
    auto rows_of = [&](int rows) {
      if (rows != configured) configure_tiles(configured = rows);
    };
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / chunks, g0 = (item % chunks) * chunk_groups;
      const int64_t g1 = std::min(groups, g0 + chunk_groups);
      const uint16_t* block = packed + b * block_len;
      for (int64_t g = g0; g < g1;) {
        const int64_t r0 = g * kAmxRows;
        const uint16_t* xg = x + r0 * k;
        float* o = out + r0 * n + b * 64;
        const bool fetch = g == g0;  // later passes find the block in L2
        if (g + 1 < g1 && r0 + 2 * kAmxRows <= m) {
          rows_of(kAmxRows);
          amx_rows32(xg, k, block, pairs, 0, o, n, fetch);
          amx_rows32(xg, k, block, pairs, 32, o, n, false);
          g += 2;
        } else {
          rows_of(static_cast<int>(std::min(kAmxRows, m - r0)));
          amx_rows16(xg, k, block, pairs, o, n, fetch);
          g += 1;
        }
      }
    }
  });
}
#else
inline bool amx_usable() { return false; }
inline void gemm_packed_amx(const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t,
                            float*) {}
#endif

}  // namespace edgefire::fused
