// UserError: the one exception type for mistakes a user can fix (a bad config value, a
// mesh that does not match the world size, a missing environment variable). Its message
// names the offending thing and the fix; the command-line tool maps it to exit code 2.
// Everything else (a peer that died, a bug) surfaces as another exception type and exit 1.
#pragma once

#include <stdexcept>
#include <string>

namespace hyperparallel {

class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& message) : std::runtime_error(message) {}
};

// Exit codes the command-line tool uses.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUserError = 2;

}  // namespace hyperparallel
