// Collectives over c10d Gloo. See communicator.h for the contract, docs/comm.md for why
// each collective is built the way it is.
#include "hyperparallel/comm/communicator.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <thread>

#include "byte_transport.h"
#include "communicator_impl.h"
#include "group_registry.h"
#include "hyperparallel/platform/fault_injection.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::comm {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "unknown";
}

// ---- PendingWork over c10d ------------------------------------------------------------

void wait_work(const c10::intrusive_ptr<c10d::Work>& work, std::chrono::milliseconds timeout,
               const std::string& what) {
  try {
    work->wait(timeout);
  } catch (const std::exception& e) {
    throw CommError(what + " failed: " + e.what() +
                    " (a peer may have exited, or is not calling the same collective)");
  }
}

WirePendingWork::WirePendingWork(std::vector<c10::intrusive_ptr<c10d::Work>> works,
                                 std::function<void()> finish, std::string what,
                                 std::chrono::milliseconds default_timeout,
                                 std::shared_ptr<std::atomic<int64_t>> wait_ns,
                                 std::shared_ptr<platform::TraceRecorder> trace,
                                 std::function<std::string()> diagnose)
    : works_(std::move(works)), finish_(std::move(finish)), what_(std::move(what)),
      default_timeout_(default_timeout), wait_ns_(std::move(wait_ns)), trace_(std::move(trace)),
      diagnose_(std::move(diagnose)) {}

WirePendingWork::~WirePendingWork() {
  if (order_) order_->remove(this);
}

void WirePendingWork::order_finish_in(std::shared_ptr<OrderedFinishes> order) {
  order_ = std::move(order);
  order_->enqueue(this);
}

void WirePendingWork::wait(std::optional<std::chrono::milliseconds> timeout) {
  if (order_) {
    order_->complete_before(this, timeout);
    order_->remove(this);
    order_ = nullptr;
  }
  complete(timeout);
}

void OrderedFinishes::enqueue(WirePendingWork* work) { queue_.push_back(work); }

void OrderedFinishes::remove(WirePendingWork* work) {
  queue_.erase(std::remove(queue_.begin(), queue_.end(), work), queue_.end());
}

void OrderedFinishes::complete_before(WirePendingWork* work, std::optional<std::chrono::milliseconds> timeout) {
  while (!queue_.empty() && queue_.front() != work) {
    WirePendingWork* earlier = queue_.front();
    queue_.erase(queue_.begin());
    earlier->leave_order();
    earlier->complete(timeout);  // its own wait() later finds nothing left to do
  }
}

void WirePendingWork::complete(std::optional<std::chrono::milliseconds> timeout) {
  // Every return and throw counts the time spent here.
  struct Account {
    WirePendingWork& work;
    std::chrono::steady_clock::time_point started;
    ~Account() {
      const auto now = std::chrono::steady_clock::now();
      *work.wait_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(now - started).count();
      if (work.trace_) {
        const std::string op = work.what_.substr(0, work.what_.find(" (rank"));
        work.trace_->span(op, "comm", work.issued_, now);
        work.trace_->span("wait " + op, "wait", started, now);
      }
    }
  } account{*this, std::chrono::steady_clock::now()};
  const auto limit = timeout.value_or(default_timeout_);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  if (posted_.valid()) {
    if (posted_.wait_until(deadline) != std::future_status::ready) {
      throw CommError(what_ + " failed: its transfers were not posted within " + std::to_string(limit.count()) +
                      " ms (a peer may have exited, or is not calling the same collective)");
    }
    works_ = posted_.get();  // rethrows what posting threw (a CommError from issue())
    posted_ = {};
  }
  for (auto& work : works_) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      wait_work(work, std::max(left, std::chrono::milliseconds(1)), what_);
    } catch (const CommError& e) {
      const std::string culprits = diagnose_ ? diagnose_() : "";
      if (culprits.empty()) throw;
      throw CommError(std::string(e.what()) + "; " + culprits);
    }
  }
  works_.clear();
  if (finish_) {
    auto finish = std::move(finish_);
    finish_ = nullptr;
    finish();
  }
}

