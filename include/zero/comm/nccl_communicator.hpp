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
///
/// Buffers are device memory of this rank's device (or memory CUDA maps there), owned by the caller, who
/// must not touch them until `wait()` on the operation's handle returned; they follow the table of
/// zero/comm/communicator.hpp (NCCL's rules, in-place forms included). Counts are elements per rank.
///
/// The pieces: zero/comm/nccl_check.hpp (`ZERO_CHECK_NCCL`), zero/comm/detail/nccl_state.hpp (the state
/// shared with the handles, and the watchdog), zero/comm/detail/tcp_rendezvous.hpp (the rendezvous of
/// `from_env`).

#include "zero/comm/communicator.hpp"
#include "zero/comm/detail/nccl_state.hpp"
#include "zero/comm/detail/tcp_rendezvous.hpp"
#include "zero/comm/nccl_check.hpp"
#include "zero/comm/nccl_handle.hpp"
#include "zero/core/cuda_check.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"
#include "zero/core/source_location.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cuda_runtime_api.h>
#include <exception>
#include <memory>
#include <nccl.h>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
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

/// The communicator over NCCL; see the file comment. A cheap movable handle to shared state.
class nccl_communicator {
public:
  /// An operation in flight (zero/comm/nccl_handle.hpp): `wait()` blocks the host until it is complete.
  using handle = nccl_handle;

  /// A fresh NCCL unique id, to share among the ranks of one group (thread-per-GPU start).
  /// \returns the id; pass the same one to the constructor of every rank.
  /// \throws nccl_error when NCCL fails (no network interface NCCL can use, for one).
  [[nodiscard]] static ncclUniqueId make_unique_id() {
    ncclUniqueId id;
    ZERO_CHECK_NCCL(ncclGetUniqueId(&id));
    return id;
  }

