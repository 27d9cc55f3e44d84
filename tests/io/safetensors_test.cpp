// safetensors reader and writer: round trips, determinism, and every malformed-file case
// (crafted byte by byte), each an Error(kBadFile) naming the file and the tensor.
#include "io/safetensors.hpp"

#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>

#include <cstring>
#include <filesystem>
#include <random>

#include "io/io_test_util.hpp"
#include "moekit/io.hpp"
#include "moekit/status.hpp"

namespace moekit::io {
namespace {

using test::st_bytes;
using test::temp_path;
using test::write_bytes;

std::vector<uint8_t> random_bytes(std::size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

// Opens `bytes` written to a file; expects Error(kBadFile) whose message names the file and
// each string of `names`.
void expect_bad(const std::vector<uint8_t>& bytes, const std::vector<std::string>& names,
                const std::string& stem) {
  const std::string path = temp_path(stem);
  write_bytes(path, bytes);
  try {
    SafetensorsFile f(path);
    ADD_FAILURE() << stem << ": opened without error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBadFile) << stem << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    for (const auto& n : names)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << stem << ": '" << n << "' not in: " << e.what();
  }
}

TEST(Safetensors, DtypeTable) {
  for (const char* n : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16",
                        "BF16", "I32", "U32", "F32", "F64", "I64", "U64"}) {
    const auto d = st_dtype_from_name(n);
    ASSERT_TRUE(d.has_value()) << n;
    EXPECT_STREQ(st_dtype_name(*d), n);
  }
  EXPECT_FALSE(st_dtype_from_name("F4").has_value());
  EXPECT_FALSE(st_dtype_from_name("bf16").has_value());  // the format's names are upper case
  EXPECT_EQ(st_dtype_size(StDtype::kBF16), 2u);
  EXPECT_EQ(st_dtype_size(StDtype::kF8E8M0), 1u);
  EXPECT_EQ(st_dtype_size(StDtype::kI64), 8u);
  for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat8E4M3,
                  DType::kUInt8, DType::kInt8, DType::kInt32, DType::kInt64}) {
    EXPECT_EQ(to_dtype(from_dtype(t)), t);
    EXPECT_EQ(st_dtype_size(from_dtype(t)), dtype_size(t));
  }
  EXPECT_FALSE(to_dtype(StDtype::kF8E8M0).has_value());
}

TEST(Safetensors, WriteThenReadEveryDtype) {
  const std::string path = temp_path("all.safetensors");
  std::vector<std::vector<uint8_t>> keep;
  std::vector<TensorRef> refs;
  uint32_t seed = 1;
  for (StDtype d :
       {StDtype::kBool, StDtype::kU8, StDtype::kI8, StDtype::kF8E5M2, StDtype::kF8E4M3,
        StDtype::kF8E8M0, StDtype::kI16, StDtype::kU16, StDtype::kF16, StDtype::kBF16,
        StDtype::kI32, StDtype::kU32, StDtype::kF32, StDtype::kF64, StDtype::kI64, StDtype::kU64}) {
    const std::vector<int64_t> shape = {3, static_cast<int64_t>(seed % 5 + 1)};
    keep.push_back(
        random_bytes(static_cast<std::size_t>(shape[0] * shape[1]) * st_dtype_size(d), seed));
    refs.push_back({std::string("t_") + st_dtype_name(d), d, shape, keep.back()});
    ++seed;
  }
  keep.push_back({});
  refs.push_back({"empty", StDtype::kF32, {0, 4}, keep.back()});
  write_safetensors(path, refs, {{"format", "pt"}, {"note", "x"}});

  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "x");
  ASSERT_EQ(f.tensors().size(), refs.size());
  for (const TensorRef& r : refs) {
    const TensorInfo& t = f.at(r.name);
    EXPECT_EQ(t.dtype, r.dtype) << r.name;
    EXPECT_EQ(t.shape, r.shape) << r.name;
    const auto b = f.bytes(t);
    ASSERT_EQ(b.size(), r.bytes.size());
    EXPECT_TRUE(std::equal(b.begin(), b.end(), r.bytes.begin())) << r.name;
  }
  // Sorted by name.
  for (std::size_t i = 1; i < f.tensors().size(); ++i)
    EXPECT_LT(f.tensors()[i - 1].name, f.tensors()[i].name);
}

