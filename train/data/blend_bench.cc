// `bazel run -c opt //train/data:blend_bench`: how long a blend's indices take
// to build over --tokens tokens, as `gpt --data-path "0.3 A 0.7 B"
// --seq-length 2048 --split 969,30,1` builds them for --train-iters x
// --global-batch-size training samples (and --eval-iters x
// --global-batch-size validation ones): BuildDataSplits, the trainer's own
// call, with an empty --data-cache-path (cold: every corpus's document,
// sample and shuffle index and the blend's dataset / sample index built and
// written), then again (warm: all of it read back).
//
// The corpora are synthetic: document lengths drawn with a fixed seed
// (log-normal, median 1000 tokens, 32..16384). Building indices reads only
// the .idx, so the .bin is a sparse file of the right size (ftruncate), not
// gigabytes of tokens; the .idx comes from the library's WriteIndexFile (what
// IndexedDatasetWriter::Finalize writes) and is opened by the library's reader,
// which checks it against the .bin's size.
//
// Then, on the same files, Megatron-Core's BlendedMegatronDatasetBuilder does
// the same, cold and warm (tools/megatron_reference/blend_bench.py, run with
// --megatron_venv's python; skipped when there is none).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/bench_util/bench_util.h"
#include "train/data/blend.h"
#include "train/data/indexed_dataset.h"

ABSL_FLAG(int64_t, tokens, 1000000000, "Tokens in all corpora together, split evenly");
ABSL_FLAG(std::string, weights, "0.3,0.7", "Blend weights, one corpus each");
ABSL_FLAG(int64_t, seq_length, 2048, "--seq-length");
ABSL_FLAG(int64_t, train_iters, 1954, "--train-iters");
ABSL_FLAG(int64_t, global_batch_size, 256, "--global-batch-size");
ABSL_FLAG(int64_t, eval_iters, 10, "--eval-iters (Loom's default)");
ABSL_FLAG(std::string, split, "969,30,1", "--split");
ABSL_FLAG(std::string, megatron_venv, "$HOME/.cache/loom/megatron-core-venv",
          "Virtual environment with megatron-core (tools/megatron_reference/make_reference.sh); "
          "\"\" skips Megatron-Core's timing");
ABSL_FLAG(std::string, dir, "", "Work folder (default: a new one under $TMPDIR, removed after)");

namespace loom::train {
namespace {

using Clock = std::chrono::steady_clock;

// Document lengths summing to exactly `tokens` (the last one cut short).
std::vector<int32_t> DocumentLengths(int64_t tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> length(std::log(1000.0), 0.6);
  std::vector<int32_t> out;
  for (int64_t left = tokens; left > 0;) {
    const int64_t l =
        std::min<int64_t>(left, std::clamp<int64_t>(std::llround(length(rng)), 32, 16384));
    out.push_back(static_cast<int32_t>(l));
    left -= l;
  }
  return out;
}

// <prefix>.idx in Megatron's layout (one sequence a document, u16 tokens,
// written by the library's WriteIndexFile) and a sparse <prefix>.bin of the
// size it implies.
bool WriteCorpus(const std::string& prefix, const std::vector<int32_t>& lengths) {
  std::vector<int64_t> doc_index(lengths.size() + 1);
  std::iota(doc_index.begin(), doc_index.end(), int64_t{0});
  if (absl::Status s = WriteIndexFile(prefix, TokenType::kU16, lengths, doc_index); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return false;
  }
  int64_t bytes = 0;
  for (int32_t l : lengths) bytes += int64_t{l} * 2;
  const int fd = ::open((prefix + ".bin").c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
  const bool ok = fd >= 0 && ::ftruncate(fd, bytes) == 0;
  if (fd >= 0) ::close(fd);
  return ok;
}

// Megatron-Core's cold and warm seconds on the same corpora, printed by
// tools/megatron_reference/blend_bench.py; says why when it cannot run.
void RunMegatron(const DataSplitsOptions& o, const std::vector<std::string>& blend,
                 const std::string& dir) {
  std::string venv = absl::GetFlag(FLAGS_megatron_venv);
  if (venv.empty()) return;
  const char* home = std::getenv("HOME");
  if (absl::StartsWith(venv, "$HOME")) venv = absl::StrCat(home ? home : "", venv.substr(5));
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");  // set by bazel run
  const std::string script =
      absl::StrCat(workspace ? workspace : ".", "/tools/megatron_reference/blend_bench.py");
  const std::string python = venv + "/bin/python";
  std::error_code error;
  for (const std::string& f : {python, script}) {
    if (!std::filesystem::exists(f, error)) {
      std::printf("megatron-core: skipped, no %s\n", f.c_str());
      return;
    }
  }
  std::string command =
      absl::StrCat("'", python, "' '", script, "' '", dir, "/megatron_cache' ", o.seq_length, " ",
                   o.split, " ", o.train_samples, " ", o.valid_samples);
  for (const std::string& entry : blend) {
    std::vector<std::string> wp = absl::StrSplit(entry, absl::MaxSplits(' ', 1));
    absl::StrAppend(&command, " ", wp[0], " '", wp[1], "'");
  }
  std::fflush(stdout);
  if (std::system(command.c_str()) != 0)
    std::printf("megatron-core: failed (%s)\n", command.c_str());
}

double SecondsSince(Clock::time_point t0) { return core::bench::MillisecondsSince(t0) / 1e3; }

int Main() {
  std::vector<double> weights;
  for (absl::string_view w : absl::StrSplit(absl::GetFlag(FLAGS_weights), ',')) {
    weights.push_back(std::strtod(std::string(w).c_str(), nullptr));
  }
  const int n = static_cast<int>(weights.size());
  std::string dir = absl::GetFlag(FLAGS_dir);
  const bool own_dir = dir.empty();
  if (own_dir) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/blend_bench.XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      std::fprintf(stderr, "cannot create a folder under %s\n", pattern.c_str());
      return 1;
    }
    dir = pattern;
  }

