#pragma once
/// \file gpt_data.hpp
/// The data side of the GPT-2 example, independent of zero's engine: token files (llm.c's shard format and
/// raw bytes), the train/validation split, the per-rank batch sampler, the evaluation windows and the
/// unigram entropy a trained model's validation loss must beat.
///
/// Every file is checked whole before training starts: a wrong header, a count the file cannot hold, bytes
/// beyond the count and a token id outside the model's vocabulary are refused with a `gpt::data_error` that
/// names the file, what was found and what was expected. An out-of-range id therefore never reaches the
/// embedding.

#include "gpt_random.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <utility>
#include <vector>

namespace gpt {

/// An error in the data: a file that cannot be read or is not what it should be, or data too small for
/// the batch asked of it. `what()` starts with `[gpt.data_error]` and names the file (or the data's
/// source), what is wrong and what was expected.
class data_error : public std::runtime_error {
public:
  /// \param message the sentence after the `[gpt.data_error] ` prefix.
  explicit data_error(const std::string& message) : std::runtime_error("[gpt.data_error] " + message) {}
};

/// A sequence of token ids and where it came from.
///
/// Tokens are `std::uint16_t`, as llm.c's version-1 shards store them: any vocabulary of at most 65536
/// ids fits (GPT-2's 50257, or 256 for the byte-level tokenizer). Widen to `std::int32_t` at the model's
/// input (`batch_sampler::next` does).
struct token_data {
  /// The token ids, in file order.
  std::vector<std::uint16_t> tokens;
  /// Where the tokens came from (a file path, with " [train]" or " [val]" after a split); errors name it.
  std::string source;
};

/// The magic number of llm.c's token shards (`header[0]`).
inline constexpr std::int32_t llmc_shard_magic = 20240520;
/// The shard version this reader accepts (`header[1]`): 1, GPT-2 tokens as uint16. (Version 2, Llama 3's
/// uint32 tokens, is refused.)
inline constexpr std::int32_t llmc_shard_version = 1;
/// The header's length in int32 words.
inline constexpr std::size_t llmc_header_words = 256;
/// The header's length in bytes (256 int32).
inline constexpr std::size_t llmc_header_bytes = llmc_header_words * sizeof(std::int32_t);

namespace detail {

/// A path as text for a message: NUL bytes written as `\0` so the message stays one readable string.
inline std::string path_text(const std::filesystem::path& file) {
  std::string text;
  for (char c : file.native()) {
    if (c == '\0') {
      text += "\\0";
    } else {
      text += c;
    }
  }
  return text;
}

/// Owns a file descriptor; closes it on scope exit.
class file_descriptor {
public:
  explicit file_descriptor(int fd) noexcept : fd_(fd) {}
  file_descriptor(file_descriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  file_descriptor(const file_descriptor&) = delete;
  file_descriptor& operator=(const file_descriptor&) = delete;
  ~file_descriptor() {
    if (fd_ >= 0) {
      ::close(fd_);
    }
  }
  int get() const noexcept { return fd_; }

private:
  int fd_;
};

/// What a file's type is, for a message refusing it.
inline const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) {
    return "a directory";
  }
  if (S_ISFIFO(mode)) {
    return "a FIFO (named pipe)";
  }
  if (S_ISCHR(mode)) {
    return "a character device";
  }
  if (S_ISBLK(mode)) {
    return "a block device";
  }
  if (S_ISSOCK(mode)) {
    return "a socket";
  }
  return "not a regular file";
}

/// Opens `file` for reading and checks that it is a regular file. The open is non-blocking, so a FIFO
/// is refused at once instead of waiting for a writer. \p expected names what the file should be.
/// \returns the open descriptor and the file's size in bytes.
/// \throws data_error for a path with a NUL byte, a file that does not exist or cannot be opened, and
/// anything but a regular file.
inline std::pair<file_descriptor, std::uint64_t> open_regular(const std::filesystem::path& file, const char* expected) {
  const std::string name = path_text(file);
  if (const auto nul = file.native().find('\0'); nul != std::string::npos) {
    throw data_error(name + ": the path has a NUL byte at position " + std::to_string(nul) + "; expected " + expected +
                     " at a path without one");
  }
  file_descriptor fd(::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) {
    const int err = errno;
    if (err == ENOENT) {
      throw data_error(name + ": no such file; expected " + expected);
    }
    throw data_error(name + ": cannot open it (" + std::strerror(err) + "); expected " + expected);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw data_error(name + ": cannot stat it (" + std::strerror(errno) + ")");
  }
  if (!S_ISREG(st.st_mode)) {
    throw data_error(name + ": it is " + file_kind(st.st_mode) + "; expected " + expected + " (a regular file)");
  }
  return {std::move(fd), static_cast<std::uint64_t>(st.st_size)};
}

/// Reads exactly \p bytes at offset \p offset into \p out, retrying short reads and EINTR.
/// \throws data_error naming the file when it ends early (it shrank while read) or a read fails.
inline void read_exact(int fd, const std::string& name, void* out, std::size_t bytes, std::uint64_t offset) {
  auto* p = static_cast<char*>(out);
  std::size_t done = 0;
  while (done < bytes) {
    const ::ssize_t got = ::pread(fd, p + done, bytes - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) {
        continue;
      }
      throw data_error(name + ": read failed at byte " + std::to_string(offset + done) + " (" + std::strerror(errno) +
                       ")");
    }
    if (got == 0) {
      throw data_error(name + ": the file ended at byte " + std::to_string(offset + done) + "; expected " +
                       std::to_string(offset + bytes) + " bytes (did it change while being read?)");
    }
    done += static_cast<std::size_t>(got);
  }
}

