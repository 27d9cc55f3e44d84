// Plain named tensors (inputs and outputs of `moekit run`) in safetensors files.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "common/numeric.hpp"
#include "io/io_test_util.hpp"
#include "moekit/io.hpp"
#include "moekit/status.hpp"

namespace moekit {
namespace {

std::string io_shape(const std::vector<int64_t>& s) {
  std::string out;
  for (int64_t d : s) out += std::to_string(d) + " ";
  return out;
}

std::vector<float> random_floats(std::size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(NamedTensors, WriteReadRoundTrip) {
  const auto h = random_floats(7 * 16, 1);
  const auto l = random_floats(7 * 8, 2);
  std::vector<int32_t> ids(7 * 2);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 5 + 3) % 8);
  const std::vector<NamedTensor> in = {
      named_tensor_from_floats("hidden", DType::kBFloat16, {7, 16}, h.data()),
      named_tensor_from_floats("router_logits", DType::kFloat32, {7, 8}, l.data()),
      make_named_tensor("topk_ids", DType::kInt32, {7, 2}, ids.data()),
  };
  const std::string path = test::temp_path("run.safetensors");
  write_tensors(path, in, {{"preset", "qwen3-30b-a3b"}});
  EXPECT_EQ(list_tensors(path), (std::vector<std::string>{"hidden", "router_logits", "topk_ids"}));
  EXPECT_EQ(read_metadata(path).at("preset"), "qwen3-30b-a3b");
  const auto all = read_tensors(path);
  ASSERT_EQ(all.size(), 3u);
  for (const NamedTensor& t : in) {
    const NamedTensor r = read_tensor(path, t.name);
    EXPECT_EQ(r.dtype, t.dtype);
    EXPECT_EQ(r.shape, t.shape);
    EXPECT_EQ(r.bytes, t.bytes);
  }
  // bf16: rounded to nearest even; fp32 exact.
  const auto hb = named_tensor_to_floats(read_tensor(path, "hidden"));
  for (std::size_t i = 0; i < h.size(); ++i)
    EXPECT_EQ(hb[i], numeric::bf16_to_float(numeric::float_to_bf16(h[i])));
  EXPECT_EQ(named_tensor_to_floats(read_tensor(path, "router_logits")), l);
  const auto f16 =
      named_tensor_to_floats(named_tensor_from_floats("x", DType::kFloat16, {4}, l.data()));
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(f16[i], l[i], std::abs(l[i]) * 1e-3f + 1e-4f);
}

TEST(NamedTensors, Errors) {
  const std::string path = test::temp_path("e.safetensors");
  const float v[2] = {1.5f, -2.0f};
  write_tensors(path, {named_tensor_from_floats("a", DType::kFloat32, {2}, v)});
  try {
    read_tensor(path, "output");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBadFile);
    EXPECT_NE(std::string(e.what()).find("output"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
  const int32_t ids[2] = {1, 2};
  try {
    named_tensor_to_floats(make_named_tensor("ids", DType::kInt32, {2}, ids));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  // A dtype moekit has no DType for is named, not misread.
  {
    const std::string h = R"({"d":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})";
    const std::string p = test::temp_path("f64.safetensors");
    test::write_bytes(p, test::st_bytes(h, std::vector<uint8_t>(8, 0x3f)));
    try {
      read_tensor(p, "d");
      ADD_FAILURE();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kBadFile);
      EXPECT_NE(std::string(e.what()).find("F64"), std::string::npos);
    }
  }
  try {
    write_tensors(test::temp_path("dup.safetensors"),
                  {named_tensor_from_floats("a", DType::kFloat32, {2}, v),
                   named_tensor_from_floats("a", DType::kFloat32, {2}, v)});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
}

TEST(NamedTensors, ShapeOverflowIsRefused) {
  const float v[1] = {1.0f};
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{int64_t{1} << 62, 4},
                                            {int64_t{1} << 62, int64_t{1} << 62, 0},
                                            {0, int64_t{1} << 40, int64_t{1} << 40}}) {
    try {
      (void)make_named_tensor("big", DType::kFloat32, shape, v);
      ADD_FAILURE() << io_shape(shape);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find("'big'"), std::string::npos) << e.what();
    }
    NamedTensor t;
    t.name = "big";
    t.shape = shape;
    EXPECT_THROW((void)t.numel(), Error);
    try {
      write_tensors(test::temp_path("big.safetensors"), {t});
      ADD_FAILURE();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    }
  }
}

// `moekit run --input X --output X`: the input is read whole, then replaced atomically.
TEST(NamedTensors, OutputOverTheInput) {
  const std::string path = test::temp_path("io.safetensors");
  const auto h = random_floats(4 * 8, 3);
  write_tensors(path, {named_tensor_from_floats("hidden", DType::kFloat32, {4, 8}, h.data())});
  auto in = read_tensors(path);
  ASSERT_EQ(in.size(), 1u);
  in[0].name = "output";
  write_tensors(path, in);
  EXPECT_EQ(list_tensors(path), std::vector<std::string>{"output"});
  EXPECT_EQ(named_tensor_to_floats(read_tensor(path, "output")), h);
  EXPECT_TRUE(test::no_temporaries(path));
}

// ---- checkpoint_files ----

class CheckpointIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(test::temp_path("ckpt"));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    const float v[2] = {1.0f, 2.0f};
    for (const char* n : {"a.safetensors", "b.safetensors"})
      write_tensors((dir_ / n).string(), {named_tensor_from_floats("x", DType::kFloat32, {2}, v)});
  }
  std::string index(const std::string& text) {
    const std::string p = (dir_ / "model.safetensors.index.json").string();
    std::ofstream(p) << text;
    return p;
  }
  std::string index_of(const std::string& a, const std::string& b) {
    return index(R"({"metadata": {"total_size": 16}, "weight_map": {"t.a": ")" + a +
                 R"(", "t.b": ")" + b + R"("}})");
  }
  // checkpoint_files(`p`) fails with `code`, naming `p` and each of `names`.
  void expect_refused(const std::string& p, const std::vector<std::string>& names,
                      ErrorCode code = ErrorCode::kBadFile) {
    try {
      (void)checkpoint_files(p);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
      for (const auto& n : names)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << n << " not in " << e.what();
    }
  }
  std::filesystem::path dir_;
};

