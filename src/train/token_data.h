// The token files of `hybridlm prepare-data` (docs/training-data.md) as a training run reads them:
// train.bin / val.bin (little-endian uint16 or uint32 ids back to back, no header) with index.json
// beside them saying which. A file is read into memory whole and checked once, so sampling never
// fails and never reads out of range.
//
// Training batches are random windows of seq_len + 1 tokens (inputs and the targets shifted by
// one), each a pure function of (seed, step, micro-batch, rank, row): resuming at step s draws the
// same batches as a run that never stopped, with no generator state to save. Validation walks the
// file in fixed, non-overlapping windows, the same ones at every evaluation.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace hybridlm {

// OUT/index.json of prepare-data.
struct TokenIndex {
  int width = 2;           // bytes per id: 2 (dtype uint16) or 4 (uint32)
  int64_t vocab_size = 0;  // the tokenizer's
  std::optional<int32_t> eos_id;
  std::filesystem::path tokenizer;  // the tokenizer.json it was encoded with (absolute)
  struct Split {
    std::string file;    // train.bin, val.bin
    uint64_t tokens = 0;
  } train, val;
};
// Reads dir/index.json; throws Error naming the file and key for anything missing or malformed.
TokenIndex read_token_index(const std::filesystem::path& dir);

class TokenFile {
 public:
  // Reads `path` (a split named in index.json beside it) into memory. Throws a one-line Error for a
  // missing or empty file, a size that is not whole ids or not the count index.json gives, and an
  // id >= vocab_size (the model's vocabulary), naming its offset in tokens.
  static TokenFile open(const std::filesystem::path& path, int64_t vocab_size);

  size_t size() const { return size_; }  // tokens
  int32_t operator[](size_t i) const { return width_ == 2 ? u16_[i] : static_cast<int32_t>(u32_[i]); }
  // out[0, n) = tokens [begin, begin + n); the range must be inside the file.
  void copy(size_t begin, size_t n, int32_t* out) const;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int width_ = 2;
  size_t size_ = 0;
  std::vector<uint16_t> u16_;  // one of the two holds the ids
  std::vector<uint32_t> u32_;
};

// splitmix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number generators", 2014): a
// bijective mix of 64 bits; hashing a counter with it gives independent-looking values.
uint64_t splitmix64(uint64_t x);

// Training windows drawn uniformly (with replacement) from the whole file.
class BatchSampler {
 public:
  // Throws Error if the file holds fewer than seq_len + 1 tokens (one window).
  BatchSampler(const TokenFile& data, int seq_len, uint64_t seed);

  // ids: (rows, seq_len + 1), row-major: the windows of micro-batch `micro` of optimizer step
  // `step` on data-parallel rank `rank`. Row r is tokens [s, s + seq_len + 1) of the file, s =
  // window_start(step, micro, rank, r).
  void batch(uint64_t step, int micro, int rank, int rows, int32_t* ids) const;
  // hash(seed, step, micro, rank, row) mapped onto [0, size - seq_len - 1].
  size_t window_start(uint64_t step, int micro, int rank, int row) const;
  int seq_len() const { return seq_len_; }

 private:
  const TokenFile& data_;
  int seq_len_;
  uint64_t seed_;
};

// Validation windows: window k is tokens [k seq_len, k seq_len + seq_len + 1), so together the
// (size - 1) / seq_len windows predict every token after the first once. With max_batches > 0
// and more windows than max_batches x rows, that many are taken evenly spaced over the file.
class EvalWindows {
 public:
  // Throws Error if the file holds fewer than seq_len + 1 tokens.
  EvalWindows(const TokenFile& data, int seq_len, int rows, int64_t max_batches);

  int64_t windows() const { return used_; }                   // windows per pass
  int64_t batches() const { return (used_ + rows_ - 1) / rows_; }  // the last may be short
  // ids: (rows, seq_len + 1). Fills the next batch's windows and returns how many (< rows only
  // for the last batch; 0 once the pass is done).
  int next(int32_t* ids);
  // Back to the first window, for the next evaluation.
  void reset() { next_ = 0; }

 private:
  const TokenFile& data_;
  int seq_len_, rows_;
  int64_t total_, used_, next_ = 0;
};

}  // namespace hybridlm
