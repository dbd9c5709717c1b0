#include "comm/launch/agent.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "comm/launch/heartbeat.h"
#include "comm/launch/launcher.h"
#include "comm/launch/local_ranks.h"

extern char** environ;

namespace loom::comm::launch {
namespace {

volatile sig_atomic_t g_signal = 0;  // written by the handler only
void OnSignal(int sig) { g_signal = sig; }

// Installs the agent's handlers for its lifetime: SIGINT/SIGTERM are
// forwarded to the ranks, SIGUSR1 too (a flight recorder dump on demand).
class SignalScope {
 public:
  SignalScope() {
    struct sigaction sa {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
    sigaction(SIGUSR1, &sa, &old_usr1_);
    g_signal = 0;
  }
  ~SignalScope() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGUSR1, &old_usr1_, nullptr);
  }
  static int Take() {
    const int s = g_signal;
    g_signal = 0;
    return s;
  }

 private:
  struct sigaction old_int_ {}, old_term_{}, old_usr1_{};
};

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

// A failure as the agents exchange it. Severity orders root causes before
// their consequences: a rank killed by a signal or hung is what made the
// others' collectives fail (they exit 1 a moment later, maybe first).
struct Failure {
  int severity = 1;  // 3: killed by a signal, hung, lost a node; 2: a signal; 1: an exit status
  int64_t at_ns = 0;
  std::string text;
  std::string Encode() const { return absl::StrCat(severity, " ", at_ns, " ", text); }
  static Failure Decode(const std::string& s) {
    Failure f;
    std::vector<std::string> parts = absl::StrSplit(s, absl::MaxSplits(' ', 2));
    if (parts.size() == 3 && absl::SimpleAtoi(parts[0], &f.severity) &&
        absl::SimpleAtoi(parts[1], &f.at_ns)) {
      f.text = parts[2];
    } else {
      f.text = s;
    }
    return f;
  }
};

// Root cause first: the most severe, then the earliest.
bool Before(const Failure& a, const Failure& b) {
  if (a.severity != b.severity) return a.severity > b.severity;
  return a.at_ns < b.at_ns;
}

class Agent {
 public:
  Agent(const AgentOptions& o, Store& store, std::string store_host,
        std::vector<std::string> argv)
      : o_(o), store_(store), store_host_(std::move(store_host)), argv_(std::move(argv)) {}

  absl::Status Run() {
    SignalScope signals;
    absl::Status s = MakeHeartbeatPages();
    if (!s.ok()) return s;
    for (int attempt = 0;; ++attempt) {
      prefix_ = absl::StrCat("agent/a", attempt, "/");
      absl::StatusOr<int> port = Rendezvous();
      if (!port.ok()) return port.status();
      s = StartRanks(attempt, *port);
      if (!s.ok()) return s;
      Outcome out = Watch();
      if (out.kind == Outcome::kSucceeded) return Leave();
      if (out.kind == Outcome::kFatal) {
        ranks_.Stop(o_.kill_grace);
        return out.error;
      }
      // A failure, here or on another node: every node stops its ranks.
      StopRanksForRestart();
      absl::Status stopped = StopBarrier();
      if (!stopped.ok()) return stopped;
      const Failure root = RootCause(out.failure);
      const bool final = Exists(prefix_ + "final");
      if (final || attempt >= o_.max_restarts) {
        if (o_.max_restarts == 0 || final) {
          return absl::InternalError(absl::StrCat(root.text, "; stopped the other ranks"));
        }
        return absl::InternalError(absl::StrCat("the job failed again after ", attempt,
                                                " restart(s) (--max-restarts=", o_.max_restarts,
                                                "); last failure: ", root.text));
      }
      Log(absl::StrCat("restart ", attempt + 1, "/", o_.max_restarts, ": ", root.text,
                       "; starting every rank again from the newest checkpoint in --save"));
    }
  }

