#pragma once
/// \file
/// What a trainer does with the NVMe folders of a config before it builds the engine, as the examples
/// do: `--nvme-path DIR` written into every NVMe offload block (`override_nvme_paths`), the folders the
/// config puts files in (`nvme_folders`, the engine's rule), and each made if missing
/// (`make_nvme_folder`), with errors that say what is at the path instead of "File exists".

#include "zero/config/config.hpp"
#include "zero/core/detail/os_path.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/offload_storage.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace zero::tools {

/// The offload blocks that can hold an `nvme_path`.
inline constexpr const char* nvme_blocks[] = {"offload_optimizer", "offload_param"};

/// Writes `dir` as the `nvme_path` of every offload block of `j` whose device is "nvme" (before the
/// config is read, so that a config whose blocks lack nvme_path takes it from the command line).
inline void override_nvme_paths(nlohmann::json& j, const std::string& dir) {
  if (!j.is_object() || !j.contains("zero_optimization") || !j["zero_optimization"].is_object()) {
    return;
  }
  auto& z = j["zero_optimization"];
  for (const char* block : nvme_blocks) {
    if (!z.contains(block) || !z[block].is_object() || !z[block].contains("device") ||
        !z[block]["device"].is_string()) {
      continue;
    }
    std::string device = z[block]["device"].get<std::string>();
    for (char& c : device) {
      c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    }
    if (device == "nvme") {
      z[block]["nvme_path"] = dir;
    }
  }
}

/// The folders `cfg` puts NVMe files in: the engine's rule (`zero::nvme_folders`).
using zero::nvme_folders;

/// Makes the folder `dir` (and its parents) unless it is one. Every rank may ask at once: one makes
/// it, the others find it made.
/// \throws io_error naming `key` and `dir` and what is there instead: a symbolic link to a folder
///         that does not exist (and where it points), a file, or the error of mkdir.
inline void make_nvme_folder(const std::string& key, const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  zero::detail::check_os_path<io_error>(key, dir.native());
  std::error_code ec;
  if (fs::create_directories(dir, ec) || fs::is_directory(dir)) {
    return;
  }
  const int err = ec ? ec.value() : 0;
  std::error_code lc;
  const auto link = fs::symlink_status(dir, lc);
  if (!lc && fs::is_symlink(link)) {
    std::error_code rc;
    const auto target = fs::read_symlink(dir, rc);
    throw io_error(zero::detail::cat(key, " ", dir.string(), ": it is a symbolic link to ", rc ? "?" : target.string(),
                                     ", which is not a folder that exists; expected a folder (or a link to one)"),
                   err);
  }
  if (!lc && fs::exists(link)) {
    throw io_error(
        zero::detail::cat(key, " ", dir.string(), ": it is not a folder; expected a folder for the swap files"), err);
  }
  throw io_error(
      zero::detail::cat(key, " ", dir.string(), ": cannot create the folder: ", ec ? ec.message() : "unknown"), err);
}

} // namespace zero::tools
