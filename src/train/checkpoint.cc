#include "train/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2 (glibc >= 2.28)
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "base/error.h"
#include "base/json.h"

namespace hybridlm {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail_errno(const fs::path& path, const char* what, int err) {
  throw_error(path.string(), ": ", what, ": ", std::strerror(err));
}

// A name that stays inside its directory and is not one of our hidden temporaries.
bool plain_name(const std::string& name) {
  return !name.empty() && name.size() <= 200 && name.find('/') == std::string::npos && name[0] != '.' &&
         name.find('\0') == std::string::npos;
}

void write_all(int fd, const uint8_t* p, size_t n, const fs::path& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) fail_errno(path, "write failed", errno);
    if (w == 0) fail_errno(path, "write failed", ENOSPC);  // no progress on a regular file: out of space
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Creates `path` (it must not exist), writes the file's bytes, fsyncs and closes it.
void write_file(const fs::path& path, const CheckpointFile& f) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno(path, "cannot create", errno);
  try {
    write_all(fd, reinterpret_cast<const uint8_t*>(f.owned.data()), f.owned.size(), path);
    for (std::span<const uint8_t> b : f.borrowed) write_all(fd, b.data(), b.size(), path);
    if (::fsync(fd) != 0) fail_errno(path, "fsync failed", errno);
  } catch (...) {
    ::close(fd);
    throw;
  }
  // close can report a delayed write error (NFS); the data is not safe if it does.
  if (::close(fd) != 0) fail_errno(path, "close failed", errno);
}

// Makes a directory's entries (files created or renamed in it) durable.
void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_errno(dir, "cannot open the directory to fsync it", errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail_errno(dir, "fsync failed", err);
}

// Removes out/.tmp-<name>-* and out/.old-<name>-* that a killed run left behind.
void remove_leftovers(const fs::path& out, const std::string& name) {
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const fs::directory_entry& e : fs::directory_iterator(out, ec)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with(".tmp-" + name + "-") || n.starts_with(".old-" + name + "-")) stale.push_back(e.path());
  }
  for (const fs::path& p : stale) fs::remove_all(p, ec);
}

// Puts directory tmp at dst, replacing what is there. With RENAME_EXCHANGE dst always names a
// whole checkpoint and the old one ends up at tmp; the fallback renames the old one to `aside`
// first (a crash between the two renames leaves it there) and moves it back if the second fails.
void install(const fs::path& tmp, const fs::path& dst, const fs::path& aside) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(dst, ec))) {
    if (::rename(tmp.c_str(), dst.c_str()) != 0) fail_errno(dst, "cannot rename the new checkpoint into place", errno);
    return;
  }
#ifdef RENAME_EXCHANGE
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dst.c_str(), RENAME_EXCHANGE) == 0) return;
  if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
    fail_errno(dst, "cannot swap the new checkpoint into place", errno);
#endif
  if (::rename(dst.c_str(), aside.c_str()) != 0) fail_errno(dst, "cannot move the old checkpoint aside", errno);
  if (::rename(tmp.c_str(), dst.c_str()) != 0) {
    const int err = errno;
    (void)::rename(aside.c_str(), dst.c_str());
    fail_errno(dst, "cannot rename the new checkpoint into place", err);
  }
  // What was dst is now at `aside`; the caller removes tmp, so move it there.
  if (::rename(aside.c_str(), tmp.c_str()) != 0) fs::remove_all(aside, ec);
}

}  // namespace

CheckpointFile CheckpointFile::text(std::string name, std::string contents) {
  return {std::move(name), std::move(contents), {}};
}

CheckpointFile CheckpointFile::safetensors(std::string name, const std::vector<TensorToWrite>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  CheckpointFile f{std::move(name), {}, {}};
  f.owned = safetensors_header(tensors, metadata, f.name);
  for (const TensorToWrite& t : tensors) f.borrowed.push_back(t.bytes);
  return f;
}

uint64_t CheckpointFile::size() const {
  uint64_t n = owned.size();
  for (std::span<const uint8_t> b : borrowed) n += b.size();
  return n;
}

void write_checkpoint(const fs::path& out, const std::string& name, const std::vector<CheckpointFile>& files) {
  check(plain_name(name), "checkpoint name '", name.substr(0, 60), "': expected a plain name (no '/', no leading '.')");
  std::set<std::string> seen;
  for (const CheckpointFile& f : files) {
    check(plain_name(f.name), "checkpoint file name '", f.name.substr(0, 60),
          "': expected a plain name (no '/', no leading '.')");
    check(seen.insert(f.name).second, "checkpoint file '", f.name, "' given twice");
  }
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out)) {
    throw_error(out.string(), ": cannot create the output directory: ",
                ec ? ec.message() : std::string("a file is in the way"));
  }
  remove_leftovers(out, name);

  const std::string pid = std::to_string(::getpid());
  const fs::path tmp = out / (".tmp-" + name + "-" + pid);
  const fs::path dst = out / name;
  if (::mkdir(tmp.c_str(), 0755) != 0) fail_errno(tmp, "cannot create", errno);
  try {
    for (const CheckpointFile& f : files) write_file(tmp / f.name, f);
    fsync_dir(tmp);
    install(tmp, dst, out / (".old-" + name + "-" + pid));
    fsync_dir(out);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  // tmp now holds the previous checkpoint, if there was one.
  fs::remove_all(tmp, ec);
}

