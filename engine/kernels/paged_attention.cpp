// Paged-attention decode: one query token per sequence attends the sequence's first seq_lens[b]
// positions, read in place from the paged KV cache through its block table (see
// engine/models/llama.py, engine/kernels/paged_attention.py).
//
// Layout: q, out [B, H, D] (q's sequences may be any stride apart, each one's heads contiguous);
// key_cache, value_cache [num_blocks, block_size, KVH, D], all float32 and contiguous; block_tables [B, N] (position p of sequence b is slot p % block_size of block
// block_tables[b, p / block_size]); seq_lens [B]. The H / KVH query heads of a kv head share it.
//
// One work item is a (sequence, kv head): for each of its query heads, scores over positions
// 0..L-1 in order (each a dot product over D: CHUNKS partial sums of LANES lanes, then the lanes
// added by a fixed tree), their max, exp(score - max) and its sum in position order, then the sum
// of exp-weighted V rows in position order, divided by the sum. Nothing in an item depends on B,
// on the other sequences or on how the items are split over threads: a sequence's output is the
// same alone and in any batch.
//
// How it goes fast without changing a bit: an item finds its positions' rows block by block once
// (no division per position); it adds the lanes of 16 scores at once, the same tree for each score
// done across 16 vectors (`lane_sums`) instead of one reduction per score; and it sums V rows and
// softmax weights for up to 4 query heads in one pass over the positions, each head's accumulators
// still taking the positions in order. Measured in docs/engine.md.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "parallel_chunks.h"
#include "vector_exp.h"

