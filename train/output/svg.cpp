#include "train/output/svg.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

namespace attograd::train::output {

std::string svg_text(const std::string& s, bool visible_whitespace) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case ' ': out += visible_whitespace ? "\u2423" : " "; break;
      case '\n': out += visible_whitespace ? "\u21b5" : " "; break;
      case '\t': out += visible_whitespace ? "\u21e5" : " "; break;
      default:
        // Other control characters are not allowed in XML 1.0.
        if (static_cast<unsigned char>(c) < 0x20) out += "?";
        else out += c;
    }
  }
  return out;
}

namespace {

// Tick spacing of 1, 2 or 5 times a power of ten giving about `count` ticks over [lo, hi].
double nice_step(double lo, double hi, int count) {
  const double raw = (hi - lo) / count;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (raw <= m * p) return m * p;
  return 10 * p;
}

std::string number_label(double v) { return fmt::format("{:g}", std::abs(v) < 1e-12 ? 0.0 : v); }

}  // namespace

std::string loss_plot_svg(const std::vector<TrainRecord>& train, const std::vector<EvalRecord>& eval,
                          const std::string& title) {
  constexpr double W = 760, H = 440, left = 70, right = 20, top = 40, bottom = 60;
  const double pw = W - left - right, ph = H - top - bottom;

  // Axis ranges over every finite value.
  double max_step = 1, lo = INFINITY, hi = -INFINITY;
  const auto see = [&](double step, double y) {
    max_step = std::max(max_step, step);
    if (std::isfinite(y)) lo = std::min(lo, y), hi = std::max(hi, y);
  };
  for (const auto& r : train) see(static_cast<double>(r.step), r.loss);
  for (const auto& r : eval) see(static_cast<double>(r.step), r.val_loss);
  if (!(lo <= hi)) lo = 0, hi = 1;
  lo = std::min(0.0, lo);  // a loss axis from zero reads honestly
  if (hi - lo < 1e-9) hi = lo + 1;
  const double ystep = nice_step(lo, hi, 6), xstep = nice_step(0, max_step, 8);
  hi = std::ceil(hi / ystep) * ystep;
  const auto X = [&](double step) { return left + pw * step / max_step; };
  const auto Y = [&](double v) { return top + ph * (1 - (v - lo) / (hi - lo)); };

  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      W, H, W, H);
  s += fmt::format("<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n", W / 2,
                   svg_text(title));
  // Grid, ticks and tick labels.
  for (double v = lo; v <= hi + ystep * 1e-6; v += ystep)
    s += fmt::format(
        "<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#e4e4e4\"/>"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
        left, left + pw, Y(v), left - 6, Y(v) + 4, number_label(v));
  for (double v = 0; v <= max_step + xstep * 1e-6; v += xstep)
    s += fmt::format(
        "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#e4e4e4\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
        X(v), top, top + ph, top + ph + 18, number_label(v));
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n", left, top,
                   pw, ph);
  // Axis labels.
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">step</text>\n", left + pw / 2, H - 16);
  s += fmt::format(
      "<text transform=\"translate(18 {}) rotate(-90)\" text-anchor=\"middle\">loss (cross-entropy, nats per "
      "token)</text>\n",
      top + ph / 2);

  const auto polyline = [&](const std::vector<std::pair<double, double>>& pts, const char* color, double width) {
    std::string p;
    for (const auto& [x, y] : pts)
      if (std::isfinite(y)) p += fmt::format("{:.1f},{:.1f} ", X(x), Y(y));
    return fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"{}\" points=\"{}\"/>\n", color, width, p);
  };
  std::vector<std::pair<double, double>> train_pts, eval_pts;
  for (const auto& r : train) train_pts.emplace_back(static_cast<double>(r.step), r.loss);
  for (const auto& r : eval) eval_pts.emplace_back(static_cast<double>(r.step), r.val_loss);
  s += polyline(train_pts, "#7aa6d8", 1);
  s += polyline(eval_pts, "#d95f02", 2);
  for (const auto& [x, y] : eval_pts)
    if (std::isfinite(y)) s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"#d95f02\"/>\n", X(x), Y(y));

  // Legend.
  const double lx = left + pw - 170, ly = top + 12;
  s += fmt::format(
      "<rect x=\"{0}\" y=\"{1}\" width=\"160\" height=\"44\" fill=\"white\" stroke=\"#999\"/>"
      "<line x1=\"{2}\" x2=\"{3}\" y1=\"{4}\" y2=\"{4}\" stroke=\"#7aa6d8\" stroke-width=\"2\"/>"
      "<text x=\"{5}\" y=\"{6}\">train (per step)</text>"
      "<line x1=\"{2}\" x2=\"{3}\" y1=\"{7}\" y2=\"{7}\" stroke=\"#d95f02\" stroke-width=\"2\"/>"
      "<text x=\"{5}\" y=\"{8}\">validation</text>\n",
      lx, ly, lx + 8, lx + 32, ly + 14, lx + 40, ly + 18, ly + 32, ly + 36);
  s += "</svg>\n";
  return s;
}

