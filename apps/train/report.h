#pragma once
// Run reporting: the progress line (live with '\r' on a terminal, plain lines otherwise) and the
// loss-curve SVG.
#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace kiln::train {

class Progress {
 public:
  // mode: "tty" (rewrite one line), "plain" (one line per call), "none"
  Progress(std::ostream& out, std::string mode) : out_(out), mode_(std::move(mode)) {}
  void update(const std::string& line);  // the live line
  void print(const std::string& line);   // a line that stays (eval results, checkpoints)
  void finish();

 private:
  std::ostream& out_;
  std::string mode_;
  bool live_ = false;
};

// Seconds as "1h02m", "3m05s", "42s".
std::string format_duration(double seconds);
std::string format_bytes(double bytes);

// A hand-written SVG: train loss (per step) and held-out loss (per eval) against the step.
void write_loss_svg(const std::string& path, const std::vector<std::pair<int64_t, double>>& train,
                    const std::vector<std::pair<int64_t, double>>& heldout, const std::string& title);

}  // namespace kiln::train
