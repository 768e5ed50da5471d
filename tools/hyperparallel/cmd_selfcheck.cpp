// hyperparallel selfcheck: the built-in default job until the trainer lands. Started
// without a rank environment it launches N local ranks of itself; as a rank it checks every
// collective of the communication layer for exact results (several dtypes, sizes that do
// not divide by the world size) and then measures each collective's bandwidth.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <stdexcept>

#include "commands.h"
#include "hyperparallel/comm/rendezvous.h"
#include "hyperparallel/launch/process_launcher.h"

namespace hyperparallel::cli {
namespace {

using comm::Communicator;
using comm::ReduceOp;

void expect_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  if (!at::equal(got, want)) throw std::runtime_error("selfcheck: " + what + " gave a wrong result");
}

// Exactness checks; every value is an integer so every reduction order gives the same bits.
void check_collectives(Communicator& c) {
  const int n = c.size(), r = c.rank();
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kLong}) {
    const auto opt = at::TensorOptions().dtype(dtype);
    const std::string name = c10::toString(dtype);
    const int64_t m = 7;  // not divisible by most world sizes
    // all_gather
    at::Tensor in = at::arange(m, opt) + 10 * r;
    at::Tensor out = at::empty({n * m}, opt);
    c.all_gather(out, in).wait();
    expect_equal(out, (at::arange(m, opt).repeat({n}) +
                       10 * at::arange(n, opt).repeat_interleave(m)), "all_gather " + name);
    // reduce_scatter (sum)
    at::Tensor big = at::arange(n * m, opt) + r;
    at::Tensor shard = at::empty({m}, opt);
    c.reduce_scatter(shard, big).wait();
    expect_equal(shard, n * at::arange(r * m, (r + 1) * m, opt) + n * (n - 1) / 2, "reduce_scatter " + name);
    // all_reduce sum and max, on a size that does not divide
    at::Tensor t = at::arange(m, opt) * (r + 1);
    c.all_reduce(t, ReduceOp::kSum).wait();
    expect_equal(t, at::arange(m, opt) * (n * (n + 1) / 2), "all_reduce sum " + name);
    at::Tensor mx = at::full({m}, r, opt);
    c.all_reduce(mx, ReduceOp::kMax).wait();
    expect_equal(mx, at::full({m}, n - 1, opt), "all_reduce max " + name);
    // broadcast from the last rank
    at::Tensor b = r == n - 1 ? at::arange(m, opt) : at::zeros({m}, opt);
    c.broadcast(b, n - 1).wait();
    expect_equal(b, at::arange(m, opt), "broadcast " + name);
    // all_to_all with uneven splits: rank r sends j+1 rows of value 10r+j to rank j
    std::vector<int64_t> in_splits, out_splits;
    std::vector<at::Tensor> parts, want_parts;
    for (int j = 0; j < n; ++j) {
      in_splits.push_back(j + 1);
      out_splits.push_back(r + 1);
      parts.push_back(at::full({j + 1, 3}, 10 * r + j, opt));
      want_parts.push_back(at::full({r + 1, 3}, 10 * j + r, opt));
    }
    at::Tensor a2a_out = at::empty({n * (r + 1), 3}, opt);
    c.all_to_all(a2a_out, at::cat(parts), out_splits, in_splits).wait();
    expect_equal(a2a_out, at::cat(want_parts), "all_to_all " + name);
  }
  // avg and send/recv on fp32
  at::Tensor avg = at::full({5}, 2.0 * c.rank());
  c.all_reduce(avg, ReduceOp::kAvg).wait();
  expect_equal(avg, at::full({5}, static_cast<double>(n - 1)), "all_reduce avg");
  if (n > 1) {
    at::Tensor token = at::full({4}, static_cast<float>(r));
    at::Tensor got = at::empty({4});
    auto s = c.send(token, (r + 1) % n, 7);
    auto v = c.recv(got, (r + n - 1) % n, 7);
    s.wait();
    v.wait();
    expect_equal(got, at::full({4}, static_cast<float>((r + n - 1) % n)), "send/recv");
  }
  c.barrier().wait();
}

