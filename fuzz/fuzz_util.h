// Helpers shared by the libFuzzer targets: a private scratch directory for inputs that the code
// under test reads from files, and the location of the test data (tests/data).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace hybridlm::fuzz {

inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("hybridlm-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline void write_file(const std::filesystem::path& p, const uint8_t* data, size_t size) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

inline std::filesystem::path test_data() {
  const char* env = std::getenv("HYBRIDLM_TEST_DATA");
  return env ? std::filesystem::path(env) : std::filesystem::path(HYBRIDLM_DEFAULT_TEST_DATA);
}

}  // namespace hybridlm::fuzz
