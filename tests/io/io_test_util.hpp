// Helpers shared by the io tests: per-test temporary files and raw safetensors bytes.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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

}  // namespace moekit::test
