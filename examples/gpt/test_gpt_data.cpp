// The GPT example's data side: llm.c shards checked whole (every refusal names the file and the numbers),
// the byte-level tokenizer, the 90/10 split, the sampler's independence of the rank count, the evaluation
// windows and the unigram entropy.
#include "gpt_data.hpp"

#include <cmath>
#include <cstdint>
#include <doctest/doctest.h>
#include <filesystem>
#include <fstream>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace {

namespace fs = std::filesystem;

/// A folder of its own under the system's temp folder, removed with everything in it at scope exit.
struct temp_folder {
  fs::path path;
  temp_folder() {
    path = fs::temp_directory_path() / ("zero_gpt_data_test_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  temp_folder(const temp_folder&) = delete;
  temp_folder& operator=(const temp_folder&) = delete;
  ~temp_folder() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

/// Writes raw bytes to a file.
void write_bytes(const fs::path& file, const std::string& bytes) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

/// Appends a little-endian int32 or uint16.
void put_le(std::string& out, std::uint32_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    out += static_cast<char>((v >> (8 * i)) & 0xFF);
  }
}

/// An llm.c shard, byte by byte: a header with the given words, then the given tokens, then extra bytes.
std::string shard_bytes(std::int32_t magic, std::int32_t version, std::int32_t count,
                        const std::vector<std::uint16_t>& tokens, const std::string& extra = "") {
  std::string out;
  put_le(out, static_cast<std::uint32_t>(magic), 4);
  put_le(out, static_cast<std::uint32_t>(version), 4);
  put_le(out, static_cast<std::uint32_t>(count), 4);
  out.append(1024 - 12, '\0');
  for (const auto t : tokens) {
    put_le(out, t, 2);
  }
  return out + extra;
}

/// The message load_llmc_shard throws for \p file (fails the test when it throws none).
std::string shard_error(const fs::path& file, int vocab = 50257) {
  try {
    (void)gpt::load_llmc_shard(file, vocab);
  } catch (const gpt::data_error& e) {
    return e.what();
  }
  FAIL("load_llmc_shard accepted " << file.string());
  return {};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

} // namespace

TEST_CASE("load_llmc_shard: a shard round-trips through write_llmc_shard") {
  temp_folder tmp;
  const fs::path file = tmp.path / "good.bin";
  const std::vector<std::uint16_t> tokens = {0, 1, 50256, 300, 65535, 7};
  gpt::write_llmc_shard(file, tokens);
  CHECK(fs::file_size(file) == 1024 + 2 * tokens.size());
  const gpt::token_data data = gpt::load_llmc_shard(file, 65536);
  CHECK(data.tokens == tokens);
  CHECK(data.source == file.string());
  // The bytes on disk are little-endian, header first, as llm.c writes them.
  CHECK(shard_bytes(20240520, 1, 6, tokens) == [&] {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }());
  // An empty shard is a valid file (the sampler refuses it later).
  gpt::write_llmc_shard(file, {});
  CHECK(gpt::load_llmc_shard(file, 256).tokens.empty());
}

TEST_CASE("load_llmc_shard: every refusal names the file, what was found and what was expected") {
  temp_folder tmp;
  const std::vector<std::uint16_t> tokens = {1, 2, 3, 4};

  SUBCASE("a file shorter than the header") {
    const fs::path file = tmp.path / "short.bin";
    write_bytes(file, std::string(100, '\0'));
    const std::string msg = shard_error(file);
    CHECK(contains(msg, "[gpt.data_error] " + file.string() + ": "));
    CHECK(contains(msg, "the file is 100 bytes, shorter than the 1024-byte header"));
  }
  SUBCASE("a wrong magic") {
    const fs::path file = tmp.path / "magic.bin";
    write_bytes(file, shard_bytes(20240521, 1, 4, tokens));
    const std::string msg = shard_error(file);
    CHECK(contains(msg, file.string()));
    CHECK(contains(msg, "magic number 20240521 in header[0]; expected 20240520"));
  }
  SUBCASE("a wrong version") {
    const fs::path file = tmp.path / "version.bin";
    write_bytes(file, shard_bytes(20240520, 2, 4, tokens));
    const std::string msg = shard_error(file);
    CHECK(contains(msg, file.string()));
    CHECK(contains(msg, "version 2 in header[1]; expected 1"));
  }
  SUBCASE("a count the file cannot hold") {
    const fs::path file = tmp.path / "count.bin";
    write_bytes(file, shard_bytes(20240520, 1, 10, tokens));
    const std::string msg = shard_error(file);
    CHECK(contains(msg, file.string()));
    CHECK(contains(msg, "header[2] says 10 tokens, which need 1044 bytes (1024 + 2*10); the file has 1032 bytes"));
  }
  SUBCASE("a negative count") {
    const fs::path file = tmp.path / "negative.bin";
    write_bytes(file, shard_bytes(20240520, 1, -3, tokens));
    const std::string msg = shard_error(file);
    CHECK(contains(msg, file.string()));
    CHECK(contains(msg, "token count -3 in header[2] is negative"));
  }
  SUBCASE("trailing bytes beyond the count") {
    const fs::path file = tmp.path / "trailing.bin";
    write_bytes(file, shard_bytes(20240520, 1, 4, tokens, "xyz"));
    const std::string msg = shard_error(file);
    CHECK(contains(msg, file.string()));
    CHECK(contains(msg, "3 trailing bytes beyond the 4 tokens of header[2]; expected 1032 bytes (1024 + 2*4), the "
                        "file has 1035"));
  }
  SUBCASE("a token id outside the vocab") {
    const fs::path file = tmp.path / "vocab.bin";
    write_bytes(file, shard_bytes(20240520, 1, 4, {5, 256, 50257, 9}));
    const std::string msg = shard_error(file, 50257);
    CHECK(contains(msg, file.string()));
    CHECK(contains(msg, "token 2 is id 50257, outside the model's vocab of 50257 (ids 0 to 50256)"));
    const std::string bytes_msg = shard_error(file, 256);
    CHECK(contains(bytes_msg, "token 1 is id 256, outside the model's vocab of 256"));
  }
  SUBCASE("a vocab a uint16 shard cannot serve") {
    const fs::path file = tmp.path / "any.bin";
    gpt::write_llmc_shard(file, tokens);
    CHECK(contains(shard_error(file, 0), "vocab 0 cannot be read from a uint16 shard; expected 1 to 65536"));
    CHECK(contains(shard_error(file, 65537), "vocab 65537"));
  }
  SUBCASE("a missing file") {
    const fs::path file = tmp.path / "missing.bin";
    CHECK(contains(shard_error(file), file.string() + ": no such file; expected an llm.c token shard"));
  }
  SUBCASE("a directory") {
    const fs::path dir = tmp.path / "folder.bin";
    fs::create_directory(dir);
    CHECK(contains(shard_error(dir), dir.string() + ": it is a directory; expected an llm.c token shard"));
  }
  SUBCASE("a FIFO is refused without blocking") {
    const fs::path fifo = tmp.path / "pipe.bin";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    CHECK(contains(shard_error(fifo), fifo.string() + ": it is a FIFO (named pipe); expected an llm.c token shard"));
    CHECK_THROWS_WITH_AS(gpt::load_text_bytes(fifo), doctest::Contains("it is a FIFO (named pipe)"), gpt::data_error);
  }
  SUBCASE("a path with a NUL byte") {
    const fs::path file(tmp.path.string() + std::string("/a\0b.bin", 8));
    const std::string msg = shard_error(file);
    CHECK(contains(msg, tmp.path.string() + "/a\\0b.bin: the path has a NUL byte at position " +
                            std::to_string(tmp.path.string().size() + 2)));
  }
}

TEST_CASE("load_text_bytes: one token per byte; an empty file is refused") {
  temp_folder tmp;
  const fs::path file = tmp.path / "text.txt";
  write_bytes(file, std::string("Hi\n\xff\x00!", 6));
  const gpt::token_data data = gpt::load_text_bytes(file);
  CHECK(data.tokens == std::vector<std::uint16_t>{'H', 'i', '\n', 255, 0, '!'});
  CHECK(data.source == file.string());

  const fs::path empty = tmp.path / "empty.txt";
  write_bytes(empty, "");
  const std::string empty_msg = empty.string() + ": the file is empty; expected text, one token per byte";
  CHECK_THROWS_WITH_AS(gpt::load_text_bytes(empty), doctest::Contains(empty_msg.c_str()), gpt::data_error);
  const std::string dir_msg = tmp.path.string() + ": it is a directory; expected a text file";
  CHECK_THROWS_WITH_AS(gpt::load_text_bytes(tmp.path), doctest::Contains(dir_msg.c_str()), gpt::data_error);
}

TEST_CASE("split_train_val: the validation part is the last 10%") {
  gpt::token_data data{{}, "corpus"};
  for (std::uint16_t i = 0; i < 1005; ++i) {
    data.tokens.push_back(i);
  }
  const auto [train, val] = gpt::split_train_val(data);
  REQUIRE(train.tokens.size() == 905);
  REQUIRE(val.tokens.size() == 100);
  CHECK(train.tokens.front() == 0);
  CHECK(train.tokens.back() == 904);
  CHECK(val.tokens.front() == 905);
  CHECK(val.tokens.back() == 1004);
  CHECK(train.source == "corpus [train]");
  CHECK(val.source == "corpus [val]");

  const auto [train20, val20] = gpt::split_train_val(data, 0.2);
  CHECK(train20.tokens.size() == 804);
  CHECK(val20.tokens.size() == 201);

  CHECK_THROWS_WITH_AS(gpt::split_train_val(data, 0.0), doctest::Contains("corpus: validation fraction"),
                       gpt::data_error);
  CHECK_THROWS_AS(gpt::split_train_val(data, 1.0), gpt::data_error);
  CHECK_THROWS_AS(gpt::split_train_val(data, std::nan("")), gpt::data_error);
  const gpt::token_data tiny{{1, 2, 3}, "tiny"};
  CHECK_THROWS_WITH_AS(gpt::split_train_val(tiny), doctest::Contains("tiny: 3 tokens cannot be split"),
                       gpt::data_error);
}

TEST_CASE("batch_sampler: the global batch does not depend on the rank count") {
  gpt::token_data data{{}, "corpus"};
  for (int i = 0; i < 5000; ++i) {
    data.tokens.push_back(static_cast<std::uint16_t>((i * 7919) % 50257));
  }
  constexpr int T = 16;
  constexpr int global_b = 6;
  constexpr std::uint64_t seed = 1234;
  constexpr int steps = 3;

  // The global batch of each step, concatenated in rank order, for a given rank count.
  const auto global_batches = [&](int ranks) {
    std::vector<std::int32_t> inputs;
    std::vector<std::int32_t> targets;
    const int B = global_b / ranks;
    std::vector<gpt::batch_sampler> samplers;
    for (int r = 0; r < ranks; ++r) {
      samplers.emplace_back(data, B, T, r, ranks, seed);
    }
    for (int s = 0; s < steps; ++s) {
      for (auto& sampler : samplers) {
        std::vector<std::int32_t> x(static_cast<std::size_t>(B * T));
        std::vector<std::int32_t> y(static_cast<std::size_t>(B * T));
        sampler.next(x.data(), y.data());
        inputs.insert(inputs.end(), x.begin(), x.end());
        targets.insert(targets.end(), y.begin(), y.end());
      }
    }
    return std::pair{inputs, targets};
  };
  const auto one = global_batches(1);
  CHECK(global_batches(2) == one);
  CHECK(global_batches(3) == one);

  // Targets are the inputs shifted by one token, read from the data at the sequence's start.
  const auto& [inputs, targets] = one;
  for (int g = 0; g < global_b; ++g) {
    const std::size_t start = gpt::sequence_start(seed, 0, static_cast<std::uint64_t>(g), data.tokens.size(), T);
    for (int t = 0; t < T; ++t) {
      const auto i = static_cast<std::size_t>(g * T + t);
      CHECK(inputs[i] == data.tokens[start + static_cast<std::size_t>(t)]);
      CHECK(targets[i] == data.tokens[start + static_cast<std::size_t>(t) + 1]);
    }
  }
  // Steps differ, and another seed gives another batch.
  const auto step_size = static_cast<std::size_t>(global_b * T);
  CHECK(!std::equal(inputs.begin(), inputs.begin() + step_size, inputs.begin() + step_size));
  gpt::batch_sampler other(data, global_b, T, 0, 1, seed + 1);
  std::vector<std::int32_t> x(step_size);
  std::vector<std::int32_t> y(step_size);
  other.next(x.data(), y.data());
  CHECK(!std::equal(x.begin(), x.end(), inputs.begin()));
  // seek() replays a step.
  other.seek(0);
  CHECK(other.step() == 0);
  std::vector<std::int32_t> x2(step_size);
  other.next(x2.data(), y.data());
  CHECK(x2 == x);
  CHECK(other.step() == 1);
}

TEST_CASE("batch_sampler: every start is a window that fits, including the last") {
  const gpt::token_data data{{0, 1, 2, 3, 4}, "five"};
  // 5 tokens, T 4: one window, at 0.
  gpt::batch_sampler sampler(data, 1, 4, 0, 1, 7);
  std::vector<std::int32_t> x(4);
  std::vector<std::int32_t> y(4);
  for (int s = 0; s < 5; ++s) {
    sampler.next(x.data(), y.data());
    CHECK(x == std::vector<std::int32_t>{0, 1, 2, 3});
    CHECK(y == std::vector<std::int32_t>{1, 2, 3, 4});
  }
  // T 1 over 5 tokens: starts 0..3, all reached over enough draws.
  std::vector<bool> seen(4, false);
  for (std::uint64_t s = 0; s < 200; ++s) {
    const std::size_t start = gpt::sequence_start(3, s, 0, 5, 1);
    REQUIRE(start < 4);
    seen[start] = true;
  }
  CHECK(seen == std::vector<bool>{true, true, true, true});
}

TEST_CASE("batch_sampler: too little data, or bad shapes, are refused with the numbers") {
  const gpt::token_data data{std::vector<std::uint16_t>(100, 1), "val.bin"};
  CHECK_THROWS_WITH_AS(gpt::batch_sampler(data, 1, 100, 0, 1, 0),
                       doctest::Contains("val.bin: 100 tokens, fewer than one sequence of T + 1 = 101 tokens needs"),
                       gpt::data_error);
  CHECK_THROWS_WITH_AS(
      gpt::batch_sampler(data, 2, 16, 1, 4, 0),
      doctest::Contains("val.bin: 100 tokens, fewer than one global batch needs: 136 (ranks 4 x B 2 x (T + 1) 17)"),
      gpt::data_error);
  CHECK_THROWS_WITH_AS(gpt::batch_sampler(data, 1, 8, 2, 2, 0),
                       doctest::Contains("val.bin: batch_sampler with B 1, T 8, rank 2 of 2"), gpt::data_error);
  CHECK_THROWS_AS(gpt::batch_sampler(data, 0, 8, 0, 1, 0), gpt::data_error);
  CHECK_THROWS_AS(gpt::batch_sampler(data, 1, 0, 0, 1, 0), gpt::data_error);
  CHECK_NOTHROW(gpt::batch_sampler(data, 2, 16, 0, 2, 0)); // 2 x 2 x 17 = 68 <= 100
}

TEST_CASE("eval_windows: windows of T + 1 tokens at 0, T, 2T, ... that fit") {
  using windows = std::vector<std::pair<std::size_t, std::size_t>>;
  CHECK(gpt::eval_windows(0, 4).empty());
  CHECK(gpt::eval_windows(4, 4).empty());
  CHECK(gpt::eval_windows(5, 4) == windows{{0, 5}});
  CHECK(gpt::eval_windows(8, 4) == windows{{0, 5}});
  CHECK(gpt::eval_windows(9, 4) == windows{{0, 5}, {4, 9}});
  CHECK(gpt::eval_windows(12, 4) == windows{{0, 5}, {4, 9}});
  CHECK(gpt::eval_windows(13, 4) == windows{{0, 5}, {4, 9}, {8, 13}});
  CHECK(gpt::eval_windows(3, 1) == windows{{0, 2}, {1, 3}});
  // 9839 tokens (the last 10% of fortunes-min's three files, 98399 bytes together) at T 64: floor(9838 / 64) = 153.
  const auto w = gpt::eval_windows(9839, 64);
  CHECK(w.size() == 153);
  CHECK(w.back() == std::pair<std::size_t, std::size_t>{152 * 64, 152 * 64 + 65});
  CHECK_THROWS_WITH_AS(gpt::eval_windows(10, 0), doctest::Contains("T 0; expected T >= 1"), gpt::data_error);
}

TEST_CASE("byte_unigram_entropy_nats: the entropy of known distributions") {
  // Uniform over 4 ids: ln 4.
  CHECK(gpt::byte_unigram_entropy_nats({{0, 1, 2, 3, 3, 2, 1, 0}, "u4"}) == doctest::Approx(std::log(4.0)));
  // One id: 0.
  CHECK(gpt::byte_unigram_entropy_nats({{'a', 'a', 'a'}, "a"}) == 0.0);
  // p = (1/2, 1/4, 1/4): 1.5 ln 2.
  CHECK(gpt::byte_unigram_entropy_nats({{7, 7, 9, 300}, "h"}) == doctest::Approx(1.5 * std::log(2.0)));
  // Uniform over all 256 bytes: ln 256.
  gpt::token_data bytes{{}, "bytes"};
  for (int i = 0; i < 512; ++i) {
    bytes.tokens.push_back(static_cast<std::uint16_t>(i % 256));
  }
  CHECK(gpt::byte_unigram_entropy_nats(bytes) == doctest::Approx(std::log(256.0)));
  CHECK_THROWS_WITH_AS(gpt::byte_unigram_entropy_nats({{}, "none"}), doctest::Contains("none: no tokens"),
                       gpt::data_error);
}
