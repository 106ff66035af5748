#pragma once
/// \file
/// Checkpoints of a model-parallel job (docs/parallelism.md, "Checkpoints"). Each pipeline stage's
/// tensor slice has its own engine over its data-parallel group (`set_model_group` with its
/// `model_coords`), and that engine saves into `dir/pipe-PP-tensor-TT` (`model_dir`), a complete
/// checkpoint whose manifest records the coordinates and each parameter's `tensor_split`.
///
/// `model_reader` reads such a job's checkpoint as one model: every stage's parameters (or one
/// stage's), each tensor whole, the slices joined along their split dimension; and it reads any
/// range of any slice of another tensor-parallel size (`read_slice`), which is how `load` puts a
/// checkpoint saved at one (pipe, tensor, data) factorization into engines at another, or into one
/// engine holding the whole model. A plain checkpoint directory (one engine's) reads the same way,
/// every tensor whole. `export_safetensors(model_reader&, ...)` (safetensors.hpp) writes the whole
/// tensors, as `zero-ckpt export` does.

#include "zero/checkpoint/reader.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace zero::checkpoint {

/// The folder of a model-parallel checkpoint root that stage `pipe`'s tensor slice `tensor` saves
/// into: "pipe-00-tensor-01".
[[nodiscard]] inline std::string model_dir_name(int pipe, int tensor) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "pipe-%02d-tensor-%02d", pipe, tensor);
  return buf;
}

/// Where `eng` saves and loads checkpoints given `dir`: `dir` itself, or, for an engine in a
/// model-parallel job (`set_model_group`), its coordinates' folder inside `dir`.
template <class Engine>
[[nodiscard]] std::filesystem::path model_dir(const Engine& eng, const std::filesystem::path& dir) {
  const auto* at = eng.model_place();
  return at != nullptr ? dir / model_dir_name(at->pipe, at->tensor) : dir;
}

/// True when `dir` is the root of a model-parallel checkpoint (it has stage 0's first slice).
[[nodiscard]] inline bool is_model_root(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::is_directory(dir / model_dir_name(0, 0), ec);
}

namespace detail {

/// How a whole tensor of shape `whole` is cut: into `slices` equal slices along dimension `dim`
/// (-1, or 1 slice: not cut).
struct tensor_cut {
  std::vector<std::int64_t> whole;
  int dim = -1;
  int slices = 1;

  [[nodiscard]] bool cut() const noexcept { return dim >= 0 && slices > 1; }
  /// Elements of a slice that are contiguous in the whole tensor, and of a whole row of them.
  [[nodiscard]] std::uint64_t run() const noexcept { return row() / static_cast<std::uint64_t>(slices); }
  [[nodiscard]] std::uint64_t row() const noexcept {
    std::uint64_t n = 1;
    for (std::size_t d = static_cast<std::size_t>(dim); d < whole.size(); ++d) {
      n *= static_cast<std::uint64_t>(whole[d]);
    }
    return n;
  }
};

/// `count` elements read from slice `slice` at `offset`, into the output at `out`.
struct slice_run {
  int slice = 0;
  std::uint64_t offset = 0;
  std::uint64_t count = 0;
  std::uint64_t out = 0;
};

/// Where elements `[offset, offset + count)` of slice `index` of cut `to` lie in the slices of cut
/// `from` of the same whole tensor: contiguous runs, in order.
[[nodiscard]] inline std::vector<slice_run> map_runs(const tensor_cut& to, int index, std::uint64_t offset,
                                                     std::uint64_t count, const tensor_cut& from) {
  constexpr std::uint64_t unbounded = std::numeric_limits<std::uint64_t>::max();
  std::vector<slice_run> runs;
  for (std::uint64_t done = 0; done < count;) {
    const std::uint64_t i = offset + done;
    std::uint64_t whole = i;
    std::uint64_t left = unbounded;
    if (to.cut()) {
      const std::uint64_t run = to.run();
      whole = i / run * to.row() + static_cast<std::uint64_t>(index) * run + i % run;
      left = run - i % run;
    }
    slice_run r{.slice = 0, .offset = whole, .count = 0, .out = done};
    if (from.cut()) {
      const std::uint64_t run = from.run();
      const std::uint64_t in_row = whole % from.row();
      r.slice = static_cast<int>(in_row / run);
      r.offset = whole / from.row() * run + in_row % run;
      left = std::min(left, run - in_row % run);
    }
    r.count = std::min(left, count - done);
    if (!runs.empty() && runs.back().slice == r.slice && runs.back().offset + runs.back().count == r.offset) {
      runs.back().count += r.count;
    } else {
      runs.push_back(r);
    }
    done += r.count;
  }
  return runs;
}

/// The whole shape of a tensor saved as slice shape `shape` cut into `slices` along `dim`.
[[nodiscard]] inline std::vector<std::int64_t> whole_shape(std::vector<std::int64_t> shape, int dim, int slices) {
  if (dim >= 0) {
    shape[static_cast<std::size_t>(dim)] *= slices;
  }
  return shape;
}

/// The cut of its whole tensor that `eng` holds of registered parameter `r`, and which slice: its
/// `tensor_split` over the tensor size of `eng`'s model coordinates (none without them).
struct held_slice {
  tensor_cut cut;
  int index = 0;
  /// "[4, 6]", or "[4, 6] (slice 1 of 2 along dimension 0: whole [8, 6])", for messages.
  std::string text;
};
template <class Engine, class Registered>
[[nodiscard]] held_slice held_slice_of(const Engine& eng, const Registered& r) {
  const auto& shape = r.info->shape;
  const auto* at = eng.model_place();
  const int slices = at != nullptr && r.tensor_split >= 0 ? at->tensor_size : 1;
  held_slice h{{whole_shape(shape, r.tensor_split, slices), r.tensor_split, slices},
               slices > 1 ? at->tensor : 0,
               shape_text(shape)};
  if (slices > 1) {
    h.text += cat(" (slice ", std::to_string(h.index), " of ", std::to_string(slices), " along dimension ",
                  std::to_string(r.tensor_split), ": whole ", shape_text(h.cut.whole), ")");
  }
  return h;
}

} // namespace detail

