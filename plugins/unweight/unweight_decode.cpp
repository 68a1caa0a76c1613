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

// One chunk's bit stream being decoded: exponents go to exps[0, n), a lookup at a time.
struct Lane {
  const uint8_t* stream;
  uint64_t pos, buf;
  int avail;
  int64_t k, n;
  uint8_t* exps;

  void start(const uint8_t* s, uint64_t bit, int64_t count, uint8_t* out) {
    stream = s, pos = bit, k = 0, n = count, exps = out;
    refill();
  }
  void refill() {
    buf = load_be64(stream + (pos >> 3)) << (pos & 7);
    avail = 64 - static_cast<int>(pos & 7);
  }
  // One table lookup: up to 4 exponents (exps needs 3 bytes of slack past n).
  void step(const uint64_t* multi, int bits, int shift) {
    if (avail < bits) refill();
    const uint64_t m = multi[buf >> shift];
    std::memcpy(exps + k, &m, 4);
    const int len = static_cast<int>((m >> 36) & 0x3F);
    k += static_cast<int64_t>((m >> 32) & 0xF);
    buf <<= len;
    avail -= len;
    pos += len;
  }
};

// table[window] = (code length << 16) | (palette exponent << 7), for every `bits`-bit window.
// row_map[i] is the output row of the i-th coded (non-verbatim) row. Each chunk is decoded in
// two passes: exponents into a scratch buffer, then whole rows composed (vectorisable).
// A thread takes chunks two at a time and steps their bit streams in turn: each lookup waits
// on the one before it in its stream (the shift by its codes' length), so one stream leaves
// the core idle between lookups, and a second stream's lookups fill that wait.
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
  const int b = static_cast<int>(bits), shift = 64 - b;
  const uint64_t* mt = multi.data();
#pragma omp parallel num_threads(threads)
  {
    std::vector<uint8_t> exps(2 * (chunk + 8));  // slack: a lookup may run past the chunk's end
#pragma omp for schedule(dynamic, 1)
    for (int64_t pair = 0; pair < (chunks + 1) / 2; ++pair) {
      Lane lanes[2];
      const int used = 2 * pair + 1 < chunks ? 2 : 1;
      for (int i = 0; i < used; ++i) {
        const int64_t c = 2 * pair + i;
        lanes[i].start(s, static_cast<uint64_t>(off[c]), std::min(chunk, count - c * chunk),
                       exps.data() + i * (chunk + 8));
      }
      if (used == 2)
        while (lanes[0].k < lanes[0].n && lanes[1].k < lanes[1].n) {
          lanes[0].step(mt, b, shift);
          lanes[1].step(mt, b, shift);
        }
      for (int i = 0; i < used; ++i) {
        Lane& lane = lanes[i];
        while (lane.k < lane.n) lane.step(mt, b, shift);
        const int64_t first = (2 * pair + i) * chunk;
        for (int64_t r = 0; r < lane.n; r += row_width) {
          uint16_t* dst = o + rows[(first + r) / row_width] * row_width;
          const uint8_t* src = sm + first + r;
          const uint8_t* e = lane.exps + r;
          for (int64_t k = 0; k < row_width; ++k)
            dst[k] = static_cast<uint16_t>((e[k] << 7) | ((src[k] & 0x80) << 8) | (src[k] & 0x7F));
        }
      }
    }
  }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("decode", &decode); }
