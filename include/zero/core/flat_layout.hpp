#pragma once
/// \file
/// `flat_layout`: where every parameter lives in one flat buffer, and which rank owns what.
///
/// Parameters are registered with a name, a shape, a dtype and a module, then `finalize` lays
/// them out. The flat buffer is a sequence of *segments*; each segment is padded to a multiple
/// of `world_size * alignment` elements and split into `world_size` equal, contiguous slices,
/// slice r owned by rank r. A rank's shard is the concatenation of its slices, one per segment,
/// stored contiguously in its own memory. With one segment this is exactly the contiguous shard
/// `[r*S, (r+1)*S)` of docs/design.md; with several, each segment is a reduce bucket (stages 0-2) or
/// a module (stage 3), and every reduce-scatter and all-gather runs in place over one segment as
/// `nccl.h` defines them, with evenly split buffers and no uneven (v-) collectives. Padding is
/// below `world_size * alignment` elements per segment, plus the alignment gaps between params.
///
/// Element counts and offsets are in elements of the layout's dtype.

#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace zero {

/// A half-open range `[begin, end)` of elements.
struct flat_range {
  std::size_t begin = 0;
  std::size_t end = 0;
  [[nodiscard]] std::size_t size() const noexcept { return end - begin; }
  [[nodiscard]] bool empty() const noexcept { return end == begin; }
  [[nodiscard]] bool contains(std::size_t i) const noexcept { return i >= begin && i < end; }
  friend bool operator==(const flat_range&, const flat_range&) = default;
};

/// How `finalize` groups parameters into segments.
enum class segment_by : std::uint8_t {
  /// Pack consecutive parameters into segments of at most `segment_bytes` (a larger parameter
  /// gets a segment of its own): reduce buckets for stages 0-2.
  bucket,
  /// One segment per module, in order of the modules' first registration: stage 3's units.
  module,
};

/// Options of `flat_layout::finalize`.
struct layout_options {
  /// Number of ranks the buffer is split over.
  int world_size = 1;
  /// Every parameter starts at, and every slice is a multiple of, this many bytes (a power of
  /// two, at least the element size). 256 keeps vector loads and NCCL on their fast paths.
  std::size_t alignment_bytes = 256;
  /// Grouping of parameters into segments.
  segment_by grouping = segment_by::bucket;
  /// With `segment_by::bucket`: the most bytes of parameters a segment holds; 0 puts everything
  /// into one segment.
  std::size_t segment_bytes = 0;
};

/// One registered parameter.
struct param_info {
  std::string name;
  std::vector<std::int64_t> shape;
  dtype type = dtype::f32;
  int module = -1;
  std::size_t numel = 0;
  /// Offset of the first element in the flat buffer (after finalize).
  std::size_t offset = 0;
  /// Index of the segment that holds it (after finalize).
  std::size_t segment = 0;
  [[nodiscard]] flat_range range() const noexcept { return {offset, offset + numel}; }
};

/// One segment of the flat buffer.
struct segment_info {
  /// Elements of the flat buffer, padding included; a multiple of world_size * alignment.
  flat_range range;
  /// Elements per rank: `range.size() / world_size`.
  std::size_t slice = 0;
  /// Where this segment's slice starts inside each rank's shard buffer.
  std::size_t shard_offset = 0;
  /// Parameters in the segment: positions `[first_param, last_param)` of `flat_order()`.
  std::size_t first_param = 0;
  std::size_t last_param = 0;
  /// The module of the segment with `segment_by::module`, -1 otherwise.
  int module = -1;
  /// Elements holding parameters or the alignment gaps between them (the rest is tail padding).
  std::size_t used = 0;
  /// Rank r's slice of the flat buffer.
  [[nodiscard]] flat_range slice_of(int rank) const noexcept {
    const std::size_t b = range.begin + static_cast<std::size_t>(rank) * slice;
    return {b, b + slice};
  }
};

/// The part of one parameter that lies in one rank's shard.
struct shard_piece {
  /// Parameter index into `params()`.
  std::size_t param = 0;
  /// First element of the piece inside the parameter (row-major element index).
  std::size_t param_offset = 0;
  /// First element of the piece in the flat buffer.
  std::size_t flat_offset = 0;
  /// First element of the piece inside the owning rank's shard buffer.
  std::size_t shard_offset = 0;
  /// Number of elements.
  std::size_t count = 0;
};

