#pragma once
/// \file
/// Command-line options shared by zero's tools: the values that resolve "auto" in a DeepSpeed
/// config (`zero::config_inputs`), under the names Hugging Face's Trainer uses where it has one.
/// Tools only; not installed.

#include "zero/config/config.hpp"
#include "zero/core/dtype.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zero::tools {

/// A CLI11 check for a number from `lo` to `hi` that names the range as written and refuses NaN
/// (CLI::Range lets NaN through, since every comparison with it is false, and prints its bounds
/// as "0.000000").
inline CLI::Validator number_in(double lo, double hi) {
  const std::string range = "a number from " + zero::detail::show_number(lo) + " to " + zero::detail::show_number(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        double v = 0;
        std::size_t used = 0;
        try {
          v = std::stod(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != s.size()) {
          return "expected " + range + ", found \"" + zero::detail::printable(s) + "\"";
        }
        if (!(v >= lo && v <= hi)) {
          return "expected " + range + ", found " + zero::detail::show_number(v);
        }
        return {};
      },
      "NUMBER in [" + zero::detail::show_number(lo) + ", " + zero::detail::show_number(hi) + "]");
}

/// Holds the raw option values until `inputs()` turns them into `config_inputs`.
class config_options {
public:
  /// Adds the options to `app`, in an option group "Config inputs".
  void add_to(CLI::App& app) {
    auto* g = app.add_option_group("Config inputs", "values that resolve \"auto\" in the config");
    g->add_option("--world-size", world_size_, "data-parallel ranks for the batch rule (default 1)");
    g->add_option("--hidden-size", hidden_size_, "model hidden size, for \"auto\" bucket sizes");
    g->add_option("--micro-batch-size", micro_batch_, "train_micro_batch_size_per_gpu (per_device_train_batch_size)");
    g->add_option("--gradient-accumulation-steps", accumulation_, "gradient_accumulation_steps");
    g->add_option("--max-grad-norm", max_grad_norm_, "gradient_clipping");
    g->add_option("--lr", lr_, "optimizer lr and scheduler warmup_max_lr (learning_rate)");
    g->add_option("--adam-beta1", beta1_, "optimizer betas[0]");
    g->add_option("--adam-beta2", beta2_, "optimizer betas[1]");
    g->add_option("--adam-epsilon", eps_, "optimizer eps");
    g->add_option("--weight-decay", weight_decay_, "optimizer weight_decay");
    g->add_option("--warmup-steps", warmup_steps_, "scheduler warmup_num_steps");
    g->add_option("--total-steps", total_steps_, "scheduler total_num_steps");
    g->add_option("--precision", precision_, "training precision: fp32, fp16 or bf16 (fp16.enabled / bf16.enabled)")
        ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
    g->add_option("--gather-16bit-weights", gather_, "stage3_gather_16bit_weights_on_model_save (true/false)");
    g->add_option("--custom-optimizer", custom_,
                  "a framework's own update rule the config's optimizer.type may name, as NAME:KEYS:STATE: the "
                  "optimizer.params keys it takes and its fp32 state tensors, each a comma-separated list "
                  "(e.g. Signum:lr,momentum,weight_decay:momentum_buffer; docs/optimizers.md); repeatable");
  }

  /// The options given, as `config_inputs`.
  /// \throws CLI::ValidationError when only one of --adam-beta1/--adam-beta2 is given.
  [[nodiscard]] config_inputs inputs() const {
    config_inputs in;
    in.world_size = world_size_;
    in.hidden_size = hidden_size_;
    in.micro_batch_size = micro_batch_;
    in.gradient_accumulation_steps = accumulation_;
    in.max_grad_norm = max_grad_norm_;
    in.lr = lr_;
    if (beta1_.has_value() != beta2_.has_value()) {
      throw CLI::ValidationError("--adam-beta1/--adam-beta2", "give both betas or neither");
    }
    if (beta1_) {
      in.betas = std::array<double, 2>{*beta1_, *beta2_};
    }
    in.eps = eps_;
    in.weight_decay = weight_decay_;
    in.warmup_steps = warmup_steps_;
    in.total_steps = total_steps_;
    if (precision_) {
      in.precision = parse_dtype(*precision_);
    }
    in.gather_16bit_weights_on_model_save = gather_;
    for (const std::string& spec : custom_) {
      in.optimizers.push_back(parse_custom_optimizer(spec));
    }
    return in;
  }

  /// A framework's rule from `NAME:KEYS:STATE` (--custom-optimizer): the name, then two comma-separated lists, each
  /// possibly empty. The config reader checks the entry itself (DeepSpeed's names, keys zero does not read, more
  /// than two state tensors). \throws CLI::ValidationError for another shape.
  [[nodiscard]] static custom_optimizer parse_custom_optimizer(const std::string& spec) {
    const auto fail = [&](const std::string& why) {
      return CLI::ValidationError("--custom-optimizer",
                                  why +
                                      "; expected NAME:KEYS:STATE such as "
                                      "Signum:lr,momentum,weight_decay:momentum_buffer, found \"" +
                                      zero::detail::printable(spec) + "\"");
    };
    // Every piece between separators, empty ones included.
    const auto split = [](const std::string& s, char sep) {
      std::vector<std::string> pieces{""};
      for (const char ch : s) {
        if (ch == sep) {
          pieces.emplace_back();
        } else {
          pieces.back().push_back(ch);
        }
      }
      return pieces;
    };
    const std::vector<std::string> parts = split(spec, ':');
    if (parts.size() != 3) {
      throw fail(std::to_string(parts.size()) + " field" + (parts.size() == 1 ? "" : "s") + " separated by ':'");
    }
    if (parts[0].empty()) {
      throw fail("no name");
    }
    const auto list = [&](const std::string& field, const char* what) {
      const std::vector<std::string> items = field.empty() ? std::vector<std::string>{} : split(field, ',');
      if (std::find(items.begin(), items.end(), std::string()) != items.end()) {
        throw fail(std::string("an empty ") + what + " name");
      }
      return items;
    };
    return custom_optimizer{.name = parts[0], .params = list(parts[1], "key"), .state = list(parts[2], "state tensor")};
  }

private:
  std::optional<std::int64_t> world_size_, hidden_size_, micro_batch_, accumulation_, warmup_steps_, total_steps_;
  std::optional<double> max_grad_norm_, lr_, beta1_, beta2_, eps_, weight_decay_;
  std::optional<std::string> precision_;
  std::optional<bool> gather_;
  std::vector<std::string> custom_;
};

} // namespace zero::tools
