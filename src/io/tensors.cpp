// Plain named tensors in safetensors files, and finding a checkpoint's files.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "common/numeric.hpp"
#include "io/packing.hpp"
#include "io/safetensors.hpp"
#include "moekit/io.hpp"
#include "moekit/status.hpp"

namespace moekit {

int64_t NamedTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

int64_t checked_numel(const std::string& name, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  "tensor '" + name + "' has negative dimension " + std::to_string(d));
    }
    n *= d;
  }
  return n;
}

io::StDtype float_dtype(const std::string& name, DType t) {
  if (t != DType::kFloat32 && t != DType::kBFloat16 && t != DType::kFloat16) {
    throw Error(ErrorCode::kInvalidArgument,
                "tensor '" + name + "' has dtype " + to_string(t) + ", not bf16, fp16 or fp32");
  }
  return io::from_dtype(t);
}

NamedTensor to_named(const io::SafetensorsFile& f, const io::TensorInfo& t) {
  const auto d = io::to_dtype(t.dtype);
  if (!d) {
    throw Error(ErrorCode::kBadFile, "safetensors file " + f.path() + ": tensor '" + t.name +
                                         "' has dtype " + io::st_dtype_name(t.dtype) +
                                         ", which moekit does not read");
  }
  NamedTensor n;
  n.name = t.name;
  n.dtype = *d;
  n.shape = t.shape;
  const auto b = f.bytes(t);
  n.bytes.assign(b.begin(), b.end());
  return n;
}

}  // namespace

NamedTensor make_named_tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                              const void* data) {
  NamedTensor t;
  const int64_t n = checked_numel(name, shape);
  t.bytes.resize(static_cast<std::size_t>(n) * dtype_size(dtype));
  if (!t.bytes.empty()) std::memcpy(t.bytes.data(), data, t.bytes.size());
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  return t;
}

NamedTensor named_tensor_from_floats(std::string name, DType dtype, std::vector<int64_t> shape,
                                     const float* values) {
  const io::StDtype sd = float_dtype(name, dtype);
  const int64_t n = checked_numel(name, shape);
  NamedTensor t;
  const std::size_t es = io::st_dtype_size(sd);
  t.bytes.resize(static_cast<std::size_t>(n) * es);
  for (int64_t i = 0; i < n; ++i) io::store_float(sd, values[i], t.bytes.data() + i * es);
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  return t;
}

std::vector<float> named_tensor_to_floats(const NamedTensor& t) {
  const io::StDtype sd = float_dtype(t.name, t.dtype);
  const std::size_t es = io::st_dtype_size(sd);
  const int64_t n = checked_numel(t.name, t.shape);
  if (t.bytes.size() != static_cast<std::size_t>(n) * es) {
    throw Error(ErrorCode::kInvalidArgument,
                "tensor '" + t.name + "' has " + std::to_string(t.bytes.size()) +
                    " bytes, but shape " + io::shape_to_string(t.shape) + " of " +
                    to_string(t.dtype) + " needs " + std::to_string(n * static_cast<int64_t>(es)));
  }
  std::vector<float> out(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = io::load_float(sd, t.bytes.data() + i * es);
  return out;
}

std::vector<std::string> list_tensors(const std::string& file) {
  const io::SafetensorsFile f(file);
  std::vector<std::string> names;
  for (const auto& t : f.tensors()) names.push_back(t.name);
  return names;
}

NamedTensor read_tensor(const std::string& file, const std::string& name) {
  const io::SafetensorsFile f(file);
  return to_named(f, f.at(name));
}

std::vector<NamedTensor> read_tensors(const std::string& file) {
  const io::SafetensorsFile f(file);
  std::vector<NamedTensor> out;
  for (const auto& t : f.tensors()) out.push_back(to_named(f, t));
  return out;
}

std::map<std::string, std::string> read_metadata(const std::string& file) {
  return io::SafetensorsFile(file).metadata();
}

void write_tensors(const std::string& file, const std::vector<NamedTensor>& tensors,
                   const std::map<std::string, std::string>& metadata) {
  std::vector<io::TensorRef> refs;
  refs.reserve(tensors.size());
  for (const NamedTensor& t : tensors) {
    checked_numel(t.name, t.shape);
    refs.push_back(io::TensorRef{t.name, io::from_dtype(t.dtype), t.shape, t.bytes});
  }
  io::write_safetensors(file, std::move(refs), metadata);
}

std::vector<std::string> checkpoint_files(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) {
    std::vector<std::string> out;
    for (const auto& entry : fs::directory_iterator(p, ec)) {
      if (entry.is_regular_file() && entry.path().extension() == ".safetensors")
        out.push_back(entry.path().string());
    }
    if (ec) throw Error(ErrorCode::kIo, "cannot list folder " + path + ": " + ec.message());
    std::sort(out.begin(), out.end());
    if (out.empty())
      throw Error(ErrorCode::kBadFile, "folder " + path + " holds no *.safetensors file");
    return out;
  }
  if (!fs::exists(p, ec))
    throw Error(ErrorCode::kIo, "checkpoint path " + path + " does not exist");
  const std::string suffix = ".index.json";
  if (path.size() >= suffix.size() &&
      path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0) {
    std::ifstream in(path);
    if (!in) throw Error(ErrorCode::kIo, "cannot open checkpoint index " + path);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
        !j["weight_map"].is_object()) {
      throw Error(ErrorCode::kBadFile, "checkpoint index " + path + " has no weight_map object");
    }
    std::set<std::string> names;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        throw Error(ErrorCode::kBadFile, "checkpoint index " + path + ": weight_map entry '" +
                                             it.key() + "' is not a file name");
      }
      names.insert(it.value().get<std::string>());
    }
    std::vector<std::string> out;
    for (const auto& n : names) out.push_back((p.parent_path() / n).string());
    return out;
  }
  return {path};
}

}  // namespace moekit
