#pragma once
/// \file
/// Consolidated weights in the safetensors format: `eng.export_safetensors(path, dtype)` (collective,
/// streamed through rank 0), `checkpoint::export_safetensors(reader, path, dtype)` (offline, from a
/// checkpoint directory; what `zero-ckpt export` runs), and `eng.init_from_safetensors(path)`.
/// Tensors carry the registered names and shapes, in registration order; trainable parameters are
/// exported from their fp32 master weights (rounded to bf16 or fp16 when asked), frozen ones from
/// their values.
///
/// Memory: the export never holds more than one chunk (`export_chunk_elements`) of one parameter
/// beside what a rank already owns: each chunk is assembled on rank 0 from the ranks that own its
/// pieces (send/recv), converted and written, then the next.

#include "zero/checkpoint/checkpoint.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/io/safetensors.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <sys/stat.h>
#include <vector>

namespace zero::checkpoint {

/// Elements of one parameter assembled at once by an export (1 Mi: 4 MiB of fp32).
inline constexpr std::size_t export_chunk_elements = std::size_t{1} << 20;

namespace detail {

/// Rounds `src` to `type` and appends the bytes to `out`.
inline void append_as(dtype type, std::span<const float> src, std::vector<std::byte>& out) {
  const std::size_t es = size_of(type);
  const std::size_t at = out.size();
  out.resize(at + src.size() * es);
  visit_float(type, [&]<class T>(type_tag<T>) {
    for (std::size_t i = 0; i < src.size(); ++i) {
      const T v = from_float<T>(src[i]);
      std::memcpy(out.data() + at + i * es, &v, es);
    }
  });
}

/// Only fp32, bf16 and fp16 are export dtypes.
inline void check_export_type(dtype type) {
  if (type != dtype::f32 && type != dtype::bf16 && type != dtype::f16) {
    throw usage_error(cat("export_safetensors: dtype ", name_of(type),
                          " is not an export dtype; expected fp32, "
                          "bf16 or fp16"));
  }
}

/// Refuses to export to `out` unless it is a regular file or a new name: the writer writes
/// `<out>.tmp` and renames it over `out`, which would replace a device node, a FIFO, a symbolic
/// link or a folder's entry with a regular file. \throws io_error naming the path, what it is and
/// what was expected.
inline void check_export_target(const std::filesystem::path& out) {
  for (const auto& p : {out, std::filesystem::path(out.string() + ".tmp")}) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      throw io_error(cat(p.string(), ": ", file_kind(st.st_mode),
                         "; expected a regular file or a new name to write the safetensors file to (an export "
                         "replaces only regular files)"));
    }
  }
}

/// Refuses an export target inside `ckpt_dir` (the folder holding a checkpoint's tags and latest),
/// where it could replace a file of the checkpoint being read. Both paths are compared with every
/// link of their existing folders resolved. \throws io_error naming both.
inline void check_outside(const std::filesystem::path& out, const std::filesystem::path& ckpt_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path root = fs::weakly_canonical(ckpt_dir, ec);
  const fs::path target = fs::weakly_canonical(fs::absolute(out, ec).parent_path(), ec);
  if (root.empty() || target.empty()) {
    throw io_error(cat(out.string(), ": cannot resolve the path to compare it with the checkpoint folder ",
                       ckpt_dir.string(), ": ", ec.message()),
                   ec.value());
  }
  const auto [r, t] = std::mismatch(root.begin(), root.end(), target.begin(), target.end());
  if (r == root.end()) {
    throw io_error(cat(out.string(), ": inside the checkpoint folder ", ckpt_dir.string(),
                       "; expected a path outside it (an export must not replace a file of the checkpoint it reads)"));
  }
}

} // namespace detail

