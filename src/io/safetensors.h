// safetensors: reading (mmap, zero-copy, fully validated), writing, and sharded checkpoints
// (model.safetensors.index.json). Format: 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data section; offsets are relative to the data section.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/mmap_file.h"
#include "tensor/dtype.h"

namespace hybridlm {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // points into the mapped file
  size_t nbytes = 0;
  std::string file;  // the file it came from (for error messages)
  const MappedFile* source = nullptr;  // the file's bytes (shared by every copy of the checkpoint)

  int64_t numel() const;
  // Converts to f32 (from F32, F16, BF16 or F64); throws Error naming the tensor for other dtypes.
  void to_f32(float* out) const;
  // Elements [first, first + n) only.
  void to_f32(float* out, size_t first, size_t n) const;
  // Elements [first, first + n), once copied out: MappedFile::release of their bytes.
  void release(size_t first, size_t n) const;
};

class SafetensorsFile {
 public:
  // Validates everything: header length within the file, JSON well-formed, every dtype known,
  // shape x dtype size == byte range, ranges inside the data section and non-overlapping.
  static SafetensorsFile open(const std::filesystem::path& path, bool use_mmap = true);
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::shared_ptr<MappedFile> file_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint directory: model.safetensors, or the shards named by model.safetensors.index.json.
class Checkpoint {
 public:
  Checkpoint() = default;
  // index_ points into files_; a copy rebuilds it so it points into the copy's own files.
  Checkpoint(const Checkpoint& other);
  Checkpoint& operator=(const Checkpoint& other);
  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;

  static Checkpoint open(const std::filesystem::path& dir, bool use_mmap = true);
  // Whether `dir` holds a checkpoint to open (model.safetensors or its index), valid or not.
  static bool present(const std::filesystem::path& dir);
  // nullptr if absent.
  const TensorInfo* find(const std::string& name) const;
  // Throws Error "<dir>: missing tensor '<name>'" if absent.
  const TensorInfo& get(const std::string& name) const;
  const std::map<std::string, const TensorInfo*>& all() const { return index_; }

 private:
  // Fills index_ from files_; throws Error if a tensor name appears in two files.
  void build_index();

  std::vector<SafetensorsFile> files_;
  std::map<std::string, const TensorInfo*> index_;
  std::filesystem::path dir_;
};

// A tensor to write: name, dtype, shape and its raw little-endian bytes.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;
};
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// What a safetensors file holds before its data section: the 8-byte header length and the JSON
// header (padded to 8 bytes). The file is these bytes, then each tensor's bytes in order; for
// writers that place the file themselves (train/checkpoint.h). Validates the tensors as
// write_safetensors does, naming `file` in errors.
std::string safetensors_header(const std::vector<TensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata, const std::string& file);

}  // namespace hybridlm