 private:
  struct Outcome {
    enum Kind { kSucceeded, kFailed, kFatal } kind = kFailed;
    Failure failure;     // kFailed: what this agent saw (text empty: another node's)
    absl::Status error;  // kFatal
  };

  void Log(const std::string& line) const {
    const std::string text =
        o_.nnodes > 1 ? absl::StrCat("loom agent (node ", o_.node_rank, ", ", host_, "): ", line)
                      : absl::StrCat("loom agent: ", line);
    if (o_.log) {
      o_.log(text);
    } else {
      std::fprintf(stderr, "%s\n", text.c_str());
      std::fflush(stderr);
    }
  }

  // "rank 3 (pid 123)" plus the node where there are several.
  std::string RankName(int local, pid_t pid) const {
    if (o_.ranks_as_threads) {
      return absl::StrCat("the ranks' process (pid ", pid, ", ", o_.nproc_per_node,
                          " ranks as threads)");
    }
    std::string s = absl::StrCat("rank ", o_.node_rank * o_.nproc_per_node + local, " (pid ",
                                 pid, ")");
    if (o_.nnodes > 1) absl::StrAppend(&s, " on node ", o_.node_rank, " (", host_, ")");
    return s;
  }

  int Processes() const { return o_.ranks_as_threads ? 1 : o_.nproc_per_node; }

  absl::Status MakeHeartbeatPages() {
    for (int i = 0; i < Processes(); ++i) {
      absl::StatusOr<std::unique_ptr<HeartbeatPage>> p = HeartbeatPage::Create();
      if (!p.ok()) return p.status();
      pages_.push_back(std::move(*p));
    }
    return absl::OkStatus();
  }

 private:
  bool Exists(const std::string& key) {
    return store_.Get(key, absl::ZeroDuration()).ok();
  }

  // Waits until counter `key` reaches the number of nodes.
  absl::Status WaitForAll(const std::string& key, absl::Duration within, int64_t* seen) {
    const absl::Time deadline = absl::Now() + within;
    for (;;) {
      absl::StatusOr<int64_t> n = store_.Add(key, 0);
      if (!n.ok()) return n.status();
      *seen = *n;
      if (*n >= o_.nnodes) return absl::OkStatus();
      if (absl::Now() >= deadline) return absl::DeadlineExceededError("");
      absl::SleepFor(absl::Milliseconds(50));
    }
  }

  // The nodes that have not set agent/a<n>/<what><k>, as "1 (hostB), 3".
  std::string MissingNodes(const std::string& what) {
    std::vector<std::string> missing;
    for (int k = 0; k < o_.nnodes; ++k) {
      if (Exists(absl::StrCat(prefix_, what, k))) continue;
      absl::StatusOr<std::string> host = store_.Get(absl::StrCat(prefix_, "host", k),
                                                    absl::ZeroDuration());
      missing.push_back(host.ok() ? absl::StrCat(k, " (", *host, ")") : absl::StrCat(k));
    }
    return absl::StrJoin(missing, ", ");
  }