TEST(Safetensors, WriterIsDeterministicAndAligned) {
  const auto a = random_bytes(24, 7), b = random_bytes(6, 8), c = random_bytes(2, 9);
  std::vector<TensorRef> refs = {{"b", StDtype::kF32, {2, 3}, a},
                                 {"a", StDtype::kBF16, {3}, b},
                                 {"c.d", StDtype::kU8, {2}, c}};
  const std::string p1 = temp_path("1.safetensors"), p2 = temp_path("2.safetensors");
  write_safetensors(p1, refs);
  std::swap(refs[0], refs[2]);
  write_safetensors(p2, refs);
  const auto x = test::read_bytes(p1), y = test::read_bytes(p2);
  EXPECT_EQ(x, y);
  uint64_t n = 0;
  std::memcpy(&n, x.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  ASSERT_EQ(x.size(), 8 + n + a.size() + b.size() + c.size());
  // Padding is spaces; the data follows in name order: a, b, c.d.
  const std::string header(x.begin() + 8, x.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}'));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), x.begin() + 8 + static_cast<std::ptrdiff_t>(n)));
  EXPECT_TRUE(test::no_temporaries(p1));
}

TEST(Safetensors, WriterRejectsBadInput) {
  const auto a = random_bytes(8, 1);
  try {
    write_safetensors(temp_path("dup"),
                      {{"x", StDtype::kF32, {2}, a}, {"x", StDtype::kF32, {2}, a}});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'x'"), std::string::npos);
  }
  try {
    write_safetensors(temp_path("size"), {{"y", StDtype::kF32, {3}, a}});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("'y'"), std::string::npos);
  }
  try {
    write_safetensors(temp_path("nodir") + "/no/such/dir/f.safetensors",
                      {{"z", StDtype::kF32, {2}, a}});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
  }
}

TEST(Safetensors, AcceptsUnpaddedHeaderAndHoles) {
  // Other writers may not pad; a gap between tensors is harmless.
  const auto data = random_bytes(20, 3);
  const std::string h =
      R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"I32","shape":[2],"data_offsets":[8,16]}})";
  const std::string path = temp_path("ok.safetensors");
  write_bytes(path, st_bytes(h, data));
  SafetensorsFile f(path);
  ASSERT_NE(f.find("b"), nullptr);
  const auto b = f.bytes(*f.find("b"));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), data.begin() + 8));
  EXPECT_EQ(f.find("c"), nullptr);
}

TEST(Safetensors, MissingFileIsIoError) {
  try {
    SafetensorsFile f(temp_path("does-not-exist"));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
  }
}

