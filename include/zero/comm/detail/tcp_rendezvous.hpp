#pragma once
/// \file
/// The TCP rendezvous of `nccl_communicator::from_env`: the launcher's environment (RANK, WORLD_SIZE,
/// MASTER_ADDR, MASTER_PORT, ZERO_RENDEZVOUS_PORT), and the exchange in which rank 0 hands NCCL's unique id
/// to every other rank. POSIX sockets; needs neither CUDA nor NCCL. Internal to `nccl_communicator`.

#include "zero/core/error.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <string>
#include <sys/socket.h>
#include <thread>
#include <type_traits>
#include <unistd.h>
#include <utility>
#include <vector>

namespace zero::detail {

/// Reads a required environment variable for `from_env`.
/// \throws config_error naming the variable and `meaning` when it is not set or empty.
[[nodiscard]] inline std::string env_required(const char* var, const char* meaning) {
  const char* v = std::getenv(var);
  if (v == nullptr || *v == '\0') {
    throw config_error(std::string("nccl_communicator::from_env: environment variable ") + var + " is not set; " +
                       "expected " + meaning + " (as torchrun sets it)");
  }
  return v;
}

/// Reads a required environment variable holding an integer in [lo, 1'000'000] for `from_env`.
/// \throws config_error naming the variable and `meaning` when it is missing or malformed.
[[nodiscard]] inline int env_int(const char* var, const char* meaning, int lo) {
  const std::string s = env_required(var, meaning);
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (errno != 0 || end == s.c_str() || *end != '\0' || v < lo || v > 1'000'000) {
    throw config_error(std::string("nccl_communicator::from_env: ") + var + "=\"" + s + "\" is not " + meaning);
  }
  return static_cast<int>(v);
}

/// A socket closed on scope exit.
class socket_fd {
public:
  explicit socket_fd(int fd = -1) noexcept : fd_(fd) {}
  socket_fd(socket_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  socket_fd& operator=(socket_fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  socket_fd(const socket_fd&) = delete;
  socket_fd& operator=(const socket_fd&) = delete;
  ~socket_fd() {
    if (fd_ >= 0) {
      ::close(fd_);
    }
  }
  [[nodiscard]] int get() const noexcept { return fd_; }

private:
  int fd_;
};

/// Sends or receives exactly `n` bytes before `deadline`; false on a closed peer or timeout.
template <bool Send>
[[nodiscard]] inline bool transfer_all(int fd, void* data, std::size_t n,
                                       std::chrono::steady_clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return false;
    }
    pollfd pfd{fd, static_cast<short>(Send ? POLLOUT : POLLIN), 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) {
      return false;
    }
    if (ready <= 0) {
      continue;
    }
    const ssize_t k = Send ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) {
      continue;
    }
    if (k <= 0) {
      return false;
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

/// A TCP socket listening on `port` of every interface (SO_REUSEADDR), or an invalid one with errno
/// set when the port cannot be had.
[[nodiscard]] inline socket_fd listen_on(int port, int backlog) {
  socket_fd s(::socket(AF_INET, SOCK_STREAM, 0));
  if (s.get() < 0) {
    return s;
  }
  const int one = 1;
  (void)::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(s.get(), backlog) != 0) {
    const int e = errno;
    s = socket_fd();
    errno = e;
  }
  return s;
}

/// What a rank sends first on the rendezvous connection, and what rank 0 answers before the id: a
/// magic word and the group's identity (size, base port), so a listener that is not this group's
/// rendezvous (another service, another job) is recognised and skipped rather than believed.
struct rendezvous_hello {
  char magic[8] = {'Z', 'E', 'R', 'O', 'R', 'D', 'V', '1'};
  std::int32_t rank = 0;
  std::int32_t size = 0;
  std::int32_t base_port = 0;
  [[nodiscard]] bool matches(const rendezvous_hello& o) const noexcept {
    return std::memcmp(magic, o.magic, sizeof(magic)) == 0 && size == o.size && base_port == o.base_port;
  }
};

/// The rendezvous of `from_env`: rank 0 listens on the first of `ports` it can bind and hands `id` to
/// every other rank; the others try the ports in turn (retrying until the deadline), greet with
/// `rendezvous_hello` and take the id only from a listener that answers with this group's hello.
/// `base_port` (MASTER_PORT or ZERO_RENDEZVOUS_PORT) names the group in the greeting.
/// `Id` is any trivially copyable value (NCCL's `ncclUniqueId`), sent as its bytes.
/// \throws comm_error when rank 0 cannot listen or two processes claim one rank; config_error when `addr`
///         does not resolve; timeout_error when the exchange does not complete within `timeout`.
template <class Id>
void exchange_unique_id(Id& id, int rank, int size, const std::string& addr, const std::vector<int>& ports,
                        int base_port, std::chrono::milliseconds timeout) {
  static_assert(std::is_trivially_copyable_v<Id>, "the rendezvous sends the id as its bytes");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string where = addr + ":" + std::to_string(ports.front()) +
                            (ports.size() > 1 ? "-" + std::to_string(ports.back()) : std::string());
  auto timeout_text = [&](const std::string& what) {
    return "nccl_communicator::from_env: rendezvous at " + where + " (rank " + std::to_string(rank) + " of " +
           std::to_string(size) + ") did not complete within " + std::to_string(timeout.count()) + " ms: " + what;
  };
  rendezvous_hello mine;
  mine.rank = rank;
  mine.size = size;
  mine.base_port = base_port;
  // A greeting or an answer comes at once from the right peer; a wrong one gets this long.
  auto soon = [&] { return std::min(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(1)); };
  if (rank == 0) {
    socket_fd server;
    std::string refused;
    for (const int port : ports) {
      if (socket_fd s = listen_on(port, size); s.get() >= 0) {
        server = std::move(s);
        break;
      }
      refused += (refused.empty() ? "" : ", ") + std::to_string(port) + " (" + std::strerror(errno) + ")";
    }
    if (server.get() < 0) {
      throw comm_error("nccl_communicator::from_env: rank 0 cannot listen on any rendezvous port: " + refused +
                       "; set ZERO_RENDEZVOUS_PORT to a free port");
    }
    std::vector<bool> seen(static_cast<std::size_t>(size), false);
    for (int joined = 1; joined < size;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        throw timeout_error(
            timeout_text(std::to_string(joined - 1) + " of " + std::to_string(size - 1) + " other ranks connected"));
      }
      pollfd pfd{server.get(), POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(std::min<long long>(left.count(), 1000))) <= 0) {
        continue;
      }
      socket_fd peer(::accept(server.get(), nullptr, nullptr));
      if (peer.get() < 0) {
        continue;
      }
      rendezvous_hello hello;
      std::memset(hello.magic, 0, sizeof(hello.magic)); // only what arrives may match
      if (!transfer_all<false>(peer.get(), &hello, sizeof(hello), soon()) || !hello.matches(mine)) {
        continue; // not one of this group's ranks: another program, or another job's rank
      }
      if (hello.rank <= 0 || hello.rank >= size || seen[static_cast<std::size_t>(hello.rank)]) {
        throw comm_error("nccl_communicator::from_env: rank 0 got a connection on " + where + " announcing rank " +
                         std::to_string(hello.rank) + "; expected a new rank in [1, " + std::to_string(size) +
                         ") (two processes with the same RANK?)");
      }
      if (!transfer_all<true>(peer.get(), &mine, sizeof(mine), deadline) ||
          !transfer_all<true>(peer.get(), &id, sizeof(id), deadline)) {
        throw comm_error("nccl_communicator::from_env: rank 0 could not send the NCCL id to rank " +
                         std::to_string(hello.rank));
      }
      seen[static_cast<std::size_t>(hello.rank)] = true;
      ++joined;
    }
    return;
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(addr.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) {
    throw config_error("nccl_communicator::from_env: MASTER_ADDR \"" + addr + "\" does not resolve to an IPv4 address");
  }
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(found, &::freeaddrinfo);
  bool answered_wrong = false;
  for (;;) {
    for (const int port : ports) {
      sockaddr_in a{};
      std::memcpy(&a, found->ai_addr, sizeof(a));
      a.sin_port = htons(static_cast<std::uint16_t>(port));
      socket_fd s(::socket(AF_INET, SOCK_STREAM, 0));
      if (s.get() < 0 || ::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        continue;
      }
      rendezvous_hello answer;
      std::memset(answer.magic, 0, sizeof(answer.magic));
      if (!transfer_all<true>(s.get(), &mine, sizeof(mine), soon()) ||
          !transfer_all<false>(s.get(), &answer, sizeof(answer), soon()) || !answer.matches(mine)) {
        answered_wrong = true; // something else listens there; try the next port
        continue;
      }
      if (!transfer_all<false>(s.get(), &id, sizeof(id), deadline)) {
        throw timeout_error(
            timeout_text("rank 0 answered on port " + std::to_string(port) + " but the NCCL id did not arrive"));
      }
      return;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      throw timeout_error(timeout_text(answered_wrong ? "only listeners that are not this group's rendezvous answered"
                                                      : "rank 0 never accepted a connection"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

/// The ports the rendezvous of `from_env` may use: ZERO_RENDEZVOUS_PORT alone when it is set, else
/// the `rendezvous_port_span` ports after MASTER_PORT (torchrun's agent serves its own store on
/// MASTER_PORT, and the port right after it may be taken by then). Returns them with the base port.
inline constexpr int rendezvous_port_span = 8;
[[nodiscard]] inline std::pair<std::vector<int>, int> rendezvous_ports() {
  if (std::getenv("ZERO_RENDEZVOUS_PORT") != nullptr) {
    const int port = env_int("ZERO_RENDEZVOUS_PORT", "a TCP port in [1, 65535] free on rank 0's host", 1);
    if (port > 65535) {
      throw config_error("nccl_communicator::from_env: ZERO_RENDEZVOUS_PORT=" + std::to_string(port) +
                         " is above 65535; expected a TCP port in [1, 65535] free on rank 0's host");
    }
    return {{port}, port};
  }
  const int base = env_int("MASTER_PORT", "a TCP port in [1, 65534] (zero listens on one of the next ones)", 1);
  std::vector<int> ports;
  for (int k = 1; k <= rendezvous_port_span && base + k <= 65535; ++k) {
    ports.push_back(base + k);
  }
  if (ports.empty()) {
    throw config_error("nccl_communicator::from_env: MASTER_PORT=" + std::to_string(base) +
                       " leaves no port above it for zero's rendezvous; set ZERO_RENDEZVOUS_PORT to a free port");
  }
  return {ports, base};
}

} // namespace zero::detail
