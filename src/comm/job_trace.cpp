#include "hyperparallel/comm/job_trace.h"

#include <ATen/ATen.h>

#include <cstring>

namespace hyperparallel::comm {

std::string gather_job_trace(Communicator& world, const platform::TraceRecorder& trace) {
  constexpr int kTag = 1;
  const std::string mine = trace.json_events(world.rank());
  at::Tensor lengths = at::empty({world.size()}, at::kLong);
  world.all_gather(lengths, at::tensor({static_cast<int64_t>(mine.size())}, at::kLong)).wait();
  if (world.rank() != 0) {
    if (mine.empty()) return "";
    at::Tensor bytes = at::empty({static_cast<int64_t>(mine.size())}, at::kByte);
    std::memcpy(bytes.data_ptr(), mine.data(), mine.size());
    world.send(bytes, 0, kTag).wait();
    return "";
  }
  std::string all = mine;
  for (int r = 1; r < world.size(); ++r) {
    const int64_t length = lengths[r].item<int64_t>();
    if (length == 0) continue;
    at::Tensor bytes = at::empty({length}, at::kByte);
    world.recv(bytes, r, kTag).wait();
    all += (all.empty() ? "" : ",\n") + std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(length));
  }
  return "{\"traceEvents\":[\n" + all + "\n]}\n";
}

}  // namespace hyperparallel::comm
