// Helpers shared by the io tests: per-test temporary files and raw safetensors bytes.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "moekit/weights.hpp"

namespace moekit::test {

// A path under the build's test folder, unique per test (CTest runs tests in parallel); a rerun
// overwrites the files of the last one instead of piling up more.
inline std::string temp_path(const std::string& stem) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir = std::filesystem::path(MOEKIT_TEST_TMP) / "io";
  std::filesystem::create_directories(dir);
  std::string name = std::string(info->test_suite_name()) + "." + info->name() + "." + stem;
  for (char& c : name)
    if (c == '/') c = '_';
  return (dir / name).string();
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Whether the folder of `target` holds no temporary the writer left for it
// (".<name>.<16 hex>.tmp").
inline bool no_temporaries(const std::string& target) {
  const std::filesystem::path t(target);
  const std::string prefix = "." + t.filename().string().substr(0, 100) + ".";
  for (const auto& e : std::filesystem::directory_iterator(t.parent_path())) {
    const std::string n = e.path().filename().string();
    if (n.rfind(prefix, 0) == 0 && n.size() > 4 && n.substr(n.size() - 4) == ".tmp") return false;
  }
  return true;
}

// [u64 length][header][data]: a safetensors file as the format lays it out, with any header.
inline std::vector<uint8_t> st_bytes(const std::string& header, const std::vector<uint8_t>& data,
                                     uint64_t length_field) {
  // Sized once and filled by index (GCC 12 warns falsely on vector::insert of a string here).
  std::vector<uint8_t> b(8 + header.size() + data.size());
  for (std::size_t i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(length_field >> (8 * i));
  for (std::size_t i = 0; i < header.size(); ++i) b[8 + i] = static_cast<uint8_t>(header[i]);
  for (std::size_t i = 0; i < data.size(); ++i) b[8 + header.size() + i] = data[i];
  return b;
}
inline std::vector<uint8_t> st_bytes(const std::string& header, const std::vector<uint8_t>& data) {
  return st_bytes(header, data, header.size());
}

// Bit-equal weights, buffer by buffer.
template <class T>
void expect_same_vec(const std::vector<T>& a, const std::vector<T>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_TRUE(a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0) << what;
}

inline void expect_same_tensor(const QuantizedTensor& a, const QuantizedTensor& b,
                               const std::string& w) {
  EXPECT_EQ(a.format, b.format) << w;
  EXPECT_EQ(a.experts, b.experts) << w;
  EXPECT_EQ(a.rows, b.rows) << w;
  EXPECT_EQ(a.cols, b.cols) << w;
  EXPECT_EQ(a.group_size, b.group_size) << w;
  expect_same_vec(a.values, b.values, w + ".values");
  expect_same_vec(a.scales, b.scales, w + ".scales");
  expect_same_vec(a.scale_bytes, b.scale_bytes, w + ".scale_bytes");
  expect_same_vec(a.zeros, b.zeros, w + ".zeros");
  expect_same_vec(a.weight_scale, b.weight_scale, w + ".weight_scale");
  expect_same_vec(a.global_scale, b.global_scale, w + ".global_scale");
  expect_same_vec(a.input_scale, b.input_scale, w + ".input_scale");
  expect_same_vec(a.pre_quant_scale, b.pre_quant_scale, w + ".pre_quant_scale");
}

inline void expect_same(const MoeWeights& a, const MoeWeights& b, const std::string& what) {
  expect_same_tensor(a.fc1, b.fc1, what + " fc1");
  expect_same_tensor(a.fc2, b.fc2, what + " fc2");
  expect_same_vec(a.fc1_bias, b.fc1_bias, what + " fc1_bias");
  expect_same_vec(a.fc2_bias, b.fc2_bias, what + " fc2_bias");
  expect_same_vec(a.routing_bias, b.routing_bias, what + " routing_bias");
}

}  // namespace moekit::test
