// bazel run -c opt //checkpoint:bench [-- --num-layers=12 --hidden-size=768 --dir=/tmp/x]
//
// Save and load throughput of a GPT-2-small-sized state (parameters + Adam
// moments, one rank) against a plain sequential write (+fsync) / read of the
// same number of bytes in the same run, and the training stall per save with
// and without --async-save.
//
// Fairness: the reference and the checkpoint move the same bytes into one
// file each, with one fsync of it; an untimed warm-up round first, so that in
// every timed round both replace an equally large file (the plain write's
// O_TRUNC frees the previous one, the save's --keep-last=1 prunes the previous
// checkpoint). Reads are measured twice, both from the page cache (files just
// written) and cold (each file dropped from the cache with
// posix_fadvise(DONTNEED) first). Each figure is the median of --repeats.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "checkpoint/checkpointer.h"
#include "checkpoint/file_util.h"
#include "comm/local/communicator.h"
#include "core/cli.h"
#include "models/gpt/gpt_config.h"

ABSL_FLAG(int64_t, num_layers, 12, "Layers (GPT-2 small: 12)");
ABSL_FLAG(int64_t, hidden_size, 768, "Hidden size (GPT-2 small: 768)");
ABSL_FLAG(std::string, dir, "/tmp/loom_ckpt_bench", "Scratch folder (deleted at the end)");
ABSL_FLAG(int, repeats, 3, "Runs of each measurement (the median is reported)");

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "bench: %s: %s\n", what, std::string(s.message()).c_str());
    std::exit(1);
  }
}

double PlainWrite(const std::string& path, const char* data, size_t n) {
  const auto t = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd, data + done, std::min<size_t>(n - done, 64 << 20));
    if (w <= 0) std::exit(2);
    done += w;
  }
  ::fsync(fd);
  ::close(fd);
  return Since(t);
}

double PlainRead(const std::string& path, char* data, size_t n) {
  const auto t = Clock::now();
  const int fd = ::open(path.c_str(), O_RDONLY);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::read(fd, data + done, std::min<size_t>(n - done, 64 << 20));
    if (r <= 0) std::exit(3);
    done += r;
  }
  ::close(fd);
  return Since(t);
}

