#pragma once
/// \file
/// ZenFlow's state in a checkpoint (the manifest's "zenflow" block and its files of kind "zenflow",
/// manifest.hpp): what `save` adds to the manifest of an engine running ZenFlow, and how `load` puts a saved
/// window and choice back (`zenflow_adamw::restore`). The window is per state element, so it is cut by the same
/// piece tables as the shards and loads at any world size or stage, as they do.

#include "zero/checkpoint/manifest.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/flat_layout.hpp"

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace zero::checkpoint::detail {

/// The name of rank r's file of ZenFlow's window: "zenflow-00003.bin".
inline std::string zenflow_file_name(int r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "zenflow-%05d.bin", r);
  return buf;
}

/// Adds to `m` the "zenflow" block of `zen` (an engine's `zenflow_adamw`, over `layout`; `index_of_layout_id`:
/// the manifest's index of each layout parameter) and, for each of its first `shard_files` files (the shards), a
/// file of kind "zenflow" with the same pieces at 4 bytes per element, at the end of `m.files`.
template <class ZenFlow>
void add_zenflow(manifest& m, const ZenFlow& zen, const flat_layout& layout,
                 const std::vector<std::size_t>& index_of_layout_id, std::size_t shard_files) {
  zenflow_entry e{.window_steps = zen.window_steps(), .selected = zen.selected(), .columns = {}};
  for (std::size_t id = 0; id < layout.param_count(); ++id) {
    if (layout.param(id).shape.size() == 2) {
      e.columns.emplace_back(index_of_layout_id[id], zen.columns(id));
    }
  }
  m.zenflow = std::move(e);
  for (std::size_t f = 0; f < shard_files; ++f) {
    file_entry fe{zenflow_file_name(m.files[f].rank), "zenflow", m.files[f].rank, 0, 0, {}};
    std::uint64_t at = 0;
    for (const auto& pc : m.files[f].pieces) {
      fe.pieces.push_back({pc.param, pc.offset, pc.count, at});
      at += pc.count * zenflow_bytes_per_element;
    }
    fe.size = at;
    m.files.push_back(std::move(fe));
  }
}

/// The saved choice of `m` per parameter of `layout` (by name; empty for one the layout does not hold).
inline std::vector<std::vector<std::int64_t>> zenflow_columns(const manifest& m, const flat_layout& layout) {
  std::vector<std::vector<std::int64_t>> out(layout.param_count());
  for (const auto& [param, columns] : m.zenflow->columns) {
    if (const auto id = layout.find(m.params[param].name)) {
      out[*id] = columns;
    }
  }
  return out;
}

} // namespace zero::checkpoint::detail
