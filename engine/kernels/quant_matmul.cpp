// y[T, N] = x[T, K] @ W[N, K]^T for W stored as GGUF 4-bit or 8-bit blocks of 32 weights,
// dequantized on the fly with float32 activations (see engine/models/quant_linear.py).
//
// Each row tile of ROWS weight rows is dequantized into float32 (exactly the values gguf's
// dequantize gives: d*q is exact in float32, one rounding for + m): for up to TOKENS tokens block
// by block in registers (`fused_tile`), for more once into a row buffer that every token of the
// current token block is multiplied with (`tile`). Every output y[t, n] is the same sum in the
// same order whatever T, whichever path and whatever tile the token falls in: LANES partial sums
// over k = LANES*j + lane in order of j, then the lanes added in order. So a row's output does
// not depend on the other rows of the batch.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "parallel_chunks.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t LANES = 16;
constexpr int64_t BLOCK = 32;
constexpr int64_t ROWS = 4;
constexpr int64_t TOKENS = 4;
constexpr int64_t TOKEN_BLOCK = 128;

typedef float f32v __attribute__((vector_size(LANES * 4)));
typedef int32_t i32v __attribute__((vector_size(LANES * 4)));
typedef uint8_t u8v __attribute__((vector_size(LANES)));
typedef int8_t i8v __attribute__((vector_size(LANES)));

