// silu(gate) * up from a bfloat16 tile of [gate | up] to a bfloat16 tile, in one pass (see
// engine/kernels/silu_mul.py): the MLP activation of prompt rows that the bfloat16 tiles compute
// (engine/models/prompt_tiles.py), between the gate/up tile's output and the down tile's input.
//
// Each output is computed in float32 from its own gate and up values alone (silu(g) = g * s, s the
// logistic of g from one exp of -|g|), then rounded once to bfloat16, to nearest even: the value
// does not depend on the row's neighbours or on how rows are split over threads.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>

#include "vector_exp.h"

namespace {

typedef uint32_t u32v __attribute__((vector_size(LANES * 4)));
typedef uint16_t u16v __attribute__((vector_size(LANES * 2)));

inline f32v widen(const uint16_t* p) {
  u16v half;
  std::memcpy(&half, p, sizeof(half));
  return (f32v)(__builtin_convertvector(half, u32v) << 16);
}

// Rounded to the nearest bfloat16, ties to even; a NaN stays a (quiet) NaN.
inline void narrow(f32v v, uint16_t* p) {
  const u32v bits = (u32v)v;
  const u32v rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const u32v out = v != v ? u32v{} + 0x7FC0u : rounded;
  const u16v half = __builtin_convertvector(out, u16v);
  std::memcpy(p, &half, sizeof(half));
}

inline f32v silu_times(f32v gate, f32v up) {
  const f32v e = exp_nonpositive(gate < splat(0.0f) ? gate : -gate);  // exp(-|gate|), in (0, 1]
  const f32v logistic = (gate < splat(0.0f) ? e : splat(1.0f)) / (splat(1.0f) + e);  // one division: e/(1+e) or 1/(1+e)
  return gate * logistic * up;
}

}  // namespace

// gate_up: [R, 2I] bfloat16 (gate in columns 0..I-1, up in I..2I-1; rows any stride apart) ->
// out: [R, I] bfloat16 (rows any stride apart), written in place.
void silu_mul_bf16(torch::Tensor gate_up, torch::Tensor out) {
  TORCH_CHECK(gate_up.dim() == 2 && out.dim() == 2 && gate_up.scalar_type() == torch::kBFloat16 && out.scalar_type() == torch::kBFloat16,
              "gate_up [R, 2I] and out [R, I], bfloat16");
  const int64_t R = gate_up.size(0), I = out.size(1);
  TORCH_CHECK(out.size(0) == R && gate_up.size(1) == 2 * I && I % LANES == 0, "I must be a multiple of 16, out [R, I] for gate_up [R, 2I]");
  TORCH_CHECK(gate_up.stride(1) == 1 && out.stride(1) == 1, "rows must be contiguous");
  const uint16_t* in = reinterpret_cast<const uint16_t*>(gate_up.data_ptr<at::BFloat16>());
  uint16_t* result = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const int64_t in_row = gate_up.stride(0), out_row = out.stride(0);
  at::parallel_for(0, R, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint16_t* gate = in + r * in_row;
      for (int64_t i = 0; i < I; i += LANES) narrow(silu_times(widen(gate + i), widen(gate + I + i)), result + r * out_row + i);
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("silu_mul_bf16", &silu_mul_bf16, "silu(gate) * up, bfloat16 [R, 2I] -> [R, I] in place", py::call_guard<py::gil_scoped_release>());
}
