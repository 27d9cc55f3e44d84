// safetensors reader (mmap) and writer. Every check of the header happens in parse(), before any
// tensor byte is handed out.
#include "io/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

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

// A value quoted in a message, cut short: a hostile header can hold a string as long as itself.
std::string clip(std::string_view v) {
  constexpr std::size_t kMax = 64;
  return v.size() <= kMax ? std::string(v) : std::string(v.substr(0, kMax)) + "...";
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
  for (int64_t d : shape) n *= d;  // every partial product fits: checked at parse time
  return n;
}

std::optional<uint64_t> tensor_bytes(const std::vector<int64_t>& shape, std::size_t elem_size) {
  constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t nonzero = elem_size;
  bool empty = false;
  for (const int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d == 0) {
      empty = true;
    } else {
      if (nonzero > kMax / static_cast<uint64_t>(d)) return std::nullopt;
      nonzero *= static_cast<uint64_t>(d);
    }
  }
  if (nonzero > kMax) return std::nullopt;
  return empty ? 0 : nonzero;
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
// Small files and JSON depth

namespace {

// Opens `path` for reading without blocking (a FIFO with no writer, a device) and checks with
// fstat that it is a regular file, returning the descriptor and the size. lstat is not used:
// a symlink to a regular file is fine here.
int open_regular(const std::string& path, const std::string& what, uint64_t* size) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const std::string e = errno_text();
    throw Error(ErrorCode::kIo, "cannot open " + what + " " + path + ": " + e);
  }
  if (!S_ISREG(st.st_mode))
    throw Error(ErrorCode::kIo, what + " " + path + " is not a regular file");
  // O_NONBLOCK: should the path become a FIFO between stat and open, open does not wait.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const std::string e = errno_text();
    throw Error(ErrorCode::kIo, "cannot open " + what + " " + path + ": " + e);
  }
  if (::fstat(fd, &st) != 0) {
    const std::string e = errno_text();
    ::close(fd);
    throw Error(ErrorCode::kIo, "cannot stat " + what + " " + path + ": " + e);
  }
  if (!S_ISREG(st.st_mode)) {  // replaced between stat and open
    ::close(fd);
    throw Error(ErrorCode::kIo, what + " " + path + " is not a regular file");
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

}  // namespace

std::string read_regular_file(const std::string& path, uint64_t max_bytes,
                              const std::string& what) {
  uint64_t size = 0;
  const int fd = open_regular(path, what, &size);
  if (size > max_bytes) {
    ::close(fd);
    throw Error(ErrorCode::kBadFile, what + " " + path + " is " + std::to_string(size) +
                                         " bytes long, over the " + std::to_string(max_bytes) +
                                         "-byte limit");
  }
  std::string out(static_cast<std::size_t>(size), '\0');
  std::size_t got = 0;
  while (got < out.size()) {
    const ssize_t r = ::pread(fd, out.data() + got, out.size() - got, static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const std::string e = r < 0 ? errno_text() : std::string("it shrank while being read");
      ::close(fd);
      throw Error(ErrorCode::kIo, "cannot read " + what + " " + path + ": " + e);
    }
    got += static_cast<std::size_t>(r);
  }
  ::close(fd);
  return out;
}

bool json_depth_within(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;  // unbalanced text is the parser's to refuse
    }
  }
  return true;
}

