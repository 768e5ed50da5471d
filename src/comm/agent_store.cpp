// The store address through torchrun's agent store. See agent_store.h.
#include "agent_store.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::comm {

std::string agent_store_key(const std::string& run_id, const std::string& restart_count) {
  return "hyperparallel/store_address/" + run_id + "/" + restart_count;
}

StoreAddress exchange_through_agent_store(const StoreAddress& agent, const std::string& key, int rank, const StoreAddress& ours,
                                          std::chrono::milliseconds timeout) {
  const std::string where = agent.host + ":" + std::to_string(agent.port);
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(agent.port);
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = timeout;
  try {
    c10d::TCPStore store(agent.host, options);
    if (rank == 0) {
      const std::string text = ours.host + ":" + std::to_string(ours.port);
      store.set(key, std::vector<uint8_t>(text.begin(), text.end()));
      return ours;
    }
    const std::vector<uint8_t> value = store.get(key);  // waits for rank 0, up to the timeout
    const std::string text(value.begin(), value.end());
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0) throw UserError("torchrun's agent store at " + where + " holds '" + text + "' under " + key);
    return {text.substr(0, colon), std::stoi(text.substr(colon + 1))};
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) {
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(timeout).count();
    throw UserError("rank " + std::to_string(rank) + ": torchrun's agent store at " + where +
                    (rank == 0 ? " could not be reached" : " did not give rank 0's store address within " + std::to_string(seconds) + " s") +
                    " (TORCHELASTIC_USE_AGENT_STORE=True; " + e.what() + ")");
  }
}

}  // namespace hyperparallel::comm
