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

namespace {

// The element count of `shape`, refusing a negative extent and a shape whose byte size (non-zero
// extents times `dtype`'s size) overflows int64, so that count * size below cannot wrap.
int64_t checked_numel(const std::string& name, const std::vector<int64_t>& shape, DType dtype) {
  for (int64_t d : shape) {
    if (d < 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  "tensor '" + name + "' has negative dimension " + std::to_string(d));
    }
  }
  if (!io::tensor_bytes(shape, dtype_size(dtype))) {
    throw Error(ErrorCode::kInvalidArgument, "tensor '" + name + "' has shape " +
                                                 io::shape_to_string(shape) + " of " +
                                                 to_string(dtype) + " whose size overflows int64");
  }
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

int64_t NamedTensor::numel() const { return checked_numel(name, shape, dtype); }

namespace {

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
  const int64_t n = checked_numel(name, shape, dtype);
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
  const int64_t n = checked_numel(name, shape, dtype);
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
  const int64_t n = checked_numel(t.name, t.shape, t.dtype);
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
    checked_numel(t.name, t.shape, t.dtype);
    refs.push_back(io::TensorRef{t.name, io::from_dtype(t.dtype), t.shape, t.bytes});
  }
  io::write_safetensors(file, std::move(refs), metadata);
}

namespace {

// Largest checkpoint index read (DeepSeek-V3's, ~91k tensors, is under 10 MB).
constexpr uint64_t kMaxIndexBytes = 100'000'000;

[[noreturn]] void bad_index(const std::string& index, const std::string& what) {
  throw Error(ErrorCode::kBadFile, "checkpoint index " + index + ": " + what);
}

// The weight_map of an index: tensor name -> shard name.
std::map<std::string, std::string> read_weight_map(const std::string& index) {
  const std::string text = io::read_regular_file(index, kMaxIndexBytes, "checkpoint index");
  const nlohmann::json j = io::parse_untrusted_json(text, "checkpoint index " + index);
  if (!j.is_object()) bad_index(index, "is not a JSON object");
  const auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object()) bad_index(index, "has no weight_map object");
  std::map<std::string, std::string> out;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string())
      bad_index(index, "weight_map entry '" + it.key() + "' is not a file name");
    out.emplace(it.key(), it.value().get<std::string>());
  }
  return out;
}

// The shards an index names, each checked to be a regular file named inside the index's folder:
// a relative name without "..". An index is often downloaded; it must not make moekit read some
// other file. Symlinks inside the folder are followed: the Hugging Face hub cache keeps every
// file of snapshots/<rev>/ as a symlink into ../../blobs/, and only someone who can write the
// folder can place one.
std::vector<std::string> index_shards(const std::string& index) {
  namespace fs = std::filesystem;
  const std::map<std::string, std::string> weight_map = read_weight_map(index);
  const fs::path folder =
      fs::path(index).parent_path().empty() ? fs::path(".") : fs::path(index).parent_path();
  std::error_code ec;
  std::map<std::string, std::string> shards;  // shard -> first tensor naming it
  for (const auto& [tensor, shard] : weight_map) shards.emplace(shard, tensor);
  std::vector<std::string> out;
  for (const auto& [shard, tensor] : shards) {
    const std::string entry = "weight_map entry '" + tensor + "' names shard '" + shard + "'";
    const fs::path rel(shard);
    bool escapes = shard.empty() || rel.has_root_name() || rel.has_root_directory();
    for (const auto& part : rel) escapes = escapes || part == "..";
    if (escapes) bad_index(index, entry + ", which is not a file name inside the index's folder");
    const fs::path full = folder / rel;
    const fs::file_status st = fs::status(full, ec);
    if (!fs::exists(st)) bad_index(index, entry + ", but " + full.string() + " does not exist");
    if (!fs::is_regular_file(st))
      bad_index(index, entry + ", but " + full.string() + " is not a regular file");
    out.push_back(full.string());
  }
  if (out.empty()) bad_index(index, "weight_map names no shard");
  return out;
}

}  // namespace

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
    return index_shards(path);
  }
  return {path};
}

}  // namespace moekit