bool WirePendingWork::is_completed() {
  if (posted_.valid()) {
    if (posted_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
    try {
      works_ = posted_.get();
    } catch (...) {
      return true;  // posting failed: wait() reports it
    }
    posted_ = {};
  }
  for (auto& work : works_) {
    if (!work->isCompleted()) return false;
  }
  return true;
}

// ---- Communicator ------------------------------------------------------------------------

namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
    default: return c10d::ReduceOp::SUM;  // avg = sum, then divide locally
  }
}

int64_t bytes_of(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

}  // namespace

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

int Communicator::rank() const { return impl_->rank; }
int Communicator::size() const { return static_cast<int>(impl_->global_ranks.size()); }
const std::string& Communicator::name() const { return impl_->name; }
const std::vector<int>& Communicator::global_ranks() const { return impl_->global_ranks; }
int Communicator::global_rank() const { return impl_->global_ranks[impl_->rank]; }
const CommOptions& Communicator::options() const { return impl_->options; }

void Communicator::set_trace(std::shared_ptr<platform::TraceRecorder> trace) { impl_->trace = std::move(trace); }

double Communicator::wait_seconds() const { return static_cast<double>(impl_->wait_ns->load()) * 1e-9; }

CommCounters Communicator::counters() const {
  std::lock_guard<std::mutex> lock(impl_->counters_mutex);
  return impl_->counters;
}

void Communicator::reset_counters() {
  std::lock_guard<std::mutex> lock(impl_->counters_mutex);
  impl_->counters = CommCounters{};
}

std::shared_ptr<Communicator> Communicator::group(const std::vector<int>& global_ranks,
                                                  const std::string& name) {
  return impl_->registry->get_or_create(global_ranks, name);
}

namespace {

// "all_gather on group 'dp_shard' (rank 1 of 4)"
std::string describe(const Communicator& c, const char* op) {
  return std::string(op) + " on group '" + c.name() + "' (rank " + std::to_string(c.rank()) + " of " +
         std::to_string(c.size()) + ")";
}

void record(Communicator::Impl& impl, CollectiveKind kind, int64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(impl.counters_mutex);
    impl.counters.record(kind, bytes);
  }
  if (impl.options.faults) impl.options.faults->pass(to_string(kind), impl.global_ranks[impl.rank]);
  if (impl.options.inject_delay_max_ms > 0) {
    // xorshift, seeded by the world rank: each rank delays differently, reproducibly.
    uint64_t& x = impl.delay_rng_state;
    if (x == 0) x = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(impl.global_ranks[impl.rank] + 1);
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::this_thread::sleep_for(std::chrono::milliseconds(x % static_cast<uint64_t>(impl.options.inject_delay_max_ms + 1)));
  }
}

// Gloo reports a connection broken by a dead peer again when the next operation on it is
// issued, synchronously; give that the same message and verdict on the peers as a failure
// seen in wait().
template <class Start>
auto issue(const Communicator::Impl& impl, const std::string& what, Start&& start) -> decltype(start()) {
  try {
    return start();
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    std::string message = what + " failed: " + e.what() + " (a peer may have exited, or is not calling the same collective)";
    if (impl.registry && impl.registry->liveness()) {
      const std::string culprits = impl.registry->liveness()->describe_unresponsive(impl.global_ranks);
      if (!culprits.empty()) message += "; " + culprits;
    }
    throw CommError(message);
  }
}

std::unique_ptr<WirePendingWork> make_wire_work(std::vector<c10::intrusive_ptr<c10d::Work>> works, std::function<void()> finish,
                                                const std::string& what, const Communicator::Impl& impl) {
  std::function<std::string()> diagnose;
  if (impl.registry && impl.registry->liveness()) {
    diagnose = [liveness = impl.registry->liveness(), ranks = impl.global_ranks] { return liveness->describe_unresponsive(ranks); };
  }
  return std::make_unique<WirePendingWork>(std::move(works), std::move(finish), what, impl.options.timeout, impl.wait_ns,
                                           impl.trace, std::move(diagnose));
}