TEST_F(CheckpointIndex, NamesShardsInItsFolder) {
  const auto files = checkpoint_files(index_of("b.safetensors", "a.safetensors"));
  EXPECT_EQ(files, (std::vector<std::string>{(dir_ / "a.safetensors").string(),
                                             (dir_ / "b.safetensors").string()}));
  // A subfolder, and a symlink that stays inside the folder, are fine.
  std::filesystem::create_directories(dir_ / "sub");
  std::filesystem::copy_file(dir_ / "a.safetensors", dir_ / "sub" / "c.safetensors");
  std::filesystem::create_symlink("a.safetensors", dir_ / "link.safetensors");
  EXPECT_EQ(checkpoint_files(index_of("sub/c.safetensors", "link.safetensors")).size(), 2u);
}

TEST_F(CheckpointIndex, ShardsOutsideTheFolderAreRefused) {
  const std::string outside = (dir_.parent_path() / "CheckpointIndex.outside.safetensors").string();
  const float v[1] = {1.0f};
  write_tensors(outside, {named_tensor_from_floats("x", DType::kFloat32, {1}, v)});
  expect_refused(index_of("a.safetensors", outside), {"'t.b'", outside});  // absolute
  expect_refused(index_of("a.safetensors", "../CheckpointIndex.outside.safetensors"),
                 {"'t.b'", ".."});
  expect_refused(index_of("sub/../../x.safetensors", "a.safetensors"), {"'t.a'"});
  expect_refused(index_of("", "a.safetensors"), {"'t.a'"});
  std::filesystem::remove(outside);
}

// The index's names are checked, not where the folder's own symlinks lead: the Hugging Face hub
// cache keeps every file of snapshots/<rev>/ as a symlink into ../../blobs/, and only someone
// who can write the folder can place a symlink there.
TEST_F(CheckpointIndex, SymlinkedShardsAsInTheHubCacheLoad) {
  const std::string blob = (dir_.parent_path() / "CheckpointIndex.blob.safetensors").string();
  const float v[1] = {1.0f};
  write_tensors(blob, {named_tensor_from_floats("x", DType::kFloat32, {1}, v)});
  std::filesystem::create_symlink(blob, dir_ / "linked.safetensors");
  EXPECT_EQ(checkpoint_files(index_of("a.safetensors", "linked.safetensors")).size(), 2u);
  std::filesystem::remove(blob);
}

TEST_F(CheckpointIndex, MissingOrOddShards) {
  expect_refused(index_of("a.safetensors", "gone.safetensors"), {"'t.b'", "gone.safetensors"});
  std::filesystem::create_directories(dir_ / "d.safetensors");
  expect_refused(index_of("d.safetensors", "a.safetensors"), {"'t.a'", "regular"});
  ASSERT_EQ(::mkfifo((dir_ / "f.safetensors").c_str(), 0600), 0);
  expect_refused(index_of("f.safetensors", "a.safetensors"), {"'t.a'", "regular"});
}

TEST_F(CheckpointIndex, MalformedIndex) {
  expect_refused(index(R"({"weight_map": {"t": "a.safetensors", "t": "b.safetensors"}})"),
                 {"'t'", "twice"});
  expect_refused(index(R"({"weight_map": {}, "weight_map": {"t": "a.safetensors"}})"),
                 {"weight_map", "twice"});
  expect_refused(index(R"({"weight_map": {"t": 3}})"), {"'t'"});
  expect_refused(index(R"({"weight_map": []})"), {"weight_map"});
  expect_refused(index(R"({"weight_map": {}})"), {"no shard"});
  expect_refused(index(R"({"weight_map": {"t": "a.safetensors"})"), {"JSON"});
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  expect_refused(index(R"({"metadata": )" + deep + R"(, "weight_map": {"t": "a.safetensors"}})"),
                 {"64"});
  // Not a regular file: refused without blocking on the FIFO.
  const std::string fifo = (dir_ / "fifo.safetensors.index.json").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_refused(fifo, {"regular"}, ErrorCode::kIo);
}

}  // namespace
}  // namespace moekit