  /// Joins the group `id` as `rank` of `size`, on CUDA device `device` (made current for the calling
  /// thread). Collective: every rank must call it with the same id and size. Start-up is bounded by
  /// `opt.timeout`; the communicator then owns a communication stream on `device`.
  /// \param rank   this rank, 0 <= rank < size.
  /// \param size   ranks in the group, >= 1.
  /// \param id     from `make_unique_id()` on one rank, the same on every rank.
  /// \param device the CUDA device of this rank.
  /// \param opt    name, timeout, shared failure flag and matching checks (see `nccl_options`).
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
    if (const cudaError_t st = cudaSetDevice(device); st != cudaSuccess) {
      detail::throw_cuda_error(st, ("cudaSetDevice(" + std::to_string(device) + ")").c_str(),
                               detail::source_location::current());
    }
    ZERO_CHECK_CUDA(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    ZERO_CHECK_CUDA(cudaEventCreateWithFlags(&s.produced, cudaEventDisableTiming));
    ZERO_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&s.scratch), 256));
    // Start-up on a non-blocking communicator, so a rank that never arrives is a timeout here, not a hang.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ZERO_CHECK_NCCL(ncclCommInitRankConfig(&s.comm, size, id, rank, &config));
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
  /// \param opt name, timeout (which also bounds the rendezvous), shared failure flag and matching checks.
  /// \returns this process's communicator, on device LOCAL_RANK.
  /// \throws config_error naming a missing or malformed variable, or a MASTER_ADDR that does not resolve;
  ///         comm_error when rank 0 cannot listen on any rendezvous port or two processes claim one rank;
  ///         timeout_error when a rank does not arrive; what the (rank, size, id, device) constructor throws.
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

  /// Moves the group; `other` must not be used afterwards (except to be assigned or destroyed).
  nccl_communicator(nccl_communicator&& other) noexcept = default;
  /// Lets go of this group (freed with its last handle) and takes `other`'s.
  nccl_communicator& operator=(nccl_communicator&& other) noexcept = default;
  /// Not copyable: copies would share one communication stream with no clear owner.
  nccl_communicator(const nccl_communicator&) = delete;
  /// Not copyable, as above.
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  /// Lets go of the group. The last owner of the state (this or a handle) stops the watchdog and destroys
  /// the NCCL communicator, aborting it instead when operations are still pending; never throws.
  ~nccl_communicator() = default;

  /// \returns this process's rank in the group, 0 <= rank() < size().
  [[nodiscard]] int rank() const noexcept { return s_->rank; }
  /// \returns the number of ranks in the group.
  [[nodiscard]] int size() const noexcept { return s_->size; }
  /// \returns the group's name in messages ("world", or "<parent>/<color>" for a split).
  [[nodiscard]] std::string_view name() const noexcept { return s_->name; }
  /// \returns the CUDA device of this rank.
  [[nodiscard]] int device() const noexcept { return s_->device; }
  /// \returns how long a wait (or a call blocked inside NCCL) may take before the communicator is aborted.
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return s_->timeout; }
  /// Sets the timeout of later waits and NCCL calls.
  /// \param t the new timeout.
  void set_timeout(std::chrono::milliseconds t) noexcept { s_->timeout = t; }
  /// \returns the NCCL communicator, owned by this object; do not destroy or abort it.
  [[nodiscard]] ncclComm_t native() const noexcept { return s_->comm; }
  /// \returns the communication stream the operations run on, owned by this object.
  [[nodiscard]] cudaStream_t stream() const noexcept { return s_->stream; }
  /// \returns true once the communicator was aborted (a failure or a timeout); every later operation
  ///          throws comm_error.
  [[nodiscard]] bool aborted() const noexcept { return s_->aborted.load(); }

  /// Orders every later operation after the work enqueued on `s` at its call (see the file comment).
  /// \param s the stream the data is produced and consumed on, not owned; null: none (the caller
  ///          synchronizes its producers itself).
  void set_compute_stream(cudaStream_t s) noexcept { s_->compute = s; }
  /// \returns the stream set by `set_compute_stream`, or null.
  [[nodiscard]] cudaStream_t compute_stream() const noexcept { return s_->compute; }

  /// Starts an all-reduce: every rank's `recv` gets the element-wise `op` over all ranks' `send`.
  /// \param send  `count` elements on this rank's device.
  /// \param recv  `count` elements written; `recv == send` runs in place.
  /// \param count elements per rank.
  /// \param op    sum, avg (floating types only) or max.
  /// \returns the handle to wait on.
  /// \throws usage_error (avg of an integer type); comm_error (aborted communicator, or the ranks'
  ///         calls differ when matching is checked); nccl_error; timeout_error (a call blocked inside NCCL).
  template <element_type T> [[nodiscard]] handle all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    check_op<T>("all_reduce", op);
    agree<T>(0, count, static_cast<std::int64_t>(op));
    return launch("all_reduce", count * sizeof(T), [&] {
      return alone_in_place(send, recv)
                 ? ncclSuccess
                 : ncclAllReduce(send, recv, count, detail::nccl_type<T>(), detail::nccl_op(op), s_->comm, s_->stream);
    });
  }

  /// Starts a reduce-scatter: rank r's `recv` gets the element-wise `op` over all ranks' block r of `send`
  /// (elements [r*recv_count, (r+1)*recv_count)).
  /// \param send       size()*recv_count elements.
  /// \param recv       recv_count elements written; `recv == send + rank()*recv_count` runs in place.
  /// \param recv_count elements per rank.
  /// \param op         as for all_reduce.
  /// \returns the handle to wait on. \throws as all_reduce.
  template <element_type T>
  [[nodiscard]] handle reduce_scatter(const T* send, T* recv, std::size_t recv_count, reduce_op op) {
    check_op<T>("reduce_scatter", op);
    agree<T>(1, recv_count, static_cast<std::int64_t>(op));
    return launch("reduce_scatter", recv_count * sizeof(T) * static_cast<std::size_t>(s_->size), [&] {
      return alone_in_place(send, recv) ? ncclSuccess
                                        : ncclReduceScatter(send, recv, recv_count, detail::nccl_type<T>(),
                                                            detail::nccl_op(op), s_->comm, s_->stream);
    });
  }

  /// Starts an all-gather: block r of every rank's `recv` (elements [r*send_count, (r+1)*send_count))
  /// gets rank r's `send`.
  /// \param send       send_count elements.
  /// \param recv       size()*send_count elements written; `send == recv + rank()*send_count` runs in place.
  /// \param send_count elements per rank.
  /// \returns the handle to wait on. \throws comm_error, nccl_error, timeout_error as all_reduce.
  template <element_type T> [[nodiscard]] handle all_gather(const T* send, T* recv, std::size_t send_count) {
    agree<T>(2, send_count, 0);
    return launch("all_gather", send_count * sizeof(T) * static_cast<std::size_t>(s_->size), [&] {
      return alone_in_place(send, recv)
                 ? ncclSuccess
                 : ncclAllGather(send, recv, send_count, detail::nccl_type<T>(), s_->comm, s_->stream);
    });
  }

  /// Starts a broadcast: every rank's `recv` gets root's `send`.
  /// \param send  count elements on root; ignored elsewhere.
  /// \param recv  count elements written on every rank, root included; `recv == send` runs in place.
  /// \param count elements.
  /// \param root  the rank that sends, 0 <= root < size().
  /// \returns the handle to wait on.
  /// \throws usage_error for a root outside the group; comm_error, nccl_error, timeout_error as all_reduce.
  template <element_type T> [[nodiscard]] handle broadcast(const T* send, T* recv, std::size_t count, int root) {
    check_rank("broadcast", root);
    agree<T>(3, count, root);
    return launch("broadcast", count * sizeof(T), [&] {
      return alone_in_place(send, recv)
                 ? ncclSuccess
                 : ncclBroadcast(send, recv, count, detail::nccl_type<T>(), root, s_->comm, s_->stream);
    });
  }

  /// Starts a barrier: a one-word all-reduce on the device, so `wait()` returns once every rank has
  /// reached it.
  /// \returns the handle to wait on. \throws comm_error, nccl_error, timeout_error as all_reduce.
  [[nodiscard]] handle barrier() {
    agree<std::uint8_t>(4, 0, 0);
    return launch("barrier", sizeof(int),
                  [&] { return ncclAllReduce(s_->scratch, s_->scratch, 1, ncclInt32, ncclSum, s_->comm, s_->stream); });
  }

  /// Starts sending `count` elements to `peer`, which must post a matching `recv` (not checked against
  /// the other ranks, even with matching on).
  /// \param data  count elements, read until the operation completes.
  /// \param count elements.
  /// \param peer  the receiving rank, 0 <= peer < size().
  /// \returns the handle to wait on.
  /// \throws usage_error for a peer outside the group; comm_error (aborted communicator); nccl_error;
  ///         timeout_error.
  template <element_type T> [[nodiscard]] handle send(const T* data, std::size_t count, int peer) {
    check_rank("send", peer);
    return launch("send", count * sizeof(T),
                  [&] { return ncclSend(data, count, detail::nccl_type<T>(), peer, s_->comm, s_->stream); });
  }

  /// Starts receiving `count` elements from `peer`'s matching `send`.
  /// \param data  count elements written.
  /// \param count elements; the sender must send exactly this many.
  /// \param peer  the sending rank, 0 <= peer < size().
  /// \returns the handle to wait on. \throws as send.
  template <element_type T> [[nodiscard]] handle recv(T* data, std::size_t count, int peer) {
    check_rank("recv", peer);
    return launch("recv", count * sizeof(T),
                  [&] { return ncclRecv(data, count, detail::nccl_type<T>(), peer, s_->comm, s_->stream); });
  }

  /// Starts an all-to-all, one grouped send/recv per peer: block p of this rank's `send` goes to rank p,
  /// and block p of `recv` comes from rank p.
  /// \param send           size()*count_per_peer elements.
  /// \param recv           size()*count_per_peer elements written; must not overlap `send`.
  /// \param count_per_peer elements per block.
  /// \returns the handle to wait on. \throws comm_error, nccl_error, timeout_error as all_reduce.
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

  /// Splits the group, collectively (`ncclCommSplit`): ranks that pass the same `color` form a new group,
  /// ordered by (key, old rank). The new communicator is named "<name()>/<color>", has its own
  /// communication stream and starts with this one's timeout, compute stream and matching setting.
  /// \param color the new group of this rank, >= 0.
  /// \param key   orders the ranks of the new group.
  /// \returns this rank's communicator of the new group.
  /// \throws usage_error for a negative color; comm_error (aborted communicator); cuda_error; nccl_error;
  ///         timeout_error.
  [[nodiscard]] nccl_communicator split(int color, int key) {
    if (color < 0) {
      throw usage_error("nccl_communicator::split: color " + std::to_string(color) +
                        " is negative; every rank "
                        "needs a color >= 0 here");
    }
    live("split");
    ZERO_CHECK_CUDA(cudaSetDevice(s_->device));
    auto child = std::make_shared<detail::nccl_state>();
    child->device = s_->device;
    child->name = s_->name + "/" + std::to_string(color);
    child->timeout = s_->timeout;
    child->group_failed = s_->group_failed;
    child->compute = s_->compute;
    child->check_matching = s_->check_matching;
    ZERO_CHECK_CUDA(cudaStreamCreateWithFlags(&child->stream, cudaStreamNonBlocking));
    ZERO_CHECK_CUDA(cudaEventCreateWithFlags(&child->produced, cudaEventDisableTiming));
    ZERO_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&child->scratch), 256));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = s_->blocking ? 1 : 0;
    s_->enter_call("split", 0);
    const ncclResult_t r = ncclCommSplit(s_->comm, color, key, &child->comm, &config);
    if (s_->leave_call()) {
      throw timeout_error(s_->reason());
    }
    detail::check_nccl(r, "ncclCommSplit", detail::source_location::current(), s_->comm);
    s_->settle("split", 0);
    child->blocking = s_->blocking;
    if (child->comm == nullptr) {
      throw nccl_error("nccl_communicator::split: NCCL returned no communicator");
    }
    child->settle("split (new communicator)", 0);
    ZERO_CHECK_NCCL(ncclCommUserRank(child->comm, &child->rank));
    ZERO_CHECK_NCCL(ncclCommCount(child->comm, &child->size));
    child->start_watchdog();
    return nccl_communicator(std::move(child));
  }

