// safetensors reader (mmap) and writer. Every check of the header happens in parse(), before any
// tensor byte is handed out.
#include "io/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "moekit/status.hpp"

namespace moekit::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little endian; moekit reads it in place");

namespace {

struct DtypeRow {
  StDtype dtype;
  const char* name;
  std::size_t size;
};
constexpr std::array<DtypeRow, 16> kDtypes{{
    {StDtype::kBool, "BOOL", 1},
    {StDtype::kU8, "U8", 1},
    {StDtype::kI8, "I8", 1},
    {StDtype::kF8E5M2, "F8_E5M2", 1},
    {StDtype::kF8E4M3, "F8_E4M3", 1},
    {StDtype::kF8E8M0, "F8_E8M0", 1},
    {StDtype::kI16, "I16", 2},
    {StDtype::kU16, "U16", 2},
    {StDtype::kF16, "F16", 2},
    {StDtype::kBF16, "BF16", 2},
    {StDtype::kI32, "I32", 4},
    {StDtype::kU32, "U32", 4},
    {StDtype::kF32, "F32", 4},
    {StDtype::kF64, "F64", 8},
    {StDtype::kI64, "I64", 8},
    {StDtype::kU64, "U64", 8},
}};

const DtypeRow& row_of(StDtype t) {
  for (const auto& r : kDtypes)
    if (r.dtype == t) return r;
  throw Error(ErrorCode::kInternal, "safetensors dtype id " + std::to_string(static_cast<int>(t)) +
                                        " is not in the table");
}

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kBadFile, "safetensors file " + path + ": " + what);
}
[[noreturn]] void bad_tensor(const std::string& path, const std::string& tensor,
                             const std::string& what) {
  bad(path, "tensor '" + tensor + "' " + what);
}

std::string errno_text() { return std::strerror(errno); }

// Reads a non-negative JSON integer that fits in int64, or returns nullopt.
std::optional<uint64_t> json_uint(const nlohmann::json& j) {
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return v;
  }
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v < 0) return std::nullopt;
    return static_cast<uint64_t>(v);
  }
  return std::nullopt;
}

}  // namespace

std::size_t st_dtype_size(StDtype t) { return row_of(t).size; }
const char* st_dtype_name(StDtype t) { return row_of(t).name; }
std::optional<StDtype> st_dtype_from_name(std::string_view name) {
  for (const auto& r : kDtypes)
    if (name == r.name) return r.dtype;
  return std::nullopt;
}

std::optional<DType> to_dtype(StDtype t) {
  switch (t) {
    case StDtype::kF32:
      return DType::kFloat32;
    case StDtype::kBF16:
      return DType::kBFloat16;
    case StDtype::kF16:
      return DType::kFloat16;
    case StDtype::kF8E4M3:
      return DType::kFloat8E4M3;
    case StDtype::kU8:
      return DType::kUInt8;
    case StDtype::kI8:
      return DType::kInt8;
    case StDtype::kI32:
      return DType::kInt32;
    case StDtype::kI64:
      return DType::kInt64;
    default:
      return std::nullopt;
  }
}

