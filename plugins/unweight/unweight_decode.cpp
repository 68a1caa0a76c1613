// Table-driven Huffman decoder for the Unweight distribution form, writing BF16 directly.
// Each chunk starts at a recorded bit offset and covers whole rows, so chunks run in parallel.
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

static inline uint64_t load_be64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return __builtin_bswap64(v);
}

// table[window] = (code length << 16) | (palette exponent << 7), for every `bits`-bit window.
// row_map[i] is the output row of the i-th coded (non-verbatim) row.
void decode(torch::Tensor stream, torch::Tensor offsets, torch::Tensor sign_mantissa,
            torch::Tensor table, torch::Tensor row_map, torch::Tensor out, int64_t count,
            int64_t chunk, int64_t row_width, int64_t bits, int64_t threads) {
  const uint8_t* s = stream.data_ptr<uint8_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  const uint8_t* sm = sign_mantissa.data_ptr<uint8_t>();
  const int32_t* tab = table.data_ptr<int32_t>();
  const int64_t* rows = row_map.data_ptr<int64_t>();
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr<int16_t>());
  const int64_t chunks = offsets.size(0);
  const int shift = 64 - static_cast<int>(bits);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t first = c * chunk, last = std::min(first + chunk, count);
    uint64_t pos = static_cast<uint64_t>(off[c]);
    uint64_t buf = load_be64(s + (pos >> 3)) << (pos & 7);
    int avail = 64 - static_cast<int>(pos & 7);
    for (int64_t r = first; r < last; r += row_width) {
      uint16_t* dst = o + rows[r / row_width] * row_width;
      const uint8_t* src = sm + r;
      for (int64_t k = 0; k < row_width; ++k) {
        if (avail < bits) {
          buf = load_be64(s + (pos >> 3)) << (pos & 7);
          avail = 64 - static_cast<int>(pos & 7);
        }
        const int32_t e = tab[buf >> shift];
        const int len = e >> 16;
        buf <<= len;
        avail -= len;
        pos += len;
        dst[k] = static_cast<uint16_t>((e & 0xFFFF) | ((src[k] & 0x80) << 8) | (src[k] & 0x7F));
      }
    }
  }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("decode", &decode); }
