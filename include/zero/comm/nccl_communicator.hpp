#pragma once
/// \file
/// `nccl_communicator`: the communicator policy over NCCL, for device memory.
///
/// Three ways to start a group:
/// - one process driving several GPUs, a thread per GPU: `zero::run_gpus(n, fn)`, or by hand with
///   `nccl_communicator::make_unique_id()` shared by the threads and the (rank, size, id, device)
///   constructor;
/// - one process per GPU started by torchrun or any launcher that sets RANK, WORLD_SIZE, LOCAL_RANK,
///   MASTER_ADDR and MASTER_PORT: `nccl_communicator::from_env()`, which passes NCCL's unique id from
///   rank 0 to the others over TCP on ZERO_RENDEZVOUS_PORT, or on the first free one of the 8 ports
///   after MASTER_PORT when that is not set (torchrun's own store holds MASTER_PORT);
/// - MPI, one process per GPU (also the multi-node path): `zero::nccl_from_mpi` in
///   zero/comm/nccl_mpi.hpp, which broadcasts the id with MPI.
///
/// ## Streams and ordering
/// Each communicator owns a communication stream. `set_compute_stream(s)` names the stream the data is
/// produced and consumed on (the engine passes its own): every operation first makes the communication
/// stream wait for an event recorded on `s` at the call, so it reads what the kernels enqueued before
/// it wrote, and the kernels enqueued after the call overlap with it. `wait()` on the handle blocks the
/// host until the operation's completion event has passed; after it, work on any stream may use the
/// buffers. Nothing here synchronizes the device.
///
/// ## Failures
/// Start-up runs on a non-blocking NCCL communicator (`ncclConfig_t::blocking = 0`), so a rank that never
/// arrives is a `timeout_error`, not a hang; operations then run on a blocking child of it (`ncclCommSplit`),
/// because a non-blocking communicator hands each launch to a helper thread, tens of microseconds per
/// collective. `wait()` polls the completion event and `ncclCommGetAsyncError`; when NCCL reports an error,
/// or the timeout passes first, the communicator is aborted (`ncclCommAbort`, which also stops its kernels)
/// and `wait()` throws `nccl_error` or `timeout_error` naming the operation, the group, the rank and the
/// bytes. A call that blocks inside NCCL (a lazy connection set-up waiting for a peer) is bounded by a
/// watchdog thread that aborts the communicator at the timeout; the call then throws `timeout_error`. An
/// aborted communicator refuses every later operation with `comm_error`. In a `run_gpus` group, a rank that
/// fails makes the others' waits abort at once instead of at their timeout.
///
/// ## Matching
/// NCCL leaves collectives that differ between ranks (another operation, count, type or root at the
/// same position) undefined: a hang or wrong data. With `nccl_options::check_matching`, or the
/// environment variable ZERO_CHECK_COLLECTIVES=1, every collective first all-gathers each rank's
/// description of it (four int64 per rank) and waits for it on the host, under the timeout; when
/// the ranks disagree every rank throws the same `comm_error` ("operation #k does not match across
/// ranks: rank 0 called all_gather(count=1000, bf16); rank 1 called all_gather(count=500, bf16)")
/// and nothing is started. The price is a host wait per collective, which ends the overlap of
/// communication with compute: a debugging mode, off by default (PyTorch's
/// TORCH_DISTRIBUTED_DEBUG=DETAIL makes the same trade). `send`/`recv` are not checked.
///
/// Element types: float, f16, bf16, double, int32, int64, uint8 (`zero::element_type`); `reduce_op::avg`
/// is for floating types.

#include "zero/comm/communicator.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"

#include <arpa/inet.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime_api.h>
#include <exception>
#include <memory>
#include <mutex>
#include <nccl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string>
#include <string_view>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

