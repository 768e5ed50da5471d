#include "post_thread.h"

namespace hyperparallel::comm {

PostThread::~PostThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_one();
  if (thread_.joinable()) thread_.join();
}

std::shared_future<PostThread::Works> PostThread::post(std::function<Works()> post) {
  std::packaged_task<Works()> task(std::move(post));
  std::shared_future<Works> result = task.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  queued_.notify_one();
  return result;
}

void PostThread::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    queued_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything queued is posted
    std::packaged_task<Works()> task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();  // an exception lands in the task's future
    lock.lock();
  }
}

}  // namespace hyperparallel::comm
