// Plain named tensors (inputs and outputs of `moekit run`) in safetensors files.
#include <gtest/gtest.h>

#include <random>

#include "common/numeric.hpp"
#include "io/io_test_util.hpp"
#include "moekit/io.hpp"
#include "moekit/status.hpp"

namespace moekit {
namespace {

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

}  // namespace
}  // namespace moekit
