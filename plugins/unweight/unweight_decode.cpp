// Table-driven Huffman decoder for the Unweight distribution form, writing BF16 directly.
// Each chunk starts at a recorded bit offset and covers whole rows, so chunks run in parallel.
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

static inline uint64_t load_be64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return __builtin_bswap64(v);
}

// For every `bits`-bit window: up to 4 whole codes decoded at once. Bytes 0-3 hold their
// exponents in order, bits 32-35 how many, bits 36-41 how many bits they take. Codes average
// under 3 bits, so a lookup yields ~4 symbols instead of 1.
static std::vector<uint64_t> multi_table(const int32_t* single, int bits) {
  const uint32_t size = 1u << bits;
  std::vector<uint64_t> multi(size);
  for (uint32_t w = 0; w < size; ++w) {
    uint64_t exps = 0;
    int used = 0, count = 0;
    while (count < 4) {
      const int32_t e = single[(w << used) & (size - 1)];
      const int len = e >> 16;
      if (used + len > bits) break;  // the rest of this code lies beyond the window
      exps |= static_cast<uint64_t>((e & 0xFFFF) >> 7) << (8 * count);
      used += len;
      ++count;
    }
    multi[w] = exps | (static_cast<uint64_t>(count) << 32) | (static_cast<uint64_t>(used) << 36);
  }
  return multi;
}

// table[window] = (code length << 16) | (palette exponent << 7), for every `bits`-bit window.
// row_map[i] is the output row of the i-th coded (non-verbatim) row. Each chunk is decoded in
// two passes: exponents into a scratch buffer, then whole rows composed (vectorisable).
void decode(torch::Tensor stream, torch::Tensor offsets, torch::Tensor sign_mantissa,
            torch::Tensor table, torch::Tensor row_map, torch::Tensor out, int64_t count,
            int64_t chunk, int64_t row_width, int64_t bits, int64_t threads) {
  const uint8_t* s = stream.data_ptr<uint8_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  const uint8_t* sm = sign_mantissa.data_ptr<uint8_t>();
  const std::vector<uint64_t> multi = multi_table(table.data_ptr<int32_t>(), bits);
  const int64_t* rows = row_map.data_ptr<int64_t>();
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr<int16_t>());
  const int64_t chunks = offsets.size(0);
  const int shift = 64 - static_cast<int>(bits);
#pragma omp parallel num_threads(threads)
  {
    std::vector<uint8_t> exps(chunk + 8);  // slack: a lookup may run past the chunk's end
#pragma omp for schedule(dynamic, 1)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t first = c * chunk, n = std::min(chunk, count - first);
      uint64_t pos = static_cast<uint64_t>(off[c]);
      uint64_t buf = load_be64(s + (pos >> 3)) << (pos & 7);
      int avail = 64 - static_cast<int>(pos & 7);
      for (int64_t k = 0; k < n;) {
        if (avail < bits) {
          buf = load_be64(s + (pos >> 3)) << (pos & 7);
          avail = 64 - static_cast<int>(pos & 7);
        }
        const uint64_t m = multi[buf >> shift];
        std::memcpy(exps.data() + k, &m, 4);
        const int len = static_cast<int>((m >> 36) & 0x3F);
        k += static_cast<int64_t>((m >> 32) & 0xF);
        buf <<= len;
        avail -= len;
        pos += len;
      }
      for (int64_t r = 0; r < n; r += row_width) {
        uint16_t* dst = o + rows[(first + r) / row_width] * row_width;
        const uint8_t* src = sm + first + r;
        const uint8_t* e = exps.data() + r;
        for (int64_t k = 0; k < row_width; ++k)
          dst[k] = static_cast<uint16_t>((e[k] << 7) | ((src[k] & 0x80) << 8) | (src[k] & 0x7F));
      }
    }
  }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("decode", &decode); }
