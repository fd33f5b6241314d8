// 16-lane float32 vectors and exp(x) for x <= 0 on them (shared by the C++ kernels of engine/kernels
// that exponentiate: the decode attention's softmax, the prompt tiles' silu).
#pragma once

#include <cstdint>

namespace {

constexpr int64_t LANES = 16;

typedef float f32v __attribute__((vector_size(LANES * 4)));
typedef int32_t i32v __attribute__((vector_size(LANES * 4)));

inline f32v splat(float x) { return f32v{} + x; }

// exp(x) for x <= 0, 16 lanes (Cephes' expf: x = n ln2 + r, |r| <= ln2/2, a degree-5
// polynomial for e^r, 2^n into the exponent bits); within 2 ulp of std::exp, 0 below -87.
inline f32v exp_nonpositive(f32v x) {
  const f32v magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  f32v clamped = x < splat(-87.0f) ? splat(-87.0f) : x;
  f32v n = (clamped * splat(1.44269504088896341f) + magic) - magic;
  f32v r = clamped - n * splat(0.693359375f) - n * splat(-2.12194440e-4f);
  f32v p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  p = p * r * r + r + splat(1.0f);
  i32v bits = (__builtin_convertvector(n, i32v) + 127) << 23;
  f32v scaled = p * (f32v)bits;
  return x < splat(-87.0f) ? splat(0.0f) : scaled;
}

}  // namespace