namespace zero {

/// Options of an `nccl_communicator`.
struct nccl_options {
  /// The group's name in messages.
  std::string name = "world";
  /// How long `wait()` (and start-up) may block before the communicator is aborted.
  std::chrono::milliseconds timeout = default_comm_timeout;
  /// Shared by the ranks of one process (set by `run_gpus`): set when a rank fails, so the others abort
  /// their waits instead of waiting for their timeout. Null: no such sharing.
  std::shared_ptr<std::atomic<bool>> group_failed{};
  /// Compare every collective across ranks before starting it (see "Matching" in the file comment);
  /// also on when the environment variable ZERO_CHECK_COLLECTIVES is 1.
  bool check_matching = false;
};

namespace detail {

/// NCCL's description of `r`, with the last error text NCCL recorded when there is one.
[[nodiscard]] inline std::string nccl_text(ncclResult_t r, ncclComm_t comm = nullptr) {
  std::string text = std::string(ncclGetErrorString(r)) + " (ncclResult_t " + std::to_string(static_cast<int>(r)) + ")";
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') {
    text += ": ";
    text += last;
  }
  return text;
}

/// Throws `nccl_error` when `r` is neither success nor in-progress.
inline ncclResult_t check_nccl(ncclResult_t r, const char* expr, ncclComm_t comm = nullptr) {
  if (r != ncclSuccess && r != ncclInProgress) {
    throw nccl_error(std::string(expr) + " failed: " + nccl_text(r, comm), static_cast<int>(r));
  }
  return r;
}

/// The NCCL data type of `T`.
template <class T> [[nodiscard]] constexpr ncclDataType_t nccl_type() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) {
    return ncclFloat32;
  } else if constexpr (std::is_same_v<U, f16>) {
    return ncclFloat16;
  } else if constexpr (std::is_same_v<U, bf16>) {
    return ncclBfloat16;
  } else if constexpr (std::is_same_v<U, double>) {
    return ncclFloat64;
  } else if constexpr (std::is_same_v<U, std::int32_t>) {
    return ncclInt32;
  } else if constexpr (std::is_same_v<U, std::int64_t>) {
    return ncclInt64;
  } else {
    static_assert(std::is_same_v<U, std::uint8_t>, "zero::nccl_communicator: unsupported element type");
    return ncclUint8;
  }
}

[[nodiscard]] inline ncclRedOp_t nccl_op(reduce_op op) {
  switch (op) {
  case reduce_op::sum:
    return ncclSum;
  case reduce_op::avg:
    return ncclAvg;
  case reduce_op::max:
    return ncclMax;
  }
  return ncclSum;
}

/// What the communicator and its handles share: the NCCL communicator, the streams and a pool of events.
struct nccl_state {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int size = 1;
  int device = 0;
  std::string name;
  std::chrono::milliseconds timeout{};
  std::shared_ptr<std::atomic<bool>> group_failed;
  cudaStream_t stream = nullptr;      // the communication stream (owned)
  cudaStream_t compute = nullptr;     // the stream operations are ordered after (not owned)
  cudaEvent_t produced = nullptr;     // recorded on `compute` at each call
  int* scratch = nullptr;             // one device word for barrier
  bool check_matching = false;        // compare collectives across ranks first (see "Matching")
  std::int64_t* signatures = nullptr; // device: size x op_signature_fields words, when check_matching
  std::uint64_t next_op = 0;          // number of the next collective, for mismatch messages
  bool blocking = false;              // `comm` is a blocking NCCL communicator (the fast path)
  std::atomic<bool> aborted{false};
  std::mutex events_mutex;
  std::vector<cudaEvent_t> free_events;

  // The watchdog: a blocking NCCL call (a lazy connection set-up that waits for a peer) cannot time out by
  // itself, so a thread aborts the communicator when a call has been inside NCCL longer than the timeout.
  std::mutex watch_mutex;
  std::condition_variable watch_cv;
  std::thread watchdog;
  bool watch_stop = false;
  const char* call_op = nullptr; // the NCCL call in progress, or null
  std::size_t call_bytes = 0;
  std::chrono::steady_clock::time_point call_since{};
  bool call_timed_out = false;
  std::string abort_reason; // guarded by watch_mutex

  nccl_state() = default;
  nccl_state(const nccl_state&) = delete;
  nccl_state& operator=(const nccl_state&) = delete;

  ~nccl_state() {
    if (watchdog.joinable()) {
      {
        const std::lock_guard lock(watch_mutex);
        watch_stop = true;
      }
      watch_cv.notify_all();
      watchdog.join();
    }
    const int previous = current_device();
    (void)cudaSetDevice(device);
    if (comm != nullptr) {
      if (aborted.load()) {
        // ncclCommAbort already freed it.
      } else if (blocking) {
        // Every operation enqueued has finished when the stream is idle; otherwise a peer is missing and a
        // blocking destroy could wait for it forever.
        if (stream != nullptr && cudaStreamQuery(stream) == cudaSuccess) {
          (void)ncclCommDestroy(comm);
        } else {
          (void)ncclCommAbort(comm);
        }
      } else if (!finalize_quietly()) {
        (void)ncclCommAbort(comm);
      } else {
        (void)ncclCommDestroy(comm);
      }
    }
    for (cudaEvent_t e : free_events) {
      (void)cudaEventDestroy(e);
    }
    if (produced != nullptr) {
      (void)cudaEventDestroy(produced);
    }
    if (scratch != nullptr) {
      (void)cudaFree(scratch);
    }
    if (signatures != nullptr) {
      (void)cudaFree(signatures);
    }
    if (stream != nullptr) {
      (void)cudaStreamDestroy(stream);
    }
    (void)cudaGetLastError();
    (void)cudaSetDevice(previous);
  }

