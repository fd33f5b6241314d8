// Work split over torch's intra-op threads in chunks that a free thread takes next (shared by the
// C++ kernels of engine/kernels).
//
// at::parallel_for gives each thread a fixed share; when the OS preempts one (on the CPU the engine
// shares its cores with the server's processes), the others finish their shares and wait at the
// end of the region for it. Here each thread takes the next chunk from an atomic counter when it
// finishes one, so a preempted thread holds up one chunk, and items of unequal cost (sequences of
// different lengths) balance themselves. Which thread computes an item never changes its result.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

constexpr int64_t CHUNKS_PER_THREAD = 8;

// f(begin, end) over [0, count) in chunks of about count / (threads * CHUNKS_PER_THREAD) items.
template <typename F>
void parallel_chunks(int64_t count, const F& f) {
  const int64_t threads = at::get_num_threads();
  const int64_t chunk = std::max<int64_t>(1, count / (threads * CHUNKS_PER_THREAD));
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t begin = next.fetch_add(chunk); begin < count; begin = next.fetch_add(chunk)) f(begin, std::min(count, begin + chunk));
  });
}