namespace detail {

/// An engine of a model-parallel job holds one stage's tensor slices: a file of the whole model is
/// written from the job's checkpoint instead. \throws usage_error saying so.
template <class Engine> void refuse_model_part(const Engine& eng, const char* what) {
  if (const auto* at = eng.model_place()) {
    throw usage_error(cat(what, ": this engine holds pipe ", std::to_string(at->pipe), ", tensor slice ",
                          std::to_string(at->tensor), " of ", std::to_string(at->tensor_size),
                          " of a model-parallel job; save a checkpoint and export the whole model from it "
                          "(checkpoint::model_reader and export_safetensors, or zero-ckpt export)"));
  }
}

/// `export_safetensors` of a reader `r` (a `reader` or a `model_reader`) of the checkpoint folder `folder`.
template <class Reader>
void export_from(Reader& r, const std::filesystem::path& folder, const std::filesystem::path& out, dtype type) {
  check_export_type(type);
  check_outside(out, folder);
  check_export_target(out);
  const manifest& m = r.info();
  std::vector<safetensors::tensor_decl> decls;
  for (const auto& p : m.params) {
    decls.push_back({p.name, type, p.shape});
  }
  safetensors::writer w(out, std::move(decls),
                        {{"format", "pt"}, {"zero.tag", m.tag}, {"zero.global_steps", std::to_string(m.global_steps)}});
  std::vector<float> chunk;
  std::vector<std::byte> bytes;
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    for (std::uint64_t off = 0; off < m.params[i].numel; off += export_chunk_elements) {
      chunk.resize(static_cast<std::size_t>(std::min<std::uint64_t>(export_chunk_elements, m.params[i].numel - off)));
      r.read(i, tensor_kind::master, off, chunk);
      bytes.clear();
      append_as(type, chunk, bytes);
      w.write(bytes);
    }
  }
  w.close();
}

} // namespace detail

/// Writes the parameters of checkpoint `r` to the safetensors file `out` in `type`, one chunk at a
/// time, atomically (`<out>.tmp`, then a rename in `out`'s folder).
/// \throws checkpoint_error for a bad checkpoint file (verified as it is read); io_error when `out`
/// is inside the checkpoint's folder, is not a regular file or a new name (a device node, a FIFO, a
/// symbolic link, a folder), or cannot be written (a file already at `out` stays as it was).
inline void export_safetensors(reader& r, const std::filesystem::path& out, dtype type = dtype::f32) {
  // r.path() is dir/tag (or dir/.old-tag): the checkpoint's folder is the one above it.
  detail::export_from(r, r.path().parent_path(), out, type);
}
/// The same for a model-parallel job's checkpoint: every stage's parameters, each tensor whole (its
/// tensor slices joined along their split dimension), as one engine holding the whole model would
/// export them. \throws as above, and io_error for `out` inside the job's root.
inline void export_safetensors(model_reader& r, const std::filesystem::path& out, dtype type = dtype::f32) {
  detail::export_from(r, r.root(), out, type);
}