StDtype from_dtype(DType t) {
  switch (t) {
    case DType::kFloat32:
      return StDtype::kF32;
    case DType::kBFloat16:
      return StDtype::kBF16;
    case DType::kFloat16:
      return StDtype::kF16;
    case DType::kFloat8E4M3:
      return StDtype::kF8E4M3;
    case DType::kUInt8:
      return StDtype::kU8;
    case DType::kInt8:
      return StDtype::kI8;
    case DType::kInt32:
      return StDtype::kI32;
    case DType::kInt64:
      return StDtype::kI64;
  }
  throw Error(ErrorCode::kInvalidArgument,
              "dtype id " + std::to_string(static_cast<int>(t)) + " has no safetensors dtype");
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // bounded at parse time
  return n;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// ---------------------------------------------------------------------------------------------
// Reader

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw Error(ErrorCode::kIo, "cannot open safetensors file " + path + ": " + errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string e = errno_text();
    ::close(fd);
    throw Error(ErrorCode::kIo, "cannot stat safetensors file " + path + ": " + e);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(ErrorCode::kIo, "safetensors file " + path + " is not a regular file");
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    bad(path, "is " + std::to_string(size_) + " bytes long, shorter than the 8-byte header length");
  }
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const std::string e = errno_text();
  ::close(fd);  // the mapping keeps the file
  if (p == MAP_FAILED)
    throw Error(ErrorCode::kIo, "cannot map safetensors file " + path + ": " + e);
  map_ = static_cast<const uint8_t*>(p);
  try {
    parse();
  } catch (...) {
    unmap();
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

void SafetensorsFile::unmap() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
  map_ = nullptr;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    size_ = std::exchange(o.size_, 0);
    data_ = std::exchange(o.data_, nullptr);
    data_size_ = std::exchange(o.data_size_, 0);
    tensors_ = std::move(o.tensors_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

void SafetensorsFile::parse() {
  uint64_t n = 0;
  std::memcpy(&n, map_, 8);  // little endian (static_assert above)
  const uint64_t avail = size_ - 8;
  if (n > kMaxHeaderBytes) {
    bad(path_, "header length " + std::to_string(n) + " exceeds the " +
                   std::to_string(kMaxHeaderBytes) + "-byte limit");
  }
  if (n > avail) {
    bad(path_, "header length " + std::to_string(n) + " runs past the end of the file (" +
                   std::to_string(avail) + " bytes after the length)");
  }
  if (n == 0) bad(path_, "header length is 0; the header must be a JSON object");
  const char* h = reinterpret_cast<const char*>(map_ + 8);
  nlohmann::json j = nlohmann::json::parse(h, h + n, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) bad(path_, "header (" + std::to_string(n) + " bytes) is not valid JSON");
  if (!j.is_object())
    bad(path_, std::string("header is a JSON ") + j.type_name() + ", not an object");

  data_ = map_ + 8 + n;
  data_size_ = static_cast<std::size_t>(avail - n);

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) bad(path_, "__metadata__ is not an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          bad(path_, "__metadata__ entry '" + m.key() + "' is a " + m.value().type_name() +
                         ", not a string");
        }
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object())
      bad_tensor(path_, name, std::string("is a JSON ") + v.type_name() + ", not an object");
    TensorInfo t;
    t.name = name;

    const auto d = v.find("dtype");
    if (d == v.end()) bad_tensor(path_, name, "has no dtype");
    if (!d->is_string()) bad_tensor(path_, name, "has a dtype that is not a string");
    const std::string dname = d->get<std::string>();
    const auto dt = st_dtype_from_name(dname);
    if (!dt) bad_tensor(path_, name, "has unknown dtype '" + dname + "'");
    t.dtype = *dt;

    const auto s = v.find("shape");
    if (s == v.end()) bad_tensor(path_, name, "has no shape");
    if (!s->is_array()) bad_tensor(path_, name, "has a shape that is not an array");
    // numel * size must not overflow: bound each step by the data buffer, which is tighter.
    uint64_t numel = 1;
    bool zero = false;
    for (const auto& dim : *s) {
      if (dim.is_number_integer() && !dim.is_number_unsigned() && dim.get<int64_t>() < 0) {
        bad_tensor(
            path_, name,
            "has negative dimension " + std::to_string(dim.get<int64_t>()) + " in its shape");
      }
      const auto u = json_uint(dim);
      if (!u)
        bad_tensor(path_, name, "has shape entry " + dim.dump() + ", not a non-negative integer");
      t.shape.push_back(static_cast<int64_t>(*u));
      if (*u == 0) zero = true;
      if (!zero) {
        if (*u > data_size_ || (numel > 0 && *u > data_size_ / numel))
          numel = data_size_ + 1;
        else
          numel *= *u;
      }
    }
    if (zero) numel = 0;

    const auto o = v.find("data_offsets");
    if (o == v.end()) bad_tensor(path_, name, "has no data_offsets");
    if (!o->is_array() || o->size() != 2)
      bad_tensor(path_, name, "has data_offsets that are not a pair [begin, end]");
    const auto b = json_uint((*o)[0]), e = json_uint((*o)[1]);
    if (!b || !e) {
      bad_tensor(path_, name,
                 "has data_offsets " + o->dump() + " that are not non-negative integers");
    }
    if (*b > *e) {
      bad_tensor(path_, name,
                 "has data_offsets begin " + std::to_string(*b) + " > end " + std::to_string(*e));
    }
    if (*e > data_size_) {
      bad_tensor(path_, name,
                 "has data_offsets [" + std::to_string(*b) + ", " + std::to_string(*e) +
                     "] outside the " + std::to_string(data_size_) + "-byte data buffer");
    }
    t.begin = *b;
    t.end = *e;
    const uint64_t esize = st_dtype_size(t.dtype);
    const bool too_big = numel > data_size_;
    if (too_big || numel * esize != t.nbytes()) {
      bad_tensor(
          path_, name,
          "holds " + std::to_string(t.nbytes()) + " bytes, but shape " + shape_to_string(t.shape) +
              " of " + dname + " needs " +
              (too_big ? std::string("more than the data buffer") : std::to_string(numel * esize)));
    }
    tensors_.push_back(std::move(t));
  }

  // Overlap: sort by start; an empty tensor cannot overlap anything.
  std::vector<const TensorInfo*> by_pos;
  for (const auto& t : tensors_)
    if (t.nbytes() > 0) by_pos.push_back(&t);
  std::sort(by_pos.begin(), by_pos.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->name < b->name;
  });
  for (std::size_t i = 1; i < by_pos.size(); ++i) {
    if (by_pos[i]->begin < by_pos[i - 1]->end) {
      bad_tensor(path_, by_pos[i]->name,
                 "bytes [" + std::to_string(by_pos[i]->begin) + ", " +
                     std::to_string(by_pos[i]->end) + ") overlap tensor '" + by_pos[i - 1]->name +
                     "' bytes [" + std::to_string(by_pos[i - 1]->begin) + ", " +
                     std::to_string(by_pos[i - 1]->end) + ")");
    }
  }
  // nlohmann's object is a sorted map, so tensors_ is sorted by name already.
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

