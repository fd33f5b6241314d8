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
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "parallel_chunks.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t LANES = 16;
constexpr int64_t MAX_CHUNKS = 16;  // head_dim up to 256

typedef float f32v __attribute__((vector_size(LANES * 4)));
typedef int32_t i32v __attribute__((vector_size(LANES * 4)));

inline f32v load(const float* p) {
  f32v v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store(float* p, f32v v) { std::memcpy(p, &v, sizeof(v)); }

inline f32v splat(float x) { return f32v{} + x; }

// The 16 lanes added in a fixed order (the same tree of shuffles whatever the caller).
inline float lane_sum(f32v v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps((__m512)v);
#else
  float s = 0.0f;
  for (int64_t i = 0; i < LANES; ++i) s += v[i];
  return s;
#endif
}

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

// q . k over CHUNKS * LANES dimensions.
template <int64_t CHUNKS>
inline float dot(const float* q, const float* k) {
  f32v acc = load(q) * load(k);
  for (int64_t c = 1; c < CHUNKS; ++c) acc += load(q + c * LANES) * load(k + c * LANES);
  return lane_sum(acc);
}

// Where position p of the item's sequence keeps its row for the kv head: the first of D floats.
struct Rows {
  const float* cache;
  const int64_t* table;
  int64_t block_size, row_stride, head_offset;

  const float* at(int64_t p) const { return cache + (table[p / block_size] * block_size + p % block_size) * row_stride + head_offset; }
};

// scores[g * L + p] = scale * q_g . k_p for the G query heads of the item.
template <int64_t CHUNKS>
void item_scores(const float* q, int64_t G, const Rows& keys, int64_t L, float scale, float* scores) {
  for (int64_t p = 0; p < L; ++p) {
    const float* k = keys.at(p);
    for (int64_t g = 0; g < G; ++g) scores[g * L + p] = dot<CHUNKS>(q + g * CHUNKS * LANES, k) * scale;
  }
}

// weights[0..L) = exp(scores - max), in place; returns their sum (added in position order).
float item_softmax(float* weights, int64_t L) {
  float max = weights[0];
  for (int64_t p = 1; p < L; ++p) max = std::max(max, weights[p]);
  int64_t p = 0;
  for (; p + LANES <= L; p += LANES) store(weights + p, exp_nonpositive(load(weights + p) - max));
  if (p < L) {  // the tail through a padded vector: every position's weight from the same function
    float tail[LANES];
    std::fill(tail, tail + LANES, -INFINITY);
    std::copy(weights + p, weights + L, tail);
    store(tail, exp_nonpositive(load(tail) - max));
    std::copy(tail, tail + (L - p), weights + p);
  }
  float sum = 0.0f;
  for (p = 0; p < L; ++p) sum += weights[p];
  return sum;
}

// out[0..D) = sum_p weights[p] * v_p / sum, the CHUNKS accumulators in registers.
template <int64_t CHUNKS>
void item_values(const float* weights, float sum, const Rows& values, int64_t L, float* out) {
  f32v acc[CHUNKS] = {};
  for (int64_t p = 0; p < L; ++p) {
    const float* v = values.at(p);
    f32v w = splat(weights[p]);
    for (int64_t c = 0; c < CHUNKS; ++c) acc[c] += w * load(v + c * LANES);
  }
  for (int64_t c = 0; c < CHUNKS; ++c) store(out + c * LANES, acc[c] / splat(sum));
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
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / KVH, kv_head = item % KVH, L = len_data[b];
      const Rows keys{k_data, table_data + b * N, block_size, KVH * D, kv_head * D};
      const Rows values{v_data, table_data + b * N, block_size, KVH * D, kv_head * D};
      const int64_t head = kv_head * G * D;  // the item's G query heads are consecutive
      scores.resize(G * L);
      item_scores<CHUNKS>(q_data + b * q_row + head, G, keys, L, static_cast<float>(scale), scores.data());
      for (int64_t g = 0; g < G; ++g) {
        float sum = item_softmax(scores.data() + g * L, L);
        item_values<CHUNKS>(scores.data() + g * L, sum, values, L, out_data + b * H * D + head + g * D);
      }
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