nlohmann::json parse_untrusted_json(const std::string& text, const std::string& label) {
  auto bad_json = [&](const std::string& what) {
    throw Error(ErrorCode::kBadFile, label + ": " + what);
  };
  if (!json_depth_within(text, kMaxJsonDepth)) {
    bad_json("nests arrays and objects deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  using json = nlohmann::json;
  std::vector<std::set<std::string>> keys;  // per open object, by depth
  std::string duplicate;
  const json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    const auto d = static_cast<std::size_t>(depth);
    if (event == json::parse_event_t::object_start) {
      keys.resize(d + 1);
      keys[d].clear();
    } else if (event == json::parse_event_t::key && d >= 1 && d <= keys.size() &&
               !keys[d - 1].insert(parsed.get<std::string>()).second && duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json j = json::parse(text, on_event, /*allow_exceptions=*/false);
  if (j.is_discarded()) bad_json("is not valid JSON");
  if (!duplicate.empty()) bad_json("key '" + duplicate + "' appears twice in one object");
  return j;
}

// ---------------------------------------------------------------------------------------------
// Reader

namespace {

// Largest shape entry or data offset the reader takes (both are int64 in moekit).
constexpr uint64_t kMaxJsonInt = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// The header's parser: nlohmann's SAX interface, whose parser keeps its own stack (one bit per
// level) instead of recursing, fed into a state machine for the safetensors schema. No DOM is
// built, so memory is what the header describes (bounded by kMaxHeaderBytes), and every object
// is checked for a key that appears twice (nlohmann's DOM would keep one of them quietly).
class HeaderParser {
 public:
  using json = nlohmann::json;
  HeaderParser(const std::string& path, uint64_t data_size) : path_(path), data_size_(data_size) {}

  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;

  // nlohmann::json_sax interface.
  bool null() { return scalar("null"); }
  bool boolean(bool) { return scalar("boolean"); }
  bool number_integer(json::number_integer_t v) {
    if (v < 0) return number(std::to_string(v), std::nullopt);
    return number(std::to_string(v), static_cast<uint64_t>(v));
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (v > kMaxJsonInt) return number(std::to_string(v), std::nullopt);
    return number(std::to_string(v), v);
  }
  bool number_float(json::number_float_t, const json::string_t& text) {
    return number(text, std::nullopt);
  }
  bool string(json::string_t& v) {
    switch (frame()) {
      case Frame::kMetadata:
        metadata[key_] = std::move(v);
        return true;
      case Frame::kTensor:
        if (key_ == "dtype") {
          const auto d = st_dtype_from_name(v);
          if (!d) bad_tensor(path_, tensor_.name, "has unknown dtype '" + clip(v) + "'");
          tensor_.dtype = *d;
          return true;
        }
        return true;  // another field: ignored
      default:
        return scalar("string");
    }
  }
  bool binary(json::binary_t&) { return scalar("binary value"); }
  bool start_object(std::size_t) { return open(true); }
  bool start_array(std::size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    switch (frame()) {
      case Frame::kTop:
        top_key_ = k;
        if (k != "__metadata__") {
          if (!tensor_names_.insert(k).second) bad_tensor(path_, k, "appears twice in the header");
        } else if (seen_metadata_) {
          bad(path_, "__metadata__ appears twice in the header");
        } else {
          seen_metadata_ = true;
        }
        break;
      case Frame::kMetadata:
        if (metadata.count(k)) bad(path_, "__metadata__ entry '" + k + "' appears twice");
        break;
      case Frame::kTensor: {
        const int bit = k == "dtype" ? 1 : k == "shape" ? 2 : k == "data_offsets" ? 4 : 0;
        if (bit && (fields_ & bit)) bad_tensor(path_, tensor_.name, "has '" + k + "' twice");
        fields_ |= bit;
        break;
      }
      default:
        break;  // a skipped value's keys
    }
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) {
    // The library's message quotes the last token, which can be as long as the header.
    const std::string where = "(error at byte " + std::to_string(position) + " of the header)";
    if (stack_.size() >= 2 && top_key_ != "__metadata__")
      bad_tensor(path_, top_key_, "is not valid JSON " + where);
    bad(path_, std::string(stack_.size() >= 2 ? "__metadata__" : "header") + " is not valid JSON " +
                   where);
  }

  // After a successful parse: sorted by name (names are unique: checked in key()).
  void finish() {
    std::sort(tensors.begin(), tensors.end(),
              [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  }

 private:
  enum class Frame { kNone, kTop, kMetadata, kTensor, kShape, kOffsets, kSkip };
  Frame frame() const { return stack_.empty() ? Frame::kNone : stack_.back(); }

  static const char* kind(bool object) { return object ? "object" : "array"; }

  // A scalar where the schema wants something else.
  bool scalar(const char* what) {
    switch (frame()) {
      case Frame::kNone:
        bad(path_, std::string("header is a JSON ") + what + ", not an object");
      case Frame::kTop:
        if (key_ == "__metadata__")
          bad(path_, std::string("__metadata__ is a JSON ") + what + ", not an object of strings");
        bad_tensor(path_, key_, std::string("is a JSON ") + what + ", not an object");
      case Frame::kMetadata:
        bad(path_, "__metadata__ entry '" + key_ + "' is a " + what + ", not a string");
      case Frame::kTensor:
        if (key_ == "dtype") bad_tensor(path_, tensor_.name, "has a dtype that is not a string");
        if (key_ == "shape") bad_tensor(path_, tensor_.name, "has a shape that is not an array");
        if (key_ == "data_offsets") {
          bad_tensor(path_, tensor_.name, "has data_offsets that are not a pair [begin, end]");
        }
        return true;  // another field: ignored
      case Frame::kShape:
        bad_tensor(path_, tensor_.name,
                   std::string("has shape entry ") + what + ", not a non-negative integer");
      case Frame::kOffsets:
        bad_tensor(path_, tensor_.name,
                   std::string("has data_offsets entry ") + what + ", not a non-negative integer");
      case Frame::kSkip:
        return true;
    }
    return true;
  }

  // `value` is set when `text` is a non-negative integer that fits in int64.
  bool number(const std::string& text, std::optional<uint64_t> value) {
    switch (frame()) {
      case Frame::kShape:
        if (!value) {
          bad_tensor(
              path_, tensor_.name,
              "has shape entry " + clip(text) + ", not a non-negative integer that fits in int64");
        }
        if (tensor_.shape.size() == kMaxRank) {
          bad_tensor(path_, tensor_.name,
                     "has more than " + std::to_string(kMaxRank) + " dimensions in its shape");
        }
        tensor_.shape.push_back(static_cast<int64_t>(*value));
        return true;
      case Frame::kOffsets:
        if (!value) {
          bad_tensor(path_, tensor_.name,
                     "has data_offsets entry " + clip(text) +
                         ", not a non-negative integer that fits in int64");
        }
        if (offsets_.size() == 2)
          bad_tensor(path_, tensor_.name, "has data_offsets that are not a pair [begin, end]");
        offsets_.push_back(*value);
        return true;
      default:
        return scalar("number");
    }
  }

  bool open(bool object) {
    if (stack_.size() >= static_cast<std::size_t>(kMaxJsonDepth)) {
      const std::string what =
          "nests arrays and objects deeper than " + std::to_string(kMaxJsonDepth) + " levels";
      if (stack_.size() < 2 || top_key_ == "__metadata__") bad(path_, "header " + what);
      bad_tensor(path_, top_key_, what);
    }
    Frame next = Frame::kSkip;
    switch (frame()) {
      case Frame::kNone:
        if (!object) bad(path_, "header is a JSON array, not an object");
        next = Frame::kTop;
        break;
      case Frame::kTop:
        if (key_ == "__metadata__") {
          if (!object) bad(path_, "__metadata__ is a JSON array, not an object of strings");
          next = Frame::kMetadata;
        } else {
          if (!object) bad_tensor(path_, key_, "is a JSON array, not an object");
          tensor_ = TensorInfo{};
          tensor_.name = key_;
          fields_ = 0;
          offsets_.clear();
          next = Frame::kTensor;
        }
        break;
      case Frame::kMetadata:
        bad(path_,
            "__metadata__ entry '" + key_ + "' is a JSON " + kind(object) + ", not a string");
      case Frame::kTensor:
        if (key_ == "shape" && !object) {
          next = Frame::kShape;
        } else if (key_ == "data_offsets" && !object) {
          next = Frame::kOffsets;
        } else if (key_ == "shape" || key_ == "data_offsets" || key_ == "dtype") {
          scalar(kind(object));  // throws the field's message
        }
        break;  // another field: skipped
      case Frame::kShape:
      case Frame::kOffsets:
        scalar(kind(object));  // throws
        break;
      case Frame::kSkip:
        break;
    }
    stack_.push_back(next);
    return true;
  }

  bool close() {
    const Frame f = frame();
    stack_.pop_back();
    if (f == Frame::kTensor) end_tensor();
    return true;
  }

  void end_tensor() {
    TensorInfo& t = tensor_;
    const std::string& name = t.name;
    if (!(fields_ & 1)) bad_tensor(path_, name, "has no dtype");
    if (!(fields_ & 2)) bad_tensor(path_, name, "has no shape");
    if (!(fields_ & 4)) bad_tensor(path_, name, "has no data_offsets");
    if (offsets_.size() != 2)
      bad_tensor(path_, name, "has data_offsets that are not a pair [begin, end]");
    const auto bytes = tensor_bytes(t.shape, st_dtype_size(t.dtype));
    if (!bytes) {
      bad_tensor(path_, name,
                 "has shape " + shape_to_string(t.shape) + " of " + st_dtype_name(t.dtype) +
                     " whose size overflows int64");
    }
    const uint64_t need = *bytes;
    const uint64_t b = offsets_[0], e = offsets_[1];
    if (b > e) {
      bad_tensor(path_, name,
                 "has data_offsets begin " + std::to_string(b) + " > end " + std::to_string(e));
    }
    if (e > data_size_) {
      bad_tensor(path_, name,
                 "has data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                     "] outside the " + std::to_string(data_size_) + "-byte data buffer");
    }
    t.begin = b;
    t.end = e;
    if (need != t.nbytes()) {
      bad_tensor(path_, name,
                 "holds " + std::to_string(t.nbytes()) + " bytes, but shape " +
                     shape_to_string(t.shape) + " of " + st_dtype_name(t.dtype) + " needs " +
                     std::to_string(need));
    }
    tensors.push_back(std::move(t));
  }

  const std::string& path_;
  const uint64_t data_size_;
  std::vector<Frame> stack_;  // at most kMaxJsonDepth deep
  std::string key_;           // the last key read
  std::string top_key_;       // the last key of the header object: the entry being read
  std::set<std::string, std::less<>> tensor_names_;
  bool seen_metadata_ = false;
  TensorInfo tensor_;  // the tensor being read
  int fields_ = 0;     // bits: dtype, shape, data_offsets seen
  std::vector<uint64_t> offsets_;
};

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  uint64_t size = 0;
  const int fd = open_regular(path, "safetensors file", &size);
  if (size < 8) {
    ::close(fd);
    bad(path, "is " + std::to_string(size) + " bytes long, shorter than the 8-byte header length");
  }
  if (size > std::numeric_limits<std::size_t>::max()) {
    ::close(fd);
    bad(path, "is too large to map (" + std::to_string(size) + " bytes)");
  }
  size_ = static_cast<std::size_t>(size);
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
  data_ = map_ + 8 + n;
  data_size_ = static_cast<std::size_t>(avail - n);

  HeaderParser parser(path_, data_size_);
  // Errors are thrown from inside the parser's callbacks (parse_error included).
  nlohmann::json::sax_parse(h, h + n, &parser);
  parser.finish();
  tensors_ = std::move(parser.tensors);
  metadata_ = std::move(parser.metadata);

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

namespace {

// A new file beside `target` (same folder, so the final rename is atomic), created with O_EXCL
// and O_NOFOLLOW: an existing file or a symlink planted under the chosen name is never opened;
// another name is tried instead. Removed on destruction unless committed.
class TempFile {
 public:
  explicit TempFile(const std::string& target) : target_(target) {
    const std::size_t slash = target.rfind('/');
    const std::string dir = slash == std::string::npos ? "" : target.substr(0, slash + 1);
    // Hidden, and short enough that a long target name cannot push it past NAME_MAX.
    const std::string base =
        (slash == std::string::npos ? target : target.substr(slash + 1)).substr(0, 100);
    static std::atomic<uint64_t> counter{0};
    uint64_t seed =
        static_cast<uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ull ^
        static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    for (int attempt = 0; attempt < 100; ++attempt) {
      seed = seed * 6364136223846793005ull + (counter.fetch_add(1) | 1);
      char suffix[17];
      std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(seed));
      path_ = dir + "." + base + "." + suffix + ".tmp";
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
      if (fd_ >= 0) return;
      if (errno != EEXIST) {
        const std::string e = errno_text();
        throw Error(ErrorCode::kIo,
                    "cannot write " + target + ": cannot create " + path_ + ": " + e);
      }
    }
    throw Error(ErrorCode::kIo, "cannot write " + target +
                                    ": no free temporary name in its folder (last " + path_ + ")");
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  const std::string& path() const { return path_; }
  // Error(kIo) when the OS refuses (a full disk, ...).
  void write(const void* data, std::size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      const ssize_t r = ::write(fd_, p, n);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        const std::string e = r < 0 ? errno_text() : std::string("nothing written");
        throw Error(ErrorCode::kIo, "cannot write " + target_ + " (to " + path_ + "): " + e);
      }
      p += r;
      n -= static_cast<std::size_t>(r);
    }
  }
  // Closes the file and renames it onto the target (replacing a file or symlink there, never
  // writing through it).
  void commit() {
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) {
      const std::string e = errno_text();
      throw Error(ErrorCode::kIo, "cannot write " + target_ + " (to " + path_ + "): " + e);
    }
    if (::rename(path_.c_str(), target_.c_str()) != 0) {
      const std::string e = errno_text();
      throw Error(ErrorCode::kIo, "cannot rename " + path_ + " to " + target_ + ": " + e);
    }
    committed_ = true;
  }

 private:
  std::string target_, path_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

void write_file_atomically(const std::string& path, std::string_view bytes) {
  TempFile tmp(path);
  tmp.write(bytes.data(), bytes.size());
  tmp.commit();
}

void write_safetensors(const std::string& path, std::vector<TensorRef> tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorRef& a, const TensorRef& b) { return a.name < b.name; });
  auto invalid = [&](const std::string& what) {
    throw Error(ErrorCode::kInvalidArgument, "cannot write " + path + ": " + what);
  };
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& t = tensors[i];
    if (t.name == "__metadata__") invalid("'__metadata__' is reserved, not a tensor name");
    if (i > 0 && tensors[i - 1].name == t.name)
      invalid("tensor name '" + t.name + "' appears twice");
    if (t.shape.size() > kMaxRank) {
      invalid("tensor '" + t.name + "' has " + std::to_string(t.shape.size()) +
              " dimensions, more than " + std::to_string(kMaxRank));
    }
    for (int64_t d : t.shape)
      if (d < 0) invalid("tensor '" + t.name + "' has negative dimension " + std::to_string(d));
    const auto bytes = tensor_bytes(t.shape, st_dtype_size(t.dtype));
    if (!bytes) {
      invalid("tensor '" + t.name + "' has shape " + shape_to_string(t.shape) +
              " whose size overflows int64");
    }
    const uint64_t need = *bytes;
    if (need != t.bytes.size()) {
      invalid("tensor '" + t.name + "' has " + std::to_string(t.bytes.size()) +
              " bytes, but shape " + shape_to_string(t.shape) + " of " + st_dtype_name(t.dtype) +
              " needs " + std::to_string(need));
    }
    header[t.name] = {{"dtype", st_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // the data buffer starts 8-byte aligned

  TempFile tmp(path);
  const uint64_t n = h.size();
  tmp.write(&n, 8);
  tmp.write(h.data(), h.size());
  for (const TensorRef& t : tensors)
    if (!t.bytes.empty()) tmp.write(t.bytes.data(), t.bytes.size());
  tmp.commit();
}

}  // namespace moekit::io