// `finish_uses_wire`: the finishing step issues more transfers, so it runs in issue order
// (OrderedFinishes).
CommHandle make_handle(std::vector<c10::intrusive_ptr<c10d::Work>> works, std::function<void()> finish,
                       const std::string& what, const Communicator::Impl& impl, bool finish_uses_wire = false) {
  auto work = make_wire_work(std::move(works), std::move(finish), what, impl);
  if (finish_uses_wire) work->order_finish_in(impl.ordered_finishes);
  return CommHandle(std::move(work));
}

// Point-to-point transfers posted on the communicator's PostThread (post_thread.h): `post`
// runs there, after everything posted before it, and its failure reaches the caller's wait().
CommHandle make_posted_handle(Communicator::Impl& impl, const std::string& what, std::function<PostThread::Works()> post,
                              std::function<void()> finish) {
  auto work = make_wire_work({}, std::move(finish), what, impl);
  work->set_posted(impl.post_thread.post([&impl, what, post = std::move(post)] { return issue(impl, what, post); }));
  return CommHandle(std::move(work));
}

CommHandle make_handle(c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish,
                       const std::string& what, const Communicator::Impl& impl, bool finish_uses_wire = false) {
  std::vector<c10::intrusive_ptr<c10d::Work>> works{std::move(work)};
  return make_handle(std::move(works), std::move(finish), what, impl, finish_uses_wire);
}

void check_user_tag(int tag, const std::string& what) {
  if (tag < 0 || tag >= Communicator::Impl::kInternalTagBase) {
    throw UserError(what + ": tag " + std::to_string(tag) + " is outside [0, 2^30); larger tags are reserved");
  }
}

void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  if (a.scalar_type() != b.scalar_type()) {
    throw UserError(what + ": output dtype " + std::string(c10::toString(a.scalar_type())) +
                    " differs from input dtype " + std::string(c10::toString(b.scalar_type())));
  }
}

void check_peer(int peer, int size, const std::string& what, const char* role) {
  if (peer < 0 || peer >= size) {
    throw UserError(what + ": " + role + " rank " + std::to_string(peer) + " is outside the group (size " +
                    std::to_string(size) + ")");
  }
}

}  // namespace

CommHandle Communicator::all_gather(const at::Tensor& output, const at::Tensor& input) {
  return all_gather_blocks(output, input, {input.defined() ? input.numel() : 0});
}

