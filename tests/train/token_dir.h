// Test helpers for the training tests: a scratch directory per test, and a directory of token
// files laid out as `hybridlm prepare-data` writes them (train.bin, val.bin, index.json).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace hybridlm::testing {

// <TempDir>/hybridlm_<suite>_<pid>_<test>, created empty; removed by the caller's TearDown.
inline std::filesystem::path scratch_dir(const std::string& suite) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                    ("hybridlm_" + suite + "_" + std::to_string(::getpid()) + "_" + info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline void write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << p;
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Little-endian ids of `width` bytes, as prepare-data's write_tokens.
inline std::string token_bytes(const std::vector<uint32_t>& ids, int width) {
  std::string b(ids.size() * static_cast<size_t>(width), '\0');
  for (size_t i = 0; i < ids.size(); ++i)
    for (int k = 0; k < width; ++k) b[i * width + k] = static_cast<char>(ids[i] >> (8 * k));
  return b;
}

// dir/train.bin, dir/val.bin and dir/index.json with the given ids; the index records `tokenizer`.
inline void write_token_dir(const std::filesystem::path& dir, const std::vector<uint32_t>& train,
                            const std::vector<uint32_t>& val, int width, int64_t vocab,
                            const std::string& tokenizer = "/nonexistent/tokenizer.json") {
  std::filesystem::create_directories(dir);
  write_file(dir / "train.bin", token_bytes(train, width));
  write_file(dir / "val.bin", token_bytes(val, width));
  const nlohmann::json index = {
      {"format", "hybridlm-tokens"},
      {"version", 1},
      {"dtype", width == 2 ? "uint16" : "uint32"},
      {"byte_order", "little"},
      {"vocab_size", vocab},
      {"eos_id", 0},
      {"tokenizer", {{"path", tokenizer}, {"sha256", "0"}}},
      {"val_fraction", 0.1},
      {"seed", 1},
      {"train", {{"file", "train.bin"}, {"tokens", train.size()}, {"documents", nlohmann::json::array()}}},
      {"val", {{"file", "val.bin"}, {"tokens", val.size()}, {"documents", nlohmann::json::array()}}}};
  write_file(dir / "index.json", index.dump(2));
}

}  // namespace hybridlm::testing
