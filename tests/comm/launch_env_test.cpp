// The launcher's environment: torchrun and mpirun variables, defaults, every bad value named,
// and the EP x TP placement of a rank.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "moekit/comm.hpp"
#include "support/specs.hpp"

namespace moekit::comm {
namespace {

using Vars = std::map<std::string, std::string>;

EnvLookup lookup(const Vars& vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

Vars torchrun(int rank, int world, int local) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(local)},
          {"MASTER_ADDR", "node0"},
          {"MASTER_PORT", "1234"}};
}

TEST(LaunchEnv, NoLauncherIsOneProcess) {
  const LaunchEnv e = parse_launch_env(lookup({}), 1);
  EXPECT_EQ(e.launcher, Launcher::kNone);
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.master_addr, kDefaultMasterAddr);
  EXPECT_EQ(e.master_port, kDefaultMasterPort);
  EXPECT_EQ(e.rendezvous_port, kDefaultMasterPort + 1);
}

TEST(LaunchEnv, Torchrun) {
  const LaunchEnv e = parse_launch_env(lookup(torchrun(5, 8, 1)), 4);
  EXPECT_EQ(e.launcher, Launcher::kTorchrun);
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 1234);
  EXPECT_EQ(e.rendezvous_port, 1235);
}

TEST(LaunchEnv, MpirunWithDefaultsAndExplicitRendezvousPort) {
  Vars v = {{"OMPI_COMM_WORLD_RANK", "2"},
            {"OMPI_COMM_WORLD_SIZE", "4"},
            {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
            {"MOEKIT_RENDEZVOUS_PORT", "40000"}};
  const LaunchEnv e = parse_launch_env(lookup(v), 4);
  EXPECT_EQ(e.launcher, Launcher::kMpirun);
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.master_addr, kDefaultMasterAddr);
  EXPECT_EQ(e.master_port, kDefaultMasterPort);
  EXPECT_EQ(e.rendezvous_port, 40000);
  EXPECT_EQ(e.comm_timeout, kDefaultCommTimeout);
  v["MOEKIT_COMM_TIMEOUT_MS"] = "1500";
  EXPECT_EQ(parse_launch_env(lookup(v), 4).comm_timeout, std::chrono::milliseconds(1500));
}

TEST(LaunchEnv, TorchrunWinsOverMpirun) {
  Vars v = torchrun(1, 2, 1);
  v["OMPI_COMM_WORLD_RANK"] = "0";
  v["OMPI_COMM_WORLD_SIZE"] = "2";
  v["OMPI_COMM_WORLD_LOCAL_RANK"] = "0";
  EXPECT_EQ(parse_launch_env(lookup(v), 2).rank, 1);
}

TEST(LaunchEnv, NegativeVisibleGpusSkipsTheGpuCheck) {
  EXPECT_EQ(parse_launch_env(lookup(torchrun(3, 4, 3)), -1).local_rank, 3);
}

struct Bad {
  const char* name;
  Vars vars;
  int visible_gpus;
  std::string variable, value;  // what the message must name
};