/// Swaps the bytes of a 16- or 32-bit unsigned integer (std::byteswap is C++23).
template <class U> constexpr U byteswap(U v) noexcept {
  U r = 0;
  for (std::size_t i = 0; i < sizeof(U); ++i) {
    r = static_cast<U>((r << 8) | ((v >> (8 * i)) & 0xFF));
  }
  return r;
}

/// Converts between little-endian file order and the host's order (the same operation both ways).
template <class U> constexpr U little_endian(U v) noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    return v;
  } else {
    return byteswap(v);
  }
}

} // namespace detail

/// Reads an llm.c token shard, checked whole.
///
/// The format: a header of 256 little-endian int32 — `header[0]` the magic 20240520, `header[1]` the
/// version 1, `header[2]` the token count — then exactly `count` little-endian uint16 tokens, so the file
/// is 1024 + 2·count bytes.
/// \param file the shard; a regular file (a directory, FIFO or device is refused without blocking).
/// \param vocab the model's vocabulary size, 1 to 65536: every token id must be below it.
/// \returns the tokens, with `source` the file's path.
/// \throws data_error naming the file for: a path with a NUL byte; a missing or unreadable file; anything
/// but a regular file; a file shorter than the header; a wrong magic or version (the value found and the one
/// expected); a negative count; a count the file cannot hold (the bytes needed and the bytes there); bytes
/// beyond the count (how many); a token id >= vocab (its position, the id and the vocab); a vocab outside
/// 1..65536.
inline token_data load_llmc_shard(const std::filesystem::path& file, int vocab) {
  const std::string name = detail::path_text(file);
  if (vocab < 1 || vocab > 65536) {
    throw data_error(name + ": vocab " + std::to_string(vocab) +
                     " cannot be read from a uint16 shard; expected 1 to 65536");
  }
  auto [fd, size] = detail::open_regular(file, "an llm.c token shard");
  if (size < llmc_header_bytes) {
    throw data_error(name + ": the file is " + std::to_string(size) + " bytes, shorter than the " +
                     std::to_string(llmc_header_bytes) + "-byte header of an llm.c token shard (256 int32)");
  }
  std::array<std::uint32_t, llmc_header_words> header{};
  detail::read_exact(fd.get(), name, header.data(), llmc_header_bytes, 0);
  const auto word = [&](std::size_t i) { return static_cast<std::int32_t>(detail::little_endian(header[i])); };
  if (word(0) != llmc_shard_magic) {
    throw data_error(name + ": magic number " + std::to_string(word(0)) + " in header[0]; expected " +
                     std::to_string(llmc_shard_magic) + " (an llm.c token shard)");
  }
  if (word(1) != llmc_shard_version) {
    throw data_error(name + ": version " + std::to_string(word(1)) + " in header[1]; expected " +
                     std::to_string(llmc_shard_version) + " (uint16 GPT-2 tokens)");
  }
  const std::int32_t count = word(2);
  if (count < 0) {
    throw data_error(name + ": token count " + std::to_string(count) + " in header[2] is negative; expected >= 0");
  }
  const std::uint64_t needed = llmc_header_bytes + 2 * static_cast<std::uint64_t>(count);
  if (size < needed) {
    throw data_error(name + ": header[2] says " + std::to_string(count) + " tokens, which need " +
                     std::to_string(needed) + " bytes (1024 + 2*" + std::to_string(count) + "); the file has " +
                     std::to_string(size) + " bytes");
  }
  if (size > needed) {
    throw data_error(name + ": " + std::to_string(size - needed) + " trailing bytes beyond the " +
                     std::to_string(count) + " tokens of header[2]; expected " + std::to_string(needed) +
                     " bytes (1024 + 2*" + std::to_string(count) + "), the file has " + std::to_string(size));
  }
  token_data data{std::vector<std::uint16_t>(static_cast<std::size_t>(count)), name};
  detail::read_exact(fd.get(), name, data.tokens.data(), data.tokens.size() * sizeof(std::uint16_t), llmc_header_bytes);
  for (std::size_t i = 0; i < data.tokens.size(); ++i) {
    data.tokens[i] = detail::little_endian(data.tokens[i]);
    if (data.tokens[i] >= vocab) {
      throw data_error(name + ": token " + std::to_string(i) + " is id " + std::to_string(data.tokens[i]) +
                       ", outside the model's vocab of " + std::to_string(vocab) + " (ids 0 to " +
                       std::to_string(vocab - 1) + ")");
    }
  }
  return data;
}

