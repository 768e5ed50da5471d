#include "group_registry.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <set>
#include <sstream>

#include "communicator_impl.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::comm {

GroupRegistry::GroupRegistry(c10::intrusive_ptr<c10d::Store> store,
                             std::shared_ptr<::gloo::transport::Device> device, int world_rank,
                             int world_size, CommOptions options, std::shared_ptr<void> keep_alive)
    : store_(std::move(store)),
      device_(std::move(device)),
      world_rank_(world_rank),
      world_size_(world_size),
      options_(options),
      keep_alive_(std::move(keep_alive)) {}

std::shared_ptr<Communicator> GroupRegistry::get_or_create(const std::vector<int>& global_ranks,
                                                           const std::string& name) {
  std::ostringstream list;
  for (size_t i = 0; i < global_ranks.size(); ++i) list << (i ? "," : "") << global_ranks[i];
  if (global_ranks.empty()) throw UserError("group '" + name + "': the rank list is empty");
  std::set<int> unique(global_ranks.begin(), global_ranks.end());
  if (unique.size() != global_ranks.size()) {
    throw UserError("group '" + name + "': rank list [" + list.str() + "] repeats a rank");
  }
  for (int r : global_ranks) {
    if (r < 0 || r >= world_size_) {
      throw UserError("group '" + name + "': rank " + std::to_string(r) + " is outside the world (size " +
                      std::to_string(world_size_) + ")");
    }
  }
  auto me = std::find(global_ranks.begin(), global_ranks.end(), world_rank_);
  if (me == global_ranks.end()) {
    throw UserError("group '" + name + "': this process (world rank " + std::to_string(world_rank_) +
                    ") is not a member of [" + list.str() + "]; only members create a group");
  }

  std::lock_guard<std::mutex> lock(mutex_);
  Entry& entry = groups_[global_ranks];
  if (auto existing = entry.comm.lock()) return existing;

  const std::string prefix = "hp/group/" + list.str() + "/" + std::to_string(entry.generation++);
  auto options = c10d::ProcessGroupGloo::Options::create(options_.timeout);
  options->devices.push_back(device_);
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, store_);

  auto impl = std::make_unique<Communicator::Impl>();
  impl->rank = static_cast<int>(me - global_ranks.begin());
  try {
    impl->group = c10::make_intrusive<c10d::ProcessGroupGloo>(
        prefixed, impl->rank, static_cast<int>(global_ranks.size()), options);
    // No member returns before every member has connected. Without this a fast member could
    // finish its work, drop the group and close its sockets while a slower one was still
    // connecting, which the slower one reports as "connection closed by peer" (c10d's
    // new_group ends with a store-based barrier for the same reason). The barrier goes to the
    // c10d group directly, so the group's collective counters start at zero.
    impl->group->barrier()->wait();
  } catch (const std::exception& e) {
    throw CommError("creating group '" + name + "' [" + list.str() + "] failed: " + e.what());
  }
  impl->registry = shared_from_this();
  impl->global_ranks = global_ranks;
  impl->name = name;
  impl->options = options_;
  auto comm = std::make_shared<Communicator>(std::move(impl));
  entry.comm = comm;
  return comm;
}

}  // namespace hyperparallel::comm
