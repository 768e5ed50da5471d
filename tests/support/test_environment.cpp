// The test binary's environment: tokenized-data caches (src/train/tokenized_cache.h) go to a
// folder of this test process, removed at its end, so tests neither read nor fill the user's
// ~/.cache. Rank processes and CLI runs the tests start inherit the folder (XDG_CACHE_HOME),
// so ranks of one test share it as a job's ranks would.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace {

class CacheFolder : public ::testing::Environment {
 public:
  void SetUp() override {
    if (std::getenv("HP_TEST_CACHE_OWNER")) return;  // a process a test started: its parent's folder
    std::string pattern = ::testing::TempDir() + "hp_test_cache_XXXXXX";
    if (!::mkdtemp(pattern.data())) return;
    folder_ = pattern;
    ::setenv("XDG_CACHE_HOME", folder_.c_str(), 1);
    ::setenv("HP_TEST_CACHE_OWNER", std::to_string(::getpid()).c_str(), 1);
  }
  void TearDown() override {
    std::error_code ec;
    if (!folder_.empty()) std::filesystem::remove_all(folder_, ec);
  }

 private:
  std::string folder_;
};

const ::testing::Environment* const kCacheFolder = ::testing::AddGlobalTestEnvironment(new CacheFolder);

}  // namespace