  absl::StatusOr<int> Rendezvous() {
    if (o_.node_rank == 0) {
      int port = o_.rank_port;
      if (port == 0) {
        absl::StatusOr<int> p = PickFreePort();
        if (!p.ok()) return p.status();
        port = *p;
      }
      absl::Status s = store_.Set(prefix_ + "rank_port", absl::StrCat(port));
      if (!s.ok()) return StoreLost(s);
    }
    absl::Status s = store_.Set(absl::StrCat(prefix_, "host", o_.node_rank), host_);
    if (!s.ok()) return StoreLost(s);
    absl::StatusOr<int64_t> joined = store_.Add(prefix_ + "joined", 1);
    if (!joined.ok()) return StoreLost(joined.status());
    int64_t seen = 0;
    s = WaitForAll(prefix_ + "joined", o_.timeout, &seen);
    if (absl::IsDeadlineExceeded(s)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rendezvous of the agents at ", store_host_, ": ", seen, " of ", o_.nnodes,
          " nodes joined within ", absl::FormatDuration(o_.timeout), "; missing node(s) ",
          MissingNodes("host"), " (is its agent running with --nnodes=", o_.nnodes,
          " and the same --master-addr/--master-port?)"));
    }
    if (!s.ok()) return StoreLost(s);
    absl::StatusOr<std::string> port = store_.Get(prefix_ + "rank_port", o_.timeout);
    int p = 0;
    if (!port.ok()) return StoreLost(port.status());
    if (!absl::SimpleAtoi(*port, &p)) return absl::InternalError("bad rank_port in the store");
    return p;
  }

  absl::Status StoreLost(const absl::Status& s) const {
    return absl::UnavailableError(absl::StrCat(
        "lost the agents' store at ", store_host_, " (node 0's agent: down, or the link to it "
        "is cut): ", s.message(), "; stopped this node's ranks"));
  }

  absl::Status StartRanks(int attempt, int rank_port) {
    static const char* kOverridden[] = {
        "RANK=",          "WORLD_SIZE=",          "LOCAL_RANK=",           "LOCAL_WORLD_SIZE=",
        "GROUP_RANK=",    "MASTER_ADDR=",         "MASTER_PORT=",          "LOOM_LAUNCHED=",
        "LOOM_RESTART_COUNT=", "LOOM_HEARTBEAT_FD=", "LOOM_RENDEZVOUS_SECRET=",
        "LOOM_LOCAL_THREADS="};
    std::vector<std::string> base;
    for (char** e = environ; *e; ++e) {
      bool skip = false;
      for (const char* k : kOverridden) skip = skip || absl::StartsWith(*e, k);
      if (!skip) base.push_back(*e);
    }
    base.push_back(absl::StrCat("MASTER_ADDR=", o_.master_addr));
    base.push_back(absl::StrCat("MASTER_PORT=", rank_port));
    base.push_back("LOOM_LAUNCHED=1");
    base.push_back(absl::StrCat("LOOM_RESTART_COUNT=", attempt));
    if (!o_.secret.empty()) base.push_back(absl::StrCat("LOOM_RENDEZVOUS_SECRET=", o_.secret));
    std::vector<std::vector<std::string>> envs(Processes(), base);
    const int world = o_.nnodes * o_.nproc_per_node;
    for (int i = 0; i < Processes(); ++i) {
      envs[i].push_back(absl::StrCat("LOOM_HEARTBEAT_FD=", pages_[i]->fd()));
      if (o_.ranks_as_threads) {
        envs[i].push_back(absl::StrCat("LOOM_LOCAL_THREADS=", o_.nproc_per_node));
        continue;
      }
      envs[i].push_back(absl::StrCat("RANK=", o_.node_rank * o_.nproc_per_node + i));
      envs[i].push_back(absl::StrCat("WORLD_SIZE=", world));
      envs[i].push_back(absl::StrCat("LOCAL_RANK=", i));
      envs[i].push_back(absl::StrCat("LOCAL_WORLD_SIZE=", o_.nproc_per_node));
      envs[i].push_back(absl::StrCat("GROUP_RANK=", o_.node_rank));
    }
    for (auto& p : pages_) p->Reset();
    last_beats_.assign(Processes(), 0);
    last_progress_.assign(Processes(), absl::Now());
    return ranks_.Start(envs, argv_);
  }

  // Watches until the attempt ends on this node.
  Outcome Watch() {
    int signalled = 0;  // the first signal forwarded
    bool reported_success = false, stopping_others = false;
    absl::Time signal_kill_at = absl::InfiniteFuture();
    absl::Time next_poll = absl::Now();
    std::vector<LocalRanks::Exit> failed_exits;
    for (;;) {
      if (const int sig = SignalScope::Take(); sig != 0) {
        if (sig == SIGUSR1) {
          AskForFlightDumps();
        } else {
          ranks_.Signal(sig);
        }
        if (sig != SIGUSR1 && signalled == 0) {
          signalled = sig;
          Log(absl::StrCat("received signal ", sig, " (", strsignal(sig),
                           "); forwarded it to the ranks"));
          signal_kill_at = absl::Now() + o_.signal_grace;
        }
      }
      if (signalled != 0 && absl::Now() >= signal_kill_at) {
        ranks_.Signal(SIGKILL);
        signal_kill_at = absl::InfiniteFuture();
      }
      for (const LocalRanks::Exit& e : ranks_.Reap()) {
        if (!e.ok()) failed_exits.push_back(e);
      }
      // A rank that fails while the others finish their step and save: the
      // save cannot complete without it, so the rest stop now rather than
      // wait in a collective for the whole grace.
      // (One the forwarded signal ended did what it was told.)
      if (signalled != 0 && !stopping_others) {
        for (const LocalRanks::Exit& e : failed_exits) {
          if (WIFSIGNALED(e.status) && WTERMSIG(e.status) == signalled) continue;
          Log(absl::StrCat(RankName(e.index, e.pid), " ", e.Describe(),
                           " after the signal; stopping the others"));
          stopping_others = true;
          signal_kill_at = std::min(signal_kill_at, absl::Now() + o_.kill_grace);
          break;
        }
      }
      if (!failed_exits.empty() && signalled == 0) {
        const LocalRanks::Exit& e = failed_exits.front();
        Failure f;
        f.severity = WIFSIGNALED(e.status) ? 3 : 1;
        f.at_ns = absl::ToUnixNanos(absl::Now());
        f.text = absl::StrCat(RankName(e.index, e.pid), " ", e.Describe());
        return Publish(f);
      }
      if (signalled == 0 && o_.heartbeat_timeout > absl::ZeroDuration()) {
        if (std::optional<Failure> hung = CheckHeartbeats(); hung.has_value()) {
          return Publish(*hung);
        }
      }
      if (ranks_.running() == 0 && !reported_success) {
        if (signalled != 0) {
          // Stopped on request: OK iff the ranks ended cleanly (saved and
          // exited 0 under --exit-signal-handler); never restarted.
          if (failed_exits.empty()) {
            absl::StatusOr<int64_t> n = store_.Add(prefix_ + "succeeded", 1);
            if (!n.ok()) return Fatal(StoreLost(n.status()));
            reported_success = true;
          } else {
            store_.Set(prefix_ + "final", "signal").IgnoreError();
            Failure f;
            f.severity = 2;
            f.at_ns = absl::ToUnixNanos(absl::Now());
            f.text = absl::StrCat("the agent received a signal; ",
                                  RankName(failed_exits[0].index, failed_exits[0].pid), " ",
                                  failed_exits[0].Describe());
            Outcome out = Publish(f);
            return out;
          }
        } else {
          absl::StatusOr<int64_t> n = store_.Add(prefix_ + "succeeded", 1);
          if (!n.ok()) return Fatal(StoreLost(n.status()));
          reported_success = true;
        }
      }
      if (absl::Now() >= next_poll) {  // the other nodes, through the store
        next_poll = absl::Now() + absl::Milliseconds(o_.nnodes > 1 ? 200 : 1000);
        absl::StatusOr<int64_t> failed = store_.Add(prefix_ + "failed", 0);
        if (!failed.ok()) return Fatal(StoreLost(failed.status()));
        if (*failed > 0) return Outcome{};  // another node's failure: restart
        absl::StatusOr<int64_t> done = store_.Add(prefix_ + "succeeded", 0);
        if (!done.ok()) return Fatal(StoreLost(done.status()));
        if (*done >= o_.nnodes) {
          Outcome out;
          out.kind = Outcome::kSucceeded;
          return out;
        }
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  }

  Outcome Fatal(absl::Status s) {
    Outcome out;
    out.kind = Outcome::kFatal;
    out.error = std::move(s);
    return out;
  }

  // Reports this node's failure to every agent.
  Outcome Publish(const Failure& f) {
    Log(f.text);
    absl::StatusOr<int64_t> i = store_.Add(prefix_ + "failed", 1);
    if (!i.ok()) return Fatal(absl::UnavailableError(absl::StrCat(f.text, "; and ",
                                                                  StoreLost(i.status()).message())));
    absl::Status s = store_.Set(absl::StrCat(prefix_, "cause", *i), f.Encode());
    if (!s.ok()) return Fatal(StoreLost(s));
    Outcome out;
    out.failure = f;
    return out;
  }

  // A rank whose beats stopped for --heartbeat-timeout-s is hung; the ranks
  // waiting for it in a collective stop beating a moment later, so the one
  // named is a stopped process (SIGSTOP) if any, else the oldest beat.
  std::optional<Failure> CheckHeartbeats() {
    const absl::Time now = absl::Now();
    int worst = -1;
    bool worst_stopped = false;
    std::vector<int> silent;
    for (int i = 0; i < Processes(); ++i) {
      if (ranks_.pid(i) <= 0) continue;
      const HeartbeatReading r = pages_[i]->Read();
      if (r.beats != last_beats_[i]) {
        last_beats_[i] = r.beats;
        last_progress_[i] = now;
        continue;
      }
      // Setup (rank 0 tokenizing a corpus while the others wait, a large
      // checkpoint load) is bounded by its own barriers and timeouts.
      if (r.phase == Phase::kStarting || r.phase == Phase::kSetup) continue;
      if (now - last_progress_[i] < o_.heartbeat_timeout) continue;
      silent.push_back(i);
      const bool stopped = IsStopped(ranks_.pid(i));
      if (worst < 0 || (stopped && !worst_stopped) ||
          (stopped == worst_stopped && LastBeat(i) < LastBeat(worst))) {
        worst = i;
        worst_stopped = stopped;
      }
    }
    if (worst < 0) return std::nullopt;
    const HeartbeatReading r = pages_[worst]->Read();
    Failure f;
    f.severity = 3;
    f.at_ns = absl::ToUnixNanos(LastBeat(worst));  // across nodes: the oldest wins
    f.text = absl::StrCat(
        RankName(worst, ranks_.pid(worst)), " is hung", worst_stopped ? " (stopped)" : "",
        ": no progress for ", absl::FormatDuration(absl::Trunc(now - last_progress_[worst],
                                                               absl::Milliseconds(100))),
        " (--heartbeat-timeout-s); last heartbeat: ",
        absl::StrCat("iteration ", r.iteration, ", ", PhaseName(r.phase)));
    if (silent.size() > 1 && !o_.ranks_as_threads) {
      std::vector<int> others;
      for (int i : silent) {
        if (i != worst) others.push_back(o_.node_rank * o_.nproc_per_node + i);
      }
      absl::StrAppend(&f.text, "; also silent since (waiting for it?): rank(s) ",
                      absl::StrJoin(others, ", "));
    }
    return f;
  }

  // When process i last beat: the rank's own clock (finer than this loop's
  // polls), else when it was started.
  absl::Time LastBeat(int i) const {
    const HeartbeatReading r = pages_[i]->Read();
    return r.at_unix_ns > 0 ? absl::FromUnixNanos(r.at_unix_ns) : last_progress_[i];
  }

  // True when `pid` is stopped (SIGSTOP, a debugger): /proc/PID/stat's state.
  static bool IsStopped(pid_t pid) {
    std::FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "r");
    if (f == nullptr) return false;
    char buf[512] = {};
    const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    const std::string stat(buf, n);
    const size_t paren = stat.rfind(')');  // the command name may hold spaces
    return paren != std::string::npos && paren + 2 < stat.size() &&
           (stat[paren + 2] == 'T' || stat[paren + 2] == 't');
  }

  // SIGUSR1: each rank writes its flight recorder (comm/flight), if it has
  // one to write. Only ranks past setup: the handler is installed with the
  // first communicator, and before it SIGUSR1 would kill the rank.
  // Returns whether any rank was asked.
  bool AskForFlightDumps() {
    if (!o_.dump_flight_recorder) return false;
    bool asked = false;
    for (int i = 0; i < Processes(); ++i) {
      const Phase phase = pages_[i]->Read().phase;
      if (ranks_.pid(i) <= 0 || phase == Phase::kStarting || phase == Phase::kSetup) continue;
      ranks_.Signal(i, SIGUSR1);
      asked = true;
    }
    return asked;
  }

  void StopRanksForRestart() {
    if (AskForFlightDumps()) absl::SleepFor(absl::Seconds(1));  // the dumps are written async
    ranks_.Stop(o_.kill_grace);
  }

  // Every node reports its ranks down before any starts them again: a rank of
  // the old attempt must never meet one of the new.
  absl::Status StopBarrier() {
    absl::Status s = store_.Set(absl::StrCat(prefix_, "down", o_.node_rank), "1");
    if (!s.ok()) return StoreLost(s);
    absl::StatusOr<int64_t> n = store_.Add(prefix_ + "stopped", 1);
    if (!n.ok()) return StoreLost(n.status());
    int64_t seen = 0;
    const absl::Duration within = o_.kill_grace + o_.timeout;
    s = WaitForAll(prefix_ + "stopped", within, &seen);
    if (absl::IsDeadlineExceeded(s)) {
      const std::string missing = MissingNodes("down");
      std::string root = RootCause(Failure{}).text;
      return absl::UnavailableError(absl::StrCat(
          "node(s) ", missing, " did not report their ranks stopped within ",
          absl::FormatDuration(within), " after a failure (", root.empty() ? "?" : root,
          "): unreachable? Ending the job rather than training without them"));
    }
    if (!s.ok()) return StoreLost(s);
    return absl::OkStatus();
  }

  // The root cause among every node's reports of this attempt.
  Failure RootCause(const Failure& mine) {
    Failure best = mine;
    absl::StatusOr<int64_t> n = store_.Add(prefix_ + "failed", 0);
    for (int64_t i = 1; n.ok() && i <= *n; ++i) {
      absl::StatusOr<std::string> v =
          store_.Get(absl::StrCat(prefix_, "cause", i), absl::Seconds(2));
      if (!v.ok()) continue;
      Failure f = Failure::Decode(*v);
      if (best.text.empty() || Before(f, best)) best = f;
    }
    return best;
  }

  // After success: node 0 serves the store until every agent has seen it.
  absl::Status Leave() {
    absl::StatusOr<int64_t> n = store_.Add(prefix_ + "exiting", 1);
    if (!n.ok() || o_.node_rank != 0 || o_.nnodes == 1) return absl::OkStatus();
    int64_t seen = 0;
    WaitForAll(prefix_ + "exiting", absl::Seconds(30), &seen).IgnoreError();
    return absl::OkStatus();
  }

  const AgentOptions o_;
  Store& store_;
  const std::string store_host_;
  const std::vector<std::string> argv_;
  const std::string host_ = HostName();
  std::string prefix_;
  std::vector<std::unique_ptr<HeartbeatPage>> pages_;
  std::vector<uint64_t> last_beats_;
  std::vector<absl::Time> last_progress_;
  LocalRanks ranks_;
};

}  // namespace

absl::Status RunAgent(const AgentOptions& options, Store& store, const std::string& store_host,
                      const std::vector<std::string>& argv) {
  Agent agent(options, store, store_host, argv);
  return agent.Run();
}

}  // namespace loom::comm::launch
