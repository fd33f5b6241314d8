// RMS normalization of rows, bit for bit torch's float32 `F.rms_norm` on the CPU (see
// engine/kernels/rms_norm.py, engine/models/llama.py).
//
// Layout: x [T, n] and weight [n] float32 contiguous, n a multiple of 32 -> out [T, n].
//
// torch computes mean(x * x) over a row as its vectorized sum of the squares divided by n
// (ATen's cascade sum over 8-float vectors: four accumulators, vector i into accumulator i % 4,
// folded level by level every 16 vectors of each; the accumulators added in order, then the 8
// lanes in order), then rsqrt(mean + eps) as 1 / sqrt, then (x * r) * weight. This file does the
// same operations in the same order, each rounded once (contraction into fused multiply-adds is
// turned off below), so the result is torch's bit for bit (tests/engine/test_rms_norm_kernel.py);
// torch's composite costs about 25 µs a call for one token in some twenty operator calls.
#pragma GCC optimize("fp-contract=off")
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

constexpr int64_t LANES = 8;
constexpr int64_t ACCUMULATORS = 4;
constexpr int64_t LEVELS = 4;
constexpr int64_t ROWS_PER_TASK = 16;

typedef float f8v __attribute__((vector_size(LANES * 4)));

inline f8v load(const float* p) {
  f8v v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline int64_t ceil_log2(int64_t x) {
  int64_t log = 0;
  while ((int64_t(1) << log) < x) ++log;
  return log;
}

// Sum of the squares of x[0:n], in ATen's order for a contiguous row of float32.
float sum_of_squares(const float* x, int64_t n) {
  const int64_t groups = n / (LANES * ACCUMULATORS);  // groups of ACCUMULATORS vectors
  const int64_t level_power = std::max<int64_t>(4, ceil_log2(groups) / LEVELS);
  const int64_t level_step = int64_t(1) << level_power;
  const int64_t level_mask = level_step - 1;
  f8v acc[LEVELS][ACCUMULATORS] = {};
  auto add_group = [&](int64_t g) {
    for (int64_t k = 0; k < ACCUMULATORS; ++k) {
      const f8v v = load(x + (g * ACCUMULATORS + k) * LANES);
      acc[0][k] += v * v;
    }
  };
  int64_t g = 0;
  while (g + level_step <= groups) {
    for (int64_t j = 0; j < level_step; ++j, ++g) add_group(g);
    for (int64_t level = 1; level < LEVELS; ++level) {
      for (int64_t k = 0; k < ACCUMULATORS; ++k) {
        acc[level][k] += acc[level - 1][k];
        acc[level - 1][k] = f8v{};
      }
      if ((g & (level_mask << (level * level_power))) != 0) break;
    }
  }
  for (; g < groups; ++g) add_group(g);
  for (int64_t level = 1; level < LEVELS; ++level) {
    for (int64_t k = 0; k < ACCUMULATORS; ++k) acc[0][k] += acc[level][k];
  }
  f8v partial = acc[0][0];
  for (int64_t k = 1; k < ACCUMULATORS; ++k) partial += acc[0][k];
  float sum = 0.0f;
  for (int64_t lane = 0; lane < LANES; ++lane) sum += partial[lane];
  return sum;
}

}  // namespace

// x: [T, n], weight: [n] float32 contiguous, n % 32 == 0 -> x * rsqrt(mean(x^2) + eps) * weight [T, n].
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x must be [T, n] contiguous float32");
  const int64_t T = x.size(0), n = x.size(1);
  TORCH_CHECK(n % (LANES * ACCUMULATORS) == 0 && n > 0, "n must be a positive multiple of 32");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == n && weight.scalar_type() == torch::kFloat32 && weight.is_contiguous(), "weight must be [n] contiguous float32");
  auto out = torch::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float epsilon = static_cast<float>(eps);  // torch adds the Python float as a float32 scalar
  at::parallel_for(0, T, ROWS_PER_TASK, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* row = xp + t * n;
      const float mean = sum_of_squares(row, n) / static_cast<float>(n);
      const float r = 1.0f / std::sqrt(mean + epsilon);
      for (int64_t i = 0; i < n; i += LANES) {
        const f8v scaled = load(row + i) * r;
        const f8v y = scaled * load(wp + i);
        std::memcpy(op + t * n + i, &y, sizeof(y));
      }
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "x * rsqrt(mean(x^2) + eps) * weight over rows, as torch's float32 rms_norm", py::call_guard<py::gil_scoped_release>());
}
