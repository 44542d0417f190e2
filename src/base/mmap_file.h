// A read-only file mapped into memory (or read into an anonymous buffer when mapping is not wanted).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>

namespace hybridlm {

class MappedFile {
 public:
  // use_mmap=false, or a file that cannot be mapped, reads the whole file into anonymous memory.
  // (Model::load always maps; without --mmap it copies the weights out, releasing pages as it goes.)
  static std::shared_ptr<MappedFile> open(const std::filesystem::path& path, bool use_mmap = true);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }
  // A mapped file: drops the whole pages inside [p, p + n) from this process's memory (a later
  // read maps them again from the file). Loading that copies weights out of the file calls it so
  // the file does not stay resident beside the copy. No-op for a file read into memory.
  void release(const uint8_t* p, size_t n) const;

 private:
  MappedFile() = default;
  std::filesystem::path path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  std::unique_ptr<uint8_t[]> owned_;
};

}  // namespace hybridlm