inline f32v load(const float* p) {
  f32v v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store(float* p, f32v v) { std::memcpy(p, &v, sizeof(v)); }

// 16 bytes widened to 16 int32 lanes (GCC scalarizes __builtin_convertvector from bytes).
inline i32v widen(const uint8_t* p) {
#if defined(__AVX512F__)
  return (i32v)_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  u8v bytes;
  std::memcpy(&bytes, p, sizeof(bytes));
  return __builtin_convertvector(bytes, i32v);
#endif
}

inline i32v widen(const int8_t* p) {
#if defined(__AVX512F__)
  return (i32v)_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  i8v bytes;
  std::memcpy(&bytes, p, sizeof(bytes));
  return __builtin_convertvector(bytes, i32v);
#endif
}

#if defined(__AVX512F__)
constexpr f32v NIBBLES = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
#endif

// Block b of a 4-bit row as its two halves of 16 float32 weights: byte j holds weight j (low
// nibble) and j+16 (high). The one place a 4-bit weight becomes float32, whichever path reads it.
// On AVX-512 the block's 16 possible weights q*d + m are made once and each nibble looks its own
// up with one permute (which reads an index's low 4 bits): the same float32 values as scaling
// every converted nibble (d*q is exact), in 5 vector operations for 32 weights instead of 7
// (8-9% faster at 1-3 tokens; docs/engine.md).
inline void q4_halves(const uint8_t* q, const float* d, const float* m, int64_t b, f32v& lo, f32v& hi) {
  const i32v wide = widen(q + b * (BLOCK / 2));
#if defined(__AVX512F__)
  const __m512 weights = (__m512)(NIBBLES * d[b] + m[b]);
  lo = (f32v)_mm512_permutexvar_ps((__m512i)wide, weights);
  hi = (f32v)_mm512_permutexvar_ps((__m512i)(wide >> 4), weights);
#else
  lo = __builtin_convertvector(wide & 15, f32v) * d[b] + m[b];
  hi = __builtin_convertvector(wide >> 4, f32v) * d[b] + m[b];
#endif
}

// Block b of an 8-bit row as its two halves: 32 int8 values times the block's scale.
inline void q8_halves(const int8_t* q, const float* d, int64_t b, f32v& lo, f32v& hi) {
  lo = __builtin_convertvector(widen(q + b * BLOCK), f32v) * d[b];
  hi = __builtin_convertvector(widen(q + b * BLOCK + LANES), f32v) * d[b];
}

// A whole row dequantized into out[K], block by block.
template <typename Halves>
void dequant_row(int64_t K, float* out, Halves halves) {
  for (int64_t b = 0; b < K / BLOCK; ++b) {
    f32v lo, hi;
    halves(b, lo, hi);
    store(out + b * BLOCK, lo);
    store(out + b * BLOCK + LANES, hi);
  }
}

typedef float f8v __attribute__((vector_size(32)));
typedef float f4v __attribute__((vector_size(16)));

// The lanes of each of ROWS (4) accumulators added as the same fixed tree, the four at once:
// h8[i] = v[i] + v[i+8], h4[i] = h8[i] + h8[i+4], h2[i] = h4[i] + h4[i+2], sum = h2[0] + h2[1].
inline f4v lane_sums(f32v a, f32v b, f32v c, f32v d) {
  f32v ab = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
            __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  f32v cd = __builtin_shufflevector(c, d, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
            __builtin_shufflevector(c, d, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  f32v h4 = __builtin_shufflevector(ab, cd, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
            __builtin_shufflevector(ab, cd, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  f8v h2 = __builtin_shufflevector(h4, h4, 0, 1, 4, 5, 8, 9, 12, 13) + __builtin_shufflevector(h4, h4, 2, 3, 6, 7, 10, 11, 14, 15);
  return __builtin_shufflevector(h2, h2, 0, 2, 4, 6) + __builtin_shufflevector(h2, h2, 1, 3, 5, 7);
}

// y[t, n0 + r] for NT tokens (x rows) and ROWS dequantized weight rows w.
// Inlined and fully unrolled: the accumulators stay in registers (measured 3-16% faster at 8-512 tokens).
template <int64_t NT>
__attribute__((always_inline)) inline void tile(const float* x, const float* w, int64_t K, float* y, int64_t N) {
  f32v acc[NT][ROWS] = {};
  for (int64_t k = 0; k < K; k += LANES) {
    f32v wv[ROWS];
#pragma GCC unroll 4
    for (int64_t r = 0; r < ROWS; ++r) wv[r] = load(w + r * K + k);
#pragma GCC unroll 4
    for (int64_t t = 0; t < NT; ++t) {
      f32v xv = load(x + t * K + k);
#pragma GCC unroll 4
      for (int64_t r = 0; r < ROWS; ++r) acc[t][r] += wv[r] * xv;
    }
  }
  static_assert(ROWS == 4, "lane_sums adds four rows' accumulators");
  for (int64_t t = 0; t < NT; ++t) {
    f4v sums = lane_sums(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
    std::memcpy(y + t * N, &sums, sizeof(sums));
  }
}

void tokens(const float* x, const float* w, int64_t K, float* y, int64_t N, int64_t count) {
  int64_t t = 0;
  for (; t + TOKENS <= count; t += TOKENS) tile<TOKENS>(x + t * K, w, K, y + t * N, N);
  switch (count - t) {
    case 3: tile<3>(x + t * K, w, K, y + t * N, N); break;
    case 2: tile<2>(x + t * K, w, K, y + t * N, N); break;
    case 1: tile<1>(x + t * K, w, K, y + t * N, N); break;
    default: break;
  }
}

// y[t, n0 + r] for NT (few) tokens and ROWS weight rows dequantized in registers, block by block:
// no row buffer to write and read back. Each accumulator takes the same products in the same order
// as in `tile` (k = 0, 16, 32, ... with the same float32 weights), so the results are bit for bit
// those of the buffered path.
template <int64_t NT, typename Halves>
__attribute__((always_inline)) inline void fused_tile(const float* x, int64_t K, int64_t n0, float* y, int64_t N, Halves halves) {
  f32v acc[NT][ROWS] = {};
  for (int64_t b = 0; b < K / BLOCK; ++b) {
    f32v lo[ROWS], hi[ROWS];
#pragma GCC unroll 4
    for (int64_t r = 0; r < ROWS; ++r) halves(n0 + r, b, lo[r], hi[r]);
#pragma GCC unroll 4
    for (int64_t t = 0; t < NT; ++t) {
      const f32v x_lo = load(x + t * K + b * BLOCK), x_hi = load(x + t * K + b * BLOCK + LANES);
#pragma GCC unroll 4
      for (int64_t r = 0; r < ROWS; ++r) acc[t][r] += lo[r] * x_lo;
#pragma GCC unroll 4
      for (int64_t r = 0; r < ROWS; ++r) acc[t][r] += hi[r] * x_hi;
    }
  }
  for (int64_t t = 0; t < NT; ++t) {
    f4v sums = lane_sums(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
    std::memcpy(y + t * N + n0, &sums, sizeof(sums));
  }
}

// y = x @ W^T for T <= TOKENS tokens, each row tile dequantized in registers.
template <int64_t NT, typename Halves>
void fused(const float* x, int64_t N, int64_t K, float* y, Halves halves) {
  parallel_chunks(N / ROWS, [&](int64_t begin, int64_t end) {
    for (int64_t tile_index = begin; tile_index < end; ++tile_index) fused_tile<NT>(x, K, tile_index * ROWS, y, N, halves);
  });
}

void check(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& scales, int64_t K) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x must be [T, K] contiguous float32");
  TORCH_CHECK(x.size(1) == K && K % BLOCK == 0, "K must match x and be a multiple of 32");
  TORCH_CHECK(q.is_contiguous() && scales.is_contiguous() && scales.scalar_type() == torch::kFloat32, "weights must be contiguous");
  TORCH_CHECK(q.size(0) % ROWS == 0 && scales.size(0) == q.size(0) && scales.size(1) == K / BLOCK, "N must be a multiple of 4");
}

// Halves: (n, b, lo, hi) -> block b of weight row n as two halves of 16 float32 weights.
template <typename Halves>
torch::Tensor matmul(const torch::Tensor& x, int64_t N, int64_t K, Halves halves) {
  const int64_t T = x.size(0);
  auto y = torch::empty({T, N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  switch (T) {  // up to TOKENS tokens, dequantizing in registers beats a row buffer (measured 1.1-1.9x at 1-4)
    case 1: fused<1>(xp, N, K, yp, halves); return y;
    case 2: fused<2>(xp, N, K, yp, halves); return y;
    case 3: fused<3>(xp, N, K, yp, halves); return y;
    case TOKENS: fused<TOKENS>(xp, N, K, yp, halves); return y;
    default: break;  // more: each row tile dequantized once into a buffer that every token block reads
  }
  for (int64_t t0 = 0; t0 < T; t0 += TOKEN_BLOCK) {
    const int64_t count = std::min(TOKEN_BLOCK, T - t0);
    parallel_chunks(N / ROWS, [&](int64_t begin, int64_t end) {
      std::vector<float> w(ROWS * K);
      for (int64_t tile_index = begin; tile_index < end; ++tile_index) {
        const int64_t n0 = tile_index * ROWS;
        for (int64_t r = 0; r < ROWS; ++r) {
          dequant_row(K, w.data() + r * K, [&](int64_t b, f32v& lo, f32v& hi) { halves(n0 + r, b, lo, hi); });
        }
        tokens(xp + t0 * K, w.data(), K, yp + t0 * N + n0, N, count);
      }
    });
  }
  return y;
}

// Whether y[t, n] = value at row n replaces the best so far as torch's max(dim).indices would
// choose: the first maximum, a NaN counting as the largest value.
inline bool better(float value, int64_t n, float best, int64_t best_n) {
  if (std::isnan(best)) return std::isnan(value) && n < best_n;
  return std::isnan(value) || value > best || (value == best && n < best_n);
}

// The index of the first maximum of v[0, count) as torch's max(dim) finds it (the first NaN, if any):
// the largest value in one pass the compiler vectorizes, then its first place.
inline int64_t first_maximum(const float* v, int64_t count) {
  float largest = v[0];
  bool nan = false;
  for (int64_t i = 0; i < count; ++i) {
    largest = v[i] > largest ? v[i] : largest;
    nan |= v[i] != v[i];
  }
  for (int64_t i = 0; i < count; ++i) {
    if (nan ? v[i] != v[i] : v[i] == largest) return i;
  }
  return 0;
}

// argmax over n of (x @ W^T)[t, n] for each token t, without the [T, N] result: each chunk of row
// tiles computes its outputs as `matmul` does (the same values: every output's sum does not depend
// on the tile or chunk it is computed in) into a buffer, and its best row per token is merged into
// the result (first maximum: the merge's outcome does not depend on the chunks' order).
template <typename Halves>
torch::Tensor argmax(const torch::Tensor& x, int64_t N, int64_t K, Halves halves) {
  const int64_t T = x.size(0);
  const float* xp = x.data_ptr<float>();
  std::vector<float> best(T, -INFINITY);
  std::vector<int64_t> best_n(T, N);
  std::mutex merge;
  parallel_chunks(N / ROWS, [&](int64_t begin, int64_t end) {
    const int64_t first = begin * ROWS, width = (end - begin) * ROWS;
    std::vector<float> y(T * width), w(T > TOKENS ? ROWS * K : 0);
    for (int64_t tile_index = begin; tile_index < end; ++tile_index) {
      const int64_t n0 = tile_index * ROWS;
      auto local = [&](int64_t n, int64_t b, f32v& lo, f32v& hi) { halves(n + first, b, lo, hi); };
      switch (T) {
        case 1: fused_tile<1>(xp, K, n0 - first, y.data(), width, local); continue;
        case 2: fused_tile<2>(xp, K, n0 - first, y.data(), width, local); continue;
        case 3: fused_tile<3>(xp, K, n0 - first, y.data(), width, local); continue;
        case TOKENS: fused_tile<TOKENS>(xp, K, n0 - first, y.data(), width, local); continue;
        default: break;
      }
      for (int64_t r = 0; r < ROWS; ++r) {
        dequant_row(K, w.data() + r * K, [&](int64_t b, f32v& lo, f32v& hi) { halves(n0 + r, b, lo, hi); });
      }
      for (int64_t t0 = 0; t0 < T; t0 += TOKEN_BLOCK) {
        tokens(xp + t0 * K, w.data(), K, y.data() + t0 * width + (n0 - first), width, std::min(TOKEN_BLOCK, T - t0));
      }
    }
    std::vector<int64_t> chunk_n(T);
    for (int64_t t = 0; t < T; ++t) chunk_n[t] = first + first_maximum(y.data() + t * width, width);
    std::lock_guard<std::mutex> lock(merge);
    for (int64_t t = 0; t < T; ++t) {
      const float value = y[t * width + chunk_n[t] - first];
      if (better(value, chunk_n[t], best[t], best_n[t])) best[t] = value, best_n[t] = chunk_n[t];
    }
  });
  auto ids = torch::empty({T}, x.options().dtype(torch::kInt64));
  std::copy(best_n.begin(), best_n.end(), ids.data_ptr<int64_t>());
  return ids;
}

// Every `halves` call also asks the memory for the same block of the row one tile (ROWS rows) ahead,
// which the next tile reads: at a few tokens a tile's rows are short streams (288-768 bytes of
// blocks) that the hardware prefetchers do not follow from row to row, so each tile waited for its
// rows. Prefetches change no value. Measured, both builds interleaved in one process (default model,
// decode step, medians of 16 rounds): 8.55 against 11.74 ms at batch 1, 11.2 against 15.0 at 4, the
// same at 16 and 64 (docs/engine.md).
inline void prefetch_ahead(const void* row_block, int64_t row_bytes) {
  __builtin_prefetch(static_cast<const char*>(row_block) + ROWS * row_bytes);
}

// op(x, N, K, halves) for a 4-bit weight (q: [N, K/2] uint8; scales, mins: [N, K/32] float32), arguments checked.
template <typename Op>
torch::Tensor on_q4(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& scales, const torch::Tensor& mins, Op op) {
  const int64_t N = q.size(0), K = q.size(1) * 2;
  check(x, q, scales, K);
  TORCH_CHECK(q.scalar_type() == torch::kUInt8 && mins.sizes() == scales.sizes() && mins.is_contiguous(), "bad 4-bit weight");
  const uint8_t* qp = q.data_ptr<uint8_t>();
  const float* dp = scales.data_ptr<float>();
  const float* mp = mins.data_ptr<float>();
  return op(x, N, K, [=](int64_t n, int64_t b, f32v& lo, f32v& hi) {
    const uint8_t* row = qp + n * (K / 2);
    const float *d = dp + n * (K / BLOCK), *m = mp + n * (K / BLOCK);
    prefetch_ahead(row + b * (BLOCK / 2), K / 2);
    if (b % 8 == 0) {
      prefetch_ahead(d + b, K / BLOCK * 4);
      prefetch_ahead(m + b, K / BLOCK * 4);
    }
    q4_halves(row, d, m, b, lo, hi);
  });
}

// op(x, N, K, halves) for an 8-bit weight (q: [N, K] int8; scales: [N, K/32] float32), arguments checked.
template <typename Op>
torch::Tensor on_q8(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& scales, Op op) {
  const int64_t N = q.size(0), K = q.size(1);
  check(x, q, scales, K);
  TORCH_CHECK(q.scalar_type() == torch::kInt8, "bad 8-bit weight");
  const int8_t* qp = q.data_ptr<int8_t>();
  const float* dp = scales.data_ptr<float>();
  return op(x, N, K, [=](int64_t n, int64_t b, f32v& lo, f32v& hi) {
    const int8_t* row = qp + n * K;
    const float* d = dp + n * (K / BLOCK);
    if (b % 2 == 0) prefetch_ahead(row + b * BLOCK, K);
    if (b % 8 == 0) prefetch_ahead(d + b, K / BLOCK * 4);
    q8_halves(row, d, b, lo, hi);
  });
}

const auto MATMUL = [](const torch::Tensor& x, int64_t N, int64_t K, auto halves) { return matmul(x, N, K, halves); };
const auto ARGMAX = [](const torch::Tensor& x, int64_t N, int64_t K, auto halves) { return argmax(x, N, K, halves); };

}  // namespace

// x: [T, K] float32 -> x @ W.T [T, N] float32 for a 4-bit weight.
torch::Tensor q4_matmul(torch::Tensor x, torch::Tensor q, torch::Tensor scales, torch::Tensor mins) { return on_q4(x, q, scales, mins, MATMUL); }

// x: [T, K] float32 -> x @ W.T [T, N] float32 for an 8-bit weight.
torch::Tensor q8_matmul(torch::Tensor x, torch::Tensor q, torch::Tensor scales) { return on_q8(x, q, scales, MATMUL); }

// (x @ W.T).max(-1).indices [T] int64 for a 4-bit weight, without the [T, N] result.
torch::Tensor q4_argmax(torch::Tensor x, torch::Tensor q, torch::Tensor scales, torch::Tensor mins) { return on_q4(x, q, scales, mins, ARGMAX); }

// (x @ W.T).max(-1).indices [T] int64 for an 8-bit weight, without the [T, N] result.
torch::Tensor q8_argmax(torch::Tensor x, torch::Tensor q, torch::Tensor scales) { return on_q8(x, q, scales, ARGMAX); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("q4_argmax", &q4_argmax, "(x @ W.T).max(-1).indices for 4-bit blocks", py::call_guard<py::gil_scoped_release>());
  m.def("q8_argmax", &q8_argmax, "(x @ W.T).max(-1).indices for 8-bit blocks", py::call_guard<py::gil_scoped_release>());
  m.def("q4_matmul", &q4_matmul, "x @ W.T for 4-bit blocks (scales, mins)", py::call_guard<py::gil_scoped_release>());
  m.def("q8_matmul", &q8_matmul, "x @ W.T for 8-bit blocks (scales)", py::call_guard<py::gil_scoped_release>());
}
