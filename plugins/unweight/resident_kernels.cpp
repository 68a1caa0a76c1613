// Kernels over the Unweight inference form of a [N, K] weight (rows of 64, K % 64 == 0):
// `linear` decodes each output row just in time inside a matrix-vector product, so the
// weight is read at 12 bits per value; `decode_rows` reconstructs BF16 rows (embedding
// lookups, or a whole weight before a large matmul). Layout: see plugins/unweight/inference.py.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "../../models/fused/row_decoder.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kRow = 64;
#if defined(__AVX512BF16__) && defined(__AVX512VBMI__)
constexpr bool kDotBf16 = true;  // x stays bf16: one instruction multiplies 32 pairs
#else
constexpr bool kDotBf16 = false;
#endif

struct Form {
  const uint8_t* packed;
  const uint8_t* sm;
  const uint8_t* palette;
  const uint8_t* flags;
  const int32_t* vstart;
  const uint16_t* verbatim;
  int64_t k;
};

Form view(const torch::Tensor& packed, const torch::Tensor& sm, const torch::Tensor& palette,
          const torch::Tensor& flags, const torch::Tensor& vstart,
          const torch::Tensor& verbatim, int64_t k) {
  TORCH_CHECK(k % kRow == 0, "K must be a multiple of 64");
  return {packed.data_ptr<uint8_t>(), sm.data_ptr<uint8_t>(), palette.data_ptr<uint8_t>(),
          flags.data_ptr<uint8_t>(), vstart.data_ptr<int32_t>(),
          reinterpret_cast<const uint16_t*>(verbatim.data_ptr<int16_t>()), k};
}

inline bool is_verbatim(const Form& f, int64_t row) { return (f.flags[row >> 3] >> (row & 7)) & 1; }

#if defined(__AVX512BW__) && defined(__AVX512VBMI__)
constexpr bool kVector = true;

// The high and low bytes of 64 BF16 weights of row `row`, in natural order.
inline void byte_planes(const Form& f, int64_t row, int64_t& v, __m512i& lo, __m512i& hi) {
  if (is_verbatim(f, row)) {
    alignas(64) uint8_t l[kRow], h[kRow];
    const uint16_t* w = f.verbatim + (v++) * kRow;
    for (int i = 0; i < kRow; ++i) { l[i] = w[i] & 0xFF; h[i] = w[i] >> 8; }
    lo = _mm512_load_si512(l);
    hi = _mm512_load_si512(h);
    return;
  }
  const __m512i pal = _mm512_castsi128_si512(_mm_loadu_si128(
      reinterpret_cast<const __m128i*>(f.palette)));
  const __m512i nib = _mm512_cvtepu8_epi16(_mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(f.packed + row * kRow / 2)));
  // Each 16-bit lane becomes [low nibble, high nibble]: the 64 indices in order.
  const __m512i idx = _mm512_or_si512(
      _mm512_and_si512(nib, _mm512_set1_epi16(0x0F)),
      _mm512_slli_epi16(_mm512_and_si512(nib, _mm512_set1_epi16(0xF0)), 4));
  const __m512i e = _mm512_permutexvar_epi8(idx, pal);
  const __m512i s = _mm512_loadu_si512(f.sm + row * kRow);
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  // 0xCA: bitwise "a ? b : c". High byte: sign | exponent >> 1; low: exponent << 7 | mantissa.
  hi = _mm512_ternarylogic_epi32(sign, s, _mm512_srli_epi16(e, 1), 0xCA);
  lo = _mm512_ternarylogic_epi32(sign, _mm512_slli_epi16(e, 7), s, 0xCA);
}

// The row's BF16 words in "kernel order", the order the in-lane unpacks leave them; `linear`
// puts x in the same order, which a dot product does not mind.
inline void decode_words(const Form& f, int64_t row, int64_t& v, uint16_t* out) {
  __m512i lo, hi;
  byte_planes(f, row, v, lo, hi);
  _mm512_store_si512(out, _mm512_unpacklo_epi8(lo, hi));
  _mm512_store_si512(out + 32, _mm512_unpackhi_epi8(lo, hi));
}

// The natural column of kernel-order word i: unpacklo takes bytes 0-7 of each 16-byte lane.
int source_column(int i) { return (i % 32) / 8 * 16 + (i / 32) * 8 + i % 8; }

