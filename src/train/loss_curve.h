// The loss curve of a run as a self-contained SVG (no scripts, fonts or external files): training
// loss as a line, validation loss as a dashed line with markers, axes with tick labels (step,
// loss), a legend and a title. The trainer rewrites <out>/loss.svg from metrics as it goes.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace hybridlm {

struct LossPoint {
  int64_t step;
  double loss;
};

// Points in step order. Non-finite losses are left out (the line breaks there); either series may
// be empty (an empty chart says "no data yet"). The title is escaped for XML.
std::string loss_curve_svg(std::span<const LossPoint> train, std::span<const LossPoint> validation,
                           const std::string& title);

}  // namespace hybridlm