/// Writes the consolidated parameters of `eng` to `path` in `type`; collective (rank 0 writes).
/// Needs a communicator with send and recv at stages 1-3.
/// \throws usage_error for a dtype other than fp32, bf16, fp16; io_error when the file cannot be
/// written (on rank 0; the other ranks then fail with an error naming rank 0).
template <class Engine> void export_safetensors(Engine& eng, const std::filesystem::path& path, dtype type) {
  using access = checkpoint_access<Engine>;
  using detail::cat;
  detail::check_export_type(type);
  if (!access::finalized(eng)) {
    throw usage_error("export_safetensors before finalize()");
  }
  detail::refuse_model_part(eng, "export_safetensors");
  auto& comm = access::comm(eng);
  using comm_type = std::remove_reference_t<decltype(comm)>;
  const int rank = comm.rank();
  const int world = comm.size();
  const int stage = eng.cfg().stage();
  const flat_layout& layout = eng.layout();
  const auto registered = access::params(eng);
  const auto st = eng.stores();
  auto& optim = eng.optimizer();
  // Host copies of this rank's fp32 values (its shard, or everything at stage 0) and of the frozen
  // parameters, through the backend's copy when they live on a device.
  std::vector<float> values(optim.state_size());
  optim.read_state(state_tensor::master, 0, values);
  const auto frozen_host = rank == 0 ? access::read(eng, static_cast<const std::byte*>(st.frozen), st.frozen_bytes)
                                     : std::vector<std::byte>{};

  std::optional<safetensors::writer> w;
  std::exception_ptr err;
  // With HSDP the first shard group gathers and writes; the others hold the same values.
  const bool writes = access::writes(eng);
  try {
    if (rank == 0 && writes) {
      detail::check_export_target(path);
      std::vector<safetensors::tensor_decl> decls;
      for (const auto& r : registered) {
        decls.push_back({r.info->name, type, r.info->shape});
      }
      w.emplace(path, std::move(decls),
                std::map<std::string, std::string>{{"format", "pt"},
                                                   {"zero.global_steps", std::to_string(eng.global_steps())}});
    }
  } catch (...) {
    err = std::current_exception();
  }
  detail::agree(eng, err, cat("export_safetensors(", path.string(), ")"));

  std::vector<float> chunk;
  std::vector<std::byte> bytes;
  for (const auto& r : registered) {
    if (!writes) {
      break;
    }
    const auto& p = *r.info;
    for (std::size_t c0 = 0; c0 < p.numel; c0 += export_chunk_elements) {
      const std::size_t c1 = std::min(p.numel, c0 + export_chunk_elements);
      if (rank == 0) {
        chunk.assign(c1 - c0, 0.0f);
      }
      if (!r.trainable) {
        if (rank == 0) {
          visit_float(p.type, [&]<class P>(type_tag<P>) {
            const P* src = reinterpret_cast<const P*>(frozen_host.data()) + p.offset;
            for (std::size_t i = c0; i < c1; ++i) {
              chunk[i - c0] = to_float(src[i]);
            }
          });
        }
      } else if (stage == 0 || world == 1) {
        if (rank == 0) {
          for (std::size_t i = c0; i < c1; ++i) {
            const std::size_t s = stage == 0 ? p.offset + i : layout.owner(p.offset + i).second;
            chunk[i - c0] = values[s];
          }
        }
      } else {
        if constexpr (can_send_recv<comm_type>) {
          const std::size_t id = *layout.find(p.name);
          for (int q = 0; q < world; ++q) {
            const auto piece = layout.intersection(id, q);
            if (!piece) {
              continue;
            }
            const std::size_t lo = std::max(c0, piece->param_offset);
            const std::size_t hi = std::min(c1, piece->param_offset + piece->count);
            if (lo >= hi) {
              continue;
            }
            if (rank == q) {
              std::vector<float> mine(hi - lo);
              for (std::size_t i = lo; i < hi; ++i) {
                const std::size_t s = piece->shard_offset + (i - piece->param_offset);
                mine[i - lo] = values[s];
              }
              if (q == 0) {
                std::copy(mine.begin(), mine.end(), chunk.begin() + static_cast<std::ptrdiff_t>(lo - c0));
              } else {
                access::send(eng, mine.data(), mine.size(), 0);
              }
            } else if (rank == 0) {
              access::recv(eng, chunk.data() + (lo - c0), hi - lo, q);
            }
          }
        } else {
          static_assert(can_send_recv<comm_type>, "zero: export_safetensors at stages 1-3 needs a communicator with "
                                                  "send and recv (each rank sends rank 0 the pieces it owns)");
        }
      }
      if (w) {
        bytes.clear();
        detail::append_as(type, chunk, bytes);
        w->write(bytes);
      }
    }
  }
  err = nullptr;
  try {
    if (w) {
      w->close();
    }
  } catch (...) {
    err = std::current_exception();
  }
  detail::agree(eng, err, cat("export_safetensors(", path.string(), ")"));
}

/// DeepSpeed's `save_16bit_model`: writes the whole model in the parameters' own dtype (bf16 or fp16,
/// fp32 when training in fp32), frozen parameters included, under the registered names, to the
/// safetensors file `dir / filename`; collective, rank 0 writes (creating `dir`). The values are the
/// parameters the framework computes with, made whole first: at stage 3 every module is all-gathered
/// for the save (the whole model on every rank at once), which
/// zero_optimization.stage3_gather_16bit_weights_on_model_save must allow; without it nothing is
/// written and false is returned, as DeepSpeed does. At stages 0-2 the parameters are whole anyway.
/// \returns true when the file was written.
/// \throws usage_error before finalize; io_error when the file cannot be written (on rank 0; the
/// other ranks then fail with an error naming rank 0).
template <class Engine>
bool save_16bit_model(Engine& eng, const std::filesystem::path& dir, const std::string& filename) {
  using access = checkpoint_access<Engine>;
  if (!access::finalized(eng)) {
    throw usage_error("save_16bit_model before finalize()");
  }
  detail::refuse_model_part(eng, "save_16bit_model");
  if (eng.cfg().stage() == 3 && !eng.cfg().zero_optimization.stage3_gather_16bit_weights_on_model_save) {
    return false;
  }
  const auto path = dir / filename;
  const auto registered = access::params(eng);
  auto whole = eng.gather_all(); // stage 3 gathers every module; stages 1-2 finish the step-end all-gathers
  std::exception_ptr err;
  try {
    if (access::comm(eng).rank() == 0 && access::writes(eng)) { // HSDP: the first shard group writes
      std::vector<safetensors::tensor_decl> decls;
      for (const auto& r : registered) {
        decls.push_back({r.info->name, r.info->type, r.info->shape});
      }
      std::filesystem::create_directories(dir);
      detail::check_export_target(path); // a regular file or a new name, as export_safetensors writes
      safetensors::writer w(path, std::move(decls),
                            {{"format", "pt"}, {"zero.global_steps", std::to_string(eng.global_steps())}});
      for (std::size_t i = 0; i < registered.size(); ++i) {
        const tensor_view v = eng.param(param_handle{i});
        const std::size_t es = size_of(v.type);
        for (std::size_t c0 = 0; c0 < v.numel; c0 += export_chunk_elements) {
          const std::size_t n = std::min(export_chunk_elements, v.numel - c0);
          w.write(access::read(eng, static_cast<const std::byte*>(v.data) + c0 * es, n * es));
        }
      }
      w.close();
    }
  } catch (...) {
    err = std::current_exception();
  }
  detail::agree(eng, err, detail::cat("save_16bit_model(", path.string(), ")"));
  return true;
}

