// Progress line and the loss-curve SVG (axes, grid, two polylines, legend; no library).
#include "report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "checkpoint.h"

namespace kiln::train {

void Progress::update(const std::string& line) {
  if (mode_ == "none") return;
  if (mode_ == "tty") {
    out_ << "\r" << line << "\x1b[K" << std::flush;
    live_ = true;
  } else {
    out_ << line << "\n" << std::flush;
  }
}

void Progress::print(const std::string& line) {
  if (mode_ == "none") return;
  if (live_) out_ << "\r\x1b[K";
  live_ = false;
  out_ << line << "\n" << std::flush;
}

void Progress::finish() {
  if (live_) out_ << "\n" << std::flush;
  live_ = false;
}

std::string format_duration(double s) {
  char buf[32];
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  if (t >= 3600) std::snprintf(buf, sizeof(buf), "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60) std::snprintf(buf, sizeof(buf), "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof(buf), "%lds", t);
  return buf;
}

std::string format_bytes(double b) {
  char buf[32];
  if (b >= 1073741824.0) std::snprintf(buf, sizeof(buf), "%.2fGiB", b / 1073741824.0);
  else std::snprintf(buf, sizeof(buf), "%.0fMiB", b / 1048576.0);
  return buf;
}

void write_loss_svg(const std::string& path, const std::vector<std::pair<int64_t, double>>& train,
                    const std::vector<std::pair<int64_t, double>>& heldout, const std::string& title) {
  const double W = 800, H = 480, L = 70, R = 20, T = 40, B = 50;
  double x_max = 1, y_min = 1e30, y_max = -1e30;
  for (const auto* s : {&train, &heldout})
    for (const auto& [x, y] : *s) {
      if (!std::isfinite(y)) continue;
      x_max = std::max(x_max, static_cast<double>(x));
      y_min = std::min(y_min, y), y_max = std::max(y_max, y);
    }
  if (y_min > y_max) y_min = 0, y_max = 1;
  y_min = std::max(0.0, std::floor(y_min)), y_max = std::ceil(y_max);
  if (y_max <= y_min) y_max = y_min + 1;
  auto px = [&](double x) { return L + (W - L - R) * x / x_max; };
  auto py = [&](double y) { return T + (H - T - B) * (1.0 - (y - y_min) / (y_max - y_min)); };
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s << "<text x=\"" << W / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" << title << "</text>\n";
  for (int i = 0; i <= 5; ++i) {
    const double y = y_min + (y_max - y_min) * i / 5.0, yy = py(y);
    s << "<line x1=\"" << L << "\" y1=\"" << yy << "\" x2=\"" << W - R << "\" y2=\"" << yy
      << "\" stroke=\"#ddd\"/><text x=\"" << L - 6 << "\" y=\"" << yy + 4 << "\" text-anchor=\"end\">" << y
      << "</text>\n";
    const double x = x_max * i / 5.0;
    s << "<text x=\"" << px(x) << "\" y=\"" << H - B + 18 << "\" text-anchor=\"middle\">" << std::lround(x)
      << "</text>\n";
  }
  s << "<line x1=\"" << L << "\" y1=\"" << H - B << "\" x2=\"" << W - R << "\" y2=\"" << H - B
    << "\" stroke=\"black\"/><line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L << "\" y2=\"" << H - B
    << "\" stroke=\"black\"/>\n";
  s << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 10 << "\" text-anchor=\"middle\">step</text>\n";
  s << "<text x=\"16\" y=\"" << (T + H - B) / 2 << "\" transform=\"rotate(-90 16 " << (T + H - B) / 2
    << ")\" text-anchor=\"middle\">loss (nats/token)</text>\n";
  auto polyline = [&](const std::vector<std::pair<int64_t, double>>& pts, const char* color, double width) {
    s << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"" << width << "\" points=\"";
    for (const auto& [x, y] : pts)
      if (std::isfinite(y)) s << px(static_cast<double>(x)) << "," << py(y) << " ";
    s << "\"/>\n";
  };
  polyline(train, "#1f77b4", 1.2);
  polyline(heldout, "#d62728", 2.0);
  for (const auto& [x, y] : heldout)
    if (std::isfinite(y)) s << "<circle cx=\"" << px(static_cast<double>(x)) << "\" cy=\"" << py(y) << "\" r=\"3\" fill=\"#d62728\"/>\n";
  s << "<rect x=\"" << W - R - 150 << "\" y=\"" << T + 6 << "\" width=\"140\" height=\"44\" fill=\"white\" stroke=\"#999\"/>\n"
    << "<line x1=\"" << W - R - 140 << "\" y1=\"" << T + 20 << "\" x2=\"" << W - R - 115 << "\" y2=\"" << T + 20
    << "\" stroke=\"#1f77b4\" stroke-width=\"2\"/><text x=\"" << W - R - 108 << "\" y=\"" << T + 24 << "\">train</text>\n"
    << "<line x1=\"" << W - R - 140 << "\" y1=\"" << T + 38 << "\" x2=\"" << W - R - 115 << "\" y2=\"" << T + 38
    << "\" stroke=\"#d62728\" stroke-width=\"2\"/><text x=\"" << W - R - 108 << "\" y=\"" << T + 42 << "\">held-out</text>\n";
  s << "</svg>\n";
  write_file_atomic(path, s.str());
}

}  // namespace kiln::train
