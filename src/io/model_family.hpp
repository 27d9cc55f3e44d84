// Internal helpers around the model-family descriptions (the descriptions themselves are public
// data: ModelFamily in include/moekit/io.hpp; the table is in model_family.cpp).
#pragma once
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "io/safetensors.hpp"
#include "moekit/io.hpp"

namespace moekit::io {

// Error(kUnsupported) naming the family and the field when `family` cannot hold `spec`'s layer
// (format, non-gated activation, biases, correction bias).
void check_family_supports(const ModelFamily& family, const MoeSpec& spec);

// The tensors of a set of checkpoint shards, by name, with the checks every loader needs.
class TensorIndex {
 public:
  explicit TensorIndex(const std::vector<std::string>& files);

  struct Hit {
    const SafetensorsFile* file = nullptr;
    const TensorInfo* info = nullptr;
    const uint8_t* data() const { return file->bytes(*info).data(); }
  };
  std::optional<Hit> find(const std::string& name) const;
  // Error(kBadFile) naming the tensor and the files when absent.
  Hit need(const std::string& name) const;
  // need(), then Error(kBadFile) naming file, tensor, expected and found dtype / shape.
  Hit expect(const std::string& name, StDtype dtype, const std::vector<int64_t>& shape) const;
  // The same with any of `dtypes` allowed (e8m0 scales: U8 or F8_E8M0).
  Hit expect(const std::string& name, const std::vector<StDtype>& dtypes,
             const std::vector<int64_t>& shape) const;
  // A float tensor (F32, BF16 or F16) of `shape`.
  Hit expect_float(const std::string& name, const std::vector<int64_t>& shape) const;

  // need() (and so every expect) records the tensor as read. Error(kFormatMismatch) naming
  // file and tensor for the first tensor whose name starts with `prefix` that was not read:
  // a tensor the spec's options do not use (zero points, an AWQ scale, another format's
  // scales, a bias) is refused rather than silently ignored. `options` describes the spec.
  void refuse_unread(const std::string& prefix, const std::string& options) const;
  // The same for exactly the tensor `name`, if present.
  void refuse_present(const std::string& name, const std::string& options) const;

 private:
  std::string files_text() const;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::pair<std::size_t, const TensorInfo*>, std::less<>> by_name_;
  mutable std::set<std::string, std::less<>> read_;
};

}  // namespace moekit::io