const TensorInfo& SafetensorsFile::at(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (!t) bad_tensor(path_, std::string(name), "is missing");
  return *t;
}

std::span<const uint8_t> SafetensorsFile::bytes(const TensorInfo& t) const {
  return {data_ + t.begin, static_cast<std::size_t>(t.nbytes())};
}

// ---------------------------------------------------------------------------------------------
// Writer

void write_safetensors(const std::string& path, std::vector<TensorRef> tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorRef& a, const TensorRef& b) { return a.name < b.name; });
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& t = tensors[i];
    if (t.name == "__metadata__") {
      throw Error(ErrorCode::kInvalidArgument,
                  "cannot write " + path + ": '__metadata__' is reserved, not a tensor name");
    }
    if (i > 0 && tensors[i - 1].name == t.name) {
      throw Error(ErrorCode::kInvalidArgument,
                  "cannot write " + path + ": tensor name '" + t.name + "' appears twice");
    }
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) {
        throw Error(ErrorCode::kInvalidArgument, "cannot write " + path + ": tensor '" + t.name +
                                                     "' has negative dimension " +
                                                     std::to_string(d));
      }
      numel *= static_cast<uint64_t>(d);
    }
    if (numel * st_dtype_size(t.dtype) != t.bytes.size()) {
      throw Error(ErrorCode::kInvalidArgument, "cannot write " + path + ": tensor '" + t.name +
                                                   "' has " + std::to_string(t.bytes.size()) +
                                                   " bytes, but shape " + shape_to_string(t.shape) +
                                                   " of " + st_dtype_name(t.dtype) + " needs " +
                                                   std::to_string(numel * st_dtype_size(t.dtype)));
    }
    header[t.name] = {{"dtype", st_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // the data buffer starts 8-byte aligned

  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw Error(ErrorCode::kIo, "cannot create " + tmp + ": " + errno_text());
  bool ok = true;
  const uint64_t n = h.size();
  ok = ok && std::fwrite(&n, 8, 1, f) == 1;
  ok = ok && std::fwrite(h.data(), 1, h.size(), f) == h.size();
  for (const TensorRef& t : tensors) {
    if (!ok) break;
    if (!t.bytes.empty()) ok = std::fwrite(t.bytes.data(), 1, t.bytes.size(), f) == t.bytes.size();
  }
  const std::string e = errno_text();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    throw Error(ErrorCode::kIo, "cannot write " + tmp + ": " + e);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string e2 = errno_text();
    std::remove(tmp.c_str());
    throw Error(ErrorCode::kIo, "cannot rename " + tmp + " to " + path + ": " + e2);
  }
}

}  // namespace moekit::io