/// Reads a file as bytes, one token per byte (a byte-level tokenizer, vocab 256).
/// \param file a regular, non-empty file.
/// \returns the bytes as token ids 0..255, with `source` the file's path.
/// \throws data_error naming the file for a path with a NUL byte, a missing or unreadable file, anything but
/// a regular file, and an empty file.
inline token_data load_text_bytes(const std::filesystem::path& file) {
  const std::string name = detail::path_text(file);
  auto [fd, size] = detail::open_regular(file, "a text file");
  if (size == 0) {
    throw data_error(name + ": the file is empty; expected text, one token per byte");
  }
  std::vector<unsigned char> bytes(static_cast<std::size_t>(size));
  detail::read_exact(fd.get(), name, bytes.data(), bytes.size(), 0);
  return token_data{std::vector<std::uint16_t>(bytes.begin(), bytes.end()), name};
}

/// Splits tokens into a training part and a validation part: the validation part is the LAST
/// floor(n · val_fraction) tokens, the training part the ones before (90/10 by default).
/// \param data the tokens; `source` gains " [train]" and " [val]".
/// \param val_fraction the validation share, strictly between 0 and 1.
/// \returns {train, val}.
/// \throws data_error naming the source when val_fraction is outside (0, 1) or either part would be empty.
inline std::pair<token_data, token_data> split_train_val(const token_data& data, double val_fraction = 0.1) {
  if (!(val_fraction > 0.0 && val_fraction < 1.0)) {
    throw data_error(data.source + ": validation fraction " + std::to_string(val_fraction) +
                     "; expected a number strictly between 0 and 1");
  }
  const std::size_t n = data.tokens.size();
  const auto n_val = static_cast<std::size_t>(std::floor(static_cast<double>(n) * val_fraction));
  if (n_val == 0 || n_val == n) {
    throw data_error(data.source + ": " + std::to_string(n) + " tokens cannot be split " +
                     std::to_string(val_fraction) + " for validation with both parts non-empty");
  }
  const auto cut = data.tokens.begin() + static_cast<std::ptrdiff_t>(n - n_val);
  return {token_data{{data.tokens.begin(), cut}, data.source + " [train]"},
          token_data{{cut, data.tokens.end()}, data.source + " [val]"}};
}

