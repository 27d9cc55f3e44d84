// What every cuda.sm90.<family>.<format> implementation shares: the Hopper engines (routing,
// permute, grouped GEMMs, activation, finalize; for the fp8 formats the FP8 engine,
// pipeline/sm90_fp8_engine.hpp; for the int group formats the W4A16 / W8A16 engine,
// pipeline/sm90_int_engine.hpp; for the microscaling formats the mx engine,
// pipeline/sm90_mx_engine.hpp). Family "cutlass": CUTLASS's ptr-array grouped GEMMs beside
// moekit's decode GEMVs; family "mx": moekit's own kernels only.
// Each format's file only names its id, family and formats; what they share is declared once
// here.
#pragma once
#include <string>
#include <vector>

#include "moekit/registry.hpp"

namespace moekit::registry::impls {

class Sm90CutlassImpl final : public Implementation {
 public:
  Sm90CutlassImpl(std::string id, WeightFormat weights, std::vector<DType> activations,
                  std::string family = "cutlass");
  std::string id() const override { return id_; }
  std::string family() const override { return family_; }
  Device device() const override { return Device::kCuda; }
  const Capability& capability() const override { return cap_; }
  std::unique_ptr<Engine> create_engine(const MoeSpec& spec, const MoeWeights& weights,
                                        int device_index) const override;

 protected:
  // Limits of the device routing kernels that the plain capability data cannot express.
  Eligibility extra_checks(const MoeSpec& spec, const Environment& env) const override;

 private:
  std::string id_;
  std::string family_;
  Capability cap_;
};

}  // namespace moekit::registry::impls
