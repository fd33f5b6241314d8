// Rotary embedding of a step's queries and keys, and the keys and values written into the paged
// KV cache, in one call (see engine/kernels/rope_cache.py, engine/models/llama.py).
//
// Layout: q [T, H, D], k and v [T, KVH, D], each token's heads contiguous but tokens any stride apart
// (column views of one merged projection's output), cos and sin [P, D] (HF's half-split tables: entry i
// and i + D/2 hold the same angle), positions, blocks and offsets [T] int64, key_cache and
// value_cache [num_blocks, block_size, KVH, D]; all float32, the tables and caches contiguous.
//
// Element i of a rotated head x at position p is x[i] * cos[p, i] + r[i] * sin[p, i] with
// r[i] = -x[i + D/2] for i < D/2 and x[i - D/2] after: two products rounded, then their sum
// rounded, as torch's `x * cos + rotated_half * sin` computes it (contraction into a fused
// multiply-add is turned off below), so the result is torch's bit for bit.
#pragma GCC optimize("fp-contract=off")
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>

namespace {

constexpr int64_t TOKENS_PER_TASK = 16;

// One head x [D] at a position's tables, into out [D] (out may be x).
void rotate(const float* x, const float* cos, const float* sin, int64_t D, float* out) {
  const int64_t half = D / 2;
  float rotated[512];
  for (int64_t i = 0; i < half; ++i) {
    rotated[i] = x[i] * cos[i] + (-x[i + half]) * sin[i];
    rotated[i + half] = x[i + half] * cos[i + half] + x[i] * sin[i + half];
  }
  std::memcpy(out, rotated, D * sizeof(float));
}

void check_float(const torch::Tensor& t, int64_t dims, const char* name) {
  TORCH_CHECK(t.dim() == dims && t.scalar_type() == torch::kFloat32 && t.is_contiguous(), name, " must be a contiguous float32 tensor of ", dims, " dims");
}

// [T, heads, D] float32 whose heads are contiguous within a token; tokens may be any stride apart.
void check_token_rows(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 3 && t.scalar_type() == torch::kFloat32 && t.stride(2) == 1 && t.stride(1) == t.size(2),
              name, " must be float32 [T, heads, D] with each token's heads contiguous");
}

void check_index(const torch::Tensor& t, int64_t T, const char* name) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == T && t.scalar_type() == torch::kInt64 && t.is_contiguous(), name, " must be [T] int64");
}

}  // namespace

// Rotates q in place; writes rotated k and v at (blocks[t], offsets[t]) of the caches.
void rope_and_write_cache(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor cos, torch::Tensor sin, torch::Tensor positions,
                          torch::Tensor blocks, torch::Tensor offsets, torch::Tensor key_cache, torch::Tensor value_cache) {
  check_token_rows(q, "q");
  check_token_rows(k, "k");
  check_token_rows(v, "v");
  check_float(cos, 2, "cos");
  check_float(sin, 2, "sin");
  check_float(key_cache, 4, "key_cache");
  check_float(value_cache, 4, "value_cache");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), KVH = k.size(1);
  TORCH_CHECK(D % 2 == 0 && D <= 512, "head_dim must be even and at most 512");
  TORCH_CHECK(k.size(0) == T && v.sizes() == k.sizes() && k.size(2) == D, "k and v must be [T, KVH, D]");
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.size(1) == D, "cos and sin must be [P, D]");
  TORCH_CHECK(key_cache.sizes() == value_cache.sizes() && key_cache.size(2) == KVH && key_cache.size(3) == D, "caches must be [num_blocks, block_size, KVH, D]");
  check_index(positions, T, "positions");
  check_index(blocks, T, "blocks");
  check_index(offsets, T, "offsets");
  const int64_t P = cos.size(0), num_blocks = key_cache.size(0), block_size = key_cache.size(1);
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* blk = blocks.data_ptr<int64_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(pos[t] >= 0 && pos[t] < P, "position ", pos[t], " is outside the rotary tables");
    TORCH_CHECK(blk[t] >= 0 && blk[t] < num_blocks && off[t] >= 0 && off[t] < block_size, "cache slot outside the cache");
  }
  float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const int64_t q_row = q.stride(0), k_row = k.stride(0), v_row = v.stride(0);
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  float* kc = key_cache.data_ptr<float>();
  float* vc = value_cache.data_ptr<float>();
  at::parallel_for(0, T, TOKENS_PER_TASK, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cp + pos[t] * D;
      const float* s = sp + pos[t] * D;
      for (int64_t h = 0; h < H; ++h) rotate(qp + t * q_row + h * D, c, s, D, qp + t * q_row + h * D);
      const int64_t slot = (blk[t] * block_size + off[t]) * KVH * D;
      for (int64_t h = 0; h < KVH; ++h) rotate(kp + t * k_row + h * D, c, s, D, kc + slot + h * D);
      std::memcpy(vc + slot, vp + t * v_row, KVH * D * sizeof(float));
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rope_and_write_cache", &rope_and_write_cache, "rotate q in place, write rotated k and v into the paged cache", py::call_guard<py::gil_scoped_release>());
}