std::string attention_svg(const AttentionMaps& maps, const std::string& title) {
  const std::size_t T = maps.tokens.size();
  const std::size_t layers = maps.weights.size(), heads = layers ? maps.weights[0].size() : 0;
  const double cell = std::clamp(360.0 / std::max<std::size_t>(T, 1), 6.0, 22.0);
  const double label = 14 + 7.0 * std::min<std::size_t>(4, [&] {
    std::size_t longest = 1;
    for (const auto& t : maps.tokens) longest = std::max(longest, t.size());
    return longest;
  }());
  const double panel = T * cell, gap = 28, margin = 20, head_title = 18;
  const double pw = label + panel + gap, ph = head_title + label + panel + gap;
  const double W = 2 * margin + heads * pw, H = 50 + layers * ph;
  const double font = std::min(12.0, cell * 0.8);

  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 {:.0f} {:.0f}\" "
      "font-family=\"monospace\" font-size=\"{:.1f}\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      W, H, W, H, font);
  s += fmt::format(
      "<text x=\"{}\" y=\"22\" font-family=\"sans-serif\" font-size=\"14\">{} (rows: queries, columns: keys; "
      "darker = more weight)</text>\n",
      margin, svg_text(title));
  for (std::size_t l = 0; l < layers; ++l) {
    for (std::size_t h = 0; h < heads; ++h) {
      const double x0 = margin + h * pw, y0 = 50 + l * ph;
      const double gx = x0 + label, gy = y0 + head_title + label;  // the grid's top-left corner
      s += fmt::format("<g><title>layer {} head {}</title>\n", l, h);
      s += fmt::format("<text x=\"{}\" y=\"{}\" font-family=\"sans-serif\" font-size=\"12\">layer {}, head {}</text>\n",
                       gx, y0 + 12, l, h);
      const std::vector<float>& w = maps.weights[l][h];
      for (std::size_t q = 0; q < T; ++q)
        for (std::size_t k = 0; k < T; ++k) {
          const float v = std::clamp(w[q * T + k], 0.0f, 1.0f);
          // White (0) to dark blue (1).
          const int r = static_cast<int>(255 - 247 * v), g = static_cast<int>(255 - 207 * v),
                    b = static_cast<int>(255 - 148 * v);
          s += fmt::format(
              "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"rgb({},{},{})\">"
              "<title>query {} → key {}: {:.3f}</title></rect>\n",
              gx + k * cell, gy + q * cell, cell, cell, r, g, b, q, k, w[q * T + k]);
        }
      s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
                       "stroke=\"#888\"/>\n",
                       gx, gy, panel, panel);
      // Key labels above the columns (rotated), query labels left of the rows.
      for (std::size_t i = 0; i < T; ++i) {
        const std::string tok = svg_text(maps.tokens[i], true);
        s += fmt::format(
            "<text transform=\"translate({:.1f} {:.1f}) rotate(-90)\" dominant-baseline=\"middle\">{}</text>\n",
            gx + (i + 0.5) * cell, gy - 4, tok);
        s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" dominant-baseline=\"middle\">{}</text>\n",
                         gx - 4, gy + (i + 0.5) * cell, tok);
      }
      s += "</g>\n";
    }
  }
  s += "</svg>\n";
  return s;
}

}  // namespace attograd::train::output
