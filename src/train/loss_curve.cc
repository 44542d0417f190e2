#include "train/loss_curve.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

namespace hybridlm {
namespace {

// Canvas and plot area, in SVG user units (pixels).
constexpr double kWidth = 800, kHeight = 480;
constexpr double kLeft = 72, kRight = 24, kTop = 44, kBottom = 56;
constexpr double kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;
constexpr const char* kTrainColour = "#1f77b4";  // blue
constexpr const char* kValColour = "#d62728";    // red

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string px(double v) { return fmt("%.2f", v); }

// Text for XML: the five special characters escaped, control characters and invalid UTF-8 bytes
// replaced (an XML parser rejects both).
std::string xml_escape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&quot;"; break;
        case '\'': out += "&apos;"; break;
        default: out += c < 0x20 ? ' ' : static_cast<char>(c);
      }
      ++i;
      continue;
    }
    // A multi-byte sequence: lead byte, continuation bytes, no overlong form or surrogate.
    const int n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    bool ok = n > 0 && i + static_cast<size_t>(n) <= s.size();
    for (int k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
    if (ok && n >= 3) {
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      ok = !(c == 0xe0 && c1 < 0xa0) && !(c == 0xed && c1 >= 0xa0) && !(c == 0xf0 && c1 < 0x90) &&
           !(c == 0xf4 && c1 >= 0x90);
    }
    if (ok) {
      out.append(s, i, static_cast<size_t>(n));
      i += static_cast<size_t>(n);
    } else {
      out += "\xef\xbf\xbd";  // U+FFFD
      ++i;
    }
  }
  return out;
}

// Ticks at multiples of 1, 2 or 5 x 10^k (at least min_step), about `want` of them over [lo, hi].
struct Ticks {
  double first, step;
  int count;
};
Ticks nice_ticks(double lo, double hi, int want, double min_step) {
  const double raw = (hi - lo) / want;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / mag;
  const double step = std::max(min_step, (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * mag);
  const double first = std::ceil(lo / step - 1e-9) * step;
  const int count = static_cast<int>(std::floor((hi - first) / step + 1e-9)) + 1;
  return {first, step, std::max(count, 0)};
}

// Digits after the point that tell ticks `step` apart: 0 for 1, 1 for 0.5, 2 for 0.02.
int decimals(double step) { return std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9))); }

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return lo > hi; }
  // A single value v becomes [v - d, v + d], d = max(abs, rel |v|); then a margin of `pad` x the
  // width on both sides.
  void widen(double abs, double rel, double pad) {
    if (hi - lo <= 0) {
      const double d = std::max(abs, std::abs(lo) * rel);
      lo -= d, hi += d;
    }
    const double m = (hi - lo) * pad;
    lo -= m, hi += m;
  }
};

}  // namespace

