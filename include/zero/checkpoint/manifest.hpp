#pragma once
/// \file
/// The manifest of a zero checkpoint (`<dir>/<tag>/manifest.json`): what was saved, by whom, and
/// where every piece of every parameter lies, so that a loader at any world size or stage reads
/// exactly the byte ranges it needs without recomputing the saving run's layout.
///
///     {"format": "zero-checkpoint", "format_version": 1, "tag": "step-100",
///      "world_size": 4, "stage": 2, "param_dtype": "bf16", "grad_dtype": "fp32",
///      "config_xxh64": "…", "global_steps": 100, "micro_steps": 200, "boundaries": 100,
///      "loss_scaler": {"dynamic": false, "cur_scale": 1, "cur_iter": 100, "last_overflow_iter": -1,
///                      "cur_hysteresis": 1},
///      "lr_scheduler": {"last_batch_iteration": 99},
///      "modules": ["fc1", "fc2"], "groups": [{"lr": 0.001, "weight_decay": 0.01}],
///      "model": {"pipe": 0, "tensor": 1, "tensor_size": 2},         (model-parallel jobs only)
///      "params": [{"name": "fc1.weight", "shape": [256, 784], "dtype": "bf16", "module": "fc1",
///                  "trainable": true, "group": 0, "tensor_split": 0}, …],  (a tensor slice only)
///      "files": [{"name": "rank-00000.bin", "kind": "shard", "rank": 0, "size": 123, "xxh64": "…",
///                 "pieces": [{"param": "fc1.weight", "offset": 0, "count": 1000, "byte_offset": 0}, …]},
///                {"name": "frozen.bin", "kind": "frozen", "rank": 0, …}]}
///
/// A piece of a `shard` file holds `count` fp32 master weights, then `count` values of each of the update
/// rule's state tensors, back to back from `byte_offset`: Adam/AdamW's first and second moments (12 bytes per
/// element). A rule other than AdamW names itself and its state tensors in the block
/// `"optimizer": {"type": "Lion", "state": ["exp_avg"]}` (zero/backend/update_rules.hpp: Lion's exp_avg, SGD's
/// momentum_buffer or none, Adagrad's sum), and its pieces hold 4 bytes per element per tensor, master included;
/// a manifest without the block holds AdamW's. A piece of
/// the `frozen` file holds `count` elements of the parameter's dtype. xxh64 is of the whole file
/// (seed 0), as 16 lowercase hex digits.
///
/// An engine running ZenFlow (`zero_optimization.zenflow`) adds its state: the block
/// `"zenflow": {"window_steps": 1, "selected": true, "columns": [{"param": "fc1.weight", "columns": [3, 7]}, …]}`
/// (the steps its window sums, whether columns were chosen, each 2-D weight's chosen columns) and one file of
/// kind `zenflow` per shard file, whose pieces hold the window's fp32 sums (4 bytes per element) and cover every
/// trainable parameter once, as the shards do.
///
/// `manifest::parse` trusts nothing in the text: a key given twice in an object is refused (the
/// config reader's check), every field is type-checked, every size and count is capped and checked
/// for overflow, file names are plain names inside the checkpoint directory, every piece starts at
/// an element boundary of its file, the pieces of a file tile it exactly (no overlap, no gap), and
/// every parameter is covered by its pieces exactly once. It throws `checkpoint_error` naming the
/// source and the field; it never allocates more than a small multiple of the text size.
///
/// The manifest's own bytes are covered by `manifest.xxh64` beside it (see `checksum_name`), which
/// `checkpoint::reader` checks before parsing.

#include "zero/checkpoint/detail/manifest_fields.hpp"
#include "zero/checkpoint/detail/optimizer_block.hpp"
#include "zero/config/config.hpp"
#include "zero/config/detail/reader.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"
#include "zero/optim/loss_scaler.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace zero::checkpoint {

