// Bad input: every way a checkpoint can be missing, corrupt or not fit the model is refused with an
// error naming what was wrong and what was expected, and the engine is left as it was.

#include "ckpt_harness.hpp"

#include <doctest/doctest.h>
#include <fstream>

namespace zt = zero::testing;
namespace fs = std::filesystem;

namespace {

/// A checkpoint of the small model (stage 2, 2 ranks, with a frozen parameter) saved as "good".
fs::path saved(const std::string& name) {
  const auto dir = zt::scratch(name);
  zt::run_spec s{.stage = 2, .world = 2, .steps = 2, .batch = 64};
  zt::with_engine(s, {.frozen = true},
                  [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
                    zt::init_and_train(eng, mh, comm, s, 2);
                    eng.save(dir, "good");
                  });
  return dir;
}

/// Loads `tag` of `dir` into a one-rank engine of the small model (stage 1) and returns the error;
/// checks that the parameters are what they were before the attempt.
std::string load_error(const fs::path& dir, const std::string& tag = "latest", bool frozen = true,
                       const std::function<void(zt::test_engine&)>& extra = {}) {
  std::string msg;
  zt::run_spec s{.stage = 1, .world = 1, .steps = 1, .batch = 64};
  zero::run_ranks(1, [&](zero::thread_communicator& comm) {
    const auto cfg = zt::make_config(s, {});
    zero::cpu_backend backend({.threads = 1});
    zt::test_engine eng(cfg, comm, backend);
    auto mh = zt::register_model(eng);
    if (frozen) {
      static_cast<void>(eng.add_param(mh.modules[0], "frozen.table", {7, 3}, {.trainable = false}));
    }
    if (extra) {
      extra(eng);
    }
    eng.finalize();
    zt::init_all(eng);
    zt::run_result before, after;
    zt::collect_params(eng, mh, comm, before);
    msg = zt::error_of([&] { eng.load(dir, tag); });
    if (!msg.empty()) {
      zt::collect_params(eng, mh, comm, after);
      CHECK(before.params == after.params);
      CHECK(eng.global_steps() == 0);
    }
  });
  return msg;
}

void flip_byte(const fs::path& f, std::uint64_t at) {
  std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  io.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  io.seekp(static_cast<std::streamoff>(at));
  io.write(&c, 1);
}

} // namespace

TEST_CASE("missing directory, missing tag, missing or dangling latest") {
  const auto dir = saved("missing");
  auto e = load_error(dir / "nowhere");
  CHECK(e.find("[zero.checkpoint_error]") == 0);
  CHECK(e.find((dir / "nowhere").string() + ": no such checkpoint directory") != std::string::npos);

  e = load_error(dir, "step-9");
  CHECK(e.find((dir / "step-9").string() + ": no such checkpoint; tags here: good") != std::string::npos);

  { std::ofstream(dir / "latest") << zero::checkpoint::detail::latest_text("gone"); }
  e = load_error(dir);
  CHECK(e.find((dir / "latest").string() + " names tag \"gone\" but " + (dir / "gone").string() +
               " does not exist; tags here: good") != std::string::npos);

  fs::remove(dir / "latest");
  e = load_error(dir);
  CHECK(e.find((dir / "latest").string() +
               ": no such file; expected the tag of the last complete checkpoint (or pass a tag)") !=
        std::string::npos);
  CHECK(load_error(dir, "good").empty());
}

TEST_CASE("a model that does not match the checkpoint is refused, naming the parameter and the shapes") {
  const auto dir = saved("mismatch");
  // A parameter the checkpoint lacks.
  auto e = load_error(dir, "latest", true, [](zt::test_engine& eng) {
    static_cast<void>(eng.add_param(eng.add_module("head"), "head.weight", {4, 4}));
  });
  CHECK(e.find("manifest.json: has no parameter \"head.weight\"; the model registered it with shape [4, 4]") !=
        std::string::npos);
  // A parameter the model lacks.
  e = load_error(dir, "latest", false);
  CHECK(e.find("has parameter \"frozen.table\" (shape [7, 3]) which the model did not register") != std::string::npos);
  // Another shape: a model whose emb is 301 long instead of 300.
  std::string msg;
  zero::run_ranks(1, [&](zero::thread_communicator& comm) {
    const auto cfg = zt::make_config({.world = 1, .batch = 64}, {});
    zero::cpu_backend backend({.threads = 1});
    zt::test_engine eng(cfg, comm, backend);
    const int m = eng.add_module("m");
    static_cast<void>(eng.add_param(m, "fc1.weight", {11, 37}));
    eng.finalize();
    msg = zt::error_of([&] { eng.load(dir); });
  });
  CHECK(msg.find("parameter \"fc1.weight\" has shape [37, 11]; the model registered [11, 37]") != std::string::npos);
}