namespace {

int64_t sum_of(const std::vector<int64_t>& v) {
  int64_t total = 0;
  for (int64_t x : v) total += x;
  return total;
}

void check_blocks(const std::vector<int64_t>& blocks, const at::Tensor& shard, const at::Tensor& unsharded, int n,
                  const std::string& what, const char* shard_role, const char* unsharded_role) {
  for (int64_t b : blocks) {
    if (b < 0) throw UserError(what + ": block sizes must be >= 0");
  }
  const int64_t total = sum_of(blocks);
  if (shard.numel() != total) {
    throw UserError(what + ": " + shard_role + " has " + std::to_string(shard.numel()) + " elements, expected " +
                    std::to_string(total) + " (the sum of the block sizes)");
  }
  if (unsharded.numel() != total * n) {
    throw UserError(what + ": " + unsharded_role + " has " + std::to_string(unsharded.numel()) +
                    " elements, expected " + std::to_string(n) + " x " + std::to_string(total) + " input elements");
  }
}


// Point-to-point tags for `count` blocks, the same sequence on every rank (SPMD order).
uint32_t reserve_tags(Communicator::Impl& impl, int count) {
  const uint32_t first = impl.internal_p2p_seq;
  impl.internal_p2p_seq += static_cast<uint32_t>(count);
  return first;
}

int internal_tag(uint32_t first, int k) {
  return Communicator::Impl::kInternalTagBase + static_cast<int>((first + static_cast<uint32_t>(k)) % (1u << 29));
}

// Walks the blocks of a blocked collective: block k is `piece` bytes at `shard_offset` of the
// shard, and its n pieces (rank-major) start at `full_offset` of the unsharded buffer.
template <class Fn>
void for_each_block(const std::vector<int64_t>& block_numels, int64_t esize, int n, Fn&& fn) {
  int64_t shard_offset = 0, full_offset = 0;
  for (size_t k = 0; k < block_numels.size(); ++k) {
    const int64_t piece = block_numels[k] * esize;
    fn(static_cast<int>(k), piece, shard_offset, full_offset);
    shard_offset += piece;
    full_offset += n * piece;
  }
}

// The point-to-point exchange under all_gather_blocks (not counted: callers count).
std::vector<c10::intrusive_ptr<c10d::Work>> gather_pieces(Communicator::Impl& impl, const at::Tensor& in_bytes,
                                                          const at::Tensor& out_bytes,
                                                          const std::vector<int64_t>& block_numels, int64_t esize,
                                                          uint32_t first_tag) {
  const int n = static_cast<int>(impl.global_ranks.size());
  const int me = impl.rank;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for_each_block(block_numels, esize, n, [&](int k, int64_t piece, int64_t shard_offset, int64_t out_offset) {
    const int tag = internal_tag(first_tag, k);
    at::Tensor mine = in_bytes.narrow(0, shard_offset, piece);
    for (int j = 1; j < n && piece > 0; ++j) {
      const int dst = (me + j) % n, src = (me - j + n) % n;
      std::vector<at::Tensor> send{mine};
      std::vector<at::Tensor> recv{out_bytes.narrow(0, out_offset + src * piece, piece)};
      works.push_back(impl.group->recv(recv, src, tag));
      works.push_back(impl.group->send(send, dst, tag));
    }
    at::Tensor my_slot = out_bytes.narrow(0, out_offset + me * piece, piece);
    if (piece > 0 && my_slot.data_ptr() != mine.data_ptr()) my_slot.copy_(mine);
  });
  return works;
}

}  // namespace

CommHandle Communicator::all_gather_blocks(const at::Tensor& unsharded, const at::Tensor& shard,
                                           const std::vector<int64_t>& block_numels) {
  const std::string what = describe(*this, "all_gather");
  check_transportable(shard, what, "input");
  check_transportable(unsharded, what, "output");
  check_same_dtype(unsharded, shard, what);
  const int n = size();
  check_blocks(block_numels, shard, unsharded, n, what, "input", "output");
  const int64_t esize = static_cast<int64_t>(shard.element_size());
  record(*impl_, CollectiveKind::kAllGather, (n - 1) * bytes_of(shard));
  if (shard.numel() == 0) return CommHandle();
  // Every rank sends its pieces to every other rank and receives each peer's pieces straight
  // into their places in the output: the ring's (n-1) shards on the wire, no staging buffer
  // and no copy-out (Gloo's own allgather stages through a fresh buffer; docs/comm.md).
  // Posted off the calling thread (post_thread.h); the tags are drawn here, in program order.
  const uint32_t first_tag = reserve_tags(*impl_, static_cast<int>(block_numels.size()));
  Impl* impl = impl_.get();
  return make_posted_handle(*impl_, what, [impl, in = flat_bytes(shard), out = flat_bytes(unsharded), block_numels, esize, first_tag] {
    return gather_pieces(*impl, in, out, block_numels, esize, first_tag);
  }, nullptr);
}