/// The format this build writes and reads.
inline constexpr int format_version = 1;
/// The value of the manifest's "format" key.
inline constexpr std::string_view format_name = "zero-checkpoint";
/// The largest manifest text read (64 MiB); a longer file is refused before it is parsed.
inline constexpr std::size_t max_manifest_bytes = std::size_t{64} << 20;
/// The largest parameter accepted from a manifest (2^48 elements): keeps every byte offset in 64 bits.
inline constexpr std::uint64_t max_param_elements = std::uint64_t{1} << 48;
/// The largest world size accepted from a manifest.
inline constexpr int max_world_size = 1 << 20;
/// The most dimensions a parameter may have.
inline constexpr std::size_t max_dims = 16;
/// Bytes per element of a `zenflow` piece: the fp32 window.
inline constexpr std::uint64_t zenflow_bytes_per_element = 4;
/// The manifest's file name in a tag's directory.
inline constexpr std::string_view manifest_name = "manifest.json";
/// The commit marker beside the manifest: the xxh64 (seed 0) of `manifest.json`'s bytes as 16
/// lowercase hex digits and a newline, written after the manifest and before the tag is published.
inline constexpr std::string_view checksum_name = "manifest.xxh64";

/// One registered parameter as the checkpoint saw it.
struct param_entry {
  std::string name;
  std::vector<std::int64_t> shape;
  dtype type = dtype::f32;
  std::string module;
  bool trainable = true;
  std::size_t group = 0;
  /// Product of `shape` (not stored; computed by `parse`).
  std::uint64_t numel = 0;
  /// In a model-parallel checkpoint: the dimension the saved tensor is a slice along (`shape` being
  /// the slice's), or -1 for a whole tensor. Stored only when not -1.
  int tensor_split = -1;
};

/// A contiguous run of one parameter's elements inside one file.
struct piece_entry {
  /// Index into `manifest::params`.
  std::size_t param = 0;
  /// First element of the run inside the parameter (row-major).
  std::uint64_t offset = 0;
  /// Elements in the run.
  std::uint64_t count = 0;
  /// Where the run starts in the file.
  std::uint64_t byte_offset = 0;
};

/// One file of the checkpoint.
struct file_entry {
  /// File name inside the tag directory (no directories).
  std::string name;
  /// "shard" (master, m, v of trainable parameters), "frozen" (frozen parameters in their dtype) or "zenflow"
  /// (ZenFlow's window of trainable parameters).
  std::string kind;
  /// The rank that wrote it.
  int rank = 0;
  /// Size in bytes and xxh64 (seed 0) of the whole file.
  std::uint64_t size = 0;
  std::uint64_t xxh64 = 0;
  std::vector<piece_entry> pieces;
};

/// Where the saving engines sat in a model-parallel job (`set_model_group`); the manifest's optional
/// "model" block, `{"pipe": 0, "tensor": 1, "tensor_size": 2}`.
struct model_entry {
  int pipe = 0;
  int tensor = 0;
  int tensor_size = 1;
};

/// ZenFlow's state beside AdamW's, the manifest's optional "zenflow" block: the steps its window sums, whether
/// columns were chosen, and the chosen columns of each 2-D weight (an index into `manifest::params`).
struct zenflow_entry {
  std::int64_t window_steps = 0;
  bool selected = false;
  std::vector<std::pair<std::size_t, std::vector<std::int64_t>>> columns;
};