/// A checkpoint read as one model; see the file comment.
class model_reader {
public:
  /// Opens checkpoint `tag` of `root`: a model-parallel job's root (its `pipe-PP-tensor-TT` folders)
  /// or one engine's checkpoint directory. `pipe` >= 0 reads that pipeline stage only (of a root).
  /// "latest" is resolved in stage 0's (or `pipe`'s) first slice; the other slices are read at the
  /// same tag. \throws checkpoint_error naming the folder or manifest that is missing or does not
  /// belong (another stage or slice, tensor size or step; a parameter whose slices differ).
  explicit model_reader(const std::filesystem::path& root, const std::string& tag = "latest", int pipe = -1,
                        bool verify_on_open = true)
      : root_(root), filtered_(pipe >= 0 && is_model_root(root)) {
    using detail::cat;
    if (!is_model_root(root)) {
      parts_.push_back(std::make_unique<reader>(root, tag, verify_on_open));
      m_ = parts_[0]->info();
      for (std::size_t i = 0; i < m_.params.size(); ++i) {
        add(i, {{0, i}}, {m_.params[i].shape, -1, 1});
      }
      return;
    }
    std::string at = tag;
    const int first = std::max(pipe, 0);
    for (int p = first; pipe < 0 || p == pipe; ++p) {
      if (p > first && !std::filesystem::is_directory(root / model_dir_name(p, 0))) {
        break;
      }
      open_stage(p, at, verify_on_open);
      at = parts_.front()->info().tag;
    }
    const manifest& head = parts_.front()->info();
    std::vector<param_entry> params = std::move(m_.params);
    m_ = head;
    m_.files.clear();
    m_.params = std::move(params);
  }

  /// The model: the first slice's manifest (tag, counters, scaler, schedule, groups), with every
  /// parameter of the stages read, each of its whole shape (`tensor_split` the dimension its slices
  /// were cut along), and no files.
  [[nodiscard]] const manifest& info() const noexcept { return m_; }
  /// The folder given: the job's root, or the engine's checkpoint directory.
  [[nodiscard]] const std::filesystem::path& root() const noexcept { return root_; }
  /// True when one stage of a model-parallel root was read: its manifest lists only that stage.
  [[nodiscard]] bool one_stage() const noexcept { return filtered_; }
  /// The checkpoints read (one per stage and slice), for verifying and showing them.
  [[nodiscard]] std::vector<reader*> parts() const {
    std::vector<reader*> out;
    for (const auto& p : parts_) {
      out.push_back(p.get());
    }
    return out;
  }