CommHandle Communicator::reduce_scatter_blocks(const at::Tensor& shard, const at::Tensor& unsharded,
                                               const std::vector<int64_t>& block_numels, ReduceOp op) {
  if (block_numels.size() == 1) return reduce_scatter(shard, unsharded, op);  // already rank-major
  const std::string what = describe(*this, "reduce_scatter");
  check_transportable(unsharded, what, "input");
  check_transportable(shard, what, "output");
  check_same_dtype(shard, unsharded, what);
  check_reducible(unsharded.scalar_type(), op, what);
  const int n = size();
  check_blocks(block_numels, shard, unsharded, n, what, "output", "input");
  record(*impl_, CollectiveKind::kReduceScatter, (n - 1) * bytes_of(shard));
  if (shard.numel() == 0) return CommHandle();
  // Rank j's pieces are scattered over the blocks of my input: send them piece by piece; every
  // peer's pieces for me land back to back in row `peer` of a warm scratch buffer, my own are
  // copied into row `me`, and the rows are reduced in rank order (same bits on every rank).
  const int64_t esize = static_cast<int64_t>(shard.element_size());
  const int64_t shard_bytes = bytes_of(shard);
  at::Tensor scratch = impl_->scratch->acquire(n * shard_bytes);
  at::Tensor in_bytes = flat_bytes(unsharded);
  const int me = rank();
  const uint32_t first_tag = reserve_tags(*impl_, static_cast<int>(block_numels.size()));
  // Posted off the calling thread (post_thread.h), which meanwhile copies its own pieces.
  Impl* impl = impl_.get();
  auto post = [impl, n, me, in_bytes, scratch, block_numels, esize, shard_bytes, first_tag] {
    PostThread::Works works;
    for_each_block(block_numels, esize, n, [&](int k, int64_t piece, int64_t shard_offset, int64_t in_offset) {
      const int tag = internal_tag(first_tag, k);
      for (int j = 1; j < n && piece > 0; ++j) {
        const int dst = (me + j) % n, src = (me - j + n) % n;
        std::vector<at::Tensor> send{in_bytes.narrow(0, in_offset + dst * piece, piece)};
        std::vector<at::Tensor> recv{scratch.narrow(0, src * shard_bytes + shard_offset, piece)};
        works.push_back(impl->group->recv(recv, src, tag));
        works.push_back(impl->group->send(send, dst, tag));
      }
    });
    return works;
  };
  at::Tensor rows = scratch.view(shard.scalar_type()).view({n, shard.numel()});
  auto finish = [pool = impl_->scratch, scratch, rows, shard, op] {
    reduce_rows_in_rank_order(rows, op, shard);
    pool->release(scratch);
  };
  CommHandle handle = make_posted_handle(*impl_, what, post, finish);
  // My own pieces go into row `me` while the transfers are posted; finish reads them in wait().
  for_each_block(block_numels, esize, n, [&](int, int64_t piece, int64_t shard_offset, int64_t in_offset) {
    if (piece > 0) scratch.narrow(0, me * shard_bytes + shard_offset, piece).copy_(in_bytes.narrow(0, in_offset + me * piece, piece));
  });
  return handle;
}

CommHandle Communicator::reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  const std::string what = describe(*this, "reduce_scatter");
  check_transportable(input, what, "input");
  check_transportable(output, what, "output");
  check_same_dtype(output, input, what);
  check_reducible(input.scalar_type(), op, what);
  const int n = size();
  if (input.numel() != output.numel() * n) {
    throw UserError(what + ": input has " + std::to_string(input.numel()) + " elements, expected " +
                    std::to_string(n) + " x " + std::to_string(output.numel()) + " output elements");
  }
  record(*impl_, CollectiveKind::kReduceScatter, (n - 1) * bytes_of(output));
  if (output.numel() == 0) return CommHandle();
  // All-to-all: chunk j of my input goes to rank j; I receive every rank's chunk `rank()`
  // into a warm scratch buffer, then reduce the rows in rank order into `output`.
  at::Tensor recv = impl_->scratch->acquire(bytes_of(input));
  at::Tensor received = recv.view(input.scalar_type()).view({n, output.numel()});
  at::Tensor send = flat_bytes(input);
  std::vector<int64_t> even;
  auto finish = [pool = impl_->scratch, recv, received, output, op] {
    reduce_rows_in_rank_order(received, op, output);
    pool->release(recv);
  };
  auto work = issue(*impl_, what, [&] { return impl_->group->alltoall_base(recv, send, even, even); });
  return make_handle(std::move(work), finish, what, *impl_);
}