  DataSplitsOptions o;
  std::vector<std::string> blend, shown;
  int64_t documents = 0;
  const auto t_write = Clock::now();
  for (int k = 0; k < n; ++k) {
    const std::string prefix = absl::StrCat(dir, "/corpus_", std::string(1, char('A' + k)));
    const std::vector<int32_t> lengths = DocumentLengths(absl::GetFlag(FLAGS_tokens) / n, 1000 + k);
    if (!WriteCorpus(prefix, lengths)) {
      std::fprintf(stderr, "cannot write %s.{idx,bin}\n", prefix.c_str());
      return 1;
    }
    documents += static_cast<int64_t>(lengths.size());
    blend.push_back(absl::StrCat(weights[k], " ", prefix));
    shown.push_back(absl::StrCat(weights[k], " ", std::string(1, char('A' + k))));
  }
  const double write_s = SecondsSince(t_write);
  o.data_path = absl::StrJoin(blend, " ");
  o.split = absl::GetFlag(FLAGS_split);
  o.seq_length = absl::GetFlag(FLAGS_seq_length);
  o.cache_dir = dir + "/cache";
  o.train_samples = absl::GetFlag(FLAGS_train_iters) * absl::GetFlag(FLAGS_global_batch_size);
  o.valid_samples = absl::GetFlag(FLAGS_eval_iters) * absl::GetFlag(FLAGS_global_batch_size);

  double load[3] = {0, 0, 0};
  getloadavg(load, 3);
  std::printf("CPU: %s, load average %.2f %.2f %.2f\n", core::bench::CpuModel().c_str(), load[0],
              load[1], load[2]);
  std::printf("corpora: %d, %lld tokens, %lld documents (.idx written in %.2f s)\n", n,
              static_cast<long long>(absl::GetFlag(FLAGS_tokens)),
              static_cast<long long>(documents), write_s);
  std::printf("--data-path \"%s\" --seq-length %lld --split %s: %lld train, %lld valid samples\n",
              absl::StrJoin(shown, " ").c_str(), static_cast<long long>(o.seq_length),
              o.split.c_str(), static_cast<long long>(o.train_samples),
              static_cast<long long>(o.valid_samples));

  int status = 0;
  for (const char* pass : {"cold", "warm"}) {
    const auto t0 = Clock::now();
    absl::StatusOr<DataSplits> splits = BuildDataSplits(o);
    const double s = SecondsSince(t0);
    if (!splits.ok()) {
      std::fprintf(stderr, "%s\n", std::string(splits.status().message()).c_str());
      status = 1;
      break;
    }
    bool cached = splits->train->indices_loaded_from_cache();
    std::string epochs;
    for (int k = 0; k < splits->train->num_datasets(); ++k) {
      cached = cached && splits->train->dataset(k).loaded_from_cache();
      absl::StrAppend(&epochs, k ? ", " : "", splits->train->dataset(k).num_samples(),
                      " samples / ", splits->train->dataset(k).epochs(), " epochs");
    }
    std::printf("%s: %.3f s (train blend %lld samples: %s; indices %s)\n", pass, s,
                static_cast<long long>(splits->train->num_samples()), epochs.c_str(),
                cached ? "read from the cache" : "built");
  }
  std::error_code error;
  int64_t cache_bytes = 0;
  for (const auto& f : std::filesystem::directory_iterator(o.cache_dir, error)) {
    cache_bytes += static_cast<int64_t>(f.file_size(error));
  }
  std::printf("cache: %.1f MB in %s\n", cache_bytes / 1e6, o.cache_dir.c_str());
  if (status == 0) RunMegatron(o, blend, dir);
  if (own_dir) std::filesystem::remove_all(dir, error);
  return status;
}

}  // namespace
}  // namespace loom::train

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return loom::train::Main();
}
