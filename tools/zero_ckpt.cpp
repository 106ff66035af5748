// zero-ckpt: looks at zero checkpoints without a model or a communicator.
//
//   zero-ckpt show DIR [--tag T]                         the manifest in brief: run, counters, params, files
//   zero-ckpt verify DIR [--tag T]                       latest, manifest and files against their xxh64
//   zero-ckpt export DIR --out FILE [--dtype bf16|fp32]  consolidated weights as one safetensors file
//                                                        (a regular file outside DIR, replaced atomically)
//
// DIR is one engine's checkpoint folder, or the root of a model-parallel job's (its pipe-PP-tensor-TT
// folders): show and verify then go through every stage's slices, and export joins the tensor slices
// into whole tensors.
//
// Exit status: 0 when all is well, 1 when the checkpoint is missing, damaged or cannot be written
// out (the message names the file and what was expected), 2 for a command-line error.

#include "zero/checkpoint/checkpoint.hpp"
#include "zero/checkpoint/safetensors.hpp"

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>

namespace {

std::string bytes_text(std::uint64_t b) {
  char buf[64];
  if (b >= (std::uint64_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%llu B (%.2f MiB)", static_cast<unsigned long long>(b),
                  static_cast<double>(b) / (1 << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  }
  return buf;
}

void show(const zero::checkpoint::reader& r) {
  const auto& m = r.info();
  std::uint64_t total = 0;
  std::uint64_t trainable = 0;
  std::uint64_t frozen = 0;
  for (const auto& f : m.files) {
    total += f.size;
  }
  for (const auto& p : m.params) {
    (p.trainable ? trainable : frozen) += p.numel;
  }
  std::cout << "checkpoint " << r.path().string() << "\n"
            << "  tag                 " << m.tag << "\n"
            << "  format version      " << m.version << "\n"
            << "  saved by            world size " << m.world_size << ", stage " << m.stage;
  if (m.model) {
    std::cout << ", pipe " << m.model->pipe << ", tensor slice " << m.model->tensor << " of " << m.model->tensor_size;
  }
  std::cout << "\n"
            << "  dtypes              params " << zero::name_of(m.param_dtype) << ", grads "
            << zero::name_of(m.grad_dtype) << ", optimizer state fp32 (" << m.optimizer.type << ": master" <<
      [&] {
        std::string names;
        for (const auto& t : m.optimizer.state) {
          names += ", " + t;
        }
        return names;
      }() << ")\n"
            << "  steps               " << m.global_steps << " optimizer steps, " << m.micro_steps << " micro-steps, "
            << m.boundaries << " boundaries\n"
            << "  loss scaler         " << (m.scaler_dynamic ? "dynamic" : "static") << ", scale " << m.scaler.cur_scale
            << ", iteration " << m.scaler.cur_iter << "\n"
            << "  lr scheduler        last_batch_iteration " << m.lr_last_batch_iteration << "\n"
            << "  config xxh64        " << zero::checkpoint::hex64(m.config_xxh64) << "\n"
            << "  parameters          " << m.params.size() << " (" << trainable << " trainable elements, " << frozen
            << " frozen)\n"
            << "  files               " << m.files.size() << ", " << bytes_text(total) << "\n\n";
  std::printf("  %-32s %-18s %-6s %-9s %s\n", "parameter", "shape", "dtype", "trainable", "module");
  for (const auto& p : m.params) {
    std::printf("  %-32s %-18s %-6s %-9s %s\n", p.name.c_str(), zero::checkpoint::detail::shape_text(p.shape).c_str(),
                std::string(zero::name_of(p.type)).c_str(), p.trainable ? "yes" : "no", p.module.c_str());
  }
  std::printf("\n  %-18s %-7s %-5s %8s %22s  %s\n", "file", "kind", "rank", "pieces", "size", "xxh64");
  for (const auto& f : m.files) {
    std::printf("  %-18s %-7s %-5d %8zu %22s  %s\n", f.name.c_str(), f.kind.c_str(), f.rank, f.pieces.size(),
                bytes_text(f.size).c_str(), zero::checkpoint::hex64(f.xxh64).c_str());
  }
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"zero-ckpt: show, verify and export zero checkpoints"};
  app.require_subcommand(1);
  std::string dir;
  std::string tag = "latest";
  std::string out;
  std::string dtype = "fp32";
  auto* show_cmd = app.add_subcommand("show", "print the manifest in brief: the run, counters, parameters, files");
  auto* verify_cmd =
      app.add_subcommand("verify", "check latest, the manifest and every file of the checkpoint against their xxh64");
  auto* export_cmd = app.add_subcommand("export", "write the consolidated parameters as one safetensors file");
  for (auto* c : {show_cmd, verify_cmd, export_cmd}) {
    c->add_option("dir", dir, "checkpoint directory (holding tags and latest)")->required();
    c->add_option("--tag", tag, "the checkpoint to read (default: the one DIR/latest names)");
  }
  export_cmd->add_option("--out", out, "the safetensors file to write")->required();
  export_cmd->add_option("--dtype", dtype, "dtype of the exported tensors")->check(CLI::IsMember({"fp32", "bf16"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    // One engine's checkpoint, or a model-parallel job's root: one checkpoint per stage and tensor slice.
    zero::checkpoint::model_reader mr(dir, tag);
    if (show_cmd->parsed()) {
      for (const auto* r : mr.parts()) {
        show(*r);
      }
    } else if (verify_cmd->parsed()) {
      std::size_t files = 0;
      for (auto* r : mr.parts()) {
        const auto& m = r->info();
        // The reader checked the manifest against its marker (and latest against its checksum) on opening.
        std::cout << "ok   " << (r->path() / zero::checkpoint::manifest_name).string() << "  xxh64 as "
                  << zero::checkpoint::checksum_name << " records\n";
        for (std::size_t f = 0; f < m.files.size(); ++f) {
          r->verify_file(f);
          std::cout << "ok   " << (r->path() / m.files[f].name).string() << "  " << bytes_text(m.files[f].size)
                    << "  xxh64 " << zero::checkpoint::hex64(m.files[f].xxh64) << "\n";
        }
        files += m.files.size();
      }
      std::cout << "verified " << files << " files of checkpoint \"" << mr.info().tag << "\"\n";
    } else {
      zero::checkpoint::export_safetensors(mr, out, zero::parse_dtype(dtype));
      std::cout << "wrote " << out << ": " << mr.info().params.size() << " tensors in " << dtype
                << " from checkpoint \"" << mr.info().tag << "\"\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "zero-ckpt: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