CommHandle Communicator::all_reduce(const at::Tensor& tensor, ReduceOp op) {
  const std::string what = describe(*this, "all_reduce");
  check_transportable(tensor, what, "input");
  check_reducible(tensor.scalar_type(), op, what);
  const int n = size();
  const int64_t shard = (tensor.numel() + n - 1) / n;
  record(*impl_, CollectiveKind::kAllReduce, 2 * (n - 1) * shard * static_cast<int64_t>(tensor.element_size()));
  if (tensor.numel() == 0) return CommHandle();

  if (gloo_reduces_natively(tensor.scalar_type())) {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    auto work = issue(*impl_, what, [&] { return impl_->group->allreduce(tensors, opts); });
    std::function<void()> finish;
    if (op == ReduceOp::kAvg) finish = [tensor, n] { tensor.div_(static_cast<double>(n)); };
    return make_handle(std::move(work), finish, what, *impl_);
  }

  // bf16 / fp16 / bool / int16: reduce-scatter as bytes, reduce locally in the accumulation
  // dtype in rank order, cast once, all-gather the reduced shards as bytes. Ring bytes.
  at::Tensor padded = tensor.view({-1});
  if (shard * n != tensor.numel()) {
    padded = at::zeros({shard * n}, tensor.options());
    padded.narrow(0, 0, tensor.numel()).copy_(tensor.view({-1}));
  }
  const int64_t shard_bytes = shard * static_cast<int64_t>(tensor.element_size());
  at::Tensor recv = impl_->scratch->acquire(n * shard_bytes);
  at::Tensor received = recv.view(tensor.scalar_type()).view({n, shard});
  at::Tensor send = flat_bytes(padded);
  std::vector<int64_t> even;
  auto work = issue(*impl_, what, [&] { return impl_->group->alltoall_base(recv, send, even, even); });
  const int me = rank();
  Impl* impl = impl_.get();  // a Communicator outlives the handles it returns
  // The all-gather phase's tag is drawn now, at issue, so it is the same on every rank
  // whatever order handles are waited in.
  const uint32_t gather_tag = reserve_tags(*impl_, 1);
  auto finish = [impl, what, recv, received, padded, tensor, shard, me, op, gather_tag]() {
    at::Tensor mine = padded.narrow(0, me * shard, shard);
    reduce_rows_in_rank_order(received, op, mine);
    impl->scratch->release(recv);
    // The all-gather phase: my reduced slot is the input, in place.
    const int64_t esize = static_cast<int64_t>(padded.element_size());
    const auto works = issue(*impl, what, [&] { return gather_pieces(*impl, flat_bytes(mine), flat_bytes(padded), {shard}, esize, gather_tag); });
    for (auto& w : works) {
      wait_work(w, impl->options.timeout, what + " (all-gather phase)");
    }
    if (padded.data_ptr() != tensor.data_ptr()) tensor.view({-1}).copy_(padded.narrow(0, 0, tensor.numel()));
  };
  return make_handle(std::move(work), finish, what, *impl_, /*finish_uses_wire=*/true);
}

CommHandle Communicator::broadcast(const at::Tensor& tensor, int root) {
  const std::string what = describe(*this, "broadcast");
  check_transportable(tensor, what, "input");
  check_peer(root, size(), what, "root");
  record(*impl_, CollectiveKind::kBroadcast, rank() == root ? (size() - 1) * bytes_of(tensor) : 0);
  if (tensor.numel() == 0) return CommHandle();
  std::vector<at::Tensor> tensors{flat_bytes(tensor)};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  auto work = issue(*impl_, what, [&] { return impl_->group->broadcast(tensors, opts); });
  return make_handle(std::move(work), nullptr, what, *impl_);
}

