// Shared fixtures of the registry tests: specs, hand-built environments and a fake
// implementation whose capability a test sets row by row.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>

#include "moekit/registry.hpp"
#include "registry/impls/impls.hpp"

namespace moekit::registry::test {

// A small valid layer every implementation of the table can run on an H200 (bf16).
inline MoeSpec small_spec(WeightFormat format = WeightFormat::kBF16, DType act = DType::kBFloat16) {
  MoeSpec s;
  s.num_experts = 8;
  s.top_k = 2;
  s.hidden = 256;
  s.intermediate = 256;
  s.act_dtype = act;
  s.weights.format = format;
  s.activation.kind = ActivationKind::kSwiGLU;
  s.routing.method = RoutingMethod::kTopKSoftmax;
  s.max_tokens = 64;
  return s;
}

inline GpuInfo h200() {
  GpuInfo g;
  g.name = "NVIDIA H200";
  g.sm = 90;
  g.multiprocessors = 132;
  g.memory_bytes = 150'000'000'000;
  g.l2_bytes = 60 * 1024 * 1024;
  return g;
}

// What a CUDA build would detect on one H200, written by hand (this machine has no GPU).
inline Environment h200_env() {
  Environment e;
  e.gpus = {h200()};
  e.cuda_runtime_version = 13000;
  e.cuda_driver_version = 13000;
  e.built_with_cuda = true;
  e.built_with_cutlass = true;
  e.built_with_nccl = false;
  e.library_version = "0.1.0";
  return e;
}

// Runs everything and needs nothing: rows of a test take away one thing at a time.
inline Capability permissive_capability() {
  Capability c;
  c.weight_formats = impls::all_weight_formats();
  c.act_dtypes = impls::all_act_dtypes();
  c.int_group_sizes = {32, 64, 128};
  c.int_zero_points = c.int_pre_quant_scale = true;
  c.activations = impls::all_activations();
  c.routings = impls::all_routings();
  c.router_weight_on_input = true;
  c.clamp = c.alpha_beta = c.fc1_bias = c.fc2_bias = true;
  return c;
}

class FakeImpl final : public Implementation {
 public:
  FakeImpl(std::string id, std::string family, Capability cap)
      : id_(std::move(id)), family_(std::move(family)), cap_(std::move(cap)) {}
  std::string id() const override { return id_; }
  std::string family() const override { return family_; }
  Device device() const override { return Device::kHost; }
  const Capability& capability() const override { return cap_; }
  std::unique_ptr<Engine> create_engine(const MoeSpec&, const MoeWeights&, int) const override {
    ++engines_created;
    return nullptr;
  }
  mutable int engines_created = 0;

 private:
  std::string id_, family_;
  Capability cap_;
};

// `s` with every feature of the reference that the Hopper engines run: both biases, Llama-4
// routing with the weight on the experts' input, GeGLU (tanh) on interleaved gate/up, an
// intermediate of 512 over TP 2, and EP 2 (rank 1 of each).
inline MoeSpec with_every_feature(MoeSpec s) {
  s.fc1_bias = s.fc2_bias = true;
  s.routing.method = RoutingMethod::kLlama4;
  s.routing.weight_placement = RouterWeightPlacement::kInput;
  s.intermediate = 512;
  s.tp_size = s.ep_size = 2;
  s.tp_rank = s.ep_rank = 1;
  s.activation.kind = ActivationKind::kGeGLUTanh;
  s.gate_up_layout = GateUpLayout::kInterleaved;
  return s;
}

// On an H200, "auto", the family's name and `id` itself each choose `id` for `s`, not degraded.
inline void expect_resolves_to(const MoeSpec& s, const char* family, const char* id) {
  for (const char* request : {"auto", family, id}) {
    const Resolution r = resolve(s, h200_env(), request);
    ASSERT_TRUE(r.ok()) << request << ": " << r.table();
    EXPECT_EQ(r.chosen->id(), id) << request;
    EXPECT_FALSE(r.degraded_from.has_value()) << request;
  }
}

// On an H200 `id` runs with_every_feature(s).
inline void expect_runs_every_feature(const MoeSpec& s, const char* id) {
  const MoeSpec all = with_every_feature(s);
  ASSERT_TRUE(all.validate().empty());
  const Eligibility e = find_implementation(id)->can_implement(all, h200_env());
  EXPECT_TRUE(e.ok()) << e.rejection().reason;
}

// Without a GPU `s` runs on the reference, and a request for `id` says why not at the GPU stage.
inline void expect_reference_without_gpu(const MoeSpec& s, const char* id) {
  Environment env = h200_env();
  env.gpus.clear();
  const Resolution r = resolve(s, env, "auto");
  ASSERT_TRUE(r.ok()) << id;
  EXPECT_EQ(r.chosen->id(), "cpu.reference") << id;
  const Eligibility e = find_implementation(id)->can_implement(s, env);
  ASSERT_FALSE(e.ok()) << id;
  EXPECT_EQ(e.rejection().stage, RejectStage::kGpuGeneration) << e.rejection().reason;
}

// On an H200 `id` refuses `s` at `stage`, its sentence naming itself and `value`; auto falls back
// to the reference and reports that sentence (the one the user can act on).
inline void expect_refused_then_reference(const MoeSpec& s, const char* id, RejectStage stage,
                                          const std::string& value) {
  const Eligibility e = find_implementation(id)->can_implement(s, h200_env());
  ASSERT_FALSE(e.ok()) << id;
  EXPECT_EQ(e.rejection().stage, stage) << e.rejection().reason;
  EXPECT_NE(e.rejection().reason.find(id), std::string::npos) << e.rejection().reason;
  EXPECT_NE(e.rejection().reason.find(value), std::string::npos) << e.rejection().reason;
  const Resolution r = resolve(s, h200_env(), "auto");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.chosen->id(), "cpu.reference");
  ASSERT_TRUE(r.degraded_from.has_value());
  EXPECT_EQ(r.degraded_from->reason.stage, stage);
  EXPECT_NE(r.degraded_from->reason.reason.find(id), std::string::npos)
      << r.degraded_from->reason.reason;
}

}  // namespace moekit::registry::test
