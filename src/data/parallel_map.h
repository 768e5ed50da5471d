// parallel_map: fn(i) for every i in [0, n) on up to `threads` threads, results in order.
// Each thread takes one contiguous range, so the work is deterministic whatever the thread
// count; when calls throw, the exception of the lowest i is rethrown (the one a serial loop
// would have met first) after every thread has stopped. fn must be safe to call concurrently
// (the Tokenizer's encode and a ChatTemplate's render are).
#pragma once

#include <algorithm>
#include <exception>
#include <thread>
#include <vector>

namespace hyperparallel::data {

template <typename T, typename Fn>
std::vector<T> parallel_map(size_t n, int threads, Fn fn) {
  std::vector<T> out(n);
  const size_t workers = std::max<size_t>(1, std::min<size_t>(n, static_cast<size_t>(std::max(1, threads))));
  std::vector<std::exception_ptr> errors(workers);
  const auto run = [&](size_t w) {
    const size_t begin = n * w / workers, end = n * (w + 1) / workers;
    try {
      for (size_t i = begin; i < end; ++i) out[i] = fn(i);
    } catch (...) {
      errors[w] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (size_t w = 1; w < workers; ++w) pool.emplace_back(run, w);
  run(0);
  for (auto& t : pool) t.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return out;
}

}  // namespace hyperparallel::data