  static int current_device() noexcept {
    int d = 0;
    (void)cudaGetDevice(&d);
    return d;
  }

  /// Flushes the communicator before destruction, bounded by the timeout. False: it did not settle.
  bool finalize_quietly() noexcept {
    if (ncclCommFinalize(comm) != ncclSuccess) {
      ncclResult_t st = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &st) != ncclSuccess || st != ncclInProgress) {
        return false;
      }
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    ncclResult_t st = ncclInProgress;
    while (std::chrono::steady_clock::now() < deadline) {
      if (ncclCommGetAsyncError(comm, &st) != ncclSuccess || st != ncclInProgress) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return st == ncclSuccess;
  }

  cudaEvent_t take_event() {
    {
      const std::lock_guard lock(events_mutex);
      if (!free_events.empty()) {
        cudaEvent_t e = free_events.back();
        free_events.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    const cudaError_t st = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (st != cudaSuccess) {
      (void)cudaGetLastError();
      throw cuda_error(std::string("nccl_communicator: cudaEventCreateWithFlags failed: ") + cudaGetErrorString(st),
                       static_cast<int>(st));
    }
    return e;
  }

  void give_event(cudaEvent_t e) noexcept {
    const std::lock_guard lock(events_mutex);
    free_events.push_back(e);
  }

  [[nodiscard]] bool peer_failed() const noexcept { return group_failed && group_failed->load(); }

  /// Aborts the communicator once (kernels stop; later operations are refused).
  void abort(std::string reason) noexcept {
    bool expected = false;
    if (aborted.compare_exchange_strong(expected, true)) {
      {
        const std::lock_guard lock(watch_mutex);
        abort_reason = std::move(reason);
      }
      (void)ncclCommAbort(comm);
    }
  }

  [[nodiscard]] std::string reason() {
    const std::lock_guard lock(watch_mutex);
    return abort_reason;
  }

  /// Starts the watchdog of blocking calls (see `watchdog`).
  void start_watchdog() {
    watchdog = std::thread([this] {
      std::unique_lock lock(watch_mutex);
      while (!watch_stop) {
        watch_cv.wait_for(lock, std::chrono::milliseconds(50));
        if (call_op != nullptr && !call_timed_out && std::chrono::steady_clock::now() - call_since > timeout) {
          call_timed_out = true;
          std::string text = detail::timeout_message(std::string(call_op) + " (inside the NCCL call)", name, rank, size,
                                                     call_bytes, timeout) +
                             "; the communicator was aborted";
          if (group_failed) {
            group_failed->store(true);
          }
          lock.unlock();
          abort(std::move(text));
          lock.lock();
        }
      }
    });
  }

  /// Marks the start and the end of a call into NCCL for the watchdog.
  void enter_call(const char* op, std::size_t bytes) {
    const std::lock_guard lock(watch_mutex);
    call_op = op;
    call_bytes = bytes;
    call_since = std::chrono::steady_clock::now();
  }
  /// \returns true when the watchdog aborted the communicator during the call.
  bool leave_call() {
    const std::lock_guard lock(watch_mutex);
    call_op = nullptr;
    return std::exchange(call_timed_out, false);
  }

  /// Polls until NCCL's state for this communicator is no longer in progress (a non-blocking call was
  /// enqueued, or start-up finished), or throws as `wait` does.
  void settle(const std::string& op, std::size_t bytes) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      ncclResult_t st = ncclInProgress;
      const ncclResult_t q = ncclCommGetAsyncError(comm, &st);
      if (q != ncclSuccess) {
        st = q;
      }
      if (st == ncclSuccess) {
        return;
      }
      if (st != ncclInProgress) {
        fail_nccl(op, bytes, st);
      }
      check_deadline(op, bytes, start);
      pause(std::chrono::steady_clock::now() - start);
    }
  }

  [[noreturn]] void fail_nccl(const std::string& op, std::size_t bytes, ncclResult_t st) {
    std::string text = op + " on group \"" + name + "\" (size " + std::to_string(size) + ") at rank " +
                       std::to_string(rank) + " failed (" + std::to_string(bytes) + " bytes): " + nccl_text(st, comm) +
                       "; the communicator was aborted";
    if (group_failed) {
      group_failed->store(true);
    }
    abort(text);
    throw nccl_error(text, static_cast<int>(st));
  }

