// Rendezvous reads torchrun-, Open MPI- and Slurm-style variables, with clear errors; real
// ranks rendezvous through each style; an unreachable master fails within the timeout.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <map>

#include "hyperparallel/comm/rendezvous.h"
#include "hyperparallel/launch/free_port.h"
#include "hyperparallel/platform/user_error.h"
#include "support/multiprocess.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace hyperparallel {
namespace {

using comm::rendezvous_info_from_env;

comm::EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string error_of(std::map<std::string, std::string> vars) {
  try {
    rendezvous_info_from_env(env_of(std::move(vars)));
  } catch (const UserError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Rendezvous, TorchrunVariables) {
  const auto info = rendezvous_info_from_env(env_of({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                                     {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "node0"},
                                                     {"MASTER_PORT", "1234"}}));
  EXPECT_EQ(info.source, "torchrun");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(info.master_addr, "node0");
  EXPECT_EQ(info.master_port, 1234);
}

TEST(Rendezvous, OpenMpiVariables) {
  const auto info = rendezvous_info_from_env(env_of({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                                                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}));
  EXPECT_EQ(info.source, "Open MPI");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 3);
  EXPECT_EQ(info.master_addr, "127.0.0.1");  // single node: the default master
  EXPECT_EQ(info.master_port, 29500);
}

TEST(Rendezvous, SlurmVariables) {
  const auto info = rendezvous_info_from_env(env_of({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"},
                                                     {"SLURM_LOCALID", "2"}, {"SLURM_NNODES", "2"},
                                                     {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29400"}}));
  EXPECT_EQ(info.source, "Slurm");
  EXPECT_EQ(info.rank, 6);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 2);
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(info.master_addr, "10.0.0.1");
  EXPECT_EQ(info.master_port, 29400);
}

TEST(Rendezvous, TorchrunWinsOverOthersAndNothingMeansOneProcess) {
  EXPECT_EQ(rendezvous_info_from_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"SLURM_PROCID", "3"},
                                             {"SLURM_NTASKS", "4"}}))
                .source,
            "torchrun");
  const auto none = rendezvous_info_from_env(env_of({}));
  EXPECT_EQ(none.world_size, 1);
  EXPECT_EQ(none.rank, 0);
}

TEST(Rendezvous, BadVariablesNameTheVariableAndTheFix) {
  EXPECT_NE(error_of({{"RANK", "1"}}).find("RANK is set but WORLD_SIZE is not"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}}).find("RANK='x' is not an integer"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("RANK=2 is not below WORLD_SIZE=2"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}).find("not a TCP port"),
            std::string::npos);
  EXPECT_NE(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NNODES", "2"}})
                .find("MASTER_ADDR is not set"),
            std::string::npos);
  EXPECT_NE(error_of({{"OMPI_COMM_WORLD_RANK", "0"}}).find("OMPI_COMM_WORLD_SIZE is not set"), std::string::npos);
}

TEST(Rendezvous, UnreachableMasterFailsWithinTheTimeout) {
  comm::RendezvousInfo info;
  info.rank = 1;
  info.world_size = 2;
  info.master_addr = "127.0.0.1";
  info.master_port = launch::find_free_port();  // nobody listens there
  comm::CommOptions options;
  options.rendezvous_timeout = std::chrono::seconds(2);
  const auto start = std::chrono::steady_clock::now();
  try {
    comm::init_process_group(info, options);
    ADD_FAILURE() << "init_process_group returned without a master";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rank 1 could not reach the rendezvous store at 127.0.0.1:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("check MASTER_ADDR/MASTER_PORT"), std::string::npos) << msg;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(Rendezvous, TorchrunsAgentStoreIsNamedByItsVariables) {
  std::map<std::string, std::string> vars = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
  EXPECT_EQ(rendezvous_info_from_env(env_of(vars)).agent_store_key, "");
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_EQ(rendezvous_info_from_env(env_of(vars)).agent_store_key, "");
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  vars["TORCHELASTIC_RUN_ID"] = "job1";
  vars["TORCHELASTIC_RESTART_COUNT"] = "2";
  EXPECT_EQ(rendezvous_info_from_env(env_of(vars)).agent_store_key, "hyperparallel/store_address/job1/2");
}

// torchrun hosts a c10d TCPStore on MASTER_PORT in its agent: the ranks must not bind it, and
// still rendezvous (through our own store, whose address travels through the agent's).
TEST(Rendezvous, TorchrunsAgentStoreHostsTheRendezvous) {
  std::unique_ptr<c10d::TCPStore> agent;
  testing::MultiProcessOptions options;
  if (!testing::is_rank_process()) {
    c10d::TCPStoreOptions o;
    o.port = 0;
    o.isServer = true;
    o.waitWorkers = false;
    agent = std::make_unique<c10d::TCPStore>("127.0.0.1", o);
    options.env = {{"HP_TEST_AGENT_PORT", std::to_string(agent->getPort())}, {"TORCHELASTIC_RUN_ID", "agent-test"},
                   {"TORCHELASTIC_RESTART_COUNT", "3"}};
  }
  options.rendezvous_style = "torchrun_agent";
  testing::run_on_ranks(
      2,
      [](testing::RankContext& ctx) {
        at::Tensor t = at::full({1}, static_cast<double>(ctx.rank + 1));
        ctx.world->all_reduce(t).wait();
        EXPECT_EQ(t.item<float>(), 3.0f);
      },
      options);
  ASSERT_TRUE(agent);
  const std::string key = "hyperparallel/store_address/agent-test/3";
  ASSERT_TRUE(agent->check({key}));
  const auto value = agent->get(key);
  EXPECT_EQ(std::string(value.begin(), value.end()).rfind("127.0.0.1:", 0), 0u);
}

TEST(Rendezvous, AnUnreachableAgentStoreIsNamed) {
  comm::RendezvousInfo info;
  info.rank = 1;
  info.world_size = 2;
  info.master_port = launch::find_free_port();  // no agent there
  info.agent_store_key = "hyperparallel/store_address/x/0";
  comm::CommOptions options;
  options.rendezvous_timeout = std::chrono::seconds(2);
  try {
    comm::init_process_group(info, options);
    ADD_FAILURE() << "init_process_group returned without an agent";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1: torchrun's agent store at 127.0.0.1:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("TORCHELASTIC_USE_AGENT_STORE=True"), std::string::npos) << e.what();
  }
}

class RendezvousStyles : public ::testing::TestWithParam<std::string> {};

TEST_P(RendezvousStyles, RealRanksJoinThroughEachLauncherStyle) {
  testing::MultiProcessOptions options;
  options.rendezvous_style = GetParam();
  testing::run_on_ranks(
      3,
      [](testing::RankContext& ctx) {
        EXPECT_EQ(ctx.world_size, 3);
        at::Tensor t = at::full({1}, static_cast<double>(ctx.rank));
        ctx.world->all_reduce(t).wait();
        EXPECT_EQ(t.item<float>(), 3.0f);  // 0 + 1 + 2: every rank joined with its own rank
        // Joining ignores SIGPIPE: a write to a peer that died is an error, not this rank's death.
        struct sigaction pipe {};
        sigaction(SIGPIPE, nullptr, &pipe);
        EXPECT_EQ(pipe.sa_handler, SIG_IGN);
      },
      options);
}

INSTANTIATE_TEST_SUITE_P(Launchers, RendezvousStyles, ::testing::Values("torchrun", "openmpi", "slurm"));

}  // namespace
}  // namespace hyperparallel