TEST(Safetensors, MalformedFiles) {
  const auto data = random_bytes(16, 5);
  const std::string ok_entry = R"("w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})";
  // Truncated: shorter than the 8-byte length.
  expect_bad({}, {}, "empty");
  expect_bad({1, 2, 3, 4, 5}, {"shorter than"}, "short");
  // Header length past the end, absurd, zero.
  expect_bad(st_bytes("{" + ok_entry + "}", data, 5000), {"5000"}, "past_end");
  expect_bad(st_bytes("{}", {}, uint64_t{1} << 62), {"limit"}, "absurd");
  expect_bad(st_bytes("", data, 0), {}, "zero_len");
  // Not JSON, not an object.
  expect_bad(st_bytes("{\"w\": {", data), {"JSON"}, "not_json");
  expect_bad(st_bytes("[1, 2, 3]", data), {"not an object"}, "array");
  expect_bad(st_bytes("{\"w\": 3}", data), {"'w'"}, "entry_not_object");
  expect_bad(st_bytes(R"({"__metadata__": {"k": 1}})", data), {"__metadata__"}, "meta_not_string");
  expect_bad(st_bytes(R"({"__metadata__": [1]})", data), {"__metadata__"}, "meta_not_object");
  // Entry fields.
  expect_bad(st_bytes(R"({"w":{"shape":[2,2],"data_offsets":[0,16]}})", data), {"'w'", "dtype"},
             "no_dtype");
  expect_bad(st_bytes(R"({"w":{"dtype":"F32","data_offsets":[0,16]}})", data), {"'w'", "shape"},
             "no_shape");
  expect_bad(st_bytes(R"({"w":{"dtype":"F32","shape":[2,2]}})", data), {"'w'", "data_offsets"},
             "no_offsets");
  expect_bad(st_bytes(R"({"w":{"dtype":7,"shape":[2,2],"data_offsets":[0,16]}})", data), {"'w'"},
             "dtype_number");
  expect_bad(st_bytes(R"({"w":{"dtype":"F31","shape":[2,2],"data_offsets":[0,16]}})", data),
             {"'w'", "F31"}, "unknown_dtype");
  expect_bad(st_bytes(R"({"w":{"dtype":"F32","shape":[-2,-2],"data_offsets":[0,16]}})", data),
             {"'w'", "-2"}, "negative_shape");
  expect_bad(st_bytes(R"({"w":{"dtype":"F32","shape":[2.5,2],"data_offsets":[0,16]}})", data),
             {"'w'"}, "float_shape");
  expect_bad(st_bytes(R"({"w":{"dtype":"F32","shape":4,"data_offsets":[0,16]}})", data), {"'w'"},
             "shape_not_array");
  expect_bad(st_bytes(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0]}})", data), {"'w'"},
             "offsets_arity");
  expect_bad(st_bytes(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[-4,12]}})", data), {"'w'"},
             "offsets_negative");
  // Offsets outside the buffer, begin > end, size not shape x dtype.
  expect_bad(st_bytes(R"({"w":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", data),
             {"'w'", "32", "16-byte"}, "outside");
  expect_bad(st_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[12,8]}})", data),
             {"'w'", "12", "8"}, "begin_gt_end");
  expect_bad(st_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", data),
             {"'w'", "[3]", "12"}, "size_mismatch");
  expect_bad(
      st_bytes(
          R"({"w":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,16]}})",
          data),
      {"'w'"}, "numel_overflow");
  expect_bad(
      st_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]}})",
               data),
      {"'w'"}, "offset_huge");
  // Overlap names both tensors.
  expect_bad(
      st_bytes(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          data),
      {"'a'", "'b'", "overlap"}, "overlap");
  expect_bad(
      st_bytes(
          R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})",
          data),
      {"'a'", "'b'"}, "contained");
}

TEST(Safetensors, MissingTensorNamesFileAndTensor) {
  const std::string path = temp_path("m.safetensors");
  const auto a = random_bytes(8, 2);
  write_safetensors(path, {{"present", StDtype::kF32, {2}, a}});
  SafetensorsFile f(path);
  try {
    (void)f.at("absent.weight");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBadFile);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("absent.weight"), std::string::npos);
  }
}

// Every prefix of a valid file and random corruption of its header: an Error or a clean open,
// never a crash (run under ASan to see out-of-bounds reads).
TEST(Safetensors, TruncationAndCorruptionNeverCrash) {
  const auto a = random_bytes(24, 11), b = random_bytes(10, 12);
  const std::string path = temp_path("v.safetensors");
  write_safetensors(path, {{"x", StDtype::kF32, {2, 3}, a}, {"y", StDtype::kBF16, {5}, b}},
                    {{"k", "v"}});
  const auto full = test::read_bytes(path);
  const std::string cut = temp_path("cut.safetensors");
  for (std::size_t n = 0; n < full.size(); ++n) {
    write_bytes(cut,
                std::vector<uint8_t>(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n)));
    try {
      SafetensorsFile f(cut);
      ADD_FAILURE() << "a file cut to " << n << " of " << full.size() << " bytes opened";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kBadFile) << n;
    }
  }
  std::mt19937 rng(99);
  uint64_t hlen = 0;
  std::memcpy(&hlen, full.data(), 8);
  for (int trial = 0; trial < 200; ++trial) {
    auto bad = full;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k) {
      const std::size_t pos = rng() % (8 + hlen);
      bad[pos] = static_cast<uint8_t>(rng());
    }
    write_bytes(cut, bad);
    try {
      SafetensorsFile f(cut);
      for (const auto& t : f.tensors()) {
        const auto s = f.bytes(t);
        EXPECT_LE(t.end, bad.size());
        volatile uint8_t sink = 0;
        for (uint8_t v : s) sink = sink ^ v;  // touch every byte handed out
        (void)sink;
      }
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kBadFile) << trial << ": " << e.what();
    }
  }
}

