// The family shared by every cuda.sm90.cutlass.<format> implementation: the Hopper engines
// (routing, permute, CUTLASS ptr-array grouped GEMMs + the decode GEMV, activation, finalize;
// for the fp8 formats the FP8 engine, pipeline/sm90_fp8_engine.hpp; for the int group formats
// the W4A16 / W8A16 engine, pipeline/sm90_int_engine.hpp).
// Each format's file only names its id and formats; what they share is declared once here.
#pragma once
#include <string>
#include <vector>

#include "moekit/registry.hpp"

namespace moekit::registry::impls {

class Sm90CutlassImpl final : public Implementation {
 public:
  Sm90CutlassImpl(std::string id, WeightFormat weights, std::vector<DType> activations);
  std::string id() const override { return id_; }
  std::string family() const override { return "cutlass"; }
  Device device() const override { return Device::kCuda; }
  const Capability& capability() const override { return cap_; }
  std::unique_ptr<Engine> create_engine(const MoeSpec& spec, const MoeWeights& weights,
                                        int device_index) const override;

 protected:
  // Limits of the device routing kernels that the plain capability data cannot express.
  Eligibility extra_checks(const MoeSpec& spec, const Environment& env) const override;

 private:
  std::string id_;
  Capability cap_;
};

}  // namespace moekit::registry::impls
