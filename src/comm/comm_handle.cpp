#include "hyperparallel/comm/comm_handle.h"

namespace hyperparallel::comm {

CommHandle::CommHandle(std::unique_ptr<PendingWork> work) : work_(std::move(work)) {}
CommHandle::CommHandle(CommHandle&&) noexcept = default;
CommHandle& CommHandle::operator=(CommHandle&&) noexcept = default;
CommHandle::~CommHandle() = default;

void CommHandle::wait(std::optional<std::chrono::milliseconds> timeout) {
  if (!work_) return;
  // Release the work even when it throws: a failed collective is not retried.
  std::unique_ptr<PendingWork> work = std::move(work_);
  work->wait(timeout);
}

bool CommHandle::is_completed() const { return !work_ || work_->is_completed(); }

}  // namespace hyperparallel::comm