namespace {

constexpr int64_t MAX_CHUNKS = 16;  // head_dim up to 256

inline f32v load(const float* p) {
  f32v v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store(float* p, f32v v) { std::memcpy(p, &v, sizeof(v)); }

// Lane j of the result is the sum of v[j]'s 16 lanes, by one fixed tree whatever j: with h8[i] =
// v[i] + v[i+8], h4[i] = h8[i] + h8[i+4], h2[i] = h4[i] + h4[i+2], the sum is h2[0] + h2[1] (the tree
// of _mm512_reduce_add_ps), each level done for several vectors at once by pairing their halves.
inline f32v lane_sums(const f32v (&v)[LANES]) {
  f32v h8[8], h4[4], h2[2];
  for (int i = 0; i < 8; ++i)  // lanes 0-7: v[2i]'s h8, lanes 8-15: v[2i+1]'s
    h8[i] = __builtin_shufflevector(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
            __builtin_shufflevector(v[2 * i], v[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 4; ++i)  // four lanes each of v[4i .. 4i+3]'s h4
    h4[i] = __builtin_shufflevector(h8[2 * i], h8[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
            __builtin_shufflevector(h8[2 * i], h8[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)  // two lanes each of v[8i .. 8i+7]'s h2
    h2[i] = __builtin_shufflevector(h4[2 * i], h4[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
            __builtin_shufflevector(h4[2 * i], h4[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return __builtin_shufflevector(h2[0], h2[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(h2[0], h2[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

// q . k over CHUNKS * LANES dimensions, lane by lane: the lanes still to add.
template <int64_t CHUNKS>
inline f32v dot_lanes(const float* q, const float* k) {
  f32v acc = load(q) * load(k);
  for (int64_t c = 1; c < CHUNKS; ++c) acc += load(q + c * LANES) * load(k + c * LANES);
  return acc;
}

// rows[p]: where position p of an item's sequence keeps its row in a cache (in floats, before the
// kv head's offset), for p in [0, L): block_table's blocks of block_size positions in order.
void position_rows(const int64_t* block_table, int64_t L, int64_t block_size, int64_t row_stride, std::vector<int64_t>& rows) {
  rows.resize(L);
  for (int64_t first = 0, i = 0; first < L; first += block_size, ++i) {
    const int64_t base = block_table[i] * block_size * row_stride, end = std::min(L, first + block_size);
    for (int64_t p = first; p < end; ++p) rows[p] = base + (p - first) * row_stride;
  }
}

// scores[p] = scale * q . k_p for p in [0, L), 16 positions at a time; returns their max.
template <int64_t CHUNKS>
float head_scores(const float* q, const float* keys, const int64_t* rows, int64_t L, float scale, float* scores) {
  f32v largest = splat(-INFINITY);
  for (int64_t p0 = 0; p0 < L; p0 += LANES) {
    const int64_t n = std::min(LANES, L - p0);
    f32v acc[LANES];
    for (int64_t j = 0; j < LANES; ++j) acc[j] = j < n ? dot_lanes<CHUNKS>(q, keys + rows[p0 + j]) : f32v{};
    f32v sums = lane_sums(acc) * splat(scale);
    for (int64_t j = n; j < LANES; ++j) sums[j] = -INFINITY;  // the tail's lanes take no part in the max
    largest = largest > sums ? largest : sums;
    if (n == LANES) {
      store(scores + p0, sums);
    } else {
      std::copy(reinterpret_cast<const float*>(&sums), reinterpret_cast<const float*>(&sums) + n, scores + p0);
    }
  }
  float max = largest[0];
  for (int64_t j = 1; j < LANES; ++j) max = std::max(max, largest[j]);
  return max;
}

// weights[0..L) = exp(weights - max), in place.
void head_exp(float* weights, int64_t L, float max) {
  int64_t p = 0;
  for (; p + LANES <= L; p += LANES) store(weights + p, exp_nonpositive(load(weights + p) - max));
  if (p < L) {  // the tail through a padded vector: every position's weight from the same function
    float tail[LANES];
    std::fill(tail, tail + LANES, -INFINITY);
    std::copy(weights + p, weights + L, tail);
    store(tail, exp_nonpositive(load(tail) - max));
    std::copy(tail, tail + (L - p), weights + p);
  }
}

// For NG query heads g: out[g * D ..] = sum_p weights[g * L + p] * v_p / sum_p weights[g * L + p],
// both sums in position order, the heads' accumulators in registers through one pass over the positions.
template <int64_t CHUNKS, int64_t NG>
void heads_values(const float* weights, const float* values, const int64_t* rows, int64_t L, float* out) {
  f32v acc[NG][CHUNKS] = {};
  float sum[NG] = {};
  for (int64_t p = 0; p < L; ++p) {
    const float* v = values + rows[p];
    for (int64_t g = 0; g < NG; ++g) {
      const float weight = weights[g * L + p];
      sum[g] += weight;
      for (int64_t c = 0; c < CHUNKS; ++c) acc[g][c] += splat(weight) * load(v + c * LANES);
    }
  }
  for (int64_t g = 0; g < NG; ++g)
    for (int64_t c = 0; c < CHUNKS; ++c) store(out + g * CHUNKS * LANES + c * LANES, acc[g][c] / splat(sum[g]));
}

// heads_values for G heads, in passes of as many heads as fit the registers (at most 4).
template <int64_t CHUNKS>
void item_values(const float* weights, const float* values, const int64_t* rows, int64_t L, int64_t G, float* out) {
  constexpr int64_t PASS = std::max<int64_t>(1, std::min<int64_t>(4, 16 / CHUNKS));
  constexpr int64_t D = CHUNKS * LANES;
  int64_t g = 0;
  for (; g + PASS <= G; g += PASS) heads_values<CHUNKS, PASS>(weights + g * L, values, rows, L, out + g * D);
  for (; g < G; ++g) heads_values<CHUNKS, 1>(weights + g * L, values, rows, L, out + g * D);
}

template <int64_t CHUNKS>
void decode(const torch::Tensor& q, const torch::Tensor& key_cache, const torch::Tensor& value_cache, const torch::Tensor& tables,
            const torch::Tensor& seq_lens, double scale, torch::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), q_row = q.stride(0);
  const int64_t block_size = key_cache.size(1), KVH = key_cache.size(2), N = tables.size(1), G = H / KVH;
  const float* q_data = q.data_ptr<float>();
  const float* k_data = key_cache.data_ptr<float>();
  const float* v_data = value_cache.data_ptr<float>();
  const int64_t* table_data = tables.data_ptr<int64_t>();
  const int64_t* len_data = seq_lens.data_ptr<int64_t>();
  float* out_data = out.data_ptr<float>();
  parallel_chunks(B * KVH, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<int64_t> rows;
    int64_t rows_of = -1;  // the sequence `rows` holds: a sequence's kv heads are consecutive items and share them
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / KVH, kv_head = item % KVH, L = len_data[b];
      if (b != rows_of) position_rows(table_data + b * N, L, block_size, KVH * D, rows), rows_of = b;
      const float* keys = k_data + kv_head * D;
      const float* values = v_data + kv_head * D;
      const int64_t head = kv_head * G * D;  // the item's G query heads are consecutive
      scores.resize(G * L);
      for (int64_t g = 0; g < G; ++g) {
        float* weights = scores.data() + g * L;
        head_exp(weights, L, head_scores<CHUNKS>(q_data + b * q_row + head + g * D, keys, rows.data(), L, static_cast<float>(scale), weights));
      }
      item_values<CHUNKS>(scores.data(), values, rows.data(), L, G, out_data + b * H * D + head);
    }
  });
}

template <int64_t... C>
void dispatch(std::integer_sequence<int64_t, C...>, int64_t chunks, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
              const torch::Tensor& tables, const torch::Tensor& seq_lens, double scale, torch::Tensor& out) {
  ((chunks == C + 1 ? decode<C + 1>(q, k, v, tables, seq_lens, scale, out) : void()), ...);
}

// Every length in 1..N * block_size, every block a sequence reads within the cache.
void check_bounds(const torch::Tensor& tables, const torch::Tensor& lens, int64_t num_blocks, int64_t block_size) {
  const int64_t N = tables.size(1);
  const int64_t* table = tables.data_ptr<int64_t>();
  const int64_t* len = lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < lens.size(0); ++b) {
    TORCH_CHECK(len[b] >= 1 && len[b] <= N * block_size, "seq_lens[", b, "] = ", len[b], " not in 1..", N * block_size);
    for (int64_t i = 0; i < (len[b] + block_size - 1) / block_size; ++i)
      TORCH_CHECK(table[b * N + i] >= 0 && table[b * N + i] < num_blocks, "block_tables[", b, ", ", i, "] not a block of the cache");
  }
}

}  // namespace

torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor key_cache, torch::Tensor value_cache, torch::Tensor block_tables,
                                     torch::Tensor seq_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && key_cache.dim() == 4 && block_tables.dim() == 2 && seq_lens.dim() == 1, "q [B, H, D], caches [blocks, block_size, KVH, D], block_tables [B, N], seq_lens [B]");
  TORCH_CHECK(q.scalar_type() == torch::kFloat && key_cache.scalar_type() == torch::kFloat && value_cache.scalar_type() == torch::kFloat, "float32 only");
  TORCH_CHECK(q.device().is_cpu() && key_cache.device().is_cpu() && value_cache.device().is_cpu(), "CPU tensors only");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous() && key_cache.sizes() == value_cache.sizes(), "contiguous caches of one shape");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), KVH = key_cache.size(2);
  TORCH_CHECK(key_cache.size(3) == D && D % LANES == 0 && D / LANES <= MAX_CHUNKS, "head_dim a multiple of 16, at most 256, as the cache's");
  TORCH_CHECK(KVH > 0 && H % KVH == 0, "query heads a multiple of kv heads");
  TORCH_CHECK(block_tables.size(0) == B && seq_lens.size(0) == B, "one block table and length per sequence");
  torch::Tensor tables = block_tables.to(torch::kLong).contiguous();
  torch::Tensor lens = seq_lens.to(torch::kLong).contiguous();
  check_bounds(tables, lens, key_cache.size(0), key_cache.size(1));
  // A sequence's heads contiguous, sequences any stride apart (q rotated in place in a merged projection's output).
  torch::Tensor queries = q.stride(2) == 1 && q.stride(1) == D ? q : q.contiguous();
  torch::Tensor out = torch::empty({B, H, D}, q.options());
  dispatch(std::make_integer_sequence<int64_t, MAX_CHUNKS>{}, D / LANES, queries, key_cache, value_cache, tables, lens, scale, out);
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention, "q [B, H, D] attends its sequence's paged keys and values -> [B, H, D]", py::call_guard<py::gil_scoped_release>());
}