/// Where sequence \p global_index of step \p step starts: splitmix64 of (seed, step, global index), modulo
/// the number of windows of T + 1 tokens, `tokens - T`. The one rule every rank uses, so the global batch
/// depends only on the seed, the step and ranks × B, not on how it is split among ranks.
/// \pre tokens >= T + 1 and T >= 1 (batch_sampler checks).
/// \returns a start in [0, tokens - T - 1].
constexpr std::size_t sequence_start(std::uint64_t seed, std::uint64_t step, std::uint64_t global_index,
                                     std::size_t tokens, int T) noexcept {
  const std::uint64_t h = detail::splitmix64(detail::splitmix64(detail::splitmix64(seed) ^ step) ^ global_index);
  return static_cast<std::size_t>(h % (tokens - static_cast<std::size_t>(T)));
}

/// Gives rank `rank` of `ranks` its B sequences of T + 1 tokens per step: inputs the first T of each,
/// targets the last T (the inputs shifted by one).
///
/// Sequence b of this rank is global sequence g = rank · B + b of the step, and starts at
/// `sequence_start(seed, step, g, tokens, T)`. So the global batch — ranks × B sequences, concatenated in
/// rank order — is the same for any rank count with the same ranks × B. The sampler reads `data` in place:
/// the token_data must outlive it.
class batch_sampler {
public:
  /// \param data the tokens to sample from (not copied; must outlive the sampler).
  /// \param B sequences per rank per step, >= 1.
  /// \param T tokens per sequence (the context), >= 1.
  /// \param rank this rank, 0 to ranks - 1.
  /// \param ranks the number of ranks, >= 1.
  /// \param seed the seed every rank shares.
  /// \throws data_error naming the data's source when B, T, rank or ranks are out of range, when the data
  /// has fewer than T + 1 tokens, or fewer than one global batch needs (ranks · B · (T + 1)); the message
  /// says how many it has and needs.
  batch_sampler(const token_data& data, int B, int T, int rank, int ranks, std::uint64_t seed)
      : data_(&data), B_(B), T_(T), rank_(rank), seed_(seed) {
    if (B < 1 || T < 1 || ranks < 1 || rank < 0 || rank >= ranks) {
      throw data_error(data.source + ": batch_sampler with B " + std::to_string(B) + ", T " + std::to_string(T) +
                       ", rank " + std::to_string(rank) + " of " + std::to_string(ranks) +
                       "; expected B >= 1, T >= 1 and 0 <= rank < ranks");
    }
    const std::size_t n = data.tokens.size();
    const auto window = static_cast<std::size_t>(T) + 1;
    if (n < window) {
      throw data_error(data.source + ": " + std::to_string(n) +
                       " tokens, fewer than one sequence of T + 1 = " + std::to_string(window) + " tokens needs");
    }
    const std::size_t global = static_cast<std::size_t>(ranks) * static_cast<std::size_t>(B) * window;
    if (n < global) {
      throw data_error(data.source + ": " + std::to_string(n) + " tokens, fewer than one global batch needs: " +
                       std::to_string(global) + " (ranks " + std::to_string(ranks) + " x B " + std::to_string(B) +
                       " x (T + 1) " + std::to_string(window) + ")");
    }
  }

  /// Writes this rank's batch of the current step and moves to the next step.
  /// \param inputs B · T ids, row-major (sequence b at inputs + b · T); owned by the caller.
  /// \param targets B · T ids, the inputs shifted by one token; owned by the caller.
  void next(std::int32_t* inputs, std::int32_t* targets) {
    const std::uint16_t* tokens = data_->tokens.data();
    const auto T = static_cast<std::size_t>(T_);
    for (int b = 0; b < B_; ++b) {
      const auto g = static_cast<std::uint64_t>(rank_) * static_cast<std::uint64_t>(B_) + static_cast<std::uint64_t>(b);
      const std::size_t start = sequence_start(seed_, step_, g, data_->tokens.size(), T_);
      const std::size_t row = static_cast<std::size_t>(b) * T;
      for (std::size_t t = 0; t < T; ++t) {
        inputs[row + t] = tokens[start + t];
        targets[row + t] = tokens[start + t + 1];
      }
    }
    ++step_;
  }

  /// The step the next call to next() samples (0 after construction).
  std::uint64_t step() const noexcept { return step_; }
  /// Sets the step the next call to next() samples, e.g. on resuming from a checkpoint.
  void seek(std::uint64_t step) noexcept { step_ = step; }

private:
  const token_data* data_;
  int B_;
  int T_;
  int rank_;
  std::uint64_t seed_;
  std::uint64_t step_ = 0;
};