double seconds_per_call(Communicator& c, const std::function<comm::CommHandle()>& issue, int iters) {
  issue().wait();  // warm-up
  c.barrier().wait();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) issue().wait();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
}

void print_bandwidth(Communicator& c, int64_t bytes) {
  const int n = c.size();
  const int64_t numel = bytes / 4 / n * n;
  at::Tensor full = at::ones({numel});
  at::Tensor shard = at::ones({numel / n});
  const int iters = 5;
  struct Row {
    const char* name;
    double seconds;
    double bus_factor;  // busbw = algbw * factor (NCCL-tests convention)
  };
  std::vector<Row> rows = {
      {"all_gather", seconds_per_call(c, [&] { return c.all_gather(full, shard); }, iters), (n - 1.0) / n},
      {"reduce_scatter", seconds_per_call(c, [&] { return c.reduce_scatter(shard, full); }, iters), (n - 1.0) / n},
      {"all_reduce", seconds_per_call(c, [&] { return c.all_reduce(full); }, iters), 2.0 * (n - 1.0) / n},
      {"all_reduce bf16", 0, 2.0 * (n - 1.0) / n},
      {"broadcast", seconds_per_call(c, [&] { return c.broadcast(full, 0); }, iters), 1.0},
      {"all_to_all", 0, (n - 1.0) / n},
  };
  at::Tensor full_bf16 = at::ones({numel * 2}, at::kBFloat16);  // same bytes
  rows[3].seconds = seconds_per_call(c, [&] { return c.all_reduce(full_bf16); }, iters);
  at::Tensor a2a_out = at::empty({numel});
  rows[5].seconds = seconds_per_call(c, [&] { return c.all_to_all(a2a_out, full); }, iters);
  if (c.rank() != 0) return;
  std::printf("\ncollective bandwidth, %d ranks, %.1f MiB per call (busbw: NCCL-tests convention)\n", n,
              static_cast<double>(numel * 4) / (1 << 20));
  std::printf("%-16s %10s %12s %12s\n", "collective", "time ms", "algbw GB/s", "busbw GB/s");
  for (const auto& row : rows) {
    const double algbw = static_cast<double>(numel * 4) / row.seconds / 1e9;
    std::printf("%-16s %10.2f %12.3f %12.3f\n", row.name, row.seconds * 1e3, algbw, algbw * row.bus_factor);
  }
  std::fflush(stdout);
}

}  // namespace

int selfcheck_command(const Args& args) {
  int nproc = 4;
  int size_mib = 16;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string v;
    if (take_option(args, i, "--nproc-per-node", v)) {
      nproc = parse_int_option("--nproc-per-node", v, 1);
    } else if (take_option(args, i, "--size-mib", v)) {
      size_mib = parse_int_option("--size-mib", v, 1);
    } else {
      throw std::invalid_argument("unknown option " + args[i] + "; options: --nproc-per-node N, --size-mib S");
    }
  }
  if (!std::getenv("RANK")) {
    launch::LaunchSpec spec;
    spec.nproc_per_node = nproc;
    spec.command = {self_executable(), "selfcheck", "--size-mib", std::to_string(size_mib)};
    std::cout << "selfcheck: starting " << nproc << " local ranks" << std::endl;
    const auto result = launch::launch_ranks(spec);
    if (!result.summary.empty()) std::cerr << "hyperparallel selfcheck: " << result.summary << "\n";
    return result.exit_code;
  }
  auto world = comm::init_process_group(comm::rendezvous_info_from_env());
  check_collectives(*world);
  if (world->rank() == 0) {
    std::cout << "all collectives exact on " << world->size()
              << " ranks (fp32, bf16, fp16, int64; uneven sizes and splits)" << std::endl;
  }
  print_bandwidth(*world, static_cast<int64_t>(size_mib) << 20);
  world->barrier().wait();
  if (world->rank() == 0) std::cout << "selfcheck passed" << std::endl;
  return 0;
}

}  // namespace hyperparallel::cli
