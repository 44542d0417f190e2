// <out>/metrics.jsonl: one JSON object per line, written as it happens, e.g.
//   {"step": 100, "loss": 3.41, "lr": 0.0003, "tokens_per_s": 51200.0, "grad_norm": 0.82}
//   {"step": 200, "loss": 3.02, "lr": 0.00029, "tokens_per_s": 51003.5, "grad_norm": 0.61, "val_loss": 3.10}
// A field that is absent is left out; a non-finite value (a NaN loss) is written as null, since
// JSON has no NaN. Each line goes out in one write(), unbuffered, so a crash loses at most the line
// being written and a reader (tail -f, a plot) sees every finished step.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "train/loss_curve.h"

namespace hybridlm {

struct MetricsRow {
  int64_t step = 0;
  std::optional<double> loss, lr, tokens_per_s, grad_norm, val_loss;
};

// One line of JSON, with its newline.
std::string metrics_line(const MetricsRow& row);

class MetricsLog {
 public:
  // Opens `path` for appending. Without resume_step it starts empty (an existing file is
  // truncated). With resume_step s it keeps the lines of steps <= s: the resumed run writes the
  // later steps again. A torn last line (a crash mid-write) is dropped; any other line that is not
  // a metrics object is an Error naming its line number. The kept lines are rewritten through a
  // temporary file and a rename.
  MetricsLog(const std::filesystem::path& path, std::optional<int64_t> resume_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // Writes the row's line; throws Error naming the file and strerror if it cannot.
  void append(const MetricsRow& row);
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

// Every row of a metrics file (empty if it does not exist); null values read back as NaN. A torn
// last line is skipped; any other malformed line throws Error naming it.
std::vector<MetricsRow> read_metrics(const std::filesystem::path& path);

// The loss curve's two series from metrics rows: (step, loss) and (step, val_loss) where present.
void loss_points(const std::vector<MetricsRow>& rows, std::vector<LossPoint>& train, std::vector<LossPoint>& val);

}  // namespace hybridlm