// Drops a (clean, fsynced) file from the page cache.
void DropCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) std::exit(4);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void DropTreeCache(const std::string& dir) {
  auto names = loom::checkpoint::ListDir(dir);
  if (!names.ok()) std::exit(5);
  for (const std::string& n : *names) {
    const std::string p = loom::checkpoint::JoinPath(dir, n);
    if (loom::checkpoint::IsDirectory(p)) {
      DropTreeCache(p);
    } else {
      DropCache(p);
    }
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  loom::core::NormalizedArgv args(argc, argv);
  absl::ParseCommandLine(args.argc(), args.argv());
  using namespace loom;
  layers::GptConfig c;
  c.num_layers = absl::GetFlag(FLAGS_num_layers);
  c.hidden_size = absl::GetFlag(FLAGS_hidden_size);
  c.num_attention_heads = 12;
  c.seq_length = 1024;
  c.vocab_size = 50257;
  std::vector<layers::ParamSpec> specs = layers::EmbeddingParamSpecs(c, 1);
  for (int l = 0; l < c.num_layers; ++l) {
    for (auto& s : layers::BlockParamSpecs(c, l)) specs.push_back(s);
  }
  for (auto& s : layers::FinalNormParamSpecs(c)) specs.push_back(s);
  auto params = layers::ParamBuffer::Create(specs, 0, 1, 1);
  Check(params.status(), "params");
  const int64_t n = params->padded_numel();
  core::Tensor m = *core::Tensor::Zeros(core::Shape{n}, core::DType::kF32);
  core::Tensor v = *core::Tensor::Zeros(core::Shape{n}, core::DType::kF32);
  for (int64_t i = 0; i < n; ++i) {
    m.data<float>()[i] = 1e-3f * (i % 1000);
    v.data<float>()[i] = 1e-6f * (i % 977);
  }
  checkpoint::RankView view;
  view.model = c;
  view.params = &*params;
  view.exp_avg = &m;
  view.exp_avg_sq = &v;
  view.moment_ranges = {{0, n}};
  const std::string dir = absl::GetFlag(FLAGS_dir);
  Check(checkpoint::RemoveTree(dir), "clean");
  Check(checkpoint::MakeDirs(dir), "mkdir");
  auto world = comm::local::CreateWorld(1);
  Check(world.status(), "world");
  comm::Communicator* w = (*world)[0].get();

  int64_t stored = 0;
  for (const auto& p : checkpoint::PiecesToSave(view, true)) stored += p.region.numel();
  const double gb = stored * 4.0 / 1e9;
  std::vector<char> plain(static_cast<size_t>(stored) * 4, 1);
  std::memcpy(plain.data(), params->flat_values().raw_data(),
              std::min(plain.size(), params->flat_values().nbytes()));

  const int repeats = absl::GetFlag(FLAGS_repeats);
  std::vector<double> save_s, async_stall_s, async_total_s, load_s, load_cold_s, write_s, read_s,
      read_cold_s;
  int64_t iteration = 0;
  checkpoint::SaveOptions ao;
  ao.dir = dir + "/ckpt";
  ao.keep_last = 1;
  ao.async = true;
  // One async checkpointer for every repeat: its snapshot buffer is reused
  // from the second save on, as in a training run.
  auto async = checkpoint::Checkpointer::Create(w, ao);
  Check(async.status(), "checkpointer");
  for (int r = -1; r < repeats; ++r) {  // r == -1: the untimed warm-up round
    const bool timed = r >= 0;
    const double ws = PlainWrite(dir + "/plain.bin", plain.data(), plain.size());
    const double rs = PlainRead(dir + "/plain.bin", plain.data(), plain.size());
    DropCache(dir + "/plain.bin");
    const double rcs = PlainRead(dir + "/plain.bin", plain.data(), plain.size());
    if (timed) {
      write_s.push_back(ws);
      read_s.push_back(rs);
      read_cold_s.push_back(rcs);
    }
    checkpoint::SaveOptions so;
    so.dir = dir + "/ckpt";
    so.keep_last = 1;
    auto sync = checkpoint::Checkpointer::Create(w, so);
    Check(sync.status(), "checkpointer");
    checkpoint::Manifest h;
    *h.mutable_model() = checkpoint::ModelConfigProto(c);
    h.mutable_training()->set_iteration(++iteration);
    auto t = Clock::now();
    Check((*sync)->Save(view, h), "save");
    if (timed) save_s.push_back(Since(t));
    if (!timed) continue;

    h.mutable_training()->set_iteration(++iteration);
    t = Clock::now();
    Check((*async)->Save(view, h), "async save");
    async_stall_s.push_back(Since(t));
    Check((*async)->Wait(), "async wait");
    async_total_s.push_back(Since(t));

    t = Clock::now();
    auto loaded = checkpoint::LoadCheckpoint(w, dir + "/ckpt", std::nullopt, view, true);
    Check(loaded.status(), "load");
    load_s.push_back(Since(t));

    DropTreeCache(dir + "/ckpt");
    t = Clock::now();
    loaded = checkpoint::LoadCheckpoint(w, dir + "/ckpt", std::nullopt, view, true);
    Check(loaded.status(), "load (cold)");
    load_cold_s.push_back(Since(t));
  }
  const double save = Median(save_s), write = Median(write_s), read = Median(read_s),
               read_cold = Median(read_cold_s), load = Median(load_s),
               load_cold = Median(load_cold_s);
  std::printf("checkpoint bench: GPT-2-small-sized state, %lld layers, hidden %lld: %.1fM "
              "parameters, %.3f GB stored (params + 2 Adam moments, f32), 1 rank, median of %d\n",
              static_cast<long long>(c.num_layers), static_cast<long long>(c.hidden_size),
              stored / 3 / 1e6, gb, repeats);
  std::printf("%-46s %10s %10s %12s\n", "operation", "seconds", "GB/s", "vs plain");
  auto row = [&](const char* what, double s, double ref) {
    if (ref <= 0) {
      std::printf("%-46s %10.3f %10.2f %12s\n", what, s, gb / s, "1.00x");
    } else {
      std::printf("%-46s %10.3f %10.2f %11.2fx\n", what, s, gb / s, ref / s);
    }
  };
  row("plain sequential write + fsync (1 file)", write, 0);
  row("checkpoint save (sync: CRC32C, fsync, commit)", save, write);
  row("plain sequential read (page cache)", read, 0);
  row("checkpoint load (CRC32C verified, page cache)", load, read);
  row("plain sequential read (cold: fadvise DONTNEED)", read_cold, 0);
  row("checkpoint load (cold: fadvise DONTNEED)", load_cold, read_cold);
  std::printf("%-46s %10.3f\n", "training stall per save, sync", save);
  std::printf("%-46s %10.3f   (background write done after %.3f s)\n",
              "training stall per save, --async-save", Median(async_stall_s),
              Median(async_total_s));
  Check(checkpoint::RemoveTree(dir), "clean");
  return 0;
}
