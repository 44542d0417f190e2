#include "train/metrics_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/json.h"

namespace hybridlm {
namespace {

namespace fs = std::filesystem;

// The optional fields, in the order they are written.
struct Field {
  const char* key;
  std::optional<double> MetricsRow::*member;
};
constexpr Field kFields[] = {{"loss", &MetricsRow::loss},
                             {"lr", &MetricsRow::lr},
                             {"tokens_per_s", &MetricsRow::tokens_per_s},
                             {"grad_norm", &MetricsRow::grad_norm},
                             {"val_loss", &MetricsRow::val_loss}};

void write_all(int fd, const std::string& s, const fs::path& path) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t w = ::write(fd, s.data() + done, s.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw_error(path.string(), ": write failed: ", std::strerror(w < 0 ? errno : ENOSPC));
    done += static_cast<size_t>(w);
  }
}

// A metrics line, or nullopt if it is not one.
std::optional<MetricsRow> parse_line(std::string_view line) {
  nlohmann::json j;
  try {
    j = parse_json(line, "metrics");
  } catch (const Error&) {
    return std::nullopt;
  }
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) return std::nullopt;
  MetricsRow r;
  r.step = j["step"].get<int64_t>();
  for (const Field& f : kFields) {
    if (!j.contains(f.key)) continue;
    if (!j[f.key].is_number() && !j[f.key].is_null()) return std::nullopt;
    // null: a value that was not finite (a NaN loss), which breaks the loss curve's line there.
    r.*f.member = j[f.key].is_null() ? std::nan("") : j[f.key].get<double>();
  }
  return r;
}

// The file's lines as (text, row), the text with its newline; a torn last line is dropped.
std::vector<std::pair<std::string, MetricsRow>> read_lines(const fs::path& path) {
  std::vector<std::pair<std::string, MetricsRow>> out;
  std::error_code ec;
  if (!fs::exists(path, ec)) return out;
  std::ifstream in(path, std::ios::binary);
  check(static_cast<bool>(in), path.string(), ": cannot read");
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    ++line_no;
    const size_t nl = text.find('\n', pos);
    const bool last_unterminated = nl == std::string::npos;
    const std::string_view line(text.data() + pos, (last_unterminated ? text.size() : nl) - pos);
    pos = last_unterminated ? text.size() : nl + 1;
    const std::optional<MetricsRow> row = parse_line(line);
    if (!row && last_unterminated) break;  // torn by a crash mid-write
    check(row.has_value(), path.string(), ": line ", line_no, " is not a metrics object with an integer step");
    out.emplace_back(std::string(line) + "\n", *row);
  }
  return out;
}

}  // namespace

std::string metrics_line(const MetricsRow& row) {
  nlohmann::ordered_json j = {{"step", row.step}};
  for (const Field& f : kFields) {
    const std::optional<double>& v = row.*f.member;
    if (v) j[f.key] = std::isfinite(*v) ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
  }
  return j.dump() + "\n";
}

MetricsLog::MetricsLog(const fs::path& path, std::optional<int64_t> resume_step) : path_(path) {
  int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC;
  if (resume_step) {
    std::string kept;
    bool dropped = false;
    for (const auto& [text, row] : read_lines(path)) {
      if (row.step <= *resume_step) kept += text;
      else dropped = true;
    }
    std::error_code ec;
    if (dropped || (fs::exists(path, ec) && fs::file_size(path, ec) != kept.size())) {
      // Through a temporary and a rename: a crash now leaves the old file or the new one.
      fs::path tmp = path;
      tmp += ".tmp-" + std::to_string(::getpid());
      const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) throw_error(tmp.string(), ": cannot create: ", std::strerror(errno));
      try {
        write_all(fd, kept, tmp);
        if (::fsync(fd) != 0) throw_error(tmp.string(), ": fsync failed: ", std::strerror(errno));
      } catch (...) {
        ::close(fd);
        fs::remove(tmp, ec);
        throw;
      }
      const bool closed = ::close(fd) == 0;
      const int err = errno;
      if (!closed || ::rename(tmp.c_str(), path.c_str()) != 0) {
        const int why = closed ? errno : err;
        fs::remove(tmp, ec);
        throw_error(path.string(), ": cannot rewrite: ", std::strerror(why));
      }
    }
  } else {
    flags |= O_TRUNC;
  }
  fd_ = ::open(path.c_str(), flags, 0644);
  if (fd_ < 0) throw_error(path.string(), ": cannot open for appending: ", std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::append(const MetricsRow& row) { write_all(fd_, metrics_line(row), path_); }

std::vector<MetricsRow> read_metrics(const fs::path& path) {
  std::vector<MetricsRow> rows;
  for (auto& [text, row] : read_lines(path)) rows.push_back(row);
  return rows;
}

void loss_points(const std::vector<MetricsRow>& rows, std::vector<LossPoint>& train, std::vector<LossPoint>& val) {
  for (const MetricsRow& r : rows) {
    if (r.loss) train.push_back({r.step, *r.loss});
    if (r.val_loss) val.push_back({r.step, *r.val_loss});
  }
}

}  // namespace hybridlm
