#pragma once
// The two pictures the program draws, as standalone SVG text:
//   loss.svg       training and validation loss over steps, axes labelled
//   attention.svg  one heat map per (layer, head): rows are queries, columns keys
#include <string>
#include <vector>

#include "train/output/metrics.h"

namespace attograd::train::output {

std::string loss_plot_svg(const std::vector<TrainRecord>& train, const std::vector<EvalRecord>& eval,
                          const std::string& title);

struct AttentionMaps {
  std::vector<std::string> tokens;  // T labels, as text
  // weights[layer][head] is a T x T row-major matrix: row = query, column = key.
  std::vector<std::vector<std::vector<float>>> weights;
};
std::string attention_svg(const AttentionMaps& maps, const std::string& title);

// XML-escaped text, with whitespace made visible ("␣", "↵", "⇥") for token labels.
std::string svg_text(const std::string& s, bool visible_whitespace = false);

}  // namespace attograd::train::output