private:
  explicit nccl_communicator(std::shared_ptr<detail::nccl_state> s) : s_(std::move(s)) {}

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
      ZERO_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&s.signatures), n * words * sizeof(std::int64_t)));
    }
    const std::uint64_t number = s.next_op++;
    const detail::op_signature mine{kind, static_cast<std::int64_t>(count), static_cast<std::int64_t>(dtype_v<T>),
                                    extra};
    std::int64_t* slot = s.signatures + static_cast<std::size_t>(s.rank) * words;
    // From pageable memory: the copy has taken `mine` when the call returns.
    ZERO_CHECK_CUDA(cudaMemcpyAsync(slot, &mine, sizeof(mine), cudaMemcpyHostToDevice, s.stream));
    handle exchange = launch("match check", n * sizeof(mine),
                             [&] { return ncclAllGather(slot, s.signatures, words, ncclInt64, s.comm, s.stream); });
    exchange.wait(); // bounded by the timeout like any operation
    std::vector<detail::op_signature> all(n);
    ZERO_CHECK_CUDA(cudaMemcpyAsync(all.data(), s.signatures, n * sizeof(mine), cudaMemcpyDeviceToHost, s.stream));
    ZERO_CHECK_CUDA(cudaStreamSynchronize(s.stream));
    if (const std::string calls = detail::mismatched_calls(all); !calls.empty()) {
      throw comm_error("operation #" + std::to_string(number) + " does not match across ranks: " + calls +
                       " (group \"" + s.name + "\"; nothing was started)");
    }
  }

  /// A collective of one rank in place leaves its buffer as it is (a sum, average or maximum over one rank,
  /// a gather or broadcast of the rank's own block): no NCCL call, whose one-rank path still runs a kernel
  /// over every byte (the GPT d48's averaged gradients at stage 0: 12.5 GB of reads and writes a step).
  /// The handle is made as for any operation: ordered after the compute stream, completed by an event.
  [[nodiscard]] bool alone_in_place(const void* send, const void* recv) const noexcept {
    return s_->size == 1 && send == recv;
  }

  /// Orders the communication stream after the compute stream, enqueues the NCCL call, records its
  /// completion event.
  template <class Call> handle launch(const char* op, std::size_t bytes, Call&& call) {
    live(op);
    auto& s = *s_;
    if (s.compute != nullptr) {
      ZERO_CHECK_CUDA(cudaEventRecord(s.produced, s.compute));
      ZERO_CHECK_CUDA(cudaStreamWaitEvent(s.stream, s.produced, 0));
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
    if (const cudaError_t st = cudaEventRecord(done, s.stream); st != cudaSuccess) {
      s.give_event(done);
      detail::throw_cuda_error(st, "cudaEventRecord(done, s.stream)", detail::source_location::current());
    }
    return handle(s_, done, op, bytes);
  }

  std::shared_ptr<detail::nccl_state> s_;
};

static_assert(full_communicator<nccl_communicator>);

/// Runs `fn(nccl_communicator&)` on `n` threads, thread i on CUDA device i as rank i of one NCCL group,
/// and returns when all are done. The first exception of any rank is rethrown here (after every thread
/// ended); the other ranks' pending waits are aborted at once rather than at their timeout.
/// \param n   ranks, one per visible GPU, 1 <= n <= the number of visible devices.
/// \param fn  called once per rank with its communicator, on that rank's thread.
/// \param opt options of every rank's communicator; its `group_failed` flag is made when null.
/// \throws usage_error when fewer than `n` devices are visible; the root cause among the ranks'
///         exceptions (one that is not another rank's failure echoed as comm_error), else the first.
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
  detail::run_rank_threads(
      n,
      [&](int r) {
        nccl_communicator comm(r, n, id, r, opt);
        fn(comm);
      },
      [&] { opt.group_failed->store(true); });
}

} // namespace zero