/// The evaluation windows over \p tokens tokens: every window of T + 1 tokens starting at 0, T, 2T, ...
/// that fits, as half-open ranges [begin, end) with end = begin + T + 1. A window's inputs are its first T
/// tokens and its targets its last T, so every token from 1 to count · T is a target exactly once. This is
/// the rule --eval-only computes val_loss by.
/// \param tokens the number of tokens.
/// \param T the context, >= 1.
/// \returns the windows in order; empty when tokens < T + 1.
/// \throws data_error when T < 1.
inline std::vector<std::pair<std::size_t, std::size_t>> eval_windows(std::size_t tokens, int T) {
  if (T < 1) {
    throw data_error("eval_windows: T " + std::to_string(T) + "; expected T >= 1");
  }
  const auto t = static_cast<std::size_t>(T);
  std::vector<std::pair<std::size_t, std::size_t>> windows;
  if (tokens < t + 1) {
    return windows;
  }
  windows.reserve((tokens - 1) / t);
  for (std::size_t begin = 0; begin + t + 1 <= tokens; begin += t) {
    windows.emplace_back(begin, begin + t + 1);
  }
  return windows;
}

/// The entropy, in nats, of the unigram distribution of the token ids in \p data: -Σ p ln p over the ids
/// that occur. A model that learned nothing but the id frequencies reaches this cross-entropy; a trained
/// model's validation loss must beat it.
/// \throws data_error naming the source when there are no tokens.
inline double byte_unigram_entropy_nats(const token_data& data) {
  if (data.tokens.empty()) {
    throw data_error(data.source + ": no tokens; the unigram entropy needs at least one");
  }
  std::vector<std::size_t> counts(65536, 0);
  for (const std::uint16_t id : data.tokens) {
    ++counts[id];
  }
  const auto n = static_cast<double>(data.tokens.size());
  double h = 0.0;
  for (const std::size_t c : counts) {
    if (c != 0) {
      const double p = static_cast<double>(c) / n;
      h -= p * std::log(p);
    }
  }
  return h;
}

/// Writes \p tokens as an llm.c token shard (version 1, little-endian), replacing \p file.
/// \throws data_error naming the file when there are more than 2^31 - 1 tokens, the path has a NUL byte, or
/// the file cannot be created or fully written.
inline void write_llmc_shard(const std::filesystem::path& file, std::span<const std::uint16_t> tokens) {
  const std::string name = detail::path_text(file);
  if (file.native().find('\0') != std::string::npos) {
    throw data_error(name + ": the path has a NUL byte; expected a path without one");
  }
  if (tokens.size() > static_cast<std::size_t>(INT32_MAX)) {
    throw data_error(name + ": " + std::to_string(tokens.size()) + " tokens; an llm.c shard holds at most " +
                     std::to_string(INT32_MAX));
  }
  std::vector<std::uint32_t> header(llmc_header_words, 0);
  header[0] = detail::little_endian(static_cast<std::uint32_t>(llmc_shard_magic));
  header[1] = detail::little_endian(static_cast<std::uint32_t>(llmc_shard_version));
  header[2] = detail::little_endian(static_cast<std::uint32_t>(tokens.size()));
  std::vector<std::uint16_t> body(tokens.begin(), tokens.end());
  for (auto& id : body) {
    id = detail::little_endian(id);
  }
  detail::file_descriptor fd(::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    throw data_error(name + ": cannot create it (" + std::strerror(errno) + ")");
  }
  const auto write_all = [&](const void* data, std::size_t bytes, const char* what) {
    const auto* p = static_cast<const char*>(data);
    std::size_t done = 0;
    while (done < bytes) {
      const ::ssize_t put = ::write(fd.get(), p + done, bytes - done);
      if (put < 0) {
        if (errno == EINTR) {
          continue;
        }
        throw data_error(name + ": writing the " + what + " failed after " + std::to_string(done) + " of " +
                         std::to_string(bytes) + " bytes (" + std::strerror(errno) + ")");
      }
      done += static_cast<std::size_t>(put);
    }
  };
  write_all(header.data(), llmc_header_bytes, "header");
  write_all(body.data(), body.size() * sizeof(std::uint16_t), "tokens");
}

} // namespace gpt