TEST(Safetensors, FileMoveKeepsMapping) {
  const std::string path = temp_path("mv.safetensors");
  const auto a = random_bytes(16, 4);
  write_safetensors(path, {{"x", StDtype::kU8, {16}, a}});
  SafetensorsFile f(path);
  SafetensorsFile g(std::move(f));
  const auto s = g.bytes(g.at("x"));
  EXPECT_TRUE(std::equal(s.begin(), s.end(), a.begin()));
}

// `levels` nested arrays around `inner`: "[[[...inner...]]]".
std::string nested(std::size_t levels, const std::string& inner = "") {
  return std::string(levels, '[') + inner + std::string(levels, ']');
}

// Nesting is refused at kMaxJsonDepth wherever it is (metadata, a tensor, a tensor's unknown
// field, the top level), without recursing per level: 100000 levels would overflow a recursive
// parser's, dump()'s or destructor's stack.
TEST(Safetensors, DeepNestingIsRefusedWithoutRecursion) {
  const auto data = random_bytes(16, 5);
  const std::string deep = nested(100000);
  const std::string limit = std::to_string(kMaxJsonDepth);
  expect_bad(st_bytes(R"({"__metadata__": )" + deep + "}", data), {"__metadata__"}, "meta_array");
  expect_bad(st_bytes(R"({"__metadata__": {"k": )" + deep + "}}", data), {"__metadata__", "'k'"},
             "meta_value");
  expect_bad(st_bytes(R"({"w": )" + deep + "}", data), {"'w'"}, "tensor_array");
  expect_bad(
      st_bytes(R"({"w": {"dtype":"F32","shape":[4],"data_offsets":[0,16],"x":)" + deep + "}}",
               data),
      {"'w'", limit}, "unknown_field");
  expect_bad(st_bytes(R"({"w": {"dtype":"F32","shape":)" + nested(100000, "4") +
                          R"(,"data_offsets":[0,16]}})",
                      data),
             {"'w'"}, "shape");
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += R"({"a":)";
  objects += "1" + std::string(100000, '}');
  expect_bad(st_bytes(R"({"w": {"x": )" + objects + "}}", data), {"'w'", limit}, "objects");
  // Unbalanced: the parser stops at the limit, before it sees the text is not JSON.
  expect_bad(st_bytes(R"({"w": {"x": )" + nested(100000).substr(0, 100000), data), {"'w'", limit},
             "unclosed");
  expect_bad(st_bytes(deep, data), {"array"}, "top_array");
  // An unknown field nested a few levels is ignored, as before.
  const std::string path = temp_path("shallow.safetensors");
  write_bytes(path, st_bytes(R"({"w": {"dtype":"F32","shape":[4],"data_offsets":[0,16],"x":)" +
                                 nested(10, R"({"a": [1, "b", null]})") + "}}",
                             data));
  EXPECT_EQ(SafetensorsFile(path).at("w").shape, std::vector<int64_t>{4});
}

