// Integrity: every single-bit change of any file of a checkpoint is refused by load and reported by
// verify; piece tables that overlap, are misaligned or leave gaps are refused even under a matching
// checksum; load refuses what save refuses (unsafe tags) and what leads outside the checkpoint
// (symbolic links), and duplicate manifest keys; a failed save leaves no temporary folder; an export
// writes only regular files outside the checkpoint.

#include "../support/file_size_limit.hpp"
#include "ckpt_harness.hpp"
#include "zero/checkpoint/safetensors.hpp"

#include <chrono>
#include <cstdlib>
#include <doctest/doctest.h>
#include <fcntl.h>
#include <fstream>
#include <sys/stat.h>
#include <unistd.h>

namespace zt = zero::testing;
namespace fs = std::filesystem;
using zero_test::file_size_limit;

namespace {

/// A tiny model: one trainable parameter of 12 elements and a frozen one of 2, so that a checkpoint
/// has a 144-byte shard, an 8-byte frozen file and a manifest of about a kilobyte.
zt::model_handles register_tiny(zt::test_engine& eng) {
  zt::model_handles mh;
  mh.modules = {eng.add_module("m")};
  mh.params = {eng.add_param(mh.modules[0], "w", {3, 4}), eng.add_param(mh.modules[0], "f", {2}, {.trainable = false})};
  return mh;
}

/// Runs `body(eng, handles, comm)` on one in-process rank with the tiny model at stage 1, finalized
/// and initialised with `scale` times the harness's pattern.
template <class Body> void with_tiny(float scale, Body&& body) {
  zero::run_ranks(1, [&](zero::thread_communicator& comm) {
    const auto cfg = zt::make_config({.stage = 1, .world = 1, .batch = 64}, {});
    zero::cpu_backend backend({.threads = 1});
    zt::test_engine eng(cfg, comm, backend);
    const auto mh = register_tiny(eng);
    eng.finalize();
    zt::init_all(eng, scale);
    body(eng, mh, comm);
  });
}

/// The tiny model saved as tag "t" of a fresh `name` folder.
fs::path tiny_saved(const std::string& name) {
  const auto dir = zt::scratch(name);
  with_tiny(1.0f,
            [&](zt::test_engine& eng, const zt::model_handles&, zero::thread_communicator&) { eng.save(dir, "t"); });
  return dir;
}

/// Flips bit `bit` of the byte at `at` of the open file `fd`.
void flip_bit(int fd, std::uint64_t at, int bit) {
  unsigned char c = 0;
  REQUIRE(::pread(fd, &c, 1, static_cast<off_t>(at)) == 1);
  c = static_cast<unsigned char>(c ^ (1u << bit));
  REQUIRE(::pwrite(fd, &c, 1, static_cast<off_t>(at)) == 1);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

} // namespace

TEST_CASE("every single-bit flip of latest, the marker, the manifest, the shard and the frozen file is refused by "
          "load and reported by verify") {
  const auto dir = tiny_saved("bitflip");
  const auto tag_dir = dir / "t";
  const auto t0 = std::chrono::steady_clock::now();
  std::size_t flips = 0;
  with_tiny(-3.0f, [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
    zt::run_result before;
    zt::collect_params(eng, mh, comm, before);
    for (const fs::path& f : {dir / "latest", tag_dir / "manifest.xxh64", tag_dir / "manifest.json",
                              tag_dir / "rank-00000.bin", tag_dir / "frozen.bin"}) {
      CAPTURE(f);
      const int fd = ::open(f.c_str(), O_RDWR | O_CLOEXEC);
      REQUIRE(fd >= 0);
      const auto size = fs::file_size(f);
      CHECK(size > 0);
      std::size_t refused_by_load = 0;
      std::size_t reported_by_verify = 0;
      std::size_t naming_the_file = 0;
      for (std::uint64_t at = 0; at < size; ++at) {
        for (int bit = 0; bit < 8; ++bit) {
          flip_bit(fd, at, bit);
          const std::string load = zt::error_of([&] { eng.load(dir); });
          const std::string verify = zt::error_of([&] { zero::checkpoint::reader(dir).verify(); });
          refused_by_load += load.rfind("[zero.checkpoint_error]", 0) == 0 ? 1 : 0;
          reported_by_verify += verify.rfind("[zero.checkpoint_error]", 0) == 0 ? 1 : 0;
          naming_the_file += contains(load, f.string()) && contains(verify, f.string()) ? 1 : 0;
          if (load.empty() || verify.empty() || !contains(load, f.string())) {
            FAIL_CHECK("bit " << bit << " of byte " << at << ": load \"" << load << "\", verify \"" << verify << "\"");
          }
          flip_bit(fd, at, bit);
          ++flips;
        }
      }
      ::close(fd);
      CHECK(refused_by_load == 8 * size);
      CHECK(reported_by_verify == 8 * size);
      CHECK(naming_the_file == 8 * size);
    }
    // Nothing changed through all the refused loads; the restored checkpoint loads.
    zt::run_result after_refusals;
    zt::collect_params(eng, mh, comm, after_refusals);
    CHECK(after_refusals.params == before.params);
    eng.load(dir);
    zt::run_result loaded;
    zt::collect_params(eng, mh, comm, loaded);
    CHECK(loaded.params != before.params);
  });
  with_tiny(1.0f, [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
    zt::run_result saved_state;
    zt::collect_params(eng, mh, comm, saved_state);
    eng.load(dir);
    zt::run_result loaded;
    zt::collect_params(eng, mh, comm, loaded);
    CHECK(loaded.params == saved_state.params);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE(flips << " flips, each loaded and verified, in " << seconds << " s");
  CHECK(flips > 8000);
}

TEST_CASE("the issue's flip of a byte_offset, and piece tables that overlap, are misaligned or leave gaps, are "
          "refused under a matching checksum") {
  const auto dir = tiny_saved("pieces");
  const auto tag_dir = dir / "t";
  const std::string text = zt::read_text(tag_dir / "manifest.json");
  const auto mpath = (tag_dir / "manifest.json").string();
  auto load_error = [&] {
    std::string e;
    with_tiny(-3.0f, [&](zt::test_engine& eng, const zt::model_handles&, zero::thread_communicator&) {
      e = zt::error_of([&] { eng.load(dir); });
      CHECK(eng.global_steps() == 0);
    });
    return e;
  };
  // The edit, as a user makes it: the checksum no longer matches.
  std::string edited = text;
  const auto at = edited.find("\"byte_offset\": 0");
  REQUIRE(at != std::string::npos);
  edited[at + 15] = '1';
  { std::ofstream(tag_dir / "manifest.json", std::ios::binary | std::ios::trunc) << edited; }
  CHECK(contains(load_error(), mpath + ": xxh64 "));
  CHECK(contains(load_error(),
                 " as " + (tag_dir / "manifest.xxh64").string() + " records (the manifest or its marker is corrupt)"));
  // The same edit with the checksum updated reaches the range checks (the one piece fills the file).
  zt::write_manifest(tag_dir, edited);
  CHECK(
      contains(load_error(), mpath + ": files[0].pieces[0].byte_offset: bytes [1, +144) run past the file's size 144"));

  auto j = nlohmann::json::parse(text);
  REQUIRE(j["files"][0]["kind"] == "shard");
  REQUIRE(j["files"][0]["pieces"].size() == 1);
  // Split the shard's one piece of 12 elements in two and move the second one.
  auto split = [&](std::uint64_t second_byte_offset, std::uint64_t size, std::uint64_t first_byte_offset = 0) {
    auto k = j;
    auto& pieces = k["files"][0]["pieces"];
    pieces =
        nlohmann::json::array({{{"param", "w"}, {"offset", 0}, {"count", 6}, {"byte_offset", first_byte_offset}},
                               {{"param", "w"}, {"offset", 6}, {"count", 6}, {"byte_offset", second_byte_offset}}});
    k["files"][0]["size"] = size;
    return k.dump(1);
  };
  zt::write_manifest(tag_dir, split(72, 144));
  CHECK(load_error().empty()); // the same bytes, described as two pieces
  // The edit where the file holds more than one piece: misaligned; moved by a whole element.
  zt::write_manifest(tag_dir, split(72, 144, 1));
  CHECK(contains(load_error(), mpath + ": files[0].pieces[0].byte_offset: found 1, expected a multiple of 4"));
  zt::write_manifest(tag_dir, split(72, 144, 4));
  CHECK(contains(load_error(), mpath + ": files[0].pieces[0].byte_offset: found 4; bytes [0, 4) of the file are in "
                                       "no piece"));
  zt::write_manifest(tag_dir, split(48, 144));
  CHECK(contains(load_error(), mpath + ": files[0].pieces[1].byte_offset: bytes [48, 120) overlap another piece's, "
                                       "which ends at 72"));
  zt::write_manifest(tag_dir, split(0, 144));
  CHECK(contains(load_error(), "overlap another piece's"));
  zt::write_manifest(tag_dir, split(74, 146));
  CHECK(contains(load_error(), mpath + ": files[0].pieces[1].byte_offset: found 74, expected a multiple of 4"));
  zt::write_manifest(tag_dir, split(76, 148));
  CHECK(contains(load_error(), mpath + ": files[0].pieces[1].byte_offset: found 76; bytes [72, 76) of the file are "
                                       "in no piece"));
  auto bigger = j;
  bigger["files"][0]["size"] = 148;
  zt::write_manifest(tag_dir, bigger.dump(1));
  CHECK(contains(load_error(), mpath + ": files[0].size: found 148; its pieces end at 144"));
  zt::write_manifest(tag_dir, text);
  CHECK(load_error().empty());
}

TEST_CASE("a manifest with a key given twice is refused, naming the key") {
  const auto dir = tiny_saved("dup-keys");
  const auto tag_dir = dir / "t";
  const std::string text = zt::read_text(tag_dir / "manifest.json");
  // "global_steps": 0 given again as 7: nlohmann alone keeps the last.
  const auto at = text.find("\"global_steps\": 0");
  REQUIRE(at != std::string::npos);
  zt::write_manifest(tag_dir, text.substr(0, at) + "\"global_steps\": 7,\n " + text.substr(at));
  std::string e;
  std::int64_t steps = -1;
  with_tiny(-3.0f, [&](zt::test_engine& eng, const zt::model_handles&, zero::thread_communicator&) {
    e = zt::error_of([&] { eng.load(dir); });
    steps = eng.global_steps();
  });
  CHECK(steps == 0);
  CHECK(e.rfind("[zero.checkpoint_error]", 0) == 0);
  CHECK(contains(e, (tag_dir / "manifest.json").string() + ": global_steps: duplicate key; give each key once"));
  CHECK(contains(zt::error_of([&] { zero::checkpoint::reader r(dir); }), "global_steps: duplicate key"));
}

TEST_CASE("load refuses the tags save refuses and files that are symbolic links") {
  const auto root = zt::scratch("unsafe-tags");
  const auto dir = root / "ckpt";
  // Real checkpoints beside and outside dir, which "../x" and an absolute tag would reach.
  with_tiny(1.0f, [&](zt::test_engine& eng, const zt::model_handles&, zero::thread_communicator&) {
    eng.save(dir, "t");
    eng.save(root, "x");
  });
  for (const std::string& tag :
       std::vector<std::string>{"../x", (root / "x").string(), "t/../t", ".tmp-t", "latest/", "a/b"}) {
    CAPTURE(tag);
    std::string load, save;
    with_tiny(-3.0f, [&](zt::test_engine& eng, const zt::model_handles&, zero::thread_communicator&) {
      load = zt::error_of([&] { eng.load(dir, tag); });
      save = zt::error_of([&] { eng.save(dir, tag); });
    });
    CHECK(load.rfind("[zero.usage_error] checkpoint tag \"", 0) == 0);
    CHECK(contains(load, "expected a plain name of letters, digits, '-', '_' and '.'"));
    CHECK(load == save); // one check for both
    CHECK(zt::error_of([&] { zero::checkpoint::reader r(dir, tag); }) == load);
  }

  // A shard replaced by a link to an identical copy outside the checkpoint: refused, not followed.
  const auto shard = dir / "t" / "rank-00000.bin";
  fs::copy_file(shard, root / "outside.bin");
  fs::remove(shard);
  fs::create_symlink(root / "outside.bin", shard);
  std::string e;
  with_tiny(-3.0f, [&](zt::test_engine& eng, const zt::model_handles&, zero::thread_communicator&) {
    e = zt::error_of([&] { eng.load(dir); });
  });
  CHECK(e.rfind("[zero.checkpoint_error] " + shard.string() +
                    ": a symbolic link; expected a checkpoint file of 144 bytes as a regular file inside the "
                    "checkpoint (links are not followed)",
                0) == 0);
  CHECK(contains(zt::error_of([&] { zero::checkpoint::reader(dir).verify(); }), shard.string() + ": a symbolic link"));
  fs::remove(shard);
  fs::copy_file(root / "outside.bin", shard);

  // The manifest, its marker and latest are not followed either, nor a tag folder that is a link.
  fs::rename(dir / "latest", root / "latest");
  fs::create_symlink(root / "latest", dir / "latest");
  CHECK(contains(zt::error_of([&] { zero::checkpoint::reader r(dir); }),
                 (dir / "latest").string() + ": a symbolic link"));
  fs::remove(dir / "latest");
  fs::rename(root / "latest", dir / "latest");
  fs::create_directory_symlink(root / "x", dir / "linked");
  CHECK(contains(zt::error_of([&] { zero::checkpoint::reader r(dir, "linked"); }),
                 (dir / "linked").string() + ": a symbolic link; expected a checkpoint directory inside " +
                     dir.string()));
  CHECK(zt::error_of([&] { zero::checkpoint::reader(dir).verify(); }).empty());
}

TEST_CASE("a save that fails to write removes its temporary folder and keeps what was saved") {
  const auto dir = tiny_saved("failed-save");
  const std::string latest = zt::read_text(dir / "latest");
  const auto snapshot = zt::read_snapshot(dir);
  for (const std::string tag : {"u", "t"}) { // a new tag, and the tag saved before
    CAPTURE(tag);
    std::string e;
    with_tiny(-3.0f, [&](zt::test_engine& eng, const zt::model_handles&, zero::thread_communicator&) {
      const file_size_limit limit(100); // the shard is 144 bytes
      e = zt::error_of([&] { eng.save(dir, tag); });
    });
    CHECK(e.rfind("[zero.io_error] " + (dir / (".tmp-" + tag) / "rank-00000.bin").string() + ": write failed: ", 0) ==
          0);
    // The bytes: how far the file got, and the write that stopped there.
    CHECK(e.find("; 100 bytes of the file were written, a write of ") != std::string::npos);
    CHECK(e.find(" stopped at byte 100") != std::string::npos);
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    CHECK(names == std::vector<std::string>{"latest", "t"});
    CHECK(zt::read_text(dir / "latest") == latest);
    CHECK(zt::read_snapshot(dir) == snapshot);
  }
  // A failure while publishing (the marker cannot be written) cleans up too.
  std::string e;
  with_tiny(-3.0f, [&](zt::test_engine& eng, const zt::model_handles&, zero::thread_communicator&) {
    zero::checkpoint::save_options opt;
    opt.observer = [](const zero::checkpoint::save_event& ev) {
      if (ev.what == "manifest_synced") {
        throw zero::io_error("injected: the disk filled up after the manifest");
      }
    };
    e = zt::error_of([&] { zero::checkpoint::save(eng, dir, "v", opt); });
  });
  CHECK(e == "[zero.io_error] injected: the disk filled up after the manifest");
  CHECK(!fs::exists(dir / ".tmp-v"));
  CHECK(!fs::exists(dir / "v"));
  CHECK(zt::read_snapshot(dir) == snapshot);
}

TEST_CASE("export writes a regular file outside the checkpoint and refuses other targets, naming them") {
  const auto root = zt::scratch("export-target");
  const auto dir = root / "ckpt";
  with_tiny(1.0f,
            [&](zt::test_engine& eng, const zt::model_handles&, zero::thread_communicator&) { eng.save(dir, "t"); });
  zero::checkpoint::reader r(dir);
  auto export_error = [&](const fs::path& out) {
    return zt::error_of([&] { zero::checkpoint::export_safetensors(r, out); });
  };
  const std::string expected_target =
      "; expected a regular file or a new name to write the safetensors file to (an export replaces only regular "
      "files)";

  // A FIFO stays a FIFO.
  const auto fifo = root / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  CHECK(export_error(fifo) == "[zero.io_error] " + fifo.string() + ": a FIFO" + expected_target);
  CHECK(fs::is_fifo(fs::symlink_status(fifo)));
  // A link stays a link, and the file it names is untouched.
  { std::ofstream(root / "precious") << "keep"; }
  const auto link = root / "link.safetensors";
  fs::create_symlink(root / "precious", link);
  CHECK(export_error(link) == "[zero.io_error] " + link.string() + ": a symbolic link" + expected_target);
  CHECK(fs::is_symlink(link));
  CHECK(zt::read_text(root / "precious") == "keep");
  // A folder, and a folder or link at the temporary name.
  fs::create_directory(root / "folder");
  CHECK(export_error(root / "folder") ==
        "[zero.io_error] " + (root / "folder").string() + ": a directory" + expected_target);
  fs::create_directory(root / "m.safetensors.tmp");
  CHECK(export_error(root / "m.safetensors") ==
        "[zero.io_error] " + (root / "m.safetensors.tmp").string() + ": a directory" + expected_target);
  CHECK(!fs::exists(root / "m.safetensors"));
  // A character device (checked without writing: the test may run as root).
  struct stat st {};
  if (::lstat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode)) {
    CHECK(zt::error_of([] { zero::checkpoint::detail::check_export_target("/dev/null"); }) ==
          "[zero.io_error] /dev/null: a character device" + expected_target);
  }

  // Inside the checkpoint folder: a shard of the checkpoint being read, and any other name there.
  const auto shard = dir / "t" / "rank-00000.bin";
  const std::string shard_bytes = zt::read_text(shard);
  for (const fs::path& out : {shard, dir / "model.safetensors", root / "ckpt" / "." / "t" / ".." / "x.safetensors"}) {
    CAPTURE(out);
    CHECK(export_error(out) == "[zero.io_error] " + out.string() + ": inside the checkpoint folder " + dir.string() +
                                   "; expected a path outside it (an export must not replace a file of the checkpoint "
                                   "it reads)");
  }
  // ... also through a link to the checkpoint's folder.
  fs::create_directory_symlink(dir, root / "alias");
  CHECK(contains(export_error(root / "alias" / "t" / "rank-00000.bin"), ": inside the checkpoint folder "));
  CHECK(zt::read_text(shard) == shard_bytes);
  CHECK(zt::error_of([&] { r.verify(); }).empty());

  // A regular file is replaced atomically: written beside it, then renamed over it.
  const auto out = root / "model.safetensors";
  { std::ofstream(out) << "old"; }
  CHECK(export_error(out).empty());
  CHECK(fs::is_regular_file(fs::symlink_status(out)));
  CHECK(!fs::exists(root / "model.safetensors.tmp"));
  zero::safetensors::reader st_r(out);
  CHECK(st_r.find("w") != nullptr);
  CHECK(st_r.find("f") != nullptr);
}

// The checkpoints zero-ckpt's command-line tests read (tools/CMakeLists.txt): DIR/good (the small model
// with a frozen parameter, 2 ranks, stage 2, saved as "step-2"), and copies of it with rank 1's shard
// bit-flipped (DIR/flipped) and truncated (DIR/truncated), DIR from ZERO_CKPT_FIXTURE_DIR. Skipped in a
// plain run; ctest's zero-ckpt.fixture runs it alone, so the fixture shares this executable's engine.
TEST_CASE("zero-ckpt fixture: a good, a bit-flipped and a truncated checkpoint" * doctest::skip()) {
  const char* where = std::getenv("ZERO_CKPT_FIXTURE_DIR");
  REQUIRE_MESSAGE(where != nullptr, "ZERO_CKPT_FIXTURE_DIR must name the folder to write the fixture to");
  const fs::path dir = where;
  fs::remove_all(dir);
  const zt::run_spec s{.stage = 2, .world = 2, .steps = 2, .batch = 64};
  zt::with_engine(s, {.frozen = true},
                  [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
                    zt::init_and_train(eng, mh, comm, s, 2);
                    eng.save(dir / "good", "step-2");
                  });
  for (const char* name : {"flipped", "truncated"}) {
    fs::copy(dir / "good", dir / name, fs::copy_options::recursive);
  }
  const auto flipped = dir / "flipped" / "step-2" / "rank-00001.bin";
  {
    std::fstream io(flipped, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(100);
    char c = 0;
    io.read(&c, 1);
    io.seekp(100);
    io.put(static_cast<char>(c ^ 1));
    REQUIRE(io.good());
  }
  const auto truncated = dir / "truncated" / "step-2" / "rank-00001.bin";
  const auto whole = fs::file_size(truncated);
  fs::resize_file(truncated, whole / 2);
  CHECK(fs::file_size(truncated) == whole / 2);
  MESSAGE("wrote " << dir.string() << "/{good,flipped,truncated}");
}