inline void decode_bf16(const Form& f, int64_t row, int64_t& v, uint16_t* out) {
  __m512i lo, hi;
  byte_planes(f, row, v, lo, hi);
  alignas(64) uint8_t first[kRow], second[kRow];
  for (int j = 0; j < 32; ++j) {  // folded to constants by the compiler
    first[2 * j] = j; first[2 * j + 1] = 64 + j;
    second[2 * j] = 32 + j; second[2 * j + 1] = 96 + j;
  }
  _mm512_storeu_si512(out, _mm512_permutex2var_epi8(lo, _mm512_load_si512(first), hi));
  _mm512_storeu_si512(out + 32, _mm512_permutex2var_epi8(lo, _mm512_load_si512(second), hi));
}

inline __m512 widen(const uint16_t* words) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(words)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

// out[m][n] for NB decoded rows and MB rows of x, K steps of 32 (bf16 pairs) or 16 (fp32).
template <int NB, int MB, bool kBf16>
inline void tile(const uint16_t* w, const void* xk, int64_t k, float (*out)[MB]) {
  __m512 acc[NB][MB];
  for (int i = 0; i < NB; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j] = _mm512_setzero_ps();
#ifdef __AVX512BF16__
  if constexpr (kBf16) {
    const uint16_t* x = static_cast<const uint16_t*>(xk);
    for (int64_t c = 0; c < k; c += 32) {
      __m512i wv[NB];
      for (int i = 0; i < NB; ++i) wv[i] = _mm512_load_si512(w + i * k + c);
      for (int j = 0; j < MB; ++j) {
        const __m512i xv = _mm512_loadu_si512(x + j * k + c);
        for (int i = 0; i < NB; ++i)
          acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)wv[i], (__m512bh)xv);
      }
    }
  } else
#endif
  {
    const float* x = static_cast<const float*>(xk);
    for (int64_t c = 0; c < k; c += 16) {
      __m512 wv[NB];
      for (int i = 0; i < NB; ++i) wv[i] = widen(w + i * k + c);
      for (int j = 0; j < MB; ++j) {
        const __m512 xv = _mm512_loadu_ps(x + j * k + c);
        for (int i = 0; i < NB; ++i) acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
      }
    }
  }
  for (int i = 0; i < NB; ++i)
    for (int j = 0; j < MB; ++j) out[i][j] = _mm512_reduce_add_ps(acc[i][j]);
}
#else  // AVX2 or scalar: rows decoded in natural column order
#if defined(__AVX2__) && defined(__FMA__)
constexpr bool kVector = true;

// 32 BF16 weights of row `row` from column `half` * 32, in natural order. A 16-entry palette
// fits one in-lane byte shuffle, so the exponents are a single lookup per 32 weights.
inline void decode_half(const Form& f, int64_t row, int half, uint16_t* out) {
  const __m128i nib = _mm_loadu_si128(
      reinterpret_cast<const __m128i*>(f.packed + row * kRow / 2 + half * 16));
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const __m128i first = _mm_and_si128(nib, low4);
  const __m128i second = _mm_and_si128(_mm_srli_epi16(nib, 4), low4);
  const __m256i idx = _mm256_setr_m128i(_mm_unpacklo_epi8(first, second),
                                        _mm_unpackhi_epi8(first, second));
  const __m256i e = _mm256_shuffle_epi8(
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(f.palette))),
      idx);
  const __m256i s = _mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(f.sm + row * kRow + half * 32));
  const __m256i sign = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i rest = _mm256_set1_epi8(0x7F);
  // High byte: sign | exponent >> 1; low byte: exponent << 7 | mantissa (the 16-bit shifts
  // carry a neighbour byte's bit, which the masks drop).
  const __m256i hi = _mm256_or_si256(_mm256_and_si256(s, sign),
                                     _mm256_and_si256(_mm256_srli_epi16(e, 1), rest));
  const __m256i lo = _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi16(e, 7), sign),
                                     _mm256_and_si256(s, rest));
  // The in-lane unpacks leave words 0-7 | 16-23 and 8-15 | 24-31; the lane swap restores order.
  const __m256i a = _mm256_unpacklo_epi8(lo, hi), b = _mm256_unpackhi_epi8(lo, hi);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permute2x128_si256(a, b, 0x20));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), _mm256_permute2x128_si256(a, b, 0x31));
}