// Shapes whose size overflows int64 are refused in every order of their extents, a zero extent
// included: a partial product of the non-zero extents would overflow in code that uses it.
TEST(Safetensors, ShapeOverflowInAnyOrder) {
  const std::string big = "4611686018427387904";  // 2^62
  for (const std::string& shape :
       std::vector<std::string>{"[" + big + "," + big + ",0]", "[0," + big + "," + big + "]",
                                "[" + big + ",0," + big + "]", "[2147483648,2147483648,4]",
                                "[4,2147483648,2147483648]"}) {
    for (const char* offsets : {"[0,0]", "[0,16]"}) {
      expect_bad(st_bytes(R"({"w":{"dtype":"U8","shape":)" + shape + R"(,"data_offsets":)" +
                              offsets + "}}",
                          random_bytes(16, 1)),
                 {"'w'", "overflows"}, "overflow");
    }
  }
  // 2^61 F32 elements: 2^63 bytes, one past INT64_MAX.
  expect_bad(
      st_bytes(R"({"w":{"dtype":"F32","shape":[2305843009213693952],"data_offsets":[0,0]}})", {}),
      {"'w'", "overflows"}, "bytes_overflow");
  // Fits in int64 but not in the file: a size mismatch, not an overflow.
  expect_bad(st_bytes(R"({"w":{"dtype":"U8","shape":[1073741824,4],"data_offsets":[0,16]}})",
                      random_bytes(16, 1)),
             {"'w'", "4294967296"}, "large");
  // An extent past int64, and a number token far longer than any message should quote.
  expect_bad(
      st_bytes(R"({"w":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0]}})", {}),
      {"'w'", "9223372036854775808"}, "past_int64");
  // Past uint64 and past double: a parse error, still naming the tensor.
  expect_bad(st_bytes(R"({"w":{"dtype":"U8","shape":[1)" + std::string(400, '0') +
                          R"(],"data_offsets":[0,0]}})",
                      {}),
             {"'w'", "JSON"}, "past_double");
  expect_bad(st_bytes(R"({"w":{"dtype":"U8","shape":[0.)" + std::string(100000, '0') +
                          R"(1],"data_offsets":[0,0]}})",
                      {}),
             {"'w'", "..."}, "long_number");
  // Rank is bounded (each extent costs memory; a header could hold millions of zeros).
  std::string zeros = "[0";
  for (std::size_t i = 0; i < kMaxRank; ++i) zeros += ",0";
  expect_bad(st_bytes(R"({"w":{"dtype":"U8","shape":)" + zeros + R"(],"data_offsets":[0,0]}})", {}),
             {"'w'", "dimensions"}, "rank");
  try {
    write_safetensors(temp_path("rank"), {{"r", StDtype::kU8, std::vector<int64_t>(kMaxRank + 1, 1),
                                           random_bytes(1, 1)}});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  // An empty tensor with a large (but bounded) extent is fine, and numel() is 0.
  const std::string path = temp_path("empty.safetensors");
  write_bytes(
      path,
      st_bytes(R"({"w":{"dtype":"F32","shape":[1000000,0,1099511627776],"data_offsets":[0,0]}})",
               {}));
  SafetensorsFile f(path);
  EXPECT_EQ(f.at("w").numel(), 0);
  EXPECT_EQ(tensor_bytes({1000000, 0, int64_t{1} << 40}, 4), 0u);
  EXPECT_FALSE(tensor_bytes({int64_t{1} << 62, int64_t{1} << 62, 0}, 1).has_value());
  EXPECT_FALSE(tensor_bytes({-1}, 1).has_value());
  EXPECT_EQ(tensor_bytes({}, 2), 2u);
}

// nlohmann's DOM keeps one of two equal keys quietly; the reader refuses them.
TEST(Safetensors, DuplicateNamesAreRefused) {
  const auto data = random_bytes(32, 5);
  const std::string a = R"("w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]})";
  const std::string b = R"("w":{"dtype":"F32","shape":[4],"data_offsets":[16,32]})";
  expect_bad(st_bytes("{" + a + "," + b + "}", data), {"'w'", "twice"}, "tensor");
  expect_bad(st_bytes(R"({"__metadata__":{"k":"1"},"__metadata__":{"k":"2"}})", data),
             {"__metadata__", "twice"}, "metadata");
  expect_bad(st_bytes(R"({"__metadata__":{"k":"1","k":"2"}})", data), {"'k'", "twice"},
             "metadata_key");
  expect_bad(
      st_bytes(R"({"w":{"dtype":"F32","dtype":"U8","shape":[4],"data_offsets":[0,16]}})", data),
      {"'w'", "dtype", "twice"}, "field");
  expect_bad(
      st_bytes(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"data_offsets":[16,32]}})",
               data),
      {"'w'", "data_offsets", "twice"}, "offsets_field");
}