TEST(LaunchEnv, EveryBadValueIsNamed) {
  auto with = [](Vars v, const std::string& k, const std::string& val) {
    v[k] = val;
    return v;
  };
  auto without = [](Vars v, const std::string& k) {
    v.erase(k);
    return v;
  };
  const Vars ok = torchrun(1, 4, 1);
  const Vars mpi = {{"OMPI_COMM_WORLD_RANK", "1"},
                    {"OMPI_COMM_WORLD_SIZE", "2"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}};
  const Bad cases[] = {
      {"rank not a number", with(ok, "RANK", "one"), 4, "RANK", "one"},
      {"rank trailing text", with(ok, "RANK", "1x"), 4, "RANK", "1x"},
      {"rank empty", with(ok, "RANK", ""), 4, "RANK", "''"},
      {"rank negative", with(ok, "RANK", "-1"), 4, "RANK", "-1"},
      {"rank huge", with(ok, "RANK", "99999999999999999999"), 4, "RANK", "99999999999999999999"},
      {"rank >= world", with(ok, "RANK", "4"), 4, "RANK", "4"},
      {"rank missing", without(ok, "RANK"), 4, "RANK", "torchrun"},
      {"world zero", with(ok, "WORLD_SIZE", "0"), 4, "WORLD_SIZE", "0"},
      {"world not a number", with(ok, "WORLD_SIZE", "4.0"), 4, "WORLD_SIZE", "4.0"},
      {"world missing", without(ok, "WORLD_SIZE"), 4, "WORLD_SIZE", "torchrun"},
      {"local missing", without(ok, "LOCAL_RANK"), 4, "LOCAL_RANK", "torchrun"},
      {"local >= world", with(ok, "LOCAL_RANK", "4"), 8, "LOCAL_RANK", "4"},
      {"local >= visible gpus", ok, 1, "LOCAL_RANK", "1"},
      {"no gpu visible", ok, 0, "LOCAL_RANK", "0 visible"},
      {"port not a number", with(ok, "MASTER_PORT", "http"), 4, "MASTER_PORT", "http"},
      {"port zero", with(ok, "MASTER_PORT", "0"), 4, "MASTER_PORT", "0"},
      {"port too big", with(ok, "MASTER_PORT", "65536"), 4, "MASTER_PORT", "65536"},
      {"port leaves no rendezvous port", with(ok, "MASTER_PORT", "65535"), 4, "MASTER_PORT",
       "65535"},
      {"rendezvous port bad", with(ok, "MOEKIT_RENDEZVOUS_PORT", "-5"), 4, "MOEKIT_RENDEZVOUS_PORT",
       "-5"},
      {"master addr empty", with(ok, "MASTER_ADDR", ""), 4, "MASTER_ADDR", "''"},
      {"comm timeout zero", with(ok, "MOEKIT_COMM_TIMEOUT_MS", "0"), 4, "MOEKIT_COMM_TIMEOUT_MS",
       "0"},
      {"comm timeout not a number", with(ok, "MOEKIT_COMM_TIMEOUT_MS", "2m"), 4,
       "MOEKIT_COMM_TIMEOUT_MS", "2m"},
      {"comm timeout past a day", with(ok, "MOEKIT_COMM_TIMEOUT_MS", "86400001"), 4,
       "MOEKIT_COMM_TIMEOUT_MS", "86400001"},
      {"mpi rank not a number", with(mpi, "OMPI_COMM_WORLD_RANK", "r1"), 2, "OMPI_COMM_WORLD_RANK",
       "r1"},
      {"mpi size missing", without(mpi, "OMPI_COMM_WORLD_SIZE"), 2, "OMPI_COMM_WORLD_SIZE",
       "mpirun"},
      {"mpi local >= gpus", mpi, 1, "OMPI_COMM_WORLD_LOCAL_RANK", "1"},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.name);
    try {
      parse_launch_env(lookup(c.vars), c.visible_gpus);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(c.variable), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.value), std::string::npos) << e.what();
    }
  }
}

MoeSpec small_spec() { return test::small_fp32_spec(16, 2, 64, 64); }

TEST(LaunchEnv, SpecForRankPlacesEpAndTp) {
  MoeSpec s = small_spec();
  s.ep_size = 4;
  s.tp_size = 2;
  const MoeSpec r = spec_for_rank(s, 5, 8);
  EXPECT_EQ(r.ep_rank, 2);
  EXPECT_EQ(r.tp_rank, 1);
  s.tp_size = 1;
  EXPECT_EQ(spec_for_rank(s, 3, 4).ep_rank, 3);
}

TEST(LaunchEnv, SpecForRankRefusesAWorldOfAnotherSize) {
  MoeSpec s = small_spec();
  s.ep_size = 4;
  try {
    spec_for_rank(s, 0, 2);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("world size 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(spec_for_rank(s, 4, 4), Error);
  s.ep_size = 3;  // does not divide 16 experts
  try {
    spec_for_rank(s, 0, 3);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidSpec);
  }
}

}  // namespace
}  // namespace moekit::comm
