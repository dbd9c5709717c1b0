// Collective benchmark, nccl-tests style:
//   bazel run //comm:bench -- --backend=ucx --nproc-per-node=2 [--json]
//   bazel run //comm:bench -- --backend=nccl [--nproc-per-node=<GPUs>]
// (nccl: buffers on each rank's GPU; the reference is a device-to-device
// cudaMemcpy and raw MPI is not timed.)
// Prints, per op, size / time / algbw / busbw (busbw = algbw x 2(n-1)/n for
// all-reduce, x (n-1)/n for all-gather, reduce-scatter and all-to-all, x 1
// for send/recv) and, in the same run, raw MPI_Allreduce and MPI_Alltoall
// (when MPI is linked: the ranks are then started by mpirun) and a memcpy of
// the same bytes as references.
// Not a test: numbers from a loaded machine mean little.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "comm/backends.h"
#include "comm/launch/flags.h"
#include "comm/launch/launcher.h"
#include "comm/launch/run_ranks.h"
#include "comm/store/auth.h"
#include "core/tensor.h"
#ifdef LOOM_COMM_HAVE_MPI
#include <mpi.h>
#endif
#ifdef LOOM_COMM_HAVE_NCCL
#include "comm/nccl/device_memory.h"
#endif

ABSL_FLAG(bool, json, false, "Print JSON records instead of tables.");
ABSL_FLAG(int64_t, min_bytes, 4, "Smallest message (bytes).");
ABSL_FLAG(int64_t, max_bytes, 64 << 20, "Largest message (bytes).");
ABSL_FLAG(int, step, 4, "Size multiplier between rows.");
ABSL_FLAG(std::string, launcher, "auto",
          "auto (mpirun when MPI is linked, else the built-in launcher), mpirun or builtin.");
ABSL_FLAG(int, rounds, 3,
          "Timed rounds per size; the fastest is reported (the machine may be shared).");
ABSL_FLAG(std::string, ops, "all_reduce,all_gather,reduce_scatter,all_to_all,send_recv",
          "Ops to run (all_to_all: also all_to_all_v with equal counts).");

namespace loom::comm {
namespace {

using core::DType;
using core::Tensor;

struct Row {
  std::string op;
  int64_t bytes;
  double time_us;
  double algbw;  // GB/s
  double busbw;  // GB/s
};

int Iters(int64_t bytes) {
  return static_cast<int>(std::clamp<int64_t>((int64_t{256} << 20) / std::max<int64_t>(bytes, 8192), 5, 1000));
}

void Check(const absl::Status& s);

// Buffers live where the communicator moves memory: host, or its GPU (nccl).
Tensor Alloc(const Communicator& c, int64_t n, DType d) {
  if (c.device().is_cpu()) return *Tensor::Empty({n}, d);
#ifdef LOOM_COMM_HAVE_NCCL
  absl::StatusOr<Tensor> t = nccl::EmptyOnDevice({n}, d, c.device());
  Check(t.status());
  return *t;
#else
  std::cerr << "bench: " << c.backend_name() << " moves " << c.device().ToString()
            << " memory, but no device support was built in" << std::endl;
  std::exit(1);
#endif
}

// Host <-> the communicator's memory.
void Put(const Tensor& dst, const void* src, size_t bytes) {
  if (dst.device().is_cpu()) {
    std::memcpy(dst.raw_data(), src, bytes);
    return;
  }
#ifdef LOOM_COMM_HAVE_NCCL
  Check(nccl::CopyBytes(dst.raw_data(), src, bytes, /*to_device=*/true, dst.device().index));
#endif
}
void Get(void* dst, const Tensor& src, size_t bytes) {
  if (src.device().is_cpu()) {
    std::memcpy(dst, src.raw_data(), bytes);
    return;
  }
#ifdef LOOM_COMM_HAVE_NCCL
  Check(nccl::CopyBytes(dst, src.raw_data(), bytes, /*to_device=*/false, src.device().index));
#endif
}

// The memcpy reference: within the buffers' memory.
void CopyRef(const Tensor& dst, const Tensor& src, size_t bytes) {
  if (src.device().is_cpu()) {
    std::memcpy(dst.raw_data(), src.raw_data(), bytes);
    return;
  }
#ifdef LOOM_COMM_HAVE_NCCL
  Check(nccl::CopyWithinDevice(dst.raw_data(), src.raw_data(), bytes, src.device().index));
#endif
}

double MaxOverRanks(Communicator& c, double v) {
  Tensor t = Alloc(c, 1, DType::kF64);
  Put(t, &v, sizeof(v));
  absl::Status s = c.AllReduce(t, ReduceOp::kMax)->Wait();
  if (!s.ok()) {
    std::cerr << s << std::endl;
    std::exit(1);
  }
  Get(&v, t, sizeof(v));
  return v;
}

// Times `iters` blocking calls of each op (after warm-up), the ops taking
// turns round by round so that all of them see the same machine: on a
// shared VM the cost of a cache line moving between the ranks' vCPUs
// changes for seconds at a time (2x on 4-byte all-reduces here), and timing
// one op's rounds after the other's compared different machines. Seconds per
// call, slowest rank, best round of each.
std::vector<double> TimeInTurns(Communicator& c, int iters,
                                const std::vector<std::function<void()>>& ops) {
  for (const auto& op : ops) {
    for (int i = 0; i < 3; ++i) op();
  }
  std::vector<double> best(ops.size(), 1e30);
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (size_t k = 0; k < ops.size(); ++k) {
      c.Barrier()->Wait().IgnoreError();
      absl::Time t0 = absl::Now();
      for (int i = 0; i < iters; ++i) ops[k]();
      double dt = absl::ToDoubleSeconds(absl::Now() - t0) / iters;
      best[k] = std::min(best[k], MaxOverRanks(c, dt));
    }
  }
  return best;
}

template <typename F>
double Time(Communicator& c, int iters, F op) {
  return TimeInTurns(c, iters, {op})[0];
}

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::cerr << "bench: " << s << std::endl;
    std::exit(1);
  }
}

