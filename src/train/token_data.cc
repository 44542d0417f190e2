#include "train/token_data.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/json.h"

namespace hybridlm {

// The ids are read straight into uint16/uint32 arrays: the files are little-endian, as every CPU
// we build for.
static_assert(std::endian::native == std::endian::little, "token files are little-endian");

namespace {

constexpr uint64_t kMaxIndexBytes = 64u << 20;  // index.json lists every document; 64 MiB is plenty

// Reads all of `path` into dst (resized to the file's size / sizeof(T)); the size must be a multiple
// of sizeof(T).
template <class T>
void read_whole(const std::filesystem::path& path, std::vector<T>& dst) {
  const std::string name = path.string();
  const int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_error(name, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  if (!stat_ok || !S_ISREG(st.st_mode)) {
    const std::string why = !stat_ok                ? std::strerror(errno)
                            : S_ISDIR(st.st_mode) ? "a directory"
                                                  : "not a regular file";
    ::close(fd);
    throw_error(name, ": cannot read: ", why);
  }
  const uint64_t bytes = static_cast<uint64_t>(st.st_size);
  if (bytes % sizeof(T) != 0) {
    ::close(fd);
    throw_error(name, ": ", bytes, " bytes is not a whole number of ", sizeof(T), "-byte token ids");
  }
  dst.resize(bytes / sizeof(T));
  auto* p = reinterpret_cast<char*>(dst.data());
  uint64_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::read(fd, p + done, std::min<uint64_t>(bytes - done, 1u << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::close(fd);
      throw_error(name, ": read failed after ", done, " of ", bytes, " bytes",
                  err ? std::string(": ") + std::strerror(err) : std::string(" (the file shrank)"));
    }
    done += static_cast<uint64_t>(n);
  }
  ::close(fd);
}

}  // namespace

TokenIndex read_token_index(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "index.json";
  const std::string where = path.string();
  std::error_code ec;
  check(std::filesystem::is_regular_file(path, ec), where,
        ": missing (token files come with the index.json of `hybridlm prepare-data`)");
  std::vector<char> text;
  check(std::filesystem::file_size(path, ec) <= kMaxIndexBytes, where, ": over ", kMaxIndexBytes >> 20, " MiB");
  read_whole(path, text);
  const nlohmann::json j = parse_json(std::string_view(text.data(), text.size()), where);
  check(j.is_object() && j.contains("format") && j["format"] == "hybridlm-tokens", where,
        ": not an index of hybridlm token files (\"format\": \"hybridlm-tokens\")");
  // Each key is looked up before it is described: check() evaluates its message arguments eagerly.
  const auto get = [&](const nlohmann::json& o, const char* key, const char* what) -> const nlohmann::json& {
    check(o.is_object() && o.contains(key), where, ": missing \"", key, "\" (", what, ")");
    return o[key];
  };
  const nlohmann::json& version = get(j, "version", "the format version");
  check(version == 1, where, ": version ", json_brief(version), " (this build reads version 1)");
  TokenIndex ix;
  const nlohmann::json& dtype = get(j, "dtype", "uint16 or uint32");
  check(dtype == "uint16" || dtype == "uint32", where, ": dtype ", json_brief(dtype), ": expected uint16 or uint32");
  ix.width = dtype == "uint16" ? 2 : 4;
  if (j.contains("byte_order"))
    check(j["byte_order"] == "little", where, ": byte_order ", json_brief(j["byte_order"]), ": expected little");
  const nlohmann::json& vocab = get(j, "vocab_size", "the tokenizer's vocabulary");
  check(vocab.is_number_integer() && vocab.get<int64_t>() > 0, where, ": vocab_size ", json_brief(vocab),
        ": expected a positive integer");
  ix.vocab_size = vocab.get<int64_t>();
  if (j.contains("eos_id") && !j["eos_id"].is_null()) {
    check(j["eos_id"].is_number_integer() && j["eos_id"].get<int64_t>() >= 0 &&
              j["eos_id"].get<int64_t>() < ix.vocab_size,
          where, ": eos_id ", json_brief(j["eos_id"]), ": expected a token id below vocab_size");
    ix.eos_id = j["eos_id"].get<int32_t>();
  }
  if (j.contains("tokenizer") && j["tokenizer"].is_object() && j["tokenizer"].contains("path") &&
      j["tokenizer"]["path"].is_string())
    ix.tokenizer = j["tokenizer"]["path"].get<std::string>();
  for (auto [key, split] : {std::pair{"train", &ix.train}, std::pair{"val", &ix.val}}) {
    const nlohmann::json& s = get(j, key, "a split");
    const nlohmann::json& file = get(s, "file", "the split's token file");
    const nlohmann::json& tokens = get(s, "tokens", "the split's token count");
    check(file.is_string() && tokens.is_number_unsigned(), where, ": ", key,
          ": expected {\"file\": name, \"tokens\": count}");
    split->file = file.get<std::string>();
    split->tokens = tokens.get<uint64_t>();
  }
  return ix;
}

TokenFile TokenFile::open(const std::filesystem::path& path, int64_t vocab_size) {
  const std::string name = path.string();
  std::error_code ec;
  check(std::filesystem::exists(path, ec), name, ": no such token file");
  const TokenIndex ix = read_token_index(path.parent_path().empty() ? "." : path.parent_path());
  const std::string base = path.filename().string();
  const TokenIndex::Split* split = base == ix.train.file ? &ix.train : base == ix.val.file ? &ix.val : nullptr;
  check(split != nullptr, name, ": not a split of ", (path.parent_path() / "index.json").string(), " (it lists ",
        ix.train.file, " and ", ix.val.file, ")");

  TokenFile f;
  f.path_ = path;
  f.width_ = ix.width;
  if (f.width_ == 2) read_whole(path, f.u16_);
  else read_whole(path, f.u32_);
  f.size_ = f.width_ == 2 ? f.u16_.size() : f.u32_.size();
  check(f.size_ > 0, name, ": empty file (no tokens)");
  check(f.size_ == split->tokens, name, ": ", f.size_, " tokens, but index.json says ", split->tokens);
  // Every id is checked once here, so an embedding lookup never reads past the table.
  const auto first_bad = [&](const auto& ids) {
    return std::find_if(ids.begin(), ids.end(), [&](auto id) { return static_cast<int64_t>(id) >= vocab_size; }) -
           ids.begin();
  };
  const size_t bad = static_cast<size_t>(f.width_ == 2 ? first_bad(f.u16_) : first_bad(f.u32_));
  check(bad == f.size_, name, ": token ", f.size_ > bad ? static_cast<int64_t>(f[bad]) : 0, " at offset ", bad,
        " (in tokens) is outside the vocabulary of ", vocab_size);
  return f;
}

void TokenFile::copy(size_t begin, size_t n, int32_t* out) const {
  if (width_ == 2) std::copy_n(u16_.begin() + static_cast<std::ptrdiff_t>(begin), n, out);
  else std::transform(u32_.begin() + static_cast<std::ptrdiff_t>(begin),
                      u32_.begin() + static_cast<std::ptrdiff_t>(begin + n), out,
                      [](uint32_t id) { return static_cast<int32_t>(id); });
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

namespace {

void check_one_window(const TokenFile& data, int seq_len) {
  check(seq_len >= 1, "seq_len ", seq_len, ": must be >= 1");
  check(data.size() >= static_cast<size_t>(seq_len) + 1, data.path().string(), ": ", data.size(),
        " tokens, fewer than seq_len + 1 = ", static_cast<int64_t>(seq_len) + 1, " (one window)");
}

}  // namespace

BatchSampler::BatchSampler(const TokenFile& data, int seq_len, uint64_t seed)
    : data_(data), seq_len_(seq_len), seed_(seed) {
  check_one_window(data, seq_len);
}

size_t BatchSampler::window_start(uint64_t step, int micro, int rank, int row) const {
  // One splitmix64 per field: the chain is a bijection of each field given the others, so distinct
  // tuples collide only as random 64-bit values do.
  uint64_t h = splitmix64(seed_);
  h = splitmix64(h ^ step);
  h = splitmix64(h ^ static_cast<uint64_t>(static_cast<uint32_t>(micro)));
  h = splitmix64(h ^ static_cast<uint64_t>(static_cast<uint32_t>(rank)));
  h = splitmix64(h ^ static_cast<uint64_t>(static_cast<uint32_t>(row)));
  // Starts 0 .. size - seq_len - 1: (h x n) >> 64 maps h onto [0, n) without a division (Lemire).
  const uint64_t n = data_.size() - static_cast<uint64_t>(seq_len_);
  return static_cast<size_t>((static_cast<unsigned __int128>(h) * n) >> 64);
}

void BatchSampler::batch(uint64_t step, int micro, int rank, int rows, int32_t* ids) const {
  const size_t w = static_cast<size_t>(seq_len_) + 1;
  for (int r = 0; r < rows; ++r) data_.copy(window_start(step, micro, rank, r), w, ids + static_cast<size_t>(r) * w);
}

EvalWindows::EvalWindows(const TokenFile& data, int seq_len, int rows, int64_t max_batches)
    : data_(data), seq_len_(seq_len), rows_(rows) {
  check_one_window(data, seq_len);
  check(rows >= 1, "evaluation rows ", rows, ": must be >= 1");
  check(max_batches >= 0, "eval_batches ", max_batches, ": must be >= 0");
  total_ = static_cast<int64_t>((data.size() - 1) / static_cast<size_t>(seq_len));
  used_ = max_batches > 0 ? std::min(total_, max_batches * rows) : total_;
}

int EvalWindows::next(int32_t* ids) {
  const size_t w = static_cast<size_t>(seq_len_) + 1;
  int n = 0;
  for (; n < rows_ && next_ < used_; ++n, ++next_) {
    // Window i of used_ is window floor(i total / used) of the file: every one when used == total,
    // else evenly spread.
    const int64_t k = static_cast<int64_t>(static_cast<unsigned __int128>(next_) * total_ / used_);
    data_.copy(static_cast<size_t>(k) * static_cast<size_t>(seq_len_), w, ids + static_cast<size_t>(n) * w);
  }
  return n;
}

}  // namespace hybridlm