/// Initialises every parameter of `eng` from the safetensors file `path` (tensors named as the
/// registered parameters, of their shapes, in fp32, bf16 or fp16), through `init_params`.
/// \throws checkpoint_error naming the file and the tensor that is missing, misshapen or of
/// another dtype; the parameters are unchanged then.
template <class Engine> void init_from_safetensors(Engine& eng, const std::filesystem::path& path) {
  using access = checkpoint_access<Engine>;
  using detail::cat;
  std::optional<safetensors::reader> st;
  std::map<std::string, detail::held_slice, std::less<>> held; // by name: the slice this engine holds
  std::exception_ptr err;
  try {
    st.emplace(path);
    for (const auto& r : access::params(eng)) {
      const auto& p = *r.info;
      const auto* t = st->find(p.name);
      auto h = detail::held_slice_of(eng, r);
      if (t == nullptr) {
        throw checkpoint_error(
            cat(path.string(), ": has no tensor \"", p.name, "\"; the model registered it with shape ", h.text));
      }
      if (t->shape != h.cut.whole) {
        throw checkpoint_error(cat(path.string(), ": tensor \"", p.name, "\" has shape ", detail::shape_text(t->shape),
                                   "; the model registered ", h.text));
      }
      held.emplace(p.name, std::move(h));
      if (t->type != dtype::f32 && t->type != dtype::bf16 && t->type != dtype::f16) {
        throw checkpoint_error(
            cat(path.string(), ": tensor \"", p.name, "\" is ", name_of(t->type), "; expected fp32, bf16 or fp16"));
      }
    }
  } catch (...) {
    err = std::current_exception();
  }
  detail::agree(eng, err, cat("init_from_safetensors(", path.string(), ")"));
  std::vector<std::byte> raw;
  eng.init_params([&](const param_info& p, std::size_t first, std::span<float> out) {
    const auto* t = st->find(p.name);
    const std::size_t es = size_of(t->type);
    const auto& h = held.find(p.name)->second;
    // A tensor slice's elements lie in runs of the whole tensor in the file.
    for (const auto& run : detail::map_runs(h.cut, h.index, first, out.size(), {h.cut.whole, -1, 1})) {
      raw.resize(run.count * es);
      st->read(*t, run.offset * es, raw);
      visit_float(t->type, [&]<class T>(type_tag<T>) {
        for (std::size_t i = 0; i < run.count; ++i) {
          T v;
          std::memcpy(&v, raw.data() + i * es, es);
          out[run.out + i] = to_float(v);
        }
      });
    }
  });
}

} // namespace zero::checkpoint

namespace zero {
/// What `basic_engine::export_safetensors` calls (found by argument-dependent lookup).
template <class Engine> void checkpoint_export_safetensors(Engine& eng, const std::filesystem::path& path, dtype type) {
  checkpoint::export_safetensors(eng, path, type);
}
/// What `basic_engine::save_16bit_model` calls.
template <class Engine>
bool checkpoint_save_16bit_model(Engine& eng, const std::filesystem::path& dir, const std::string& filename) {
  return checkpoint::save_16bit_model(eng, dir, filename);
}
/// What `basic_engine::init_from_safetensors` calls.
template <class Engine> void checkpoint_init_from_safetensors(Engine& eng, const std::filesystem::path& path) {
  checkpoint::init_from_safetensors(eng, path);
}
} // namespace zero