void RunBench(Communicator& c, const launch::CommFlags& flags, bool have_mpi) {
  const bool json = absl::GetFlag(FLAGS_json);
  const int n = c.size(), r = c.rank();
  const bool root = r == 0;
  std::vector<int64_t> sizes;
  for (int64_t b = absl::GetFlag(FLAGS_min_bytes); b <= absl::GetFlag(FLAGS_max_bytes);
       b *= absl::GetFlag(FLAGS_step)) {
    sizes.push_back(b);
  }
  const std::string ops = absl::GetFlag(FLAGS_ops);
  std::vector<Row> rows;
  const int64_t max_count = sizes.back() / 4;
  Tensor a = Alloc(c, max_count * n, DType::kF32);
  Tensor b = Alloc(c, max_count * n, DType::kF32);
  {
    std::vector<float> ones(max_count * n, 1.0f), zeros(max_count * n, 0.0f);
    Put(a, ones.data(), a.nbytes());
    Put(b, zeros.data(), b.nbytes());
  }
  // Raw MPI is timed on host buffers only (MPI here is not CUDA-aware).
  if (!c.device().is_cpu()) have_mpi = false;
  const double ar_factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;
  const double ag_factor = n > 1 ? 1.0 * (n - 1) / n : 1.0;

  for (int64_t bytes : sizes) {
    const int64_t count = bytes / 4;
    if (count == 0) continue;
    const int iters = Iters(bytes);
    Tensor in = *a.View(0, {count});
    Tensor out = *b.View(0, {count});
    auto add = [&](const std::string& op, double secs, double factor) {
      double algbw = bytes / secs / 1e9;
      rows.push_back({op, bytes, secs * 1e6, algbw, algbw * factor});
    };
    if (ops.find("all_reduce") != std::string::npos) {
      // Ours and its references in turns (see TimeInTurns).
      std::vector<std::function<void()>> turns = {
          [&] { Check(c.AllReduce(in, out, ReduceOp::kSum)->Wait()); },
          [&] { CopyRef(out, in, bytes); }};
#ifdef LOOM_COMM_HAVE_MPI
      if (have_mpi) {
        turns.push_back([&] {
          MPI_Allreduce(in.raw_data(), out.raw_data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                        MPI_COMM_WORLD);
        });
      }
#endif
      const std::vector<double> t = TimeInTurns(c, iters, turns);
      add("all_reduce", t[0], ar_factor);
      if (t.size() > 2) add("mpi_allreduce(raw)", t[2], ar_factor);
      add(c.device().is_cpu() ? "memcpy(ref)" : "cudaMemcpy D2D(ref)", t[1], 1.0);
    }
    if (ops.find("all_gather") != std::string::npos && count % n == 0) {
      // nccl-tests convention: size = the gathered output.
      Tensor gin = *a.View(0, {count / n});
      add("all_gather", Time(c, iters, [&] { Check(c.AllGather(gin, out)->Wait()); }), ag_factor);
    }
    if (ops.find("reduce_scatter") != std::string::npos && count % n == 0) {
      Tensor rout = *b.View(0, {count / n});
      add("reduce_scatter",
          Time(c, iters, [&] { Check(c.ReduceScatter(in, rout, ReduceOp::kSum)->Wait()); }),
          ag_factor);
    }
    if (ops.find("all_to_all") != std::string::npos && count % n == 0) {
      // nccl-tests convention: size = one rank's whole input (size / n per
      // peer); busbw = algbw x (n-1)/n. Ours, per-peer counts (equal here)
      // and raw MPI_Alltoall in turns.
      const std::vector<int64_t> per_peer(n, count / n);
      std::vector<std::function<void()>> turns = {
          [&] { Check(c.AllToAll(in, out)->Wait()); },
          [&] { Check(c.AllToAllV(in, per_peer, out, per_peer)->Wait()); }};
#ifdef LOOM_COMM_HAVE_MPI
      if (have_mpi) {
        turns.push_back([&] {
          MPI_Alltoall(in.raw_data(), static_cast<int>(count / n), MPI_FLOAT, out.raw_data(),
                       static_cast<int>(count / n), MPI_FLOAT, MPI_COMM_WORLD);
        });
      }
#endif
      const std::vector<double> t = TimeInTurns(c, iters, turns);
      add("all_to_all", t[0], ag_factor);
      add("all_to_all_v", t[1], ag_factor);
      if (t.size() > 2) add("mpi_alltoall(raw)", t[2], ag_factor);
    }
    if (ops.find("send_recv") != std::string::npos && n > 1) {
      const int right = (r + 1) % n, left = (r + n - 1) % n;
      add("send_recv", Time(c, iters, [&] {
            Check(c.BatchSendRecv({{P2POp::Kind::kSend, in, right, 0},
                                   {P2POp::Kind::kRecv, out, left, 0}})
                      ->Wait());
          }), 1.0);
    }
  }

  if (root) {
    if (json) {
      std::cout << "[\n";
      for (size_t i = 0; i < rows.size(); ++i) {
        const Row& x = rows[i];
        std::cout << absl::StrFormat(
            "  {\"backend\": \"%s\", \"ranks\": %d, \"op\": \"%s\", \"bytes\": %d, "
            "\"time_us\": %.3f, \"algbw_GBps\": %.4f, \"busbw_GBps\": %.4f}%s\n",
            flags.backend, n, x.op, x.bytes, x.time_us, x.algbw, x.busbw,
            i + 1 < rows.size() ? "," : "");
      }
      std::cout << "]" << std::endl;
    } else {
      std::cout << absl::StrFormat("# comm bench: backend %s, %d ranks, f32, sum; time = slowest "
                                   "rank's mean, best of %d rounds; raw MPI: %s\n",
                                   flags.backend, n, absl::GetFlag(FLAGS_rounds), have_mpi ? "yes" : "no (not under mpirun)");
      std::vector<std::string> names;
      for (const Row& x : rows) {
        if (std::find(names.begin(), names.end(), x.op) == names.end()) names.push_back(x.op);
      }
      for (const std::string& op : names) {
        std::cout << absl::StrFormat("#\n# %-20s %12s %12s %12s %12s\n", op, "size(B)", "time(us)",
                                     "algbw(GB/s)", "busbw(GB/s)");
        for (const Row& x : rows) {
          if (x.op != op) continue;
          std::cout << absl::StrFormat("  %-20s %12d %12.2f %12.3f %12.3f\n", "", x.bytes,
                                       x.time_us, x.algbw, x.busbw);
        }
      }
      // Ours vs raw MPI, timed in the same turns.
      if (have_mpi) {
        struct VsMpi {
          const char* ours;
          const char* raw;   // its row
          const char* call;  // the MPI call timed
        };
        const VsMpi vs_mpi[] = {{"all_reduce", "mpi_allreduce(raw)", "MPI_Allreduce"},
                                {"all_to_all", "mpi_alltoall(raw)", "MPI_Alltoall"},
                                {"all_to_all_v", "mpi_alltoall(raw)", "MPI_Alltoall"}};
        for (const auto& [ours, raw, call] : vs_mpi) {
          if (std::none_of(rows.begin(), rows.end(), [&](const Row& x) { return x.op == ours; })) {
            continue;
          }
          std::cout << absl::StrFormat(
              "#\n# %s vs raw %s (%s backend)\n# %12s %14s %14s %10s %12s\n", ours, call,
              flags.backend, "size(B)", "ours busbw", "MPI busbw", "ratio", "lat ratio");
          for (const Row& x : rows) {
            if (x.op != ours) continue;
            for (const Row& m : rows) {
              if (m.op == raw && m.bytes == x.bytes) {
                std::cout << absl::StrFormat("  %12d %14.3f %14.3f %10.2f %12.2f\n", x.bytes,
                                             x.busbw, m.busbw, x.busbw / m.busbw,
                                             x.time_us / m.time_us);
              }
            }
          }
        }
      }
    }
  }
  Check(c.Barrier()->Wait());
}