// ---- trainer state --------------------------------------------------------------------------------

std::string trainer_state_json(const TrainerState& s) {
  nlohmann::ordered_json j = {{"format", "hybridlm-trainer-state"},
                              {"version", 1},
                              {"step", s.step},
                              {"tokens", s.tokens},
                              {"seed", s.seed},
                              {"elapsed_s", s.elapsed_s}};
  // JSON has no NaN: a non-finite loss is written as null, like an absent one.
  const auto opt = [](const std::optional<double>& v) {
    return v && std::isfinite(*v) ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
  };
  j["loss"] = opt(s.loss);
  j["val_loss"] = opt(s.val_loss);
  return j.dump(2) + "\n";
}

TrainerState parse_trainer_state(const std::string& text, const std::string& where) {
  const nlohmann::json j = parse_json(text, where);
  check(j.is_object() && j.contains("format") && j["format"] == "hybridlm-trainer-state", where,
        ": not a trainer state (\"format\": \"hybridlm-trainer-state\")");
  check(j.contains("version") && j["version"] == 1, where, ": version ",
        j.contains("version") ? json_brief(j["version"]) : std::string("missing"), " (this build reads version 1)");
  const auto integer = [&](const char* key) -> int64_t {
    check(j.contains(key) && j[key].is_number_integer() && j[key].get<int64_t>() >= 0, where, ": ", key, " ",
          j.contains(key) ? json_brief(j[key]) : std::string("missing"), ": expected an integer >= 0");
    return j[key].get<int64_t>();
  };
  const auto optional_number = [&](const char* key) -> std::optional<double> {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    check(j[key].is_number(), where, ": ", key, " ", json_brief(j[key]), ": expected a number or null");
    return j[key].get<double>();
  };
  TrainerState s;
  s.step = integer("step");
  s.tokens = integer("tokens");
  check(j.contains("seed") && j["seed"].is_number_unsigned(), where, ": seed: expected an integer >= 0");
  s.seed = j["seed"].get<uint64_t>();
  const std::optional<double> elapsed = optional_number("elapsed_s");
  s.elapsed_s = elapsed.value_or(0);
  s.loss = optional_number("loss");
  s.val_loss = optional_number("val_loss");
  return s;
}

TrainerState read_trainer_state(const fs::path& checkpoint_dir) {
  const fs::path path = checkpoint_dir / kTrainerStateFile;
  std::ifstream in(path, std::ios::binary);
  check(static_cast<bool>(in), path.string(), ": cannot read (not a training checkpoint?)");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_trainer_state(text.str(), path.string());
}

std::optional<fs::path> latest_checkpoint(const fs::path& out) {
  std::error_code ec;
  std::optional<fs::path> best;
  int64_t best_step = -1;
  std::vector<fs::path> dirs;
  for (const fs::directory_entry& e : fs::directory_iterator(out, ec))
    if (e.is_directory(ec) && e.path().filename().string()[0] != '.' && fs::exists(e.path() / kTrainerStateFile, ec))
      dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());  // ties go to the greater name
  for (const fs::path& d : dirs) {
    const int64_t step = read_trainer_state(d).step;
    if (step >= best_step) best_step = step, best = d;
  }
  return best;
}

std::vector<std::string> prune_checkpoints(const fs::path& out, int64_t keep, int64_t saved_step) {
  std::vector<std::string> removed;
  if (keep <= 0) return removed;
  std::error_code ec;
  std::vector<std::pair<int64_t, std::string>> steps;
  std::vector<fs::path> leftovers;  // of a run killed while pruning
  for (const fs::directory_entry& e : fs::directory_iterator(out, ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with(".old-step-")) leftovers.push_back(e.path());
    if (!e.is_directory(ec) || !name.starts_with("step-") || name.size() == 5) continue;
    const std::string digits = name.substr(5);
    if (digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      continue;
    const int64_t step = std::stoll(digits);
    if (step < saved_step) steps.emplace_back(step, name);
  }
  for (const fs::path& p : leftovers) fs::remove_all(p, ec);
  if (static_cast<int64_t>(steps.size()) <= keep - 1) return removed;
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + static_cast<size_t>(keep - 1) < steps.size(); ++i) {
    const fs::path dir = out / steps[i].second;
    const fs::path aside = out / (".old-" + steps[i].second + "-" + std::to_string(::getpid()));
    fs::rename(dir, aside, ec);
    check(!ec, dir.string(), ": cannot remove an old checkpoint (", ec.message(), ")");
    fs::remove_all(aside, ec);
    check(!ec, aside.string(), ": cannot remove an old checkpoint (", ec.message(), ")");
    removed.push_back(steps[i].second);
  }
  return removed;
}

}  // namespace hybridlm
