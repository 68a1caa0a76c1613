// The fused decode step's interface to weight forms only their codec can read (a codec
// plugin's packed rows, such as Unweight's 12-bit form): the codec's own extension decodes
// whole rows to BF16 and the fused step multiplies them, so the step reads the packed bytes
// and never a dense copy. A codec hands one over in a PyCapsule named "edgefire.row_decoder"
// holding a RowDecoder*, valid while the capsule lives.
#pragma once

#include <cstdint>

namespace edgefire::fused {

struct RowDecoder {
  int64_t rows, cols;  // the weight's shape; cols % 32 == 0
  // BF16 bits of weight rows [row0, row0 + count) into out [count][cols], column c of out
  // holding the weight's column order[c] (a codec may decode in its own column order; the
  // fused step puts x in the same order, which a dot product does not mind).
  void (*decode)(const void* self, int64_t row0, int64_t count, uint16_t* out);
  const int32_t* order;  // cols entries
  const void* self;
};

constexpr const char* kRowDecoderCapsule = "edgefire.row_decoder";

}  // namespace edgefire::fused