inline void decode_coded(const Form& f, int64_t row, uint16_t* out) {
  decode_half(f, row, 0, out);
  decode_half(f, row, 1, out + 32);
}

inline float sum8(__m256 v) {
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

// out[m][n] for NB decoded rows and MB float32 rows of x, K steps of 8.
template <int NB, int MB, bool kBf16>
inline void tile(const uint16_t* w, const void* xk, int64_t k, float (*out)[MB]) {
  static_assert(!kBf16, "AVX2 multiplies float32 x");
  const float* x = static_cast<const float*>(xk);
  __m256 acc[NB][MB];
  for (int i = 0; i < NB; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t c = 0; c < k; c += 8) {
    __m256 wv[NB];
    for (int i = 0; i < NB; ++i)
      wv[i] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
          _mm_load_si128(reinterpret_cast<const __m128i*>(w + i * k + c))), 16));
    for (int j = 0; j < MB; ++j) {
      const __m256 xv = _mm256_loadu_ps(x + j * k + c);
      for (int i = 0; i < NB; ++i) acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
    }
  }
  for (int i = 0; i < NB; ++i)
    for (int j = 0; j < MB; ++j) out[i][j] = sum8(acc[i][j]);
}
#else
constexpr bool kVector = false;

inline uint16_t scalar_bits(const Form& f, int64_t at) {
  const uint8_t s = f.sm[at];
  const uint8_t idx = (f.packed[at >> 1] >> ((at & 1) * 4)) & 0xF;
  return static_cast<uint16_t>(((s & 0x80) << 8) | (f.palette[idx] << 7) | (s & 0x7F));
}

inline void decode_coded(const Form& f, int64_t row, uint16_t* out) {
  for (int64_t i = 0; i < kRow; ++i) out[i] = scalar_bits(f, row * kRow + i);
}

template <int NB, int MB, bool kBf16>
inline void tile(const uint16_t* w, const void* xk, int64_t k, float (*out)[MB]) {
  const float* x = static_cast<const float*>(xk);
  for (int i = 0; i < NB; ++i)
    for (int j = 0; j < MB; ++j) {
      float acc = 0.f;
      for (int64_t c = 0; c < k; ++c) {
        const uint32_t bits = static_cast<uint32_t>(w[i * k + c]) << 16;
        float wf;
        std::memcpy(&wf, &bits, 4);
        acc += wf * x[j * k + c];
      }
      out[i][j] = acc;
    }
}
#endif

inline void decode_bf16(const Form& f, int64_t row, int64_t& v, uint16_t* out) {
  if (is_verbatim(f, row)) {
    std::memcpy(out, f.verbatim + (v++) * kRow, kRow * sizeof(uint16_t));
    return;
  }
  decode_coded(f, row, out);
}

inline void decode_words(const Form& f, int64_t row, int64_t& v, uint16_t* out) {
  decode_bf16(f, row, v, out);
}

int source_column(int i) { return i; }
#endif

constexpr int kNB = 4;  // output rows per tile: decoded once, multiplied by every x row
// x rows per tile: its NB x MB accumulators and NB weight vectors stay in registers (32 with
// AVX-512, 16 with AVX2).
#if defined(__AVX512BW__) && defined(__AVX512VBMI__)
constexpr int kMB = 4;
#else
constexpr int kMB = 2;
#endif

// x in kernel order, padded to whole tiles of mb rows: bf16 words for the dot-product
// instruction, or fp32.
template <typename T, typename X>
std::vector<X> arrange(const torch::Tensor& x, int64_t padded) {
  const int64_t m_rows = x.size(0), k = x.size(1);
  const T* xs = x.data_ptr<T>();
  std::vector<X> xp(padded * k + 32);
  int source[kRow];
  for (int i = 0; i < kRow; ++i) source[i] = source_column(i);
  for (int64_t m = 0; m < m_rows; ++m)
    for (int64_t c = 0; c < k; c += kRow)
      for (int i = 0; i < kRow; ++i) {
        const T value = xs[m * k + c + source[i]];
        if constexpr (std::is_same_v<X, float>) xp[m * k + c + i] = static_cast<float>(value);
        else xp[m * k + c + i] = value.x;  // bf16 bits
      }
  return xp;
}

