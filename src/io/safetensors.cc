// safetensors reader/writer and sharded checkpoints. The format (huggingface/safetensors, docs
// "Format" section):
//   [u64 little-endian N][N bytes of UTF-8 JSON header, may be padded with trailing spaces][data]
// Every header entry is {"dtype": "F32", "shape": [d0, d1, ..], "data_offsets": [begin, end]},
// with offsets relative to the start of the data section; the optional "__metadata__" entry is a
// string -> string map. We validate the whole header before handing out any pointer, so a
// TensorInfo's [data, data + nbytes) is always inside the mapping.
#include "io/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/json.h"

namespace hybridlm {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; reading it in place needs a little-endian host");

namespace {

using nlohmann::json;

// The reference implementation refuses headers above 100 MB; a header that large is corrupt, and
// refusing it early keeps a bad length from making us parse (or allocate) gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// Name of the index file written next to the shards by transformers' save_pretrained.
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

// Error messages are one line: strip newlines out of anything quoted from a file or a library.
std::string one_line(std::string s, size_t max_len = 200) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  if (s.size() > max_len) s = s.substr(0, max_len) + "...";
  return s;
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // unaligned-safe; the host is little-endian (static_assert above)
  return v;
}

// Reads a JSON integer that must fit in int64_t and be >= 0. Returns false otherwise (floats,
// negatives, strings, huge unsigned values).
bool get_nonneg_int(const json& j, int64_t* out) {
  if (j.is_number_unsigned()) {
    uint64_t u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = v;
    return true;
  }
  return false;
}

// numel * elem_size, or false on overflow of uint64_t.
bool checked_nbytes(const std::vector<int64_t>& shape, size_t elem_size, uint64_t* out) {
  uint64_t n = elem_size;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *out = n;
  return true;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// Parses one header entry into `info` (everything but `data`); `where` is "<file>: tensor '<name>'".
void parse_entry(const json& e, const std::string& where, TensorInfo* info, uint64_t* begin,
                 uint64_t* end) {
  check(e.is_object(), where, ": header entry is not a JSON object");
  auto dt = e.find("dtype");
  check(dt != e.end(), where, ": header entry has no 'dtype'");
  check(dt->is_string(), where, ": 'dtype' is not a string");
  const std::string& dname = dt->get_ref<const std::string&>();
  check(dtype_from_name(dname, &info->dtype), where, ": unknown dtype '", one_line(dname), "'");

  auto sh = e.find("shape");
  check(sh != e.end(), where, ": header entry has no 'shape'");
  check(sh->is_array(), where, ": 'shape' is not an array");
  info->shape.clear();
  for (const json& d : *sh) {
    if (d.is_number_integer() && d.get<int64_t>() < 0) {
      throw Error(where + ": negative dimension " + std::to_string(d.get<int64_t>()) + " in shape");
    }
    int64_t v = 0;
    check(get_nonneg_int(d, &v), where, ": shape entry ", json_brief(d), " is not an integer");
    info->shape.push_back(v);
  }

  auto off = e.find("data_offsets");
  check(off != e.end(), where, ": header entry has no 'data_offsets'");
  check(off->is_array() && off->size() == 2,
        where, ": 'data_offsets' is not an array of two integers");
  int64_t b = 0, en = 0;
  check(get_nonneg_int((*off)[0], &b) && get_nonneg_int((*off)[1], &en),
        where, ": 'data_offsets' ", json_brief(*off), " are not non-negative integers");
  check(b <= en, where, ": data_offsets begin ", b, " > end ", en);
  *begin = static_cast<uint64_t>(b);
  *end = static_cast<uint64_t>(en);

  uint64_t want = 0;
  check(checked_nbytes(info->shape, dtype_size(info->dtype), &want),
        where, ": shape ", shape_str(info->shape), " overflows the byte count");
  check(want == *end - *begin, where, ": shape ", shape_str(info->shape), " x ", dname, " is ", want,
      " bytes but data_offsets span ", *end - *begin);
  info->nbytes = static_cast<size_t>(want);
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void TensorInfo::to_f32(float* out) const { to_f32(out, 0, static_cast<size_t>(numel())); }

void TensorInfo::release(size_t first, size_t n) const {
  if (source && first <= static_cast<size_t>(numel()) && n <= static_cast<size_t>(numel()) - first)
    source->release(data + first * dtype_size(dtype), n * dtype_size(dtype));
}

void TensorInfo::to_f32(float* out, size_t first, size_t n) const {
  check(first <= static_cast<size_t>(numel()) && n <= static_cast<size_t>(numel()) - first,
        file, ": tensor '", name, "': element range out of bounds");
  const uint8_t* data = this->data + first * dtype_size(dtype);
  // Data in the mapping may be unaligned (offsets are arbitrary), so every read is a memcpy.
  switch (dtype) {
    case DType::F32:
      if (n) std::memcpy(out, data, n * 4);
      return;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, data + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      return;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, data + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      return;
    case DType::F64:
      for (size_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, data + 8 * i, 8);
        out[i] = static_cast<float>(d);
      }
      return;
    default:
      throw Error(file + ": tensor '" + name + "' has dtype " + std::string(dtype_name(dtype)) +
                  ", which cannot be converted to F32");
  }
}

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path, bool use_mmap) {
  SafetensorsFile out;
  out.file_ = MappedFile::open(path, use_mmap);
  const std::string fname = path.string();
  const uint8_t* base = out.file_->data();
  const uint64_t size = out.file_->size();

  check(size >= 8, fname, ": file is ", size, " bytes, shorter than the 8-byte header length");
  const uint64_t n = read_u64_le(base);
  check(n <= kMaxHeaderBytes, fname, ": header length ", n, " exceeds the 100 MiB limit (corrupt file?)");
  check(n <= size - 8, fname, ": header length ", n, " is beyond the end of the ", size, "-byte file");
  const uint64_t data_start = 8 + n;
  const uint64_t data_size = size - data_start;

  // Parse, noting duplicate top-level keys (nlohmann would silently keep the last one).
  std::set<std::string> seen;
  std::string duplicate;
  json header;
  try {
    header = json::parse(base + 8, base + data_start,
                         [&](int depth, json::parse_event_t ev, json& parsed) {
                           check_json_depth(depth, fname + ": header");
                           if (ev == json::parse_event_t::key && depth == 1 && duplicate.empty() &&
                               !seen.insert(parsed.get<std::string>()).second) {
                             duplicate = parsed.get<std::string>();
                           }
                           return true;
                         });
  } catch (const json::exception& e) {
    throw Error(fname + ": header is not valid JSON: " + one_line(e.what()));
  }
  check(duplicate.empty(), fname, ": header lists '", one_line(duplicate), "' twice");
  check(header.is_object(), fname, ": header is not a JSON object");

  struct Range {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    if (key == "__metadata__") {
      check(it->is_object(), fname, ": '__metadata__' is not a JSON object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        check(m->is_string(), fname, ": '__metadata__' value for '", one_line(m.key()), "' is not a string");
        out.metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const std::string where = fname + ": tensor '" + one_line(key) + "'";
    TensorInfo info;
    info.name = key;
    info.file = fname;
    uint64_t b = 0, e = 0;
    parse_entry(*it, where, &info, &b, &e);
    check(e <= data_size, where, ": data_offsets [", b, ", ", e, "] are beyond the ", data_size,
        "-byte data section (truncated file?)");
    info.data = base + data_start + b;
    info.source = out.file_.get();
    auto [pos, inserted] = out.tensors_.emplace(key, std::move(info));
    ranges.push_back({b, e, &pos->first});
  }

  // Overlap check: sort by begin; each non-empty range must start at or after the previous end.
  // Gaps and trailing bytes are tolerated (the reference writer never makes them, but they are
  // harmless); empty tensors occupy no bytes and cannot overlap anything.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const Range* prev = nullptr;
  for (const Range& r : ranges) {
    if (r.begin == r.end) continue;
    if (prev && r.begin < prev->end) {
      throw Error(fname + ": tensors '" + one_line(*prev->name) + "' [" +
                  std::to_string(prev->begin) + ", " + std::to_string(prev->end) + ") and '" +
                  one_line(*r.name) + "' [" + std::to_string(r.begin) + ", " +
                  std::to_string(r.end) + ") have overlapping data_offsets");
    }
    prev = &r;
  }
  return out;
}

// ---- Checkpoint ----------------------------------------------------------------------------------

Checkpoint::Checkpoint(const Checkpoint& other) : files_(other.files_), dir_(other.dir_) {
  build_index();
}

Checkpoint& Checkpoint::operator=(const Checkpoint& other) {
  if (this != &other) {
    files_ = other.files_;
    dir_ = other.dir_;
    build_index();
  }
  return *this;
}

void Checkpoint::build_index() {
  // index_ points at TensorInfo nodes inside files_[i].tensors_ (a std::map: nodes never move, not
  // even when files_ reallocates or the Checkpoint is moved).
  index_.clear();
  for (const SafetensorsFile& f : files_) {
    for (const auto& [name, info] : f.tensors()) {
      auto [it, inserted] = index_.emplace(name, &info);
      check(inserted, dir_.string(), ": tensor '", one_line(name), "' is in both ", it->second->file, " and ",
          info.file);
    }
  }
}

Checkpoint Checkpoint::open(const std::filesystem::path& dir, bool use_mmap) {
  Checkpoint ck;
  ck.dir_ = dir;
  const std::filesystem::path index_path = dir / kIndexName;
  const std::string iname = index_path.string();
  std::error_code ec;
  if (std::filesystem::exists(index_path, ec)) {
    auto mf = MappedFile::open(index_path, use_mmap);
    const json index = parse_json(
        std::string_view(reinterpret_cast<const char*>(mf->data()), mf->size()), iname);
    check(index.is_object(), iname, ": not a JSON object");
    auto wm = index.find("weight_map");
    check(wm != index.end(), iname, ": no 'weight_map'");
    check(wm->is_object(), iname, ": 'weight_map' is not a JSON object");

    // shard file -> tensors the index says it holds; shards opened once each, in name order.
    std::map<std::string, std::vector<std::string>> by_shard;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      check(it->is_string(), iname, ": weight_map entry for tensor '", one_line(it.key()), "' is not a string");
      by_shard[it->get<std::string>()].push_back(it.key());
    }
    ck.files_.reserve(by_shard.size());
    for (const auto& [shard, names] : by_shard) {
      // A shard is a file name inside the checkpoint directory: no paths (an index from a
      // stranger must not make us open /etc/passwd or ../../anything).
      check(!shard.empty() && shard != "." && shard != ".." &&
                shard.find_first_of(std::string("/\\\0", 3)) == std::string::npos,
            iname, ": shard '", one_line(shard), "' (for tensor '", one_line(names.front()),
                "') is not a plain file name");
      const std::filesystem::path sp = dir / shard;
      check(std::filesystem::is_regular_file(sp, ec),
            iname, ": shard file '", one_line(shard), "' (for tensor '", one_line(names.front()),
                "') does not exist in ", dir.string());
      ck.files_.push_back(SafetensorsFile::open(sp, use_mmap));
      const auto& have = ck.files_.back().tensors();
      for (const std::string& n : names) {
        check(have.count(n) != 0, sp.string(), ": tensor '", one_line(n), "' is named in ", kIndexName,
            " but absent from shard '", one_line(shard), "'");
      }
    }
  } else if (std::filesystem::exists(dir / kSingleName, ec)) {
    ck.files_.push_back(SafetensorsFile::open(dir / kSingleName, use_mmap));
  } else {
    throw Error(dir.string() + ": no " + kSingleName + " or " + kIndexName);
  }
  ck.build_index();
  return ck;
}

bool Checkpoint::present(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::exists(dir / kIndexName, ec) || std::filesystem::exists(dir / kSingleName, ec);
}

const TensorInfo* Checkpoint::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const TensorInfo& Checkpoint::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) throw Error(dir_.string() + ": missing tensor '" + one_line(name) + "'");
  return *t;
}