std::string SelfPath() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string("/proc/self/exe");
}

int Main(int argc, char** argv) {
  std::vector<std::string> original(argv, argv + argc);
  launch::ParseFlags(argc, argv, "comm collective benchmark");
  launch::CommFlags flags = launch::GetCommFlags();
  // Started by mpirun (comm/launch is the only reader of launcher variables).
  const absl::StatusOr<launch::RankInfo> started = launch::DiscoverRank(flags.rank);
  const bool under_mpirun = started.ok() && started->from == launch::RankSource::kOpenMpi;
  std::string launcher = absl::GetFlag(FLAGS_launcher);
#ifdef LOOM_COMM_HAVE_MPI
  if (launcher == "auto") launcher = "mpirun";
#else
  if (launcher == "auto") launcher = "builtin";
#endif
  // The ranks run under mpirun so the raw MPI reference runs beside ours.
  if (launcher == "mpirun" && flags.nproc_per_node > 1 && flags.backend != "local" &&
      !under_mpirun && !launch::IsLaunchedChild()) {
    auto port = launch::PickFreePort();
    Check(port.status());
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", absl::StrCat(*port).c_str(), 1);
    // mpirun's ranks meet in the TCP store (ucx, nccl): one secret for all.
    absl::StatusOr<std::string> secret = flags.rendezvous_secret;
    if (secret->empty()) secret = MakeRendezvousSecret();
    Check(secret.status());
    setenv("LOOM_RENDEZVOUS_SECRET", secret->c_str(), 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    std::vector<std::string> args = {"mpirun", "-np", absl::StrCat(flags.nproc_per_node),
                                      "--oversubscribe", "--bind-to", "none",
                                      "--mca", "plm_rsh_agent", "false",
                                      "-x", "MASTER_ADDR", "-x", "MASTER_PORT",
                                      "-x", "LOOM_RENDEZVOUS_SECRET",
                                      SelfPath()};
    // The comm flags are re-read from the original argv (without --nproc-per-node).
    for (size_t i = 1; i < original.size(); ++i) {
      if (original[i].find("nproc") == std::string::npos) args.push_back(original[i]);
    }
    std::vector<char*> cargs;
    for (auto& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    execvp("mpirun", cargs.data());
    std::cerr << "bench: cannot exec mpirun (" << std::strerror(errno)
              << "); use --launcher=builtin" << std::endl;
    return 1;
  }
  // Otherwise the built-in agent, the local backend's threads, or this rank.
  [[maybe_unused]] bool we_init_mpi = false;
  const launch::RanksOutcome out = launch::RunRanks(
      flags, {}, argc, argv, [&](Communicator& c, const launch::RankContext&) {
        bool have_mpi = false;
#ifdef LOOM_COMM_HAVE_MPI
        if (under_mpirun && flags.backend != "local") {
          int inited = 0;
          MPI_Initialized(&inited);
          if (!inited) {
            int provided;
            MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
            we_init_mpi = true;
          }
          have_mpi = true;
        }
#endif
        RunBench(c, flags, have_mpi);
        return absl::OkStatus();
      });
#ifdef LOOM_COMM_HAVE_MPI
  if (we_init_mpi) MPI_Finalize();  // after the world is gone
#endif
  if (!out.status.ok()) std::cerr << "bench: " << out.status << std::endl;
  return out.ExitCode();
}

}  // namespace
}  // namespace loom::comm

int main(int argc, char** argv) { return loom::comm::Main(argc, argv); }