CommHandle Communicator::all_to_all(const at::Tensor& output, const at::Tensor& input,
                                    const std::vector<int64_t>& output_splits,
                                    const std::vector<int64_t>& input_splits) {
  const std::string what = describe(*this, "all_to_all");
  check_transportable(input, what, "input");
  check_transportable(output, what, "output");
  check_same_dtype(output, input, what);
  const int n = size();
  const int64_t in_rows = input.dim() == 0 ? 1 : input.size(0);
  const int64_t out_rows = output.dim() == 0 ? 1 : output.size(0);
  // Row widths from the dims after the first, so a rank that sends or receives no rows still
  // takes part (every rank must issue the collective).
  auto row_elems = [](const at::Tensor& t) {
    int64_t elems = 1;
    for (int64_t d = 1; d < t.dim(); ++d) elems *= t.size(d);
    return elems;
  };
  const int64_t row_elems_in = row_elems(input);
  const int64_t row_elems_out = row_elems(output);
  if (row_elems_in != row_elems_out) {
    throw UserError(what + ": input rows hold " + std::to_string(row_elems_in) + " elements but output rows hold " +
                    std::to_string(row_elems_out) + "; dims after the first must match");
  }
  auto check_splits = [&](const std::vector<int64_t>& splits, int64_t rows, const char* role) {
    if (splits.empty()) {
      if (rows % n != 0) {
        throw UserError(what + ": " + role + " has " + std::to_string(rows) + " rows, not divisible by " +
                        std::to_string(n) + " ranks; pass " + role + "_splits");
      }
      return std::vector<int64_t>(n, rows / n);
    }
    if (static_cast<int>(splits.size()) != n) {
      throw UserError(what + ": " + role + "_splits has " + std::to_string(splits.size()) + " entries, expected " +
                      std::to_string(n));
    }
    int64_t sum = 0;
    for (int64_t s : splits) {
      if (s < 0) throw UserError(what + ": " + role + "_splits has a negative entry");
      sum += s;
    }
    if (sum != rows) {
      throw UserError(what + ": " + role + "_splits sum to " + std::to_string(sum) + " but the " + role + " has " +
                      std::to_string(rows) + " rows");
    }
    return splits;
  };
  std::vector<int64_t> in_splits = check_splits(input_splits, in_rows, "input");
  std::vector<int64_t> out_splits = check_splits(output_splits, out_rows, "output");
  const int64_t row_bytes = row_elems_in * static_cast<int64_t>(input.element_size());
  int64_t sent = 0;
  for (int j = 0; j < n; ++j) {
    if (j != rank()) sent += in_splits[j] * row_bytes;
  }
  record(*impl_, CollectiveKind::kAllToAll, sent);
  if (row_bytes == 0) return CommHandle();
  at::Tensor send = flat_bytes(input).view({in_rows, row_bytes});
  at::Tensor recv = flat_bytes(output).view({out_rows, row_bytes});
  auto work = issue(*impl_, what, [&] { return impl_->group->alltoall_base(recv, send, out_splits, in_splits); });
  return make_handle(std::move(work), nullptr, what, *impl_);
}

CommHandle Communicator::send(const at::Tensor& tensor, int dst, int tag) {
  const std::string what = describe(*this, "send");
  check_transportable(tensor, what, "input");
  check_user_tag(tag, what);
  check_peer(dst, size(), what, "destination");
  record(*impl_, CollectiveKind::kSend, bytes_of(tensor));
  std::vector<at::Tensor> tensors{flat_bytes(tensor)};
  auto work = issue(*impl_, what, [&] { return impl_->group->send(tensors, dst, tag); });
  return make_handle(std::move(work), nullptr, what, *impl_);
}

CommHandle Communicator::recv(const at::Tensor& tensor, int src, int tag) {
  const std::string what = describe(*this, "recv");
  check_transportable(tensor, what, "output");
  check_user_tag(tag, what);
  check_peer(src, size(), what, "source");
  record(*impl_, CollectiveKind::kRecv, bytes_of(tensor));
  std::vector<at::Tensor> tensors{flat_bytes(tensor)};
  auto work = issue(*impl_, what, [&] { return impl_->group->recv(tensors, src, tag); });
  return make_handle(std::move(work), nullptr, what, *impl_);
}

CommHandle Communicator::barrier() {
  const std::string what = describe(*this, "barrier");
  record(*impl_, CollectiveKind::kBarrier, 0);
  auto work = issue(*impl_, what, [&] { return impl_->group->barrier(); });
  return make_handle(std::move(work), nullptr, what, *impl_);
}

}  // namespace hyperparallel::comm