/// Everything in `manifest.json`; see the file comment.
struct manifest {
  int version = format_version;
  std::string tag;
  int world_size = 1;
  int stage = 0;
  dtype param_dtype = dtype::f32;
  dtype grad_dtype = dtype::f32;
  /// xxh64 of the saving run's resolved config (its `to_json().dump()`), for information: a load
  /// under another config (another stage or world size) is allowed.
  std::uint64_t config_xxh64 = 0;
  std::int64_t global_steps = 0;
  std::int64_t micro_steps = 0;
  std::int64_t boundaries = 0;
  bool scaler_dynamic = false;
  loss_scaler_state scaler;
  std::int64_t lr_last_batch_iteration = -1;
  std::vector<std::string> modules;
  /// Parameter groups: (lr, weight decay).
  std::vector<std::pair<double, double>> groups;
  /// Set when a model-parallel job saved this (one checkpoint per pipeline stage and tensor slice).
  std::optional<model_entry> model;
  std::vector<param_entry> params;
  std::vector<file_entry> files;
  /// Set when an engine running ZenFlow saved this; its window is in the files of kind "zenflow".
  std::optional<zenflow_entry> zenflow;
  /// The update rule of the shards' state.
  optimizer_entry optimizer;

  /// Bytes per element of a shard piece: the fp32 master and each state tensor of `optimizer`.
  [[nodiscard]] std::uint64_t shard_element_bytes() const noexcept { return 4 * (1 + optimizer.state.size()); }

  /// Index of the parameter named `name`, or -1.
  [[nodiscard]] std::ptrdiff_t find(std::string_view name) const {
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (params[i].name == name) {
        return static_cast<std::ptrdiff_t>(i);
      }
    }
    return -1;
  }

  /// The manifest as JSON, in the format of the file comment.
  [[nodiscard]] nlohmann::json to_json() const;
  /// Parses and validates a manifest. \param source the file named in messages.
  /// \throws checkpoint_error naming `source`, the field, what was found and what was expected.
  [[nodiscard]] static manifest parse(std::string_view text, const std::string& source);
};

namespace detail {

using zero::detail::cat;
using json = nlohmann::json;

/// A file name that stays inside the tag directory.
inline bool plain_file_name(std::string_view n) {
  if (n.empty() || n.size() > 255 || n == "." || n == "..") {
    return false;
  }
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == '.';
  });
}

/// Throws unless the runs (offset, count) of parameter `p` tile it exactly once; `files` names the files in
/// messages beyond "file" (e.g. of one kind).
inline void check_tiled(const std::string& source, const param_entry& p,
                        std::vector<std::pair<std::uint64_t, std::uint64_t>>& runs, std::string_view files) {
  std::sort(runs.begin(), runs.end());
  std::uint64_t next = 0;
  for (const auto& [off, cnt] : runs) {
    if (off != next) {
      throw checkpoint_error(cat(
          source, ": parameter \"", p.name, "\": ",
          off < next ? cat("elements from ", std::to_string(off), " are stored twice", files)
                     : cat("elements [", std::to_string(next), ", ", std::to_string(off), ") are in no file", files)));
    }
    next = off + cnt;
  }
  if (next != p.numel) {
    throw checkpoint_error(cat(source, ": parameter \"", p.name, "\": elements [", std::to_string(next), ", ",
                               std::to_string(p.numel), ") are in no file", files));
  }
}

/// The manifest's "zenflow" block (`top`'s), its parameters found in `by_name`: each a trainable 2-D weight named
/// once, its columns ascending inside its width.
inline zenflow_entry parse_zenflow(const fields& top, const std::vector<param_entry>& params,
                                   const std::map<std::string, std::size_t, std::less<>>& by_name) {
  const fields z(top.at("zenflow"), top.source(), "zenflow");
  zenflow_entry e;
  e.window_steps = z.integer("window_steps", 0, std::numeric_limits<std::int64_t>::max() / 4);
  e.selected = z.boolean("selected");
  std::size_t ci = 0;
  std::vector<bool> seen(params.size(), false);
  for (const json& v : z.array("columns")) {
    const fields c(v, top.source(), cat("zenflow.columns[", std::to_string(ci++), "]"));
    const std::string name = c.str("param");
    const auto it = by_name.find(name);
    if (it == by_name.end() || !params[it->second].trainable || params[it->second].shape.size() != 2 ||
        seen[it->second]) {
      c.fail("param", cat("\"", name.substr(0, 80), "\": expected a trainable 2-D parameter of params, named once"));
    }
    seen[it->second] = true;
    const std::int64_t cols = params[it->second].shape[1];
    std::vector<std::int64_t> chosen;
    for (const json& col : c.array("columns")) {
      if (!col.is_number_integer() || col.get<std::int64_t>() < 0 || col.get<std::int64_t>() >= cols ||
          (!chosen.empty() && col.get<std::int64_t>() <= chosen.back())) {
        c.fail("columns", cat("found ", zero::detail::show(col), "; expected ascending columns in [0, ",
                              std::to_string(cols), ")"));
      }
      chosen.push_back(col.get<std::int64_t>());
    }
    e.columns.emplace_back(it->second, std::move(chosen));
  }
  return e;
}

} // namespace detail

