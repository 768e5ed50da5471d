// Collective bandwidth through the Communicator next to raw c10d Gloo, in one run, on the
// same ranks at the same moment: every measurement alternates ours / raw so both see the
// same machine load. Run through the launcher: scripts/bench_comm.sh does 2 and 4 ranks.
//
// Raw baselines are what a user would write on c10d directly: ProcessGroupGloo::allgather
// into views of one flat buffer, allreduce, broadcast, alltoall_base; Gloo has no
// reduce-scatter, so its baseline is alltoall_base followed by a sum over ranks.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator_impl.h"
#include "hyperparallel/comm/rendezvous.h"

using namespace hyperparallel;

namespace {

double time_once(comm::Communicator& c, const std::function<void()>& op) {
  c.barrier().wait();
  const auto t0 = std::chrono::steady_clock::now();
  op();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Case {
  std::string name;
  std::function<void()> ours;
  std::function<void()> raw;
};

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  auto world = comm::init_process_group(comm::rendezvous_info_from_env());
  auto& c = *world;
  auto pg = c.impl().group;
  const int n = c.size();
  if (c.rank() == 0) {
    std::printf("| ranks | collective | MiB | ours ms | raw c10d ms | ours GB/s (bus) | overhead (median) | overhead (best) |\n");
    std::printf("|---|---|---|---|---|---|---|---|\n");
  }
  for (int mib : {1, 4, 16, 64}) {
    const int64_t numel = (static_cast<int64_t>(mib) << 20) / 4 / n * n;
    at::Tensor full = at::ones({numel});
    at::Tensor shard = at::ones({numel / n});
    at::Tensor scratch = at::empty({numel});
    std::vector<int64_t> even;
    std::vector<Case> cases;
    cases.push_back({"all_gather", [&] { c.all_gather(full, shard).wait(); },
                     [&] {
                       std::vector<std::vector<at::Tensor>> out{full.chunk(n)};
                       std::vector<at::Tensor> in{shard};
                       pg->allgather(out, in)->wait();
                     }});
    cases.push_back({"reduce_scatter", [&] { c.reduce_scatter(shard, full).wait(); },
                     [&] {
                       pg->alltoall_base(scratch, full, even, even)->wait();
                       at::sum_out(shard, scratch.view({n, -1}), 0);
                     }});
    cases.push_back({"all_reduce", [&] { c.all_reduce(full).wait(); },
                     [&] {
                       std::vector<at::Tensor> t{full};
                       pg->allreduce(t)->wait();
                     }});
    cases.push_back({"broadcast", [&] { c.broadcast(full, 0).wait(); },
                     [&] {
                       std::vector<at::Tensor> t{full};
                       pg->broadcast(t)->wait();
                     }});
    cases.push_back({"all_to_all", [&] { c.all_to_all(scratch, full).wait(); },
                     [&] { pg->alltoall_base(scratch, full, even, even)->wait(); }});
    for (auto& k : cases) {
      k.ours();  // warm-up both paths
      k.raw();
      std::vector<double> ours, raw;
      for (int r = 0; r < rounds; ++r) {
        ours.push_back(time_once(c, k.ours));
        raw.push_back(time_once(c, k.raw));
      }
      // Every rank's median would differ slightly; report rank 0's.
      const double o = median(ours), w = median(raw);
      const double o_best = *std::min_element(ours.begin(), ours.end());
      const double w_best = *std::min_element(raw.begin(), raw.end());
      double bus = 1.0;
      if (k.name == "all_gather" || k.name == "reduce_scatter" || k.name == "all_to_all") bus = (n - 1.0) / n;
      if (k.name == "all_reduce") bus = 2.0 * (n - 1.0) / n;
      if (c.rank() == 0) {
        std::printf("| %d | %s | %d | %.2f | %.2f | %.3f | %+.1f%% | %+.1f%% |\n", n, k.name.c_str(), mib, o * 1e3,
                    w * 1e3, numel * 4.0 / o / 1e9 * bus, (o / w - 1.0) * 100.0, (o_best / w_best - 1.0) * 100.0);
        std::fflush(stdout);
      }
    }
  }
  c.barrier().wait();
  return 0;
}