std::string loss_curve_svg(std::span<const LossPoint> train, std::span<const LossPoint> validation,
                           const std::string& title) {
  Range xs, ys;
  for (auto series : {train, validation})
    for (const LossPoint& p : series)
      if (std::isfinite(p.loss)) xs.add(static_cast<double>(p.step)), ys.add(p.loss);
  const bool no_data = xs.empty();
  if (no_data) xs.add(0), xs.add(10), ys.add(0), ys.add(1);  // empty axes of a sensible size
  xs.widen(1, 0, 0);
  ys.widen(0.05, 0.05, 0.05);
  const auto x_of = [&](double step) { return kLeft + (step - xs.lo) / (xs.hi - xs.lo) * kPlotW; };
  const auto y_of = [&](double loss) { return kTop + (ys.hi - loss) / (ys.hi - ys.lo) * kPlotH; };

  std::string s;
  s += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(kWidth) + "\" height=\"" + px(kHeight) +
       "\" viewBox=\"0 0 " + px(kWidth) + " " + px(kHeight) +
       "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text class=\"title\" x=\"" + px(kWidth / 2) + "\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">" +
       xml_escape(title) + "</text>\n";

  // Grid lines and tick labels.
  s += "<g class=\"x-axis\" stroke=\"#ddd\">\n";
  const Ticks xt = nice_ticks(xs.lo, xs.hi, 8, 1);  // steps are integers
  for (int i = 0; i < xt.count; ++i) {
    const double v = xt.first + i * xt.step, x = x_of(v);
    s += "<line x1=\"" + px(x) + "\" y1=\"" + px(kTop) + "\" x2=\"" + px(x) + "\" y2=\"" + px(kTop + kPlotH) + "\"/>";
    s += "<text class=\"tick\" x=\"" + px(x) + "\" y=\"" + px(kTop + kPlotH + 18) +
         "\" text-anchor=\"middle\" stroke=\"none\" fill=\"#333\">" + fmt("%.0f", v) + "</text>\n";
  }
  s += "</g>\n<g class=\"y-axis\" stroke=\"#ddd\">\n";
  const Ticks yt = nice_ticks(ys.lo, ys.hi, 6, 0);
  const std::string yfmt = "%." + std::to_string(decimals(yt.step)) + "f";
  for (int i = 0; i < yt.count; ++i) {
    const double v = yt.first + i * yt.step, y = y_of(v);
    s += "<line x1=\"" + px(kLeft) + "\" y1=\"" + px(y) + "\" x2=\"" + px(kLeft + kPlotW) + "\" y2=\"" + px(y) + "\"/>";
    s += "<text class=\"tick\" x=\"" + px(kLeft - 8) + "\" y=\"" + px(y + 4) +
         "\" text-anchor=\"end\" stroke=\"none\" fill=\"#333\">" + fmt(yfmt.c_str(), std::abs(v) < 1e-12 ? 0 : v) +
         "</text>\n";
  }
  s += "</g>\n";
  s += "<rect x=\"" + px(kLeft) + "\" y=\"" + px(kTop) + "\" width=\"" + px(kPlotW) + "\" height=\"" + px(kPlotH) +
       "\" fill=\"none\" stroke=\"#333\"/>\n";
  s += "<text class=\"label\" x=\"" + px(kLeft + kPlotW / 2) + "\" y=\"" + px(kHeight - 14) +
       "\" text-anchor=\"middle\">step</text>\n";
  const std::string mid = px(kTop + kPlotH / 2);
  s += "<text class=\"label\" x=\"18\" y=\"" + mid + "\" text-anchor=\"middle\" transform=\"rotate(-90 18 " + mid +
       ")\">loss</text>\n";
  if (no_data)
    s += "<text class=\"empty\" x=\"" + px(kLeft + kPlotW / 2) + "\" y=\"" + px(kTop + kPlotH / 2) +
         "\" text-anchor=\"middle\" fill=\"#999\">no data yet</text>\n";

  // A series: one polyline per run of finite points (a NaN breaks the line). A run of one point,
  // which a polyline does not show, gets a dot when the series has no markers of its own. Within a
  // run, the points that fall in one pixel column are drawn as their first, lowest, highest and
  // last (in step order): the line looks the same as with every point (M4 aggregation), and a run
  // of a million steps costs at most four points per column.
  const auto lines = [&](std::span<const LossPoint> pts, const char* cls, const char* colour, const char* extra,
                         bool dots) {
    std::string out, cur;
    int n = 0;
    const auto add = [&](const LossPoint& p) {
      if (n++) cur += ' ';
      cur += px(x_of(static_cast<double>(p.step)));
      cur += ',';
      cur += px(y_of(p.loss));
    };
    // The pixel column being gathered: indices of its first, lowest, highest and last points.
    long column = 0;
    size_t first = 0, low = 0, high = 0, last = 0;
    bool open = false;
    const auto close_column = [&] {
      if (!open) return;
      size_t picks[4] = {first, low, high, last};
      std::sort(picks, picks + 4);
      for (int i = 0; i < 4; ++i)
        if (i == 0 || picks[i] != picks[i - 1]) add(pts[picks[i]]);
      open = false;
    };
    const auto flush = [&] {
      close_column();
      if (n > 0)
        out += std::string("<polyline class=\"") + cls + "\" fill=\"none\" stroke=\"" + colour +
               "\" stroke-width=\"1.5\"" + extra + " points=\"" + cur + "\"/>\n";
      if (n == 1 && dots) {
        const size_t comma = cur.find(',');
        out += std::string("<circle class=\"") + cls + "-dot\" cx=\"" + cur.substr(0, comma) + "\" cy=\"" +
               cur.substr(comma + 1) + "\" r=\"2\" fill=\"" + colour + "\"/>\n";
      }
      cur.clear();
      n = 0;
    };
    for (size_t i = 0; i < pts.size(); ++i) {
      const LossPoint& p = pts[i];
      if (!std::isfinite(p.loss)) {
        flush();
        continue;
      }
      const long c = std::lround(std::floor(x_of(static_cast<double>(p.step))));
      if (open && c == column) {
        if (p.loss < pts[low].loss) low = i;
        if (p.loss > pts[high].loss) high = i;
        last = i;
        continue;
      }
      close_column();
      column = c;
      first = low = high = last = i;
      open = true;
    }
    flush();
    return out;
  };
  s += lines(train, "train", kTrainColour, "", true);
  s += lines(validation, "validation", kValColour, " stroke-dasharray=\"6 3\"", false);
  for (const LossPoint& p : validation)
    if (std::isfinite(p.loss))
      s += "<circle class=\"validation-point\" cx=\"" + px(x_of(static_cast<double>(p.step))) + "\" cy=\"" +
           px(y_of(p.loss)) + "\" r=\"3\" fill=\"" + kValColour + "\"/>\n";

  // Legend, top right inside the plot.
  const bool has_val = !validation.empty();
  const double lx = kLeft + kPlotW - 130, ly = kTop + 10;
  s += "<g class=\"legend\">\n<rect x=\"" + px(lx) + "\" y=\"" + px(ly) + "\" width=\"120\" height=\"" +
       px(has_val ? 46 : 26) + "\" fill=\"white\" stroke=\"#999\"/>\n";
  const auto entry = [&](int row, const char* colour, const char* name, bool dashed) {
    const double y = ly + 16 + 20 * row;
    s += "<line x1=\"" + px(lx + 8) + "\" y1=\"" + px(y - 4) + "\" x2=\"" + px(lx + 36) + "\" y2=\"" + px(y - 4) +
         "\" stroke=\"" + colour + "\" stroke-width=\"2\"" + (dashed ? " stroke-dasharray=\"6 3\"" : "") + "/>";
    s += std::string("<text x=\"") + px(lx + 44) + "\" y=\"" + px(y) + "\">" + name + "</text>\n";
  };
  entry(0, kTrainColour, "train", false);
  if (has_val) entry(1, kValColour, "validation", true);
  s += "</g>\n</svg>\n";
  return s;
}

}  // namespace hybridlm