template <typename T, int MB, bool kBf16>
void linear_tiles(const torch::Tensor& x, const Form& f, int64_t n_out, torch::Tensor& out) {
  using X = std::conditional_t<kBf16, uint16_t, float>;
  const int64_t m_rows = x.size(0), k = f.k, per_row = k / kRow;
  const int64_t padded = (m_rows + MB - 1) / MB * MB;
  const std::vector<X> xp = arrange<T, X>(x, padded);
  T* o = out.data_ptr<T>();
  const int64_t blocks = (n_out + kNB - 1) / kNB;
  at::parallel_for(0, blocks, 4, [&](int64_t begin, int64_t end) {
    std::vector<uint16_t> store(kNB * k + 32, 0);
    uint16_t* w = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(store.data()) + 63) & ~63);
    float result[kNB][MB];
    for (int64_t b = begin; b < end; ++b) {
      const int64_t n0 = b * kNB, nb = std::min<int64_t>(kNB, n_out - n0);
      for (int64_t i = 0; i < nb; ++i) {
        int64_t v = f.vstart[n0 + i];
        for (int64_t j = 0; j < per_row; ++j)
          decode_words(f, (n0 + i) * per_row + j, v, w + i * k + j * kRow);
      }
      for (int64_t m0 = 0; m0 < m_rows; m0 += MB) {
        tile<kNB, MB, kBf16>(w, xp.data() + m0 * k, k, result);
        for (int64_t i = 0; i < nb; ++i)
          for (int64_t j = 0; j < MB && m0 + j < m_rows; ++j)
            o[(m0 + j) * n_out + n0 + i] = static_cast<T>(result[i][j]);
      }
    }
  });
}

template <typename T, bool kBf16>
void linear_impl(const torch::Tensor& x, const Form& f, int64_t n_out, torch::Tensor& out) {
  // One x row: a tile of one keeps the matvec free of padding work.
  if (x.size(0) == 1) linear_tiles<T, 1, kBf16>(x, f, n_out, out);
  else linear_tiles<T, kMB, kBf16>(x, f, n_out, out);
}

}  // namespace

torch::Tensor linear(torch::Tensor x, torch::Tensor packed, torch::Tensor sm,
                     torch::Tensor palette, torch::Tensor flags, torch::Tensor vstart,
                     torch::Tensor verbatim) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous [M, K] matrix");
  const Form f = view(packed, sm, palette, flags, vstart, verbatim, x.size(1));
  const int64_t n_out = vstart.size(0);
  auto out = torch::empty({x.size(0), n_out}, x.options());
  if (x.scalar_type() == torch::kBFloat16)
    linear_impl<at::BFloat16, kDotBf16>(x, f, n_out, out);
  else if (x.scalar_type() == torch::kFloat32)
    linear_impl<float, false>(x, f, n_out, out);
  else
    TORCH_CHECK(false, "x must be float32 or bfloat16");
  return out;
}

// out[i] = row ids[i] of the weight (all rows when ids is empty), as BF16 bits.
void decode_rows(torch::Tensor ids, torch::Tensor packed, torch::Tensor sm,
                 torch::Tensor palette, torch::Tensor flags, torch::Tensor vstart,
                 torch::Tensor verbatim, int64_t k, torch::Tensor out) {
  const Form f = view(packed, sm, palette, flags, vstart, verbatim, k);
  const bool all = ids.numel() == 0;
  const int64_t count = all ? vstart.size(0) : ids.numel(), per_row = k / kRow;
  const int64_t* id = all ? nullptr : ids.data_ptr<int64_t>();
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr<int16_t>());
  at::parallel_for(0, count, 8, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t n = all ? i : id[i];
      int64_t v = f.vstart[n];
      for (int64_t j = 0; j < per_row; ++j)
        decode_bf16(f, n * per_row + j, v, o + i * k + j * kRow);
    }
  });
}

// How often each exponent byte occurs in BF16 words.
torch::Tensor exponent_histogram(torch::Tensor words) {
  const uint16_t* w = reinterpret_cast<const uint16_t*>(words.data_ptr<int16_t>());
  const int64_t n = words.numel();
  const int threads = at::get_num_threads();
  std::vector<int64_t> counts(256 * threads, 0);
  at::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) {
    int64_t* c = counts.data() + 256 * at::get_thread_num();
    for (int64_t i = begin; i < end; ++i) ++c[(w[i] >> 7) & 0xFF];
  });
  auto out = torch::zeros({256}, torch::kInt64);
  int64_t* o = out.data_ptr<int64_t>();
  for (int t = 0; t < threads; ++t)
    for (int e = 0; e < 256; ++e) o[e] += counts[256 * t + e];
  return out;
}