inline nlohmann::json manifest::to_json() const {
  using nlohmann::json;
  json j;
  j["format"] = format_name;
  j["format_version"] = version;
  j["tag"] = tag;
  j["world_size"] = world_size;
  j["stage"] = stage;
  j["param_dtype"] = name_of(param_dtype);
  j["grad_dtype"] = name_of(grad_dtype);
  j["config_xxh64"] = hex64(config_xxh64);
  j["global_steps"] = global_steps;
  j["micro_steps"] = micro_steps;
  j["boundaries"] = boundaries;
  j["loss_scaler"] = {{"dynamic", scaler_dynamic},
                      {"cur_scale", scaler.cur_scale},
                      {"cur_iter", scaler.cur_iter},
                      {"last_overflow_iter", scaler.last_overflow_iter},
                      {"cur_hysteresis", scaler.cur_hysteresis}};
  j["lr_scheduler"] = {{"last_batch_iteration", lr_last_batch_iteration}};
  j["modules"] = modules;
  json g = json::array();
  for (const auto& [lr, wd] : groups) {
    g.push_back({{"lr", lr}, {"weight_decay", wd}});
  }
  j["groups"] = std::move(g);
  if (model) {
    j["model"] = {{"pipe", model->pipe}, {"tensor", model->tensor}, {"tensor_size", model->tensor_size}};
  }
  json ps = json::array();
  for (const auto& p : params) {
    ps.push_back({{"name", p.name},
                  {"shape", p.shape},
                  {"dtype", name_of(p.type)},
                  {"module", p.module},
                  {"trainable", p.trainable},
                  {"group", p.group}});
    if (p.tensor_split >= 0) {
      ps.back()["tensor_split"] = p.tensor_split;
    }
  }
  j["params"] = std::move(ps);
  json fs = json::array();
  for (const auto& f : files) {
    json pieces = json::array();
    for (const auto& pc : f.pieces) {
      pieces.push_back({{"param", params[pc.param].name},
                        {"offset", pc.offset},
                        {"count", pc.count},
                        {"byte_offset", pc.byte_offset}});
    }
    fs.push_back({{"name", f.name},
                  {"kind", f.kind},
                  {"rank", f.rank},
                  {"size", f.size},
                  {"xxh64", hex64(f.xxh64)},
                  {"pieces", std::move(pieces)}});
  }
  j["files"] = std::move(fs);
  if (optimizer != optimizer_entry{}) {
    j["optimizer"] = {{"type", optimizer.type}, {"state", optimizer.state}};
  }
  if (zenflow) {
    json cs = json::array();
    for (const auto& [param, cols] : zenflow->columns) {
      cs.push_back({{"param", params[param].name}, {"columns", cols}});
    }
    j["zenflow"] = {{"window_steps", zenflow->window_steps}, {"selected", zenflow->selected}, {"columns", cs}};
  }
  return j;
}