// ---- Writer --------------------------------------------------------------------------------------

std::string safetensors_header(const std::vector<TensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata, const std::string& fname) {
  // ordered_json keeps insertion order: "__metadata__" first, then tensors in the order given
  // (which is also their order in the data section).
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    const std::string where = fname + ": tensor '" + one_line(t.name) + "'";
    check(!t.name.empty(), fname, ": empty tensor name");
    check(t.name != "__metadata__", where, ": name is reserved");
    check(!header.contains(t.name), where, ": written twice");
    check(t.dtype < DType::kCount, where, ": invalid dtype");
    uint64_t want = 0;
    check(checked_nbytes(t.shape, dtype_size(t.dtype), &want),
          where, ": shape ", shape_str(t.shape), " has a negative dimension or overflows");
    check(want == t.bytes.size(), where, ": shape ", shape_str(t.shape), " x ", std::string(dtype_name(t.dtype)),
        " is ", want, " bytes but ", t.bytes.size(), " were given");
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + want}}};
    offset += want;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::exception& e) {
    throw Error(fname + ": cannot encode header: " + one_line(e.what()));
  }
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + text;
}

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string fname = path.string();
  const std::string head = safetensors_header(tensors, metadata, fname);

  // Write to a temporary next to the target, then rename: readers never see a half-written file.
  std::filesystem::path tmp = path;
  tmp += ".tmp." + std::to_string(::getpid());
  const std::string tname = tmp.string();
  std::FILE* f = std::fopen(tname.c_str(), "wb");
  if (!f) throw Error(fname + ": cannot create " + tname + ": " + std::strerror(errno));
  bool ok = std::fwrite(head.data(), 1, head.size(), f) == head.size();
  for (const TensorToWrite& t : tensors) {
    if (!ok) break;
    if (!t.bytes.empty()) ok = std::fwrite(t.bytes.data(), 1, t.bytes.size(), f) == t.bytes.size();
  }
  ok = std::fflush(f) == 0 && ok;
  ok = ::fsync(::fileno(f)) == 0 && ok;
  const int err = errno;
  ok = std::fclose(f) == 0 && ok;
  std::error_code ec;
  if (!ok) {
    std::filesystem::remove(tmp, ec);
    throw Error(fname + ": write failed: " + std::strerror(err));
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(tmp, ec);
    throw Error(fname + ": cannot rename " + tname + " into place: " + why);
  }
}

}  // namespace hybridlm
