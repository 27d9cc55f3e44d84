// Reading and writing safetensors files (https://github.com/huggingface/safetensors):
//   [8 bytes: little-endian u64 N][N bytes: JSON header][data buffer]
// The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// relative to the data buffer) plus an optional "__metadata__" object of strings. The reader maps
// the file and checks the whole header when the file is opened, so every later access is in bounds;
// every malformed case is Error(kBadFile) naming the file and the tensor. Hostile files are
// expected: the header is parsed without recursion (nesting past kMaxJsonDepth is refused), every
// length is checked against the file size before anything is allocated, and a name that appears
// twice is refused rather than one copy silently winning.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/types.hpp"

namespace moekit::io {

// Every dtype of the safetensors format except the sub-byte ones (F4, F6_*), which have no
// whole-byte size. Names are the format's ("F8_E4M3", "BF16", ...).
enum class StDtype : int {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kF8E8M0,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
};
std::size_t st_dtype_size(StDtype t);
const char* st_dtype_name(StDtype t);
std::optional<StDtype> st_dtype_from_name(std::string_view name);
// moekit's DType of a safetensors dtype, when it has one (F8_E8M0 and the unsigned/wide kinds
// do not).
std::optional<DType> to_dtype(StDtype t);
StDtype from_dtype(DType t);

// Largest header the reader accepts (the reference implementation's limit,
// safetensors/src/tensor.rs MAX_HEADER_SIZE).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Deepest nesting of JSON arrays and objects the readers accept (a safetensors header needs 3;
// a checkpoint index 3). Deeper input is refused before any parser recurses over it.
inline constexpr int kMaxJsonDepth = 64;
// Most dimensions a tensor may have (PyTorch allows 64 too); bounds what one shape can allocate.
inline constexpr std::size_t kMaxRank = 64;

struct TensorInfo {
  std::string name;
  StDtype dtype = StDtype::kU8;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range in the data buffer
  // The reader refuses a shape whose non-zero extents multiply (times the dtype size) past
  // INT64_MAX, so every partial product of `shape`, in any order, fits in int64.
  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

// The byte size of a tensor of `shape` with `elem_size`-byte elements, or nullopt when an extent
// is negative or the non-zero extents times `elem_size` pass INT64_MAX. A zero extent does not
// hide such extents: when this returns a value, every partial product of `shape` (in any order)
// times `elem_size` fits in int64.
std::optional<uint64_t> tensor_bytes(const std::vector<int64_t>& shape, std::size_t elem_size);

// "[2, 3]"
std::string shape_to_string(const std::vector<int64_t>& shape);

// A safetensors file, mapped read-only. Move-only.
class SafetensorsFile {
 public:
  // Opens and validates `path`. Error(kIo) when the OS refuses, Error(kBadFile) when malformed.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Sorted by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(std::string_view name) const;
  // Error(kBadFile) naming the file and the tensor when absent.
  const TensorInfo& at(std::string_view name) const;
  // The tensor's bytes (in bounds: checked at open). Not aligned beyond 1 byte in general.
  std::span<const uint8_t> bytes(const TensorInfo& t) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  void parse();
  void unmap();
  std::string path_;
  const uint8_t* map_ = nullptr;
  std::size_t size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data buffer
  std::size_t data_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write; `bytes` must stay alive until write_safetensors returns.
struct TensorRef {
  std::string name;
  StDtype dtype = StDtype::kU8;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;
};

// Writes a safetensors file: tensors in name order (so the same tensors give the same bytes),
// header padded with spaces to a multiple of 8 bytes. The bytes go to a new temporary file in
// `path`'s folder, created exclusively (O_EXCL, O_NOFOLLOW: never an existing file or a symlink
// planted there), which is then renamed onto `path`; on any failure, exceptions included, the
// temporary is removed and `path` is untouched. Since `path` is replaced, never written in place,
// `tensors` may point into a SafetensorsFile mapping `path` itself (it keeps the old file).
// A symlink at `path` is replaced, not followed. Error(kInvalidArgument) for duplicate names, a
// negative extent, more than kMaxRank extents or a byte count that does not match the shape;
// Error(kIo) when the OS refuses.
void write_safetensors(const std::string& path, std::vector<TensorRef> tensors,
                       const std::map<std::string, std::string>& metadata = {});

// `bytes` as the whole of `path`, written as write_safetensors writes: into a new temporary
// beside it, then renamed onto it (a symlink at `path` is replaced, not followed; on failure
// `path` is untouched). Error(kIo) when the OS refuses.
void write_file_atomically(const std::string& path, std::string_view bytes);

// The whole of a small regular file (a checkpoint index, a spec): Error(kIo) naming `what` and
// `path` when it is missing, unreadable or not a regular file (a FIFO, a device, a folder: checked
// before reading, so nothing blocks), Error(kBadFile) when longer than `max_bytes`.
std::string read_regular_file(const std::string& path, uint64_t max_bytes, const std::string& what);

// Whether the JSON arrays and objects of `text` nest at most `max_depth` deep (an iterative scan
// that understands strings; it does not validate the JSON otherwise). Run before handing
// untrusted text to a parser or a dump() that recurses per level.
bool json_depth_within(std::string_view text, int max_depth);

// Untrusted JSON text (a checkpoint index, a checkpoint's config.json) as a DOM: its nesting is
// checked first (json_depth_within, kMaxJsonDepth), since nlohmann's dump() and comparisons
// recurse per level, and a key that appears twice in one object is refused (the DOM would keep
// one of them quietly). Error(kBadFile) "<label>: <what is wrong>" for either and for text that
// is not JSON; `label` names the kind of file and its path.
nlohmann::json parse_untrusted_json(const std::string& text, const std::string& label);

}  // namespace moekit::io