TEST_CASE("an unknown format version and a damaged manifest are refused") {
  const auto dir = saved("version");
  const auto mpath = dir / "good" / "manifest.json";
  const std::string text = zt::read_text(mpath);
  auto j = nlohmann::json::parse(text);
  j["format_version"] = 7;
  zt::write_manifest(dir / "good", j.dump());
  auto e = load_error(dir);
  CHECK(e.find(mpath.string() + ": format_version: found 7; this build reads format version 1 only") !=
        std::string::npos);
  zt::write_manifest(dir / "good", text.substr(0, text.size() / 2));
  e = load_error(dir);
  CHECK(e.find(mpath.string() + ": not valid JSON") != std::string::npos);
}

TEST_CASE("a checkpoint without the manifest's checksum, or a latest without its own, is refused by name") {
  const auto dir = saved("no-checksum");
  const auto marker = dir / "good" / "manifest.xxh64";
  const std::string latest = zt::read_text(dir / "latest");
  { std::ofstream(dir / "latest", std::ios::trunc) << "good\n"; } // as zero wrote it before the checksum
  auto e = load_error(dir);
  CHECK(e.find((dir / "latest").string() + ": holds \"good\", without the tag's xxh64") != std::string::npos);
  CHECK(load_error(dir, "good").empty());
  { std::ofstream(dir / "latest", std::ios::trunc) << latest; }
  fs::remove(marker);
  e = load_error(dir);
  CHECK(e.find(marker.string() + ": no such file; expected the xxh64 of manifest.json") != std::string::npos);
}

TEST_CASE("a truncated or bit-flipped file is detected, naming the file, before anything changes") {
  const auto dir = saved("corrupt");
  for (const std::string name : {"rank-00000.bin", "rank-00001.bin", "frozen.bin"}) {
    CAPTURE(name);
    const auto f = dir / "good" / name;
    const auto size = fs::file_size(f);
    std::string original;
    {
      std::ifstream in(f, std::ios::binary);
      original.assign(std::istreambuf_iterator<char>(in), {});
    }
    flip_byte(f, size / 2);
    auto e = load_error(dir);
    CHECK(e.find(f.string() + ": xxh64 ") != std::string::npos);
    CHECK(e.find("(the file is corrupt)") != std::string::npos);
    CHECK(zt::error_of([&] { zero::checkpoint::reader(dir).verify(); }).find(f.string()) != std::string::npos);
    flip_byte(f, size / 2);
    fs::resize_file(f, size - 1);
    e = load_error(dir);
    CHECK(e.find(f.string() + ": " + std::to_string(size - 1) + " bytes, expected " + std::to_string(size) +
                 " (truncated)") != std::string::npos);
    { std::ofstream(f, std::ios::binary | std::ios::trunc) << original; }
    CHECK(load_error(dir).empty());
  }
}

TEST_CASE("with several ranks, a rank that cannot read its part fails the load on every rank") {
  const auto dir = saved("agree");
  // Rank 1 of a 2-rank stage-1 load reads only the second half of each segment; damage a byte
  // that only it reads, so that rank 0 by itself would succeed.
  const auto f = dir / "good" / "rank-00001.bin";
  std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
  io.seekp(static_cast<std::streamoff>(fs::file_size(f) - 1));
  io.put('\x7f');
  io.close();
  std::vector<std::string> errors(2);
  zt::run_spec s{.stage = 1, .world = 2, .steps = 2, .batch = 64};
  zt::with_engine(s, {.frozen = true},
                  [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
                    zt::init_all(eng);
                    errors[static_cast<std::size_t>(comm.rank())] = zt::error_of([&] { eng.load(dir); });
                    CHECK(eng.global_steps() == 0);
                    zt::train_range(eng, mh, comm, s, 0, 1); // still usable, no rank left behind
                  });
  for (const auto& e : errors) {
    CHECK(e.find("[zero.checkpoint_error]") == 0);
  }
  CHECK((errors[0].find(f.string()) != std::string::npos || errors[1].find(f.string()) != std::string::npos));
}

TEST_CASE("save refuses a bad tag and a call inside an accumulation") {
  const auto dir = zt::scratch("bad-save");
  zt::run_spec s{.stage = 0, .world = 1, .accumulation = 2, .steps = 1, .batch = 64};
  zt::with_engine(s, {}, [&](zt::test_engine& eng, const zt::model_handles&, zero::thread_communicator&) {
    zt::init_all(eng);
    CHECK(zt::error_of([&] { eng.save(dir, "latest"); }).find("other than \"latest\"") != std::string::npos);
    CHECK(zt::error_of([&] { eng.save(dir, "../x"); }).find("expected a plain name") != std::string::npos);
    eng.save(dir, "ok");
    CHECK(fs::exists(dir / "ok" / "manifest.json"));
  });
}
