// metrics.jsonl: one object per line, visible as soon as append returns; a resumed run drops the
// lines after its checkpoint's step and a line torn by a crash.
#include "train/metrics_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "token_dir.h"

namespace hybridlm {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class MetricsLogTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::scratch_dir("metrics_log"); }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<int64_t> steps_in(const fs::path& p) {
    std::vector<int64_t> steps;
    for (const MetricsRow& r : read_metrics(p)) steps.push_back(r.step);
    return steps;
  }

  fs::path dir_;
};

MetricsRow row(int64_t step, std::optional<double> val = std::nullopt) {
  return {step, 4.0 - 0.01 * static_cast<double>(step), 3e-4, 51200.5, 0.75, val};
}

TEST_F(MetricsLogTest, OneObjectPerLineVisibleAtOnce) {
  const fs::path p = dir_ / "metrics.jsonl";
  MetricsLog log(p, std::nullopt);
  log.append(row(10));
  log.append(row(20, 3.5));
  // Still open: every line is already in the file.
  const std::string text = testing::read_file(p);
  ASSERT_EQ(std::count(text.begin(), text.end(), '\n'), 2);
  const std::string first = text.substr(0, text.find('\n'));
  EXPECT_EQ(first, R"({"step":10,"loss":3.9,"lr":0.0003,"tokens_per_s":51200.5,"grad_norm":0.75})");
  const nlohmann::json second = nlohmann::json::parse(text.substr(text.find('\n') + 1));
  EXPECT_EQ(second["step"], 20);
  EXPECT_DOUBLE_EQ(second["val_loss"].get<double>(), 3.5);

  const std::vector<MetricsRow> rows = read_metrics(p);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].val_loss, std::nullopt);
  EXPECT_EQ(rows[1].val_loss, 3.5);
  EXPECT_EQ(rows[1].lr, 3e-4);
}

TEST_F(MetricsLogTest, NonFiniteIsNullAndBreaksTheCurve) {
  const fs::path p = dir_ / "m.jsonl";
  {
    MetricsLog log(p, std::nullopt);
    log.append({1, 2.0, {}, {}, {}, {}});
    log.append({2, std::nan(""), {}, {}, INFINITY, {}});
    log.append({3, 1.5, {}, {}, {}, 1.7});
  }
  EXPECT_THAT(testing::read_file(p), HasSubstr(R"({"step":2,"loss":null,"grad_norm":null})"));
  const std::vector<MetricsRow> rows = read_metrics(p);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_TRUE(std::isnan(*rows[1].loss));
  EXPECT_EQ(rows[0].lr, std::nullopt);
  std::vector<LossPoint> train, val;
  loss_points(rows, train, val);
  ASSERT_EQ(train.size(), 3u);
  EXPECT_TRUE(std::isnan(train[1].loss));
  ASSERT_EQ(val.size(), 1u);
  EXPECT_EQ(val[0].step, 3);
}

TEST_F(MetricsLogTest, FreshStartTruncatesResumeKeepsUpToItsStep) {
  const fs::path p = dir_ / "metrics.jsonl";
  {
    MetricsLog log(p, std::nullopt);
    for (int64_t s : {10, 20, 30, 40}) log.append(row(s));
  }
  {
    // Resumed from the checkpoint at step 20: 30 and 40 are written again.
    MetricsLog log(p, 20);
    EXPECT_EQ(steps_in(p), (std::vector<int64_t>{10, 20}));
    log.append(row(30));
  }
  EXPECT_EQ(steps_in(p), (std::vector<int64_t>{10, 20, 30}));
  {
    MetricsLog log(p, 100);  // nothing after the step: unchanged
    EXPECT_EQ(steps_in(p), (std::vector<int64_t>{10, 20, 30}));
  }
  {
    MetricsLog log(p, std::nullopt);
    log.append(row(1));
  }
  EXPECT_EQ(steps_in(p), (std::vector<int64_t>{1}));
  // Resuming with no file yet starts one.
  MetricsLog fresh(dir_ / "new.jsonl", 5);
  fresh.append(row(6));
  EXPECT_EQ(steps_in(dir_ / "new.jsonl"), (std::vector<int64_t>{6}));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 2);  // no temporaries
}

TEST_F(MetricsLogTest, TornLastLineIsDroppedOtherDamageIsAnError) {
  const fs::path p = dir_ / "metrics.jsonl";
  testing::write_file(p, metrics_line(row(10)) + metrics_line(row(20)) + "{\"step\": 30, \"lo");
  EXPECT_EQ(steps_in(p), (std::vector<int64_t>{10, 20}));
  {
    MetricsLog log(p, 20);
    log.append(row(30));
  }
  EXPECT_EQ(steps_in(p), (std::vector<int64_t>{10, 20, 30}));
  EXPECT_EQ(testing::read_file(p), metrics_line(row(10)) + metrics_line(row(20)) + metrics_line(row(30)));

  testing::write_file(p, metrics_line(row(10)) + "garbage\n" + metrics_line(row(20)));
  try {
    MetricsLog log(p, 20);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), p.string() + ": line 2 is not a metrics object with an integer step");
  }
  testing::write_file(p, "{\"step\": \"ten\"}\n");
  EXPECT_THROW(read_metrics(p), Error);
}

TEST_F(MetricsLogTest, UnwritablePath) {
  testing::write_file(dir_ / "file", "x");
  try {
    MetricsLog log(dir_ / "file/metrics.jsonl", std::nullopt);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              (dir_ / "file/metrics.jsonl").string() + ": cannot open for appending: Not a directory");
  }
}

}  // namespace
}  // namespace hybridlm
