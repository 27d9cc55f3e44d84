// The launcher's environment (torchrun, mpirun), parsed and validated before anything is made.
#include <cerrno>
#include <cstdlib>
#include <string>

#include "moekit/comm.hpp"

namespace moekit::comm {

const char* to_string(Launcher l) {
  switch (l) {
    case Launcher::kNone:
      return "none";
    case Launcher::kTorchrun:
      return "torchrun";
    case Launcher::kMpirun:
      return "mpirun";
  }
  return "?";
}

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

namespace {

[[noreturn]] void refuse(const std::string& sentence) {
  throw Error(ErrorCode::kInvalidArgument, sentence);
}

// A decimal integer in [lo, hi]; the error names the variable and its value.
int parse_int(const std::string& name, const std::string& text, long lo, long hi) {
  const std::string quoted = name + "='" + text + "'";
  if (text.empty()) refuse(quoted + " is empty: expected a decimal integer");
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || text.front() == ' ')
    refuse(quoted + " is not a decimal integer");
  if (errno == ERANGE || v < lo || v > hi)
    refuse(quoted + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<int>(v);
}

int required_int(const EnvLookup& env, const std::string& name, const char* launcher, long lo,
                 long hi) {
  const std::optional<std::string> v = env(name);
  if (!v)
    refuse(std::string(launcher) + " environment without " + name +
           " (it sets it for every process)");
  return parse_int(name, *v, lo, hi);
}

constexpr long kMaxRanks = 1 << 20;

}  // namespace

LaunchEnv parse_launch_env(const EnvLookup& env, int visible_gpus) {
  LaunchEnv out;
  const char* rank_var = nullptr;
  const char* size_var = nullptr;
  const char* local_var = nullptr;
  if (env("RANK") || env("WORLD_SIZE") || env("LOCAL_RANK")) {
    out.launcher = Launcher::kTorchrun;
    rank_var = "RANK", size_var = "WORLD_SIZE", local_var = "LOCAL_RANK";
  } else if (env("OMPI_COMM_WORLD_RANK") || env("OMPI_COMM_WORLD_SIZE") ||
             env("OMPI_COMM_WORLD_LOCAL_RANK")) {
    out.launcher = Launcher::kMpirun;
    rank_var = "OMPI_COMM_WORLD_RANK", size_var = "OMPI_COMM_WORLD_SIZE",
    local_var = "OMPI_COMM_WORLD_LOCAL_RANK";
  }
  if (out.launcher != Launcher::kNone) {
    const char* who = to_string(out.launcher);
    out.world_size = required_int(env, size_var, who, 1, kMaxRanks);
    out.rank = required_int(env, rank_var, who, 0, kMaxRanks);
    out.local_rank = required_int(env, local_var, who, 0, kMaxRanks);
    if (out.rank >= out.world_size)
      refuse(std::string(rank_var) + "=" + std::to_string(out.rank) + " is not below " + size_var +
             "=" + std::to_string(out.world_size));
    if (out.local_rank >= out.world_size)
      refuse(std::string(local_var) + "=" + std::to_string(out.local_rank) + " is not below " +
             size_var + "=" + std::to_string(out.world_size));
  }
  if (out.launcher != Launcher::kNone && visible_gpus >= 0 && out.local_rank >= visible_gpus)
    refuse(std::string(local_var) + "=" + std::to_string(out.local_rank) +
           " names a GPU this process cannot see (" + std::to_string(visible_gpus) +
           " visible: check CUDA_VISIBLE_DEVICES and the processes per node)");

  if (const auto addr = env("MASTER_ADDR")) {
    if (addr->empty()) refuse("MASTER_ADDR='' is empty: expected a host name or address");
    out.master_addr = *addr;
  }
  if (const auto port = env("MASTER_PORT"))
    out.master_port = parse_int("MASTER_PORT", *port, 1, 65535);
  if (const auto port = env("MOEKIT_RENDEZVOUS_PORT")) {
    out.rendezvous_port = parse_int("MOEKIT_RENDEZVOUS_PORT", *port, 1, 65535);
  } else {
    if (out.master_port == 65535)
      refuse(
          "MASTER_PORT=65535 leaves no port for the rendezvous (MASTER_PORT + 1): set "
          "MOEKIT_RENDEZVOUS_PORT");
    out.rendezvous_port = out.master_port + 1;
  }
  if (const auto ms = env("MOEKIT_COMM_TIMEOUT_MS"))
    out.comm_timeout =
        std::chrono::milliseconds(parse_int("MOEKIT_COMM_TIMEOUT_MS", *ms, 1, 86400000));
  return out;
}

MoeSpec spec_for_rank(const MoeSpec& spec, int rank, int world_size) {
  spec.validate_or_throw();
  if (world_size < 1 || rank < 0 || rank >= world_size)
    refuse("rank " + std::to_string(rank) + " is not in a world of " + std::to_string(world_size));
  if (static_cast<int64_t>(spec.ep_size) * spec.tp_size != world_size)
    refuse("ep_size " + std::to_string(spec.ep_size) + " x tp_size " +
           std::to_string(spec.tp_size) + " does not equal the world size " +
           std::to_string(world_size) + " (every rank holds one EP x TP shard)");
  MoeSpec out = spec;
  out.ep_rank = rank / spec.tp_size;
  out.tp_rank = rank % spec.tp_size;
  return out;
}

}  // namespace moekit::comm