/// Where parameters live in a flat buffer of one dtype, and which rank owns which element.
class flat_layout {
public:
  /// A layout whose elements are of type `type`; every parameter added must have that dtype
  /// (make one layout per dtype, as DeepSpeed makes one flat group per dtype).
  explicit flat_layout(dtype type = dtype::f32) : type_(type) {}

  /// The element type of the buffer.
  [[nodiscard]] dtype type() const noexcept { return type_; }

  /// Registers a module (a layer or block, the unit stage 3 gathers) and returns its id.
  /// \throws usage_error after finalize, or when the name is taken.
  int add_module(const std::string& name) {
    check_open("add_module(\"" + name + "\")");
    if (name.empty()) {
      throw usage_error("add_module: a module needs a non-empty name");
    }
    if (module_ids_.contains(name)) {
      throw usage_error("add_module: module \"" + name + "\" is already registered");
    }
    module_ids_.emplace(name, static_cast<int>(modules_.size()));
    modules_.push_back(name);
    return static_cast<int>(modules_.size()) - 1;
  }

  /// Registers a parameter and returns its id (stable across finalize).
  /// \throws usage_error naming the parameter for an empty or duplicate name, a dimension that
  /// is not positive, an element count that overflows, a dtype other than the layout's, a module
  /// id that was never registered, or a call after finalize.
  std::size_t add(const std::string& name, const std::vector<std::int64_t>& shape, dtype type, int module = -1) {
    check_open("add(\"" + name + "\")");
    if (name.empty()) {
      throw usage_error("add: a parameter needs a non-empty name");
    }
    if (ids_.contains(name)) {
      throw usage_error("add: parameter \"" + name + "\" is already registered");
    }
    if (type != type_) {
      throw usage_error("add: parameter \"" + name + "\" has dtype " + std::string(name_of(type)) +
                        " but this layout holds " + std::string(name_of(type_)) + "; use one layout per dtype");
    }
    if (module < -1 || module >= static_cast<int>(modules_.size())) {
      throw usage_error("add: parameter \"" + name + "\" names module id " + std::to_string(module) + " but only " +
                        std::to_string(modules_.size()) + " modules are registered");
    }
    if (shape.empty()) {
      throw usage_error("add: parameter \"" + name + "\" has an empty shape; a scalar is shape {1}");
    }
    std::size_t numel = 1;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] <= 0) {
        throw usage_error("add: parameter \"" + name + "\" has dimension " + std::to_string(d) + " = " +
                          std::to_string(shape[d]) + "; every dimension must be positive");
      }
      const auto extent = static_cast<std::size_t>(shape[d]);
      if (numel > std::numeric_limits<std::size_t>::max() / 4 / extent) {
        throw usage_error("add: parameter \"" + name + "\" has more elements than a size_t can count");
      }
      numel *= extent;
    }
    param_info p;
    p.name = name;
    p.shape = shape;
    p.type = type;
    p.module = module;
    p.numel = numel;
    ids_.emplace(name, registered_.size());
    registered_.push_back(std::move(p));
    return registered_.size() - 1;
  }

  /// Lays the parameters out for `opt.world_size` ranks.
  /// \throws usage_error for a world size below 1, an alignment that is not a power of two of at
  /// least one element, no parameters, or a second call.
  void finalize(const layout_options& opt) {
    check_open("finalize");
    if (opt.world_size < 1) {
      throw usage_error("finalize: world_size must be at least 1, got " + std::to_string(opt.world_size));
    }
    const std::size_t esize = size_of(type_);
    if (opt.alignment_bytes == 0 || (opt.alignment_bytes & (opt.alignment_bytes - 1)) != 0 ||
        opt.alignment_bytes < esize) {
      throw usage_error("finalize: alignment_bytes must be a power of two of at least " + std::to_string(esize) +
                        " (one " + std::string(name_of(type_)) + " element), got " +
                        std::to_string(opt.alignment_bytes));
    }
    if (registered_.empty()) {
      throw usage_error("finalize: no parameters were registered");
    }
    world_ = opt.world_size;
    align_ = opt.alignment_bytes / esize;
    grouping_ = opt.grouping;

    // Flat order: registration order, or grouped by module in order of first appearance.
    order_.resize(registered_.size());
    for (std::size_t i = 0; i < order_.size(); ++i) {
      order_[i] = i;
    }
    if (opt.grouping == segment_by::module) {
      std::vector<std::size_t> first_seen(modules_.size() + 1, std::numeric_limits<std::size_t>::max());
      for (std::size_t i = 0; i < registered_.size(); ++i) {
        auto& f = first_seen[static_cast<std::size_t>(registered_[i].module + 1)];
        f = std::min(f, i);
      }
      std::stable_sort(order_.begin(), order_.end(), [&](std::size_t a, std::size_t b) {
        return first_seen[static_cast<std::size_t>(registered_[a].module + 1)] <
               first_seen[static_cast<std::size_t>(registered_[b].module + 1)];
      });
    }

    const std::size_t unit = align_ * static_cast<std::size_t>(world_);
    const std::size_t cap =
        opt.segment_bytes == 0 ? std::numeric_limits<std::size_t>::max() : opt.segment_bytes / esize;
    std::size_t offset = 0;
    std::size_t shard_offset = 0;
    segment_info seg;
    std::size_t cursor = 0; // next free element inside the open segment
    auto close_segment = [&](std::size_t end_param) {
      seg.used = cursor;
      const std::size_t padded = std::max(unit, round_up(cursor, unit));
      seg.range = {offset, offset + padded};
      seg.slice = padded / static_cast<std::size_t>(world_);
      seg.shard_offset = shard_offset;
      seg.last_param = end_param;
      offset += padded;
      shard_offset += seg.slice;
      segments_.push_back(seg);
    };
    for (std::size_t k = 0; k < order_.size(); ++k) {
      auto& p = registered_[order_[k]];
      const bool starts_new = [&] {
        if (k == 0) {
          return false;
        }
        if (opt.grouping == segment_by::module) {
          return p.module != registered_[order_[k - 1]].module;
        }
        return round_up(cursor, align_) + p.numel > cap;
      }();
      if (k > 0 && starts_new) {
        close_segment(k);
        seg = segment_info{};
        cursor = 0;
      }
      if (cursor == 0) {
        seg.first_param = k;
        seg.module = opt.grouping == segment_by::module ? p.module : -1;
      }
      cursor = round_up(cursor, align_);
      p.offset = offset + cursor;
      p.segment = segments_.size();
      cursor += p.numel;
    }
    close_segment(order_.size());
    total_ = offset;
    shard_size_ = shard_offset;
    finalized_ = true;
  }

  /// True after finalize.
  [[nodiscard]] bool finalized() const noexcept { return finalized_; }
  /// Ranks the layout was finalized for.
  [[nodiscard]] int world_size() const { return check_final(), world_; }
  /// Alignment in elements.
  [[nodiscard]] std::size_t alignment() const { return check_final(), align_; }
  /// Elements of the whole flat buffer, padding included; a multiple of world_size.
  [[nodiscard]] std::size_t total_size() const { return check_final(), total_; }
  /// Elements of one rank's shard (the same for every rank): total_size() / world_size().
  [[nodiscard]] std::size_t shard_size() const { return check_final(), shard_size_; }
  /// Elements that hold parameters.
  [[nodiscard]] std::size_t numel() const {
    std::size_t n = 0;
    for (const auto& p : registered_) {
      n += p.numel;
    }
    return n;
  }
  /// Padding elements: alignment gaps and segment tails.
  [[nodiscard]] std::size_t padding() const { return total_size() - numel(); }

  /// Number of parameters registered.
  [[nodiscard]] std::size_t param_count() const noexcept { return registered_.size(); }
  /// Parameter by id (the value `add` returned).
  [[nodiscard]] const param_info& param(std::size_t id) const {
    if (id >= registered_.size()) {
      throw usage_error("param id " + std::to_string(id) + " is out of range; " + std::to_string(registered_.size()) +
                        " parameters are registered");
    }
    return registered_[id];
  }
  /// Id of the parameter named `name`, if registered.
  [[nodiscard]] std::optional<std::size_t> find(const std::string& name) const {
    if (auto it = ids_.find(name); it != ids_.end()) {
      return it->second;
    }
    return std::nullopt;
  }
  /// Parameter ids in flat order (the order segments hold them).
  [[nodiscard]] const std::vector<std::size_t>& flat_order() const { return check_final(), order_; }
  /// Registered module names, by id.
  [[nodiscard]] const std::vector<std::string>& modules() const noexcept { return modules_; }

  /// The segments, in flat order.
  [[nodiscard]] const std::vector<segment_info>& segments() const { return check_final(), segments_; }

  /// Rank `rank`'s slices of the flat buffer, one per segment, in order.
  [[nodiscard]] std::vector<flat_range> shard_ranges(int rank) const {
    check_rank(rank);
    std::vector<flat_range> out;
    out.reserve(segments_.size());
    for (const auto& s : segments_) {
      out.push_back(s.slice_of(rank));
    }
    return out;
  }

  /// The rank owning flat element `i`, and the element's index inside that rank's shard buffer.
  [[nodiscard]] std::pair<int, std::size_t> owner(std::size_t i) const {
    check_final();
    if (i >= total_) {
      throw usage_error("flat index " + std::to_string(i) + " is outside the buffer of " + std::to_string(total_) +
                        " elements");
    }
    const auto it = std::upper_bound(segments_.begin(), segments_.end(), i,
                                     [](std::size_t v, const segment_info& s) { return v < s.range.begin; });
    const auto& s = *(it - 1);
    const std::size_t within = i - s.range.begin;
    return {static_cast<int>(within / s.slice), s.shard_offset + within % s.slice};
  }

  /// The part of parameter `id` that rank `rank` owns, if any (a parameter lies in one segment,
  /// so the part is one contiguous piece).
  [[nodiscard]] std::optional<shard_piece> intersection(std::size_t id, int rank) const {
    check_rank(rank);
    const auto& p = param(id);
    const auto& s = segments_[p.segment];
    const flat_range mine = s.slice_of(rank);
    const std::size_t b = std::max(mine.begin, p.offset);
    const std::size_t e = std::min(mine.end, p.offset + p.numel);
    if (b >= e) {
      return std::nullopt;
    }
    return shard_piece{id, b - p.offset, b, s.shard_offset + (b - mine.begin), e - b};
  }

  /// Every piece of every parameter that rank `rank` owns, in flat order.
  [[nodiscard]] std::vector<shard_piece> pieces(int rank) const {
    check_rank(rank);
    std::vector<shard_piece> out;
    for (std::size_t id : order_) {
      if (auto piece = intersection(id, rank)) {
        out.push_back(*piece);
      }
    }
    return out;
  }

  /// Groups consecutive segments into buckets of at most `max_bytes` of flat buffer each (a
  /// segment larger than that is a bucket alone). Returns, per bucket, the range of segment
  /// indices `[first, last)` it covers. Used to batch all-gathers (allgather_bucket_size).
  [[nodiscard]] std::vector<std::pair<std::size_t, std::size_t>> bucket_plan(std::size_t max_bytes) const {
    check_final();
    if (max_bytes == 0) {
      throw usage_error("bucket_plan: max_bytes must be positive");
    }
    const std::size_t cap = std::max<std::size_t>(1, max_bytes / size_of(type_));
    std::vector<std::pair<std::size_t, std::size_t>> out;
    std::size_t first = 0;
    std::size_t size = 0;
    for (std::size_t i = 0; i < segments_.size(); ++i) {
      const std::size_t n = segments_[i].range.size();
      if (i > first && size + n > cap) {
        out.emplace_back(first, i);
        first = i;
        size = 0;
      }
      size += n;
    }
    out.emplace_back(first, segments_.size());
    return out;
  }

private:
  static std::size_t round_up(std::size_t v, std::size_t m) noexcept { return (v + m - 1) / m * m; }
  void check_open(const std::string& what) const {
    if (finalized_) {
      throw usage_error("flat_layout::" + what + " after finalize; register everything first");
    }
  }
  void check_final() const {
    if (!finalized_) {
      throw usage_error("flat_layout is not finalized; call finalize() after registering parameters");
    }
  }
  void check_rank(int rank) const {
    check_final();
    if (rank < 0 || rank >= world_) {
      throw usage_error("rank " + std::to_string(rank) + " is outside the layout's world of " + std::to_string(world_) +
                        " ranks");
    }
  }

  dtype type_;
  std::vector<param_info> registered_;
  std::unordered_map<std::string, std::size_t> ids_;
  std::vector<std::string> modules_;
  std::unordered_map<std::string, int> module_ids_;
  std::vector<std::size_t> order_;
  std::vector<segment_info> segments_;
  int world_ = 1;
  std::size_t align_ = 1;
  segment_by grouping_ = segment_by::bucket;
  std::size_t total_ = 0;
  std::size_t shard_size_ = 0;
  bool finalized_ = false;
};

} // namespace zero