TEST(Safetensors, HeaderLengthAndOffsetsAgainstTheFile) {
  const auto data = random_bytes(16, 5);
  const std::string h = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  expect_bad(st_bytes(h, data, ~uint64_t{0}), {"18446744073709551615"}, "max_u64");
  expect_bad(st_bytes(h, data, kMaxHeaderBytes + 1), {"limit"}, "over_limit");
  expect_bad(st_bytes(h, data, h.size() + data.size() + 1), {"past the end"}, "one_past");
  // The header may not swallow the data: then the offsets are past the (now empty) buffer.
  expect_bad(st_bytes(h, data, h.size() + data.size()), {}, "whole_file");
  expect_bad(st_bytes(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", data),
             {"'w'", "16", "0"}, "reversed");
  expect_bad(st_bytes(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16,32]}})", data),
             {"'w'", "pair"}, "triple");
  expect_bad(
      st_bytes(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[8,9223372036854775807]}})", data),
      {"'w'", "outside"}, "end_int64_max");
  expect_bad(
      st_bytes(
          R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},"v":{"dtype":"U8","shape":[9],"data_offsets":[0,9]}})",
          data),
      {"'v'", "'w'", "overlap"}, "overlap");
}

// Paths that are not regular files are refused by their type before any read, so a FIFO with no
// writer does not block and /dev/zero is not read forever.
TEST(Safetensors, NonRegularFilesAreRefusedWithoutBlocking) {
  const std::string fifo = temp_path("fifo");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  const std::string dir = temp_path("dir");
  std::filesystem::create_directories(dir);
  for (const std::string& p : {fifo, dir, std::string("/dev/zero"), std::string("/dev/null")}) {
    try {
      SafetensorsFile f(p);
      ADD_FAILURE() << p << " opened";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kIo) << e.what();
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
    try {
      (void)read_regular_file(p, 1000, "spec");
      ADD_FAILURE() << p << " read";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kIo) << e.what();
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove(fifo);
}

TEST(Safetensors, UnreadableFileIsIoError) {
  // Refusals the OS makes even to root: a symlink loop, a path through a file.
  const std::string loop = temp_path("loop.safetensors");
  std::filesystem::remove(loop);
  std::filesystem::create_symlink(std::filesystem::path(loop).filename(), loop);
  const std::string plain = temp_path("plain");
  write_bytes(plain, {1});
  for (const std::string& p : {loop, plain + "/x.safetensors"}) {
    try {
      SafetensorsFile f(p);
      ADD_FAILURE() << p;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kIo) << e.what();
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
  // Mode 000: refused unless this user is root.
  const std::string path = temp_path("locked.safetensors");
  write_safetensors(path, {{"x", StDtype::kU8, {2}, random_bytes(2, 1)}});
  ASSERT_EQ(::chmod(path.c_str(), 0), 0);
  try {
    SafetensorsFile f(path);
    ::chmod(path.c_str(), 0600);
    GTEST_SKIP() << "this user reads a file of mode 000 (root): the refusal is not testable here";
  } catch (const Error& e) {
    ::chmod(path.c_str(), 0600);
    EXPECT_EQ(e.code(), ErrorCode::kIo) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(Safetensors, ReadRegularFileLimits) {
  const std::string path = temp_path("small.json");
  write_bytes(path, {'{', '}'});
  EXPECT_EQ(read_regular_file(path, 2, "spec"), "{}");
  try {
    (void)read_regular_file(path, 1, "spec");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBadFile);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_TRUE(json_depth_within(R"({"a": [1, {"b": "[[[[[[["}]})", 3));
  EXPECT_FALSE(json_depth_within(R"({"a": [1, {"b": []}]})", 3));
  EXPECT_TRUE(json_depth_within(R"(["\"[[[[", "\\", []])", 2));
}

// The temporary is created exclusively beside the target and renamed onto it: a symlink at the
// target is replaced, not written through, and a failure leaves no temporary behind.
TEST(Safetensors, WriterReplacesTargetAtomically) {
  const auto a = random_bytes(8, 1);
  const std::string victim = temp_path("victim");
  write_bytes(victim, {1, 2, 3});
  const std::string link = temp_path("link.safetensors");
  std::filesystem::remove(link);
  std::filesystem::create_symlink(victim, link);
  write_safetensors(link, {{"x", StDtype::kF32, {2}, a}});
  EXPECT_EQ(test::read_bytes(victim), (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_FALSE(std::filesystem::is_symlink(link));
  EXPECT_EQ(SafetensorsFile(link).at("x").shape, std::vector<int64_t>{2});
  EXPECT_TRUE(test::no_temporaries(link));

  // The rename fails (the target is a non-empty folder): kIo, and the temporary is gone.
  const std::string dir = temp_path("target_dir");
  std::filesystem::create_directories(dir + "/inner");
  try {
    write_safetensors(dir, {{"x", StDtype::kF32, {2}, a}});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo) << e.what();
    EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::filesystem::is_directory(dir + "/inner"));
  EXPECT_TRUE(test::no_temporaries(dir));

  // Bad input is refused before any file is created.
  const std::string never = temp_path("never.safetensors");
  std::filesystem::remove(never);
  try {
    write_safetensors(never, {{"x", StDtype::kF32, {int64_t{1} << 62, 4}, {}}});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("'x'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(never));
  EXPECT_TRUE(test::no_temporaries(never));
}

// A write that fails part way (here: past the process's file-size limit, which binds root too)
// is Error(kIo); the target keeps its old bytes and the temporary is removed.
TEST(Safetensors, WriterCleansUpAfterAFailedWrite) {
  const std::string path = temp_path("partial.safetensors");
  const auto small = random_bytes(8, 1), big = random_bytes(64 * 1024, 2);
  write_safetensors(path, {{"old", StDtype::kU8, {8}, small}});
  const auto before = test::read_bytes(path);
  rlimit old_limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  rlimit limit = old_limit;
  limit.rlim_cur = 4096;
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // then write() fails with EFBIG
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  bool threw = false;
  ErrorCode code = ErrorCode::kOk;
  std::string message;
  try {
    write_safetensors(path, {{"new", StDtype::kU8, {64 * 1024}, big}});
  } catch (const Error& e) {
    threw = true;
    code = e.code();
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_TRUE(threw);
  EXPECT_EQ(code, ErrorCode::kIo);
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_EQ(test::read_bytes(path), before);
  EXPECT_TRUE(test::no_temporaries(path));
}

// Writing over the file being read: the old mapping keeps the old file, the path gets the new.
TEST(Safetensors, WriteOverTheMappedInput) {
  const std::string path = temp_path("inplace.safetensors");
  const auto a = random_bytes(16, 3);
  write_safetensors(path, {{"x", StDtype::kU8, {16}, a}});
  SafetensorsFile old(path);
  const auto bytes = old.bytes(old.at("x"));
  write_safetensors(path,
                    {{"y", StDtype::kU8, {16}, bytes}, {"z", StDtype::kU8, {8}, bytes.first(8)}});
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), a.begin()));
  SafetensorsFile now(path);
  EXPECT_EQ(now.find("x"), nullptr);
  const auto y = now.bytes(now.at("y"));
  EXPECT_TRUE(std::equal(y.begin(), y.end(), a.begin()));
}

}  // namespace
}  // namespace moekit::io