  /// Reads elements `[offset, offset + out.size())` of whole tensor `kind` of parameter `param` (an
  /// index into `info().params`) as fp32. \throws as `reader::read`.
  void read(std::size_t param, tensor_kind kind, std::uint64_t offset, std::span<float> out) {
    read_slice(param, kind, {m_.params.at(param).shape, -1, 1}, 0, offset, out);
  }
  /// Reads elements `[offset, offset + out.size())` of slice `index` of `cut` (a cut of parameter
  /// `param`'s whole shape: another tensor-parallel size, or none) as fp32.
  /// \throws usage_error for a cut of another shape or a range outside the slice; as `reader::read`.
  void read_slice(std::size_t param, tensor_kind kind, const detail::tensor_cut& cut, int index, std::uint64_t offset,
                  std::span<float> out) {
    using detail::cat;
    const auto& p = m_.params.at(param);
    if (cut.whole != p.shape || index < 0 || index >= cut.slices || cut.slices < 1 ||
        cut.dim >= static_cast<int>(p.shape.size()) ||
        (cut.dim >= 0 && p.shape[static_cast<std::size_t>(cut.dim)] % cut.slices != 0) ||
        (cut.dim < 0 && cut.slices != 1)) {
      throw usage_error(cat("model_reader: a cut of \"", p.name, "\" as ", detail::shape_text(cut.whole), " into ",
                            std::to_string(cut.slices), " slices; its whole shape is ", detail::shape_text(p.shape)));
    }
    if (offset > p.numel / static_cast<std::uint64_t>(cut.slices) ||
        out.size() > p.numel / static_cast<std::uint64_t>(cut.slices) - offset) {
      throw usage_error(cat("model_reader: elements [", std::to_string(offset), ", +", std::to_string(out.size()),
                            ") of slice ", std::to_string(index), " of \"", p.name, "\" outside it"));
    }
    for (const auto& r : detail::map_runs(cut, index, offset, out.size(), cuts_[param])) {
      const auto [part, at] = slices_[param][static_cast<std::size_t>(r.slice)];
      parts_[part]->read(at, kind, r.offset, out.subspan(r.out, r.count));
    }
  }

private:
  /// Opens every tensor slice of stage `p` at `tag`, checks that they belong together, and adds the
  /// stage's parameters.
  void open_stage(int p, const std::string& tag, bool verify) {
    using detail::cat;
    const std::size_t first = parts_.size();
    const auto open = [&](int t, const std::string& at) -> const manifest& {
      const auto dir = root_ / model_dir_name(p, t);
      parts_.push_back(std::make_unique<reader>(dir, at, verify));
      const manifest& m = parts_.back()->info();
      const std::string source = (parts_.back()->path() / manifest_name).string();
      if (!m.model || m.model->pipe != p || m.model->tensor != t) {
        throw checkpoint_error(cat(
            source, ": ",
            m.model ? cat("records pipe ", std::to_string(m.model->pipe), ", tensor ", std::to_string(m.model->tensor))
                    : std::string("records no model coordinates"),
            "; expected pipe ", std::to_string(p), ", tensor ", std::to_string(t), " (its folder's name)"));
      }
      const manifest& head = parts_.front()->info();
      if (parts_.size() > 1 && (m.model->tensor_size != parts_[first]->info().model->tensor_size ||
                                m.global_steps != head.global_steps || m.boundaries != head.boundaries)) {
        throw checkpoint_error(cat(
            source, ": tensor size ", std::to_string(m.model->tensor_size), " at step ", std::to_string(m.global_steps),
            "; expected tensor size ", std::to_string(parts_[first]->info().model->tensor_size), " at step ",
            std::to_string(head.global_steps), " as ", (parts_.front()->path() / manifest_name).string(), " records"));
      }
      return m;
    };
    const std::string at = open(0, tag).tag;
    const int slices = parts_[first]->info().model->tensor_size;
    for (int t = 1; t < slices; ++t) {
      const manifest& m = open(t, at);
      const manifest& m0 = parts_[first]->info();
      bool same = m.params.size() == m0.params.size();
      for (std::size_t i = 0; same && i < m.params.size(); ++i) {
        same = m.params[i].name == m0.params[i].name && m.params[i].shape == m0.params[i].shape &&
               m.params[i].tensor_split == m0.params[i].tensor_split;
      }
      if (!same) {
        throw checkpoint_error(cat((parts_.back()->path() / manifest_name).string(),
                                   ": its parameters (names, slice shapes, split dimensions) differ from those of ",
                                   (parts_[first]->path() / manifest_name).string(),
                                   "; expected the slices of one stage"));
      }
    }
    for (std::size_t i = 0; i < parts_[first]->info().params.size(); ++i) {
      param_entry e = parts_[first]->info().params[i];
      const int dim = e.tensor_split; // -1: the same on every slice, read from the first
      e.shape = detail::whole_shape(e.shape, dim, slices);
      e.numel *= static_cast<std::uint64_t>(dim >= 0 ? slices : 1);
      std::vector<std::pair<std::size_t, std::size_t>> where;
      for (int t = 0; t < (dim >= 0 ? slices : 1); ++t) {
        where.emplace_back(first + static_cast<std::size_t>(t), i);
      }
      if (m_.find(e.name) >= 0) {
        throw checkpoint_error(cat((parts_[first]->path() / manifest_name).string(), ": parameter \"", e.name,
                                   "\" is also in an earlier stage; expected each stage's own parameters"));
      }
      m_.params.push_back(e);
      add(m_.params.size() - 1, std::move(where), {e.shape, dim, dim >= 0 ? slices : 1});
    }
  }
  void add(std::size_t param, std::vector<std::pair<std::size_t, std::size_t>> where, detail::tensor_cut cut) {
    slices_.resize(param + 1);
    cuts_.resize(param + 1);
    slices_[param] = std::move(where);
    cuts_[param] = std::move(cut);
  }

  std::filesystem::path root_;
  bool filtered_;
  manifest m_;
  std::vector<std::unique_ptr<reader>> parts_;
  /// Per parameter, per saved slice: (index into parts_, its index there); and how it was cut.
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> slices_;
  std::vector<detail::tensor_cut> cuts_;
};

} // namespace zero::checkpoint