  void check_deadline(const std::string& op, std::size_t bytes, std::chrono::steady_clock::time_point start) {
    if (peer_failed()) {
      std::string text = op + " on group \"" + name + "\" at rank " + std::to_string(rank) +
                         " was abandoned: another rank of the group failed; the communicator was aborted";
      abort(text);
      throw comm_error(text);
    }
    if (std::chrono::steady_clock::now() - start > timeout) {
      std::string text =
          detail::timeout_message(op, name, rank, size, bytes, timeout) + "; the communicator was aborted";
      if (group_failed) {
        group_failed->store(true);
      }
      abort(text);
      throw timeout_error(text);
    }
  }

  /// Between polls: yield the core for the first 20 ms of a wait (a collective usually ends well within it,
  /// and a sleep would add the timer's slack, tens of microseconds, to every one), then sleep 50 us.
  static void pause(std::chrono::steady_clock::duration waited) {
    if (waited < std::chrono::milliseconds(20)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
};

/// Reads a required environment variable for `from_env`.
[[nodiscard]] inline std::string env_required(const char* var, const char* meaning) {
  const char* v = std::getenv(var);
  if (v == nullptr || *v == '\0') {
    throw config_error(std::string("nccl_communicator::from_env: environment variable ") + var + " is not set; " +
                       "expected " + meaning + " (as torchrun sets it)");
  }
  return v;
}

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
inline void exchange_unique_id(ncclUniqueId& id, int rank, int size, const std::string& addr,
                               const std::vector<int>& ports, int base_port, std::chrono::milliseconds timeout) {
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

} // namespace detail

/// The communicator over NCCL; see the file comment. A cheap movable handle to shared state.
class nccl_communicator {
public:
  /// An operation in flight: `wait()` blocks the host until it is complete (see the file comment).
  /// Dropping a handle without `wait()` is allowed: the operation still completes in stream order.
  class handle {
  public:
    handle() = default;
    handle(std::shared_ptr<detail::nccl_state> s, cudaEvent_t done, std::string op, std::size_t bytes)
        : s_(std::move(s)), done_(done), op_(std::move(op)), bytes_(bytes) {}
    handle(handle&& o) noexcept
        : s_(std::move(o.s_)), done_(std::exchange(o.done_, nullptr)), op_(std::move(o.op_)), bytes_(o.bytes_) {}
    handle& operator=(handle&& o) noexcept {
      release();
      s_ = std::move(o.s_);
      done_ = std::exchange(o.done_, nullptr);
      op_ = std::move(o.op_);
      bytes_ = o.bytes_;
      return *this;
    }
    handle(const handle&) = delete;
    handle& operator=(const handle&) = delete;
    ~handle() { release(); }

    /// Blocks until the operation is complete.
    /// \throws timeout_error (timeout passed), nccl_error (NCCL reported a failure), comm_error (another rank
    ///         of a `run_gpus` group failed); in each case the communicator is aborted first.
    void wait() {
      if (done_ == nullptr) {
        return;
      }
      const auto start = std::chrono::steady_clock::now();
      for (std::uint64_t spins = 0;; ++spins) {
        const cudaError_t q = cudaEventQuery(done_);
        if (q == cudaSuccess) {
          release();
          return;
        }
        if (q != cudaErrorNotReady) {
          (void)cudaGetLastError();
          throw cuda_error(op_ + " at rank " + std::to_string(s_->rank) + ": " + cudaGetErrorString(q),
                           static_cast<int>(q));
        }
        // NCCL's error state, the peers and the clock are looked at every 64 polls: the event query alone
        // is what keeps the latency of a finished collective low.
        if (spins % 64 == 63) {
          if (s_->aborted.load()) {
            throw comm_error(op_ + " at rank " + std::to_string(s_->rank) + ": the communicator was aborted (" +
                             s_->reason() + ")");
          }
          ncclResult_t st = ncclSuccess;
          if (ncclCommGetAsyncError(s_->comm, &st) == ncclSuccess && st != ncclSuccess && st != ncclInProgress) {
            s_->fail_nccl(op_, bytes_, st);
          }
          s_->check_deadline(op_, bytes_, start);
          detail::nccl_state::pause(std::chrono::steady_clock::now() - start);
        }
      }
    }

  private:
    void release() noexcept {
      if (done_ != nullptr) {
        s_->give_event(done_);
        done_ = nullptr;
      }
    }
    std::shared_ptr<detail::nccl_state> s_;
    cudaEvent_t done_ = nullptr;
    std::string op_;
    std::size_t bytes_ = 0;
  };

  /// A fresh NCCL unique id, to share among the ranks of one group (thread-per-GPU start).
  /// \throws nccl_error.
  [[nodiscard]] static ncclUniqueId make_unique_id() {
    ncclUniqueId id;
    detail::check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    return id;
  }

  /// Joins the group `id` as `rank` of `size`, on CUDA device `device` (made current for the calling
  /// thread). Collective: every rank must call it with the same id and size.
  /// \throws usage_error for a bad rank or size; cuda_error for a bad device; timeout_error when the other
  ///         ranks do not arrive within the timeout; nccl_error when NCCL fails.
  nccl_communicator(int rank, int size, const ncclUniqueId& id, int device, nccl_options opt = {})
      : s_(std::make_shared<detail::nccl_state>()) {
    if (size < 1 || rank < 0 || rank >= size) {
      throw usage_error("nccl_communicator: rank " + std::to_string(rank) + " is outside a group of size " +
                        std::to_string(size));
    }
    auto& s = *s_;
    s.rank = rank;
    s.size = size;
    s.device = device;
    s.name = std::move(opt.name);
    s.timeout = opt.timeout;
    s.group_failed = std::move(opt.group_failed);
    const char* check_env = std::getenv("ZERO_CHECK_COLLECTIVES");
    s.check_matching = opt.check_matching || (check_env != nullptr && std::string_view(check_env) == "1");
    cuda_call(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
    cuda_call(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    cuda_call(cudaEventCreateWithFlags(&s.produced, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    cuda_call(cudaMalloc(reinterpret_cast<void**>(&s.scratch), 256), "cudaMalloc");
    // Start-up on a non-blocking communicator, so a rank that never arrives is a timeout here, not a hang.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    detail::check_nccl(ncclCommInitRankConfig(&s.comm, size, id, rank, &config), "ncclCommInitRankConfig");
    s.settle("start-up (ncclCommInitRankConfig)", 0);
    // Operations run on a blocking child of it: a non-blocking communicator hands every launch to a helper
    // thread of NCCL's, which costs tens of microseconds per collective. The watchdog bounds the blocking
    // calls instead.
    ncclConfig_t fast = NCCL_CONFIG_INITIALIZER;
    fast.blocking = 1;
    ncclComm_t child = nullptr;
    const ncclResult_t r = ncclCommSplit(s.comm, 0, rank, &child, &fast);
    if (r == ncclSuccess || r == ncclInProgress) {
      s.settle("start-up (ncclCommSplit)", 0);
    }
    if ((r == ncclSuccess || r == ncclInProgress) && child != nullptr) {
      ncclComm_t parent = std::exchange(s.comm, child);
      s.blocking = true;
      std::swap(s.comm, parent);
      const bool flushed = s.finalize_quietly();
      std::swap(s.comm, parent);
      if (flushed) {
        (void)ncclCommDestroy(parent);
      } else {
        (void)ncclCommAbort(parent);
      }
    }
    s.start_watchdog();
  }

  /// Joins the group described by torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK (the device),
  /// MASTER_ADDR and MASTER_PORT; rank 0 hands NCCL's id to the others over TCP on ZERO_RENDEZVOUS_PORT,
  /// or on the first of the 8 ports after MASTER_PORT it can listen on (torchrun's agent keeps
  /// MASTER_PORT for its own store); the others greet each port in turn and take the id only from
  /// a listener that answers as this group's rendezvous.
  /// \throws config_error naming a missing or malformed variable; timeout_error when a rank does not arrive.
  [[nodiscard]] static nccl_communicator from_env(nccl_options opt = {}) {
    const int size = detail::env_int("WORLD_SIZE", "the number of processes (an integer >= 1)", 1);
    const int rank = detail::env_int("RANK", "this process's rank (an integer in [0, WORLD_SIZE))", 0);
    const int local = detail::env_int("LOCAL_RANK", "this process's GPU on its node (an integer >= 0)", 0);
    if (rank >= size) {
      throw config_error("nccl_communicator::from_env: RANK=" + std::to_string(rank) +
                         " is not below WORLD_SIZE=" + std::to_string(size));
    }
    ncclUniqueId id{};
    if (size > 1) {
      const std::string addr = detail::env_required("MASTER_ADDR", "the host name or IPv4 address of rank 0");
      // torchrun's agent already serves its own store on MASTER_PORT (shared with the workers since
      // torch 2.4), so zero's rendezvous takes ZERO_RENDEZVOUS_PORT, or else one of the ports after it.
      const auto [ports, base] = detail::rendezvous_ports();
      if (rank == 0) {
        id = make_unique_id();
      }
      detail::exchange_unique_id(id, rank, size, addr, ports, base, opt.timeout);
    } else {
      id = make_unique_id();
    }
    return nccl_communicator(rank, size, id, local, std::move(opt));
  }

  nccl_communicator(nccl_communicator&&) noexcept = default;
  nccl_communicator& operator=(nccl_communicator&&) noexcept = default;
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  ~nccl_communicator() = default;

  /// This rank.
  [[nodiscard]] int rank() const noexcept { return s_->rank; }
  /// Ranks in the group.
  [[nodiscard]] int size() const noexcept { return s_->size; }
  /// The group's name.
  [[nodiscard]] std::string_view name() const noexcept { return s_->name; }
  /// The CUDA device of this rank.
  [[nodiscard]] int device() const noexcept { return s_->device; }
  /// The current timeout.
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return s_->timeout; }
  /// Sets the timeout of later waits.
  void set_timeout(std::chrono::milliseconds t) noexcept { s_->timeout = t; }
  /// The NCCL communicator.
  [[nodiscard]] ncclComm_t native() const noexcept { return s_->comm; }
  /// The communication stream the operations run on.
  [[nodiscard]] cudaStream_t stream() const noexcept { return s_->stream; }
  /// True once the communicator was aborted (a failure or a timeout).
  [[nodiscard]] bool aborted() const noexcept { return s_->aborted.load(); }

  /// The stream every later operation is ordered after (see the file comment); null: none (the caller
  /// synchronizes its producers itself). Not owned.
  void set_compute_stream(cudaStream_t s) noexcept { s_->compute = s; }
  /// The stream set by `set_compute_stream`.
  [[nodiscard]] cudaStream_t compute_stream() const noexcept { return s_->compute; }

  /// recv[i] = op over ranks of send[i], `count` elements each (in place when recv == send).
  template <element_type T> [[nodiscard]] handle all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    check_op<T>("all_reduce", op);
    agree<T>(0, count, static_cast<std::int64_t>(op));
    return launch("all_reduce", count * sizeof(T), [&] {
      return ncclAllReduce(send, recv, count, detail::nccl_type<T>(), detail::nccl_op(op), s_->comm, s_->stream);
    });
  }

  /// Rank r receives in `recv` the op over ranks of send[r*recv_count, (r+1)*recv_count).
  template <element_type T>
  [[nodiscard]] handle reduce_scatter(const T* send, T* recv, std::size_t recv_count, reduce_op op) {
    check_op<T>("reduce_scatter", op);
    agree<T>(1, recv_count, static_cast<std::int64_t>(op));
    return launch("reduce_scatter", recv_count * sizeof(T) * static_cast<std::size_t>(s_->size), [&] {
      return ncclReduceScatter(send, recv, recv_count, detail::nccl_type<T>(), detail::nccl_op(op), s_->comm,
                               s_->stream);
    });
  }

  /// recv[r*send_count, (r+1)*send_count) = send of rank r.
  template <element_type T> [[nodiscard]] handle all_gather(const T* send, T* recv, std::size_t send_count) {
    agree<T>(2, send_count, 0);
    return launch("all_gather", send_count * sizeof(T) * static_cast<std::size_t>(s_->size),
                  [&] { return ncclAllGather(send, recv, send_count, detail::nccl_type<T>(), s_->comm, s_->stream); });
  }

  /// recv = root's send, `count` elements.
  template <element_type T> [[nodiscard]] handle broadcast(const T* send, T* recv, std::size_t count, int root) {
    check_rank("broadcast", root);
    agree<T>(3, count, root);
    return launch("broadcast", count * sizeof(T),
                  [&] { return ncclBroadcast(send, recv, count, detail::nccl_type<T>(), root, s_->comm, s_->stream); });
  }

  /// Completes when every rank has reached it (a one-word all-reduce on the device).
  [[nodiscard]] handle barrier() {
    agree<std::uint8_t>(4, 0, 0);
    return launch("barrier", sizeof(int),
                  [&] { return ncclAllReduce(s_->scratch, s_->scratch, 1, ncclInt32, ncclSum, s_->comm, s_->stream); });
  }

  /// Sends `count` elements to `peer` (matched by the peer's `recv`).
  template <element_type T> [[nodiscard]] handle send(const T* data, std::size_t count, int peer) {
    check_rank("send", peer);
    return launch("send", count * sizeof(T),
                  [&] { return ncclSend(data, count, detail::nccl_type<T>(), peer, s_->comm, s_->stream); });
  }

  /// Receives `count` elements from `peer`.
  template <element_type T> [[nodiscard]] handle recv(T* data, std::size_t count, int peer) {
    check_rank("recv", peer);
    return launch("recv", count * sizeof(T),
                  [&] { return ncclRecv(data, count, detail::nccl_type<T>(), peer, s_->comm, s_->stream); });
  }

  /// recv[p*count, (p+1)*count) = send[rank*count, ...) of rank p: one grouped send/recv per peer.
  template <element_type T> [[nodiscard]] handle all_to_all(const T* send, T* recv, std::size_t count_per_peer) {
    agree<T>(5, count_per_peer, 0);
    return launch("all_to_all", count_per_peer * sizeof(T) * static_cast<std::size_t>(s_->size), [&] {
      ncclResult_t r = ncclGroupStart();
      for (int p = 0; p < s_->size && (r == ncclSuccess || r == ncclInProgress); ++p) {
        const std::size_t off = static_cast<std::size_t>(p) * count_per_peer;
        r = ncclSend(send + off, count_per_peer, detail::nccl_type<T>(), p, s_->comm, s_->stream);
        if (r == ncclSuccess || r == ncclInProgress) {
          r = ncclRecv(recv + off, count_per_peer, detail::nccl_type<T>(), p, s_->comm, s_->stream);
        }
      }
      const ncclResult_t end = ncclGroupEnd();
      return (r == ncclSuccess || r == ncclInProgress) ? end : r;
    });
  }

  /// The communicator of the ranks that passed the same `color` (>= 0), ordered by (key, rank).
  /// Collective over the group. \throws usage_error for a negative color; nccl_error; timeout_error.
  [[nodiscard]] nccl_communicator split(int color, int key) {
    if (color < 0) {
      throw usage_error("nccl_communicator::split: color " + std::to_string(color) +
                        " is negative; every rank "
                        "needs a color >= 0 here");
    }
    live("split");
    cuda_call(cudaSetDevice(s_->device), "cudaSetDevice");
    auto child = std::make_shared<detail::nccl_state>();
    child->device = s_->device;
    child->name = s_->name + "/" + std::to_string(color);
    child->timeout = s_->timeout;
    child->group_failed = s_->group_failed;
    child->compute = s_->compute;
    child->check_matching = s_->check_matching;
    cuda_call(cudaStreamCreateWithFlags(&child->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    cuda_call(cudaEventCreateWithFlags(&child->produced, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    cuda_call(cudaMalloc(reinterpret_cast<void**>(&child->scratch), 256), "cudaMalloc");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = s_->blocking ? 1 : 0;
    s_->enter_call("split", 0);
    const ncclResult_t r = ncclCommSplit(s_->comm, color, key, &child->comm, &config);
    if (s_->leave_call()) {
      throw timeout_error(s_->reason());
    }
    detail::check_nccl(r, "ncclCommSplit", s_->comm);
    s_->settle("split", 0);
    child->blocking = s_->blocking;
    if (child->comm == nullptr) {
      throw nccl_error("nccl_communicator::split: NCCL returned no communicator");
    }
    child->settle("split (new communicator)", 0);
    detail::check_nccl(ncclCommUserRank(child->comm, &child->rank), "ncclCommUserRank", child->comm);
    detail::check_nccl(ncclCommCount(child->comm, &child->size), "ncclCommCount", child->comm);
    child->start_watchdog();
    return nccl_communicator(std::move(child));
  }

private:
  explicit nccl_communicator(std::shared_ptr<detail::nccl_state> s) : s_(std::move(s)) {}

  static void cuda_call(cudaError_t st, const std::string& what) {
    if (st != cudaSuccess) {
      (void)cudaGetLastError();
      throw cuda_error("nccl_communicator: " + what + " failed: " + cudaGetErrorString(st), static_cast<int>(st));
    }
  }

  void live(const char* op) const {
    if (s_->aborted.load()) {
      throw comm_error(std::string(op) + " on group \"" + s_->name + "\" at rank " + std::to_string(s_->rank) +
                       ": the communicator was aborted earlier (" + s_->reason() + ")");
    }
  }

  void check_rank(const char* op, int r) const {
    if (r < 0 || r >= s_->size) {
      throw usage_error(std::string(op) + ": rank " + std::to_string(r) + " is outside group \"" + s_->name +
                        "\" of size " + std::to_string(s_->size));
    }
  }

  template <class T> static void check_op(const char* op, reduce_op r) {
    if (r == reduce_op::avg && !(std::is_floating_point_v<T> || is_half_v<T>)) {
      throw usage_error(std::string(op) + ": reduce_op::avg needs a floating element type");
    }
  }

  /// With check_matching: all-gathers this rank's description of the collective it is about to start
  /// (`kind` indexes detail::op_names) and waits for every rank's on the host; throws comm_error naming
  /// each rank's call when they differ (see "Matching" in the file comment). Otherwise nothing.
  template <class T> void agree(std::int64_t kind, std::size_t count, std::int64_t extra) {
    if (!s_->check_matching) {
      return;
    }
    auto& s = *s_;
    const auto n = static_cast<std::size_t>(s.size);
    constexpr std::size_t words = detail::op_signature_fields;
    if (s.signatures == nullptr) {
      cuda_call(cudaMalloc(reinterpret_cast<void**>(&s.signatures), n * words * sizeof(std::int64_t)),
                "cudaMalloc (collective signatures)");
    }
    const std::uint64_t number = s.next_op++;
    const detail::op_signature mine{kind, static_cast<std::int64_t>(count), static_cast<std::int64_t>(dtype_v<T>),
                                    extra};
    std::int64_t* slot = s.signatures + static_cast<std::size_t>(s.rank) * words;
    // From pageable memory: the copy has taken `mine` when the call returns.
    cuda_call(cudaMemcpyAsync(slot, &mine, sizeof(mine), cudaMemcpyHostToDevice, s.stream),
              "cudaMemcpyAsync (collective signature)");
    handle exchange = launch("match check", n * sizeof(mine),
                             [&] { return ncclAllGather(slot, s.signatures, words, ncclInt64, s.comm, s.stream); });
    exchange.wait(); // bounded by the timeout like any operation
    std::vector<detail::op_signature> all(n);
    cuda_call(cudaMemcpyAsync(all.data(), s.signatures, n * sizeof(mine), cudaMemcpyDeviceToHost, s.stream),
              "cudaMemcpyAsync (collective signatures)");
    cuda_call(cudaStreamSynchronize(s.stream), "cudaStreamSynchronize (collective signatures)");
    if (const std::string calls = detail::mismatched_calls(all); !calls.empty()) {
      throw comm_error("operation #" + std::to_string(number) + " does not match across ranks: " + calls +
                       " (group \"" + s.name + "\"; nothing was started)");
    }
  }

  /// Orders the communication stream after the compute stream, enqueues the NCCL call, records its
  /// completion event.
  template <class Call> handle launch(const char* op, std::size_t bytes, Call&& call) {
    live(op);
    auto& s = *s_;
    if (s.compute != nullptr) {
      cuda_call(cudaEventRecord(s.produced, s.compute), std::string(op) + ": cudaEventRecord");
      cuda_call(cudaStreamWaitEvent(s.stream, s.produced, 0), std::string(op) + ": cudaStreamWaitEvent");
    }
    s.enter_call(op, bytes);
    const ncclResult_t r = call();
    if (s.leave_call()) {
      throw timeout_error(s.reason());
    }
    if (r != ncclSuccess && r != ncclInProgress) {
      s.fail_nccl(op, bytes, r);
    }
    if (r == ncclInProgress) {
      s.settle(op, bytes);
    }
    cudaEvent_t done = s.take_event();
    const cudaError_t st = cudaEventRecord(done, s.stream);
    if (st != cudaSuccess) {
      s.give_event(done);
      cuda_call(st, std::string(op) + ": cudaEventRecord");
    }
    return handle(s_, done, op, bytes);
  }

  std::shared_ptr<detail::nccl_state> s_;
};

static_assert(full_communicator<nccl_communicator>);

/// Runs `fn(nccl_communicator&)` on `n` threads, thread i on CUDA device i as rank i of one NCCL group,
/// and returns when all are done. The first exception of any rank is rethrown here (after every thread
/// ended); the other ranks' pending waits are aborted at once rather than at their timeout.
/// \throws usage_error when fewer than `n` devices are visible.
template <class F> void run_gpus(int n, F&& fn, nccl_options opt = {}) {
  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess) {
    (void)cudaGetLastError();
    visible = 0;
  }
  if (n < 1 || n > visible) {
    throw usage_error("run_gpus: asked for " + std::to_string(n) + " GPUs, " + std::to_string(visible) +
                      " are visible");
  }
  const ncclUniqueId id = nccl_communicator::make_unique_id();
  if (!opt.group_failed) {
    opt.group_failed = std::make_shared<std::atomic<bool>>(false);
  }
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        nccl_communicator comm(r, n, id, r, opt);
        fn(comm);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        opt.group_failed->store(true);
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  // Prefer the root cause: a failure that is not "another rank failed".
  std::exception_ptr first;
  for (const auto& e : errors) {
    if (!e) {
      continue;
    }
    try {
      std::rethrow_exception(e);
    } catch (const comm_error&) {
      if (!first) {
        first = e;
      }
      continue;
    } catch (...) {
      std::rethrow_exception(e);
    }
  }
  if (first) {
    std::rethrow_exception(first);
  }
}

} // namespace zero
