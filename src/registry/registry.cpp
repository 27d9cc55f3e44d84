// The one priority table: every implementation, highest priority first, listed explicitly.
#include "moekit/registry.hpp"

#include <atomic>

#include "registry/impls/impls.hpp"
#include "registry/registry_internal.hpp"

namespace moekit {

const std::vector<const Implementation*>& all_implementations() {
  // The Hopper kernels come first where they can run; their formats do not overlap, so their
  // order among themselves decides nothing. The CPU reference runs everything, last.
  static const std::vector<const Implementation*> table = {
      &registry::impls::cuda_sm90_cutlass_bf16(),
      &registry::impls::cuda_sm90_cutlass_fp16(),
      &registry::impls::cuda_sm90_cutlass_fp8_block128(),
      &registry::impls::cuda_sm90_cutlass_fp8(),
      &registry::impls::cuda_sm90_cutlass_int4_group(),
      &registry::impls::cuda_sm90_cutlass_int8_group(),
      &registry::impls::cuda_sm90_mx_mxfp4(),
      &registry::impls::cuda_sm90_mx_nvfp4(),
      &registry::impls::cuda_sm90_mx_mxfp8(),
      &registry::impls::cpu_reference(),
  };
  return table;
}

int priority_of(const std::string& id) {
  const auto& table = all_implementations();
  for (size_t i = 0; i < table.size(); ++i)
    if (table[i]->id() == id) return static_cast<int>(i);
  return -1;
}

const Implementation* find_implementation(const std::string& id) {
  int p = priority_of(id);
  return p < 0 ? nullptr : all_implementations()[static_cast<size_t>(p)];
}

namespace registry {
namespace {
std::atomic<std::uint64_t> g_engines_created{0};
}
std::uint64_t engines_created() { return g_engines_created.load(); }
void count_engine_created() { g_engines_created.fetch_add(1); }
}  // namespace registry

}  // namespace moekit
