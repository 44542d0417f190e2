// The loss-curve SVG: well-formed XML (checked here by structure, and by Python's xml.etree in
// loss_curve_svg_test.py on the samples this test writes), both series and a legend, ticks on both
// axes, and the odd inputs: no validation, no data, NaN, one point, a title that needs escaping.
#include "train/loss_curve.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

namespace hybridlm {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

// "" if `xml` is well-formed as far as an SVG of ours goes: one root element, tags nested and
// closed, attribute values quoted, '&' only in the five predefined entities, no '<' in text;
// else what is wrong.
std::string xml_problem(const std::string& xml) {
  std::vector<std::string> open;
  bool root_seen = false;
  size_t i = 0;
  if (xml.starts_with("<?xml")) i = xml.find("?>") + 2;
  while (i < xml.size()) {
    if (xml[i] != '<') {
      if (open.empty() && !std::isspace(static_cast<unsigned char>(xml[i]))) return "text outside the root";
      if (xml[i] == '&') {
        bool ok = false;
        for (const char* e : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"})
          ok = ok || xml.compare(i, std::strlen(e), e) == 0;
        if (!ok) return "bare & at " + std::to_string(i);
      }
      ++i;
      continue;
    }
    const size_t end = xml.find('>', i);
    if (end == std::string::npos) return "unclosed tag at " + std::to_string(i);
    std::string tag = xml.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.starts_with("/")) {
      if (open.empty() || open.back() != tag.substr(1)) return "mismatched </" + tag.substr(1) + ">";
      open.pop_back();
      continue;
    }
    const bool self_closing = tag.ends_with("/");
    if (self_closing) tag.pop_back();
    const std::string name = tag.substr(0, tag.find_first_of(" \n"));
    if (open.empty()) {
      if (root_seen) return "a second root <" + name + ">";
      root_seen = true;
    }
    // Attributes: name="value" pairs, no '<' or unescaped '&' in values.
    size_t a = name.size();
    while (a < tag.size()) {
      while (a < tag.size() && std::isspace(static_cast<unsigned char>(tag[a]))) ++a;
      if (a == tag.size()) break;
      const size_t eq = tag.find('=', a);
      if (eq == std::string::npos || eq + 1 >= tag.size() || tag[eq + 1] != '"')
        return "unquoted attribute in <" + name + ">";
      const size_t close = tag.find('"', eq + 2);
      if (close == std::string::npos) return "unterminated attribute in <" + name + ">";
      const std::string value = tag.substr(eq + 2, close - eq - 2);
      if (value.find('<') != std::string::npos) return "'<' in an attribute of <" + name + ">";
      a = close + 1;
    }
    if (!self_closing) open.push_back(name);
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  return root_seen ? "" : "no root element";
}

std::vector<LossPoint> curve(int n, int every, double start, double scale) {
  std::vector<LossPoint> v;
  for (int i = 0; i < n; ++i) v.push_back({int64_t{i} * every, start * std::exp(-scale * i) + 1.5});
  return v;
}

// The samples loss_curve_svg_test.py parses with xml.etree, written to $HYBRIDLM_SVG_OUT.
struct Sample {
  const char* file;
  std::vector<LossPoint> train, val;
  std::string title;
};
std::vector<Sample> samples() {
  std::vector<LossPoint> nan_train = curve(30, 10, 8, 0.1);
  nan_train[12].loss = std::nan("");
  return {{"both.svg", curve(100, 10, 9, 0.05), curve(10, 100, 9, 0.5), "tiny <run> & \"friends\""},
          {"no_validation.svg", curve(50, 1, 4, 0.1), {}, "train only"},
          {"empty.svg", {}, {}, "nothing yet"},
          {"nan.svg", nan_train, {{100, 3.0}}, "a NaN step"},
          {"one_point.svg", {{7, 2.5}}, {}, "\xff bad utf-8 \xe2\x82"}};
}

TEST(LossCurve, BothSeriesAxesAndLegend) {
  const std::vector<LossPoint> train = curve(100, 10, 9, 0.05), val = curve(10, 100, 9, 0.5);
  const std::string svg = loss_curve_svg(train, val, "run <a> & b");
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_THAT(svg, HasSubstr("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_EQ(count(svg, "<polyline class=\"train\""), 1u);
  EXPECT_EQ(count(svg, "<polyline class=\"validation\""), 1u);
  EXPECT_EQ(count(svg, "<circle class=\"validation-point\""), val.size());
  // All 100 train points are on the line.
  const size_t p = svg.find("<polyline class=\"train\"");
  const std::string line = svg.substr(p, svg.find("/>", p) - p);
  EXPECT_EQ(count(line, ","), 100u);
  // Two colours, a legend naming both, the title escaped, axis labels and tick labels.
  EXPECT_THAT(svg, HasSubstr("stroke=\"#1f77b4\""));
  EXPECT_THAT(svg, HasSubstr("stroke=\"#d62728\""));
  EXPECT_THAT(svg, HasSubstr(">train</text>"));
  EXPECT_THAT(svg, HasSubstr(">validation</text>"));
  EXPECT_THAT(svg, HasSubstr(">run &lt;a&gt; &amp; b</text>"));
  EXPECT_THAT(svg, HasSubstr(">step</text>"));
  EXPECT_THAT(svg, HasSubstr(">loss</text>"));
  EXPECT_GE(count(svg, "class=\"tick\""), 8u);
  EXPECT_THAT(svg, HasSubstr(">0</text>"));    // the first step
  EXPECT_THAT(svg, HasSubstr(">800</text>"));  // a step tick (0..990 in steps of 100 or 200)
}

TEST(LossCurve, EmptyValidationAndNoData) {
  const std::vector<LossPoint> train = curve(20, 5, 3, 0.2);
  const std::string svg = loss_curve_svg(train, {}, "t");
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(count(svg, "<polyline class=\"train\""), 1u);
  EXPECT_THAT(svg, Not(HasSubstr("class=\"validation")));
  EXPECT_THAT(svg, Not(HasSubstr(">validation</text>")));

  const std::string empty = loss_curve_svg({}, {}, "t");
  EXPECT_EQ(xml_problem(empty), "");
  EXPECT_THAT(empty, HasSubstr("no data yet"));
  EXPECT_THAT(empty, Not(HasSubstr("<polyline")));
}

TEST(LossCurve, NanBreaksTheLineAndOnePointStillDraws) {
  std::vector<LossPoint> train = curve(30, 10, 8, 0.1);
  train[12].loss = std::nan("");
  train[20].loss = INFINITY;
  const std::string svg = loss_curve_svg(train, {}, "t");
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(count(svg, "<polyline class=\"train\""), 3u);
  EXPECT_THAT(svg, Not(HasSubstr("nan")));
  EXPECT_THAT(svg, Not(HasSubstr("inf")));

  const std::vector<LossPoint> one = {{7, 2.5}};
  const std::string single = loss_curve_svg(one, {}, "t");
  EXPECT_EQ(xml_problem(single), "");
  EXPECT_THAT(single, HasSubstr(">7</text>"));  // the step, on a range around it
  EXPECT_THAT(single, HasSubstr("<polyline class=\"train\""));
}

// A long run is drawn with at most four points per pixel column (the plot is under 800 wide),
// and those keep each column's extremes: the lowest and highest losses still appear.
TEST(LossCurve, LongRunsKeepFourPointsPerColumn) {
  std::vector<LossPoint> train;
  for (int i = 0; i < 200000; ++i) train.push_back({i, 3.0 + std::sin(i * 0.37)});
  train[123457].loss = -5.0;  // a spike a thinning by stride would miss
  train[98765].loss = 11.0;
  const std::string svg = loss_curve_svg(train, {}, "t");
  EXPECT_EQ(xml_problem(svg), "");
  const size_t at = svg.find("<polyline class=\"train\"");
  ASSERT_NE(at, std::string::npos);
  const size_t b = svg.find("points=\"", at) + 8, e = svg.find('"', b);
  const std::string pts = svg.substr(b, e - b);
  const size_t n = count(pts, ",");
  EXPECT_GT(n, 1000u);
  EXPECT_LE(n, 4u * 800u);
  // The two spikes are the plot's extremes (the data range, padded by 5%, spans y 44 .. 424): the
  // drawn points still reach them.
  double ymin = 1e9, ymax = -1e9;
  for (size_t i = 0; (i = pts.find(',', i)) != std::string::npos; ++i) {
    const double y = std::stod(pts.substr(i + 1));
    ymin = std::min(ymin, y), ymax = std::max(ymax, y);
  }
  EXPECT_LT(ymin, 70.0);   // 11.0
  EXPECT_GT(ymax, 398.0);  // -5.0
}

TEST(LossCurve, TitleWithControlCharactersAndBadUtf8) {
  const std::string svg = loss_curve_svg({}, {}, "a\x01\tb \xff \xc3\xa9 \xe2\x82");
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_THAT(svg, HasSubstr(">a  b \xef\xbf\xbd \xc3\xa9 \xef\xbf\xbd\xef\xbf\xbd</text>"));
}

TEST(LossCurve, Samples) {
  const char* dir = std::getenv("HYBRIDLM_SVG_OUT");
  for (const Sample& s : samples()) {
    const std::string svg = loss_curve_svg(s.train, s.val, s.title);
    EXPECT_EQ(xml_problem(svg), "") << s.file;
    if (dir) {
      std::ofstream f(std::filesystem::path(dir) / s.file, std::ios::binary);
      f << svg;
      ASSERT_TRUE(f.good()) << s.file;
    }
  }
}

}  // namespace
}  // namespace hybridlm