inline manifest manifest::parse(std::string_view text, const std::string& source) {
  using detail::cat;
  using detail::fields;
  using nlohmann::json;
  if (text.size() > max_manifest_bytes) {
    throw checkpoint_error(cat(source, ": the manifest is ", std::to_string(text.size()), " bytes, expected at most ",
                               std::to_string(max_manifest_bytes)));
  }
  json j;
  try {
    // The config reader's parse: it refuses a key given twice in one object (nlohmann keeps the last).
    j = zero::detail::parse_text(text, "");
  } catch (const config_error& e) {
    std::string what = e.what();
    what.erase(0, std::min(what.size(), what.find("] ") + 2)); // the "[zero.config_error] " id
    throw checkpoint_error(cat(source, ": ", what, "; expected a zero checkpoint manifest"));
  }
  const fields top(j, source, "");
  manifest m;
  if (top.str("format") != format_name) {
    top.fail("format", cat("found \"", top.str("format").substr(0, 40), "\", expected \"", format_name, "\""));
  }
  const json& ver = top.at("format_version");
  if (!ver.is_number_integer() || ver.get<std::int64_t>() != format_version) {
    top.fail("format_version", cat("found ", zero::detail::show(ver), "; this build reads format version ",
                                   std::to_string(format_version), " only"));
  }
  m.tag = top.str("tag");
  m.world_size = static_cast<int>(top.integer("world_size", 1, max_world_size));
  m.stage = static_cast<int>(top.integer("stage", 0, 3));
  m.param_dtype = top.type("param_dtype");
  m.grad_dtype = top.type("grad_dtype");
  m.config_xxh64 = top.hash("config_xxh64");
  constexpr std::int64_t big = std::numeric_limits<std::int64_t>::max() / 4;
  m.global_steps = top.integer("global_steps", 0, big);
  m.micro_steps = top.integer("micro_steps", 0, big);
  m.boundaries = top.integer("boundaries", 0, big);
  {
    const fields s(top.at("loss_scaler"), source, "loss_scaler");
    m.scaler_dynamic = s.boolean("dynamic");
    m.scaler.cur_scale = s.number("cur_scale");
    if (!(m.scaler.cur_scale > 0) || !std::isfinite(m.scaler.cur_scale)) {
      s.fail("cur_scale", "expected a positive finite number");
    }
    m.scaler.cur_iter = s.integer("cur_iter", 0, big);
    m.scaler.last_overflow_iter = s.integer("last_overflow_iter", -1, big);
    m.scaler.cur_hysteresis = static_cast<int>(s.integer("cur_hysteresis", 0, 1 << 30));
  }
  {
    const fields s(top.at("lr_scheduler"), source, "lr_scheduler");
    m.lr_last_batch_iteration = s.integer("last_batch_iteration", -1, big);
  }
  for (const json& v : top.array("modules")) {
    if (!v.is_string()) {
      top.fail("modules", cat("expected strings, found ", zero::detail::kind_of(v)));
    }
    m.modules.push_back(v.get<std::string>());
  }
  std::size_t gi = 0;
  for (const json& v : top.array("groups")) {
    const fields g(v, source, cat("groups[", std::to_string(gi++), "]"));
    m.groups.emplace_back(g.number("lr"), g.number("weight_decay"));
  }
  if (top.has("optimizer")) {
    m.optimizer = detail::parse_optimizer(top);
  }
  if (top.has("model")) {
    const fields f(top.at("model"), source, "model");
    model_entry e;
    e.pipe = static_cast<int>(f.integer("pipe", 0, max_world_size));
    e.tensor_size = static_cast<int>(f.integer("tensor_size", 1, max_world_size));
    e.tensor = static_cast<int>(f.integer("tensor", 0, e.tensor_size - 1));
    m.model = e;
  }
  std::map<std::string, std::size_t, std::less<>> by_name;
  std::size_t pi = 0;
  for (const json& v : top.array("params")) {
    const fields f(v, source, cat("params[", std::to_string(pi++), "]"));
    param_entry p;
    p.name = f.str("name");
    if (p.name.empty()) {
      f.fail("name", "expected a non-empty name");
    }
    if (by_name.contains(p.name)) {
      f.fail("name", cat("\"", p.name, "\" appears twice"));
    }
    const json& shape = f.array("shape");
    if (shape.empty() || shape.size() > max_dims) {
      f.fail("shape",
             cat("has ", std::to_string(shape.size()), " dimensions, expected 1 to ", std::to_string(max_dims)));
    }
    p.numel = 1;
    for (const json& d : shape) {
      if (!d.is_number_integer() || d.get<std::int64_t>() <= 0 ||
          static_cast<std::uint64_t>(d.get<std::int64_t>()) > max_param_elements) {
        f.fail("shape", cat("found ", zero::detail::show(shape), ", expected positive integers"));
      }
      const auto extent = static_cast<std::uint64_t>(d.get<std::int64_t>());
      if (p.numel > max_param_elements / extent) {
        f.fail("shape", cat("found ", zero::detail::show(shape), ": more than 2^48 elements"));
      }
      p.numel *= extent;
      p.shape.push_back(static_cast<std::int64_t>(extent));
    }
    p.type = f.type("dtype");
    p.module = f.str("module");
    p.trainable = f.boolean("trainable");
    p.group = static_cast<std::size_t>(f.integer("group", 0, 1 << 30));
    if (p.trainable && p.group >= m.groups.size()) {
      f.fail("group",
             cat("found ", std::to_string(p.group), ", but there are ", std::to_string(m.groups.size()), " groups"));
    }
    if (f.has("tensor_split")) {
      p.tensor_split = static_cast<int>(f.integer("tensor_split", 0, static_cast<std::int64_t>(p.shape.size()) - 1));
    }
    by_name.emplace(p.name, m.params.size());
    m.params.push_back(std::move(p));
  }
  // Covered[i]: the (offset, count) runs of parameter i, to check that pieces tile it exactly once (the shards'
  // and the frozen file's, and apart from them ZenFlow's files').
  std::vector<std::vector<std::pair<std::uint64_t, std::uint64_t>>> covered(m.params.size());
  auto covered_zenflow = covered;
  bool has_zenflow_file = false;
  std::size_t fi = 0;
  bool has_frozen_file = false;
  for (const json& v : top.array("files")) {
    const fields f(v, source, cat("files[", std::to_string(fi++), "]"));
    file_entry fe;
    fe.name = f.str("name");
    if (!detail::plain_file_name(fe.name) || fe.name == manifest_name || fe.name == checksum_name) {
      f.fail("name", cat("found \"", fe.name.substr(0, 60),
                         "\", expected a plain file name (letters, digits, '-', "
                         "'_', '.') other than ",
                         manifest_name, " and ", checksum_name));
    }
    for (const auto& other : m.files) {
      if (other.name == fe.name) {
        f.fail("name", cat("\"", fe.name, "\" appears twice"));
      }
    }
    fe.kind = f.str("kind");
    if (fe.kind != "shard" && fe.kind != "frozen" && fe.kind != "zenflow") {
      f.fail("kind", cat("found \"", fe.kind.substr(0, 40), "\", expected \"shard\", \"frozen\" or \"zenflow\""));
    }
    const bool zen = fe.kind == "zenflow";
    const bool shard = fe.kind == "shard" || zen; // both hold fp32 values of trainable parameters
    has_frozen_file = has_frozen_file || !shard;
    fe.rank = static_cast<int>(f.integer("rank", 0, m.world_size - 1));
    fe.size = f.count("size", std::numeric_limits<std::int64_t>::max());
    fe.xxh64 = f.hash("xxh64");
    // (byte_offset, bytes, index) of each piece, to check that they tile the file.
    std::vector<std::tuple<std::uint64_t, std::uint64_t, std::size_t>> tiles;
    std::size_t k = 0;
    for (const json& pv : f.array("pieces")) {
      const fields pf(pv, source, cat(f.path(), ".pieces[", std::to_string(k++), "]"));
      piece_entry pc;
      const std::string pname = pf.str("param");
      auto it = by_name.find(pname);
      if (it == by_name.end()) {
        pf.fail("param", cat("\"", pname.substr(0, 80), "\" is not in params"));
      }
      pc.param = it->second;
      const auto& p = m.params[pc.param];
      if (p.trainable != shard) {
        pf.fail("param",
                cat("\"", p.name, "\" is ", p.trainable ? "trainable" : "frozen", " but this is a ", fe.kind, " file"));
      }
      pc.offset = pf.count("offset", max_param_elements);
      pc.count = pf.count("count", max_param_elements);
      pc.byte_offset = pf.count("byte_offset", std::numeric_limits<std::int64_t>::max());
      if (pc.count == 0 || pc.offset + pc.count > p.numel) {
        pf.fail("count", cat("elements [", std::to_string(pc.offset), ", ", std::to_string(pc.offset + pc.count),
                             ") do not lie inside \"", p.name, "\" of ", std::to_string(p.numel), " elements"));
      }
      const std::uint64_t bytes = pc.count * (zen     ? zenflow_bytes_per_element
                                              : shard ? m.shard_element_bytes()
                                                      : size_of(p.type));
      if (pc.byte_offset > fe.size || bytes > fe.size - pc.byte_offset) {
        pf.fail("byte_offset", cat("bytes [", std::to_string(pc.byte_offset), ", +", std::to_string(bytes),
                                   ") run past the file's size ", std::to_string(fe.size)));
      }
      // Every element of a shard is fp32; a frozen piece holds elements of its parameter's dtype.
      const std::uint64_t align = shard ? sizeof(float) : size_of(p.type);
      if (pc.byte_offset % align != 0) {
        pf.fail("byte_offset",
                cat("found ", std::to_string(pc.byte_offset), ", expected a multiple of ", std::to_string(align),
                    " (the start of a ", shard ? "fp32" : name_of(p.type), " element)"));
      }
      (zen ? covered_zenflow : covered)[pc.param].emplace_back(pc.offset, pc.count);
      tiles.push_back({pc.byte_offset, bytes, fe.pieces.size()});
      fe.pieces.push_back(pc);
    }
    // The pieces tile the file: sorted by where they start, each begins where the one before ends.
    std::sort(tiles.begin(), tiles.end());
    std::uint64_t next_byte = 0;
    for (const auto& [at, bytes, k] : tiles) {
      if (at != next_byte) {
        f.fail(cat("pieces[", std::to_string(k), "].byte_offset"),
               at < next_byte ? cat("bytes [", std::to_string(at), ", ", std::to_string(at + bytes),
                                    ") overlap another piece's, which ends at ", std::to_string(next_byte),
                                    "; expected every byte of the file in one piece")
                              : cat("found ", std::to_string(at), "; bytes [", std::to_string(next_byte), ", ",
                                    std::to_string(at), ") of the file are in no piece"));
      }
      next_byte = at + bytes;
    }
    if (next_byte != fe.size) {
      f.fail("size", cat("found ", std::to_string(fe.size), "; its pieces end at ", std::to_string(next_byte),
                         ", expected the file to end there"));
    }
    has_zenflow_file = has_zenflow_file || zen;
    m.files.push_back(std::move(fe));
  }
  static_cast<void>(has_frozen_file);
  if (top.has("zenflow")) {
    m.zenflow = detail::parse_zenflow(top, m.params, by_name);
  }
  if (has_zenflow_file && !m.zenflow) {
    top.fail("files", "has files of kind \"zenflow\" but the manifest has no \"zenflow\" block");
  }
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    detail::check_tiled(source, m.params[i], covered[i], "");
    if (m.zenflow && m.params[i].trainable) {
      detail::check_tiled(source, m.params[i], covered_zenflow[i], " of kind \"zenflow\"");
    }
  }
  return m;
}

} // namespace zero::checkpoint
