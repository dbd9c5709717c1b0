// bazel run -c opt //checkpoint:bench [-- --num-layers=12 --hidden-size=768 --dir=/tmp/x]
//
// Save and load throughput of a GPT-2-small-sized state (parameters + Adam
// moments, one rank) against a plain sequential write (+fsync) / read of the
// same number of bytes in the same run, and the training stall per save with
// and without --async-save. Reads hit the page cache (files just written).
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "checkpoint/checkpointer.h"
#include "checkpoint/file_util.h"
#include "comm/local/communicator.h"
#include "core/cli.h"
#include "layers/gpt_config.h"

ABSL_FLAG(int64_t, num_layers, 12, "Layers (GPT-2 small: 12)");
ABSL_FLAG(int64_t, hidden_size, 768, "Hidden size (GPT-2 small: 768)");
ABSL_FLAG(std::string, dir, "/tmp/loom_ckpt_bench", "Scratch folder (deleted at the end)");
ABSL_FLAG(int, repeats, 3, "Runs of each measurement (the best is reported)");

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
  view.shard_end = n;
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
  double save_s = 1e9, async_stall_s = 1e9, async_total_s = 1e9, load_s = 1e9, write_s = 1e9,
         read_s = 1e9;
  int64_t iteration = 0;
  checkpoint::SaveOptions ao;
  ao.dir = dir + "/ckpt";
  ao.keep_last = 1;
  ao.async = true;
  // One async checkpointer for every repeat: its snapshot buffer is reused
  // from the second save on, as in a training run.
  auto async = checkpoint::Checkpointer::Create(w, ao);
  Check(async.status(), "checkpointer");
  for (int r = 0; r < repeats; ++r) {
    write_s = std::min(write_s, PlainWrite(dir + "/plain.bin", plain.data(), plain.size()));
    read_s = std::min(read_s, PlainRead(dir + "/plain.bin", plain.data(), plain.size()));
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
    save_s = std::min(save_s, Since(t));

    h.mutable_training()->set_iteration(++iteration);
    t = Clock::now();
    Check((*async)->Save(view, h), "async save");
    async_stall_s = std::min(async_stall_s, Since(t));
    Check((*async)->Wait(), "async wait");
    async_total_s = std::min(async_total_s, Since(t));

    t = Clock::now();
    auto loaded = checkpoint::LoadCheckpoint(w, dir + "/ckpt", std::nullopt, view, true);
    Check(loaded.status(), "load");
    load_s = std::min(load_s, Since(t));
  }
  std::printf("checkpoint bench: GPT-2-small-sized state, %lld layers, hidden %lld: %.1fM "
              "parameters, %.3f GB stored (params + 2 Adam moments, f32), 1 rank, best of %d\n",
              static_cast<long long>(c.num_layers), static_cast<long long>(c.hidden_size),
              stored / 3 / 1e6, gb, repeats);
  std::printf("%-44s %10s %10s %12s\n", "operation", "seconds", "GB/s", "vs plain");
  std::printf("%-44s %10.3f %10.2f %12s\n", "plain sequential write + fsync (1 file)", write_s,
              gb / write_s, "1.00x");
  std::printf("%-44s %10.3f %10.2f %11.2fx\n", "checkpoint save (sync: CRC32C, fsync, commit)",
              save_s, gb / save_s, write_s / save_s);
  std::printf("%-44s %10.3f %10.2f %12s\n", "plain sequential read (page cache)", read_s,
              gb / read_s, "1.00x");
  std::printf("%-44s %10.3f %10.2f %11.2fx\n", "checkpoint load (mmap, CRC32C, reshard copy)",
              load_s, gb / load_s, read_s / load_s);
  std::printf("%-44s %10.3f\n", "training stall per save, sync", save_s);
  std::printf("%-44s %10.3f   (background write done after %.3f s)\n",
              "training stall per save, --async-save", async_stall_s, async_total_s);
  Check(checkpoint::RemoveTree(dir), "clean");
  return 0;
}