// The inference form's packed indices and sign+mantissa bytes of whole rows of BF16 words;
// lookup maps an exponent to its palette index or 255. Returns per row whether it must be
// verbatim (its slots are then left zero).
torch::Tensor encode_rows(torch::Tensor words, torch::Tensor lookup, torch::Tensor packed,
                          torch::Tensor sm) {
  const uint16_t* w = reinterpret_cast<const uint16_t*>(words.data_ptr<int16_t>());
  const uint8_t* lut = lookup.data_ptr<uint8_t>();
  uint8_t* p = packed.data_ptr<uint8_t>();
  uint8_t* s = sm.data_ptr<uint8_t>();
  const int64_t rows = words.numel() / kRow;
  auto verbatim = torch::zeros({rows}, torch::kBool);
  bool* vb = verbatim.data_ptr<bool>();
  at::parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
    uint8_t idx[kRow];
    for (int64_t r = begin; r < end; ++r) {
      const uint16_t* row = w + r * kRow;
      uint8_t missing = 0;
      for (int i = 0; i < kRow; ++i) {
        idx[i] = lut[(row[i] >> 7) & 0xFF];
        missing |= idx[i] == 255;
      }
      if (missing) {
        vb[r] = true;
        std::memset(p + r * kRow / 2, 0, kRow / 2);
        std::memset(s + r * kRow, 0, kRow);
        continue;
      }
      for (int i = 0; i < kRow; ++i)
        s[r * kRow + i] = static_cast<uint8_t>(((row[i] >> 8) & 0x80) | (row[i] & 0x7F));
      for (int i = 0; i < kRow / 2; ++i)
        p[r * kRow / 2 + i] = static_cast<uint8_t>(idx[2 * i] | (idx[2 * i + 1] << 4));
    }
  });
  return verbatim;
}

bool vectorised() { return kVector; }

namespace {

// What a row decoder handed to the fused decode step reads: the form, its tensors kept alive
// while the decoder lives, and the column order decode_words leaves rows in.
struct RowSource {
  Form f;
  std::vector<torch::Tensor> keep;
  std::vector<int32_t> order;
  edgefire::fused::RowDecoder abi;
};

void decode_weight_rows(const void* self, int64_t row0, int64_t count, uint16_t* out) {
  const auto* s = static_cast<const RowSource*>(self);
  const int64_t k = s->f.k, per_row = k / kRow;
  for (int64_t r = 0; r < count; ++r) {
    int64_t v = s->f.vstart[row0 + r];
    for (int64_t j = 0; j < per_row; ++j)
      decode_words(s->f, (row0 + r) * per_row + j, v, out + r * k + j * kRow);
  }
}

}  // namespace

// The form as an edgefire.row_decoder capsule (models/fused/row_decoder.h): the fused decode
// step multiplies its rows decoded just in time, reading the weight at 12 bits.
pybind11::capsule row_decoder(torch::Tensor packed, torch::Tensor sm, torch::Tensor palette,
                              torch::Tensor flags, torch::Tensor vstart, torch::Tensor verbatim,
                              int64_t k) {
  auto* s = new RowSource{view(packed, sm, palette, flags, vstart, verbatim, k),
                          {packed, sm, palette, flags, vstart, verbatim}, {}, {}};
  s->order.resize(k);
  for (int64_t c = 0; c < k; ++c)
    s->order[c] = static_cast<int32_t>(c / kRow * kRow + source_column(static_cast<int>(c % kRow)));
  s->abi = {vstart.size(0), k, decode_weight_rows, s->order.data(), s};
  return pybind11::capsule(&s->abi, edgefire::fused::kRowDecoderCapsule, [](PyObject* capsule) {
    auto* abi = static_cast<edgefire::fused::RowDecoder*>(
        PyCapsule_GetPointer(capsule, edgefire::fused::kRowDecoderCapsule));
    delete static_cast<const RowSource*>(abi->self);
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear", &linear);
  m.def("decode_rows", &decode_rows);
  m.def("exponent_histogram", &exponent_histogram);
  m.def("encode_rows", &encode_rows);
  m.def("vectorised", &vectorised);
  m.def("row_decoder", &row_decoder);
}
