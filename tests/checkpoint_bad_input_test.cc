// Every bad input gets a clear error naming the file, flag or field, and
// nothing is overwritten: a missing folder, a truncated or bit-flipped
// shard, an unknown manifest version, a model config that does not match
// the flags, and a `latest` pointing at a damaged checkpoint.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "checkpoint/file_util.h"
#include "checkpoint/format.h"
#include "checkpoint/reader.h"
#include "train/test_util.h"
#include "gtest/gtest.h"

namespace loom::checkpoint {
namespace testing = ::loom::train::testing;
namespace {

using testing::Layout;

const Layout kLayout{2, 1, 1};

std::string Tmp(const std::string& name) { return std::string(getenv("TEST_TMPDIR")) + "/" + name; }

// One healthy run (saved at 5 and 10), copied fresh for each case.
std::string Pristine() {
  static const std::string dir = [] {
    const std::string d = Tmp("pristine");
    EXPECT_TRUE(RemoveTree(d).ok());
    train::TrainConfig c = testing::TinyConfig(kLayout, 10);
    c.save = d;
    c.save_interval = 5;
    testing::RunResult r = testing::Run(c, kLayout);
    EXPECT_TRUE(r.status.ok()) << r.status;
    return d;
  }();
  return dir;
}

std::string FreshCopy(const std::string& name) {
  const std::string d = Tmp(name);
  EXPECT_TRUE(RemoveTree(d).ok());
  EXPECT_EQ(system(("cp -r " + Pristine() + " " + d).c_str()), 0);
  return d;
}

absl::Status Load(const std::string& dir, std::optional<int64_t> iteration = std::nullopt,
                  int hidden = 32) {
  train::TrainConfig c = testing::TinyConfig(kLayout, 10);
  c.model.hidden_size = hidden;
  c.load = dir;
  c.save = dir;  // a failed load must not write anything here
  c.checkpoint.load_iteration = iteration;
  return testing::Run(c, kLayout).status;
}

std::string Listing(const std::string& dir) {
  std::string out;
  const std::vector<std::string> names = *ListDir(dir);
  for (const std::string& n : names) {
    out += n + " ";
    if (IsDirectory(JoinPath(dir, n))) {
      const std::vector<std::string> files = *ListDir(JoinPath(dir, n));
      for (const std::string& m : files) {
        struct stat st;
        ::stat(JoinPath(JoinPath(dir, n), m).c_str(), &st);
        out += m + ":" + std::to_string(st.st_size) + ":" + std::to_string(st.st_mtime) + " ";
      }
    }
  }
  return out + *ReadFile(JoinPath(dir, "latest"));
}

void FlipBit(const std::string& path, long offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c;
  f.read(&c, 1);
  c ^= 0x10;
  f.seekp(offset);
  f.write(&c, 1);
}

#define EXPECT_HAS(status, text) \
  EXPECT_NE(std::string((status).message()).find(text), std::string::npos) << (status)

TEST(BadInputTest, HealthyCheckpointLoads) { EXPECT_TRUE(Load(Pristine()).ok()); }

TEST(BadInputTest, MissingFolder) {
  absl::Status s = Load(Tmp("does_not_exist"));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_HAS(s, "--load=" + Tmp("does_not_exist") + ": no such folder");
  EXPECT_FALSE(PathExists(Tmp("does_not_exist")));
  absl::Status it = Load(Pristine(), 7);
  EXPECT_HAS(it, "--load-iteration=7");
  EXPECT_HAS(it, "iter_0000005");
}

TEST(BadInputTest, TruncatedShardNamesTheFile) {
  const std::string d = FreshCopy("truncated");
  const std::string shard = d + "/iter_0000010/shard_00001_of_00002.bin";
  struct stat st;
  ASSERT_EQ(::stat(shard.c_str(), &st), 0);
  ASSERT_EQ(::truncate(shard.c_str(), st.st_size - 100), 0);
  const std::string before = Listing(d);
  absl::Status s = Load(d);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_HAS(s, shard);
  EXPECT_HAS(s, "truncated");
  EXPECT_EQ(Listing(d), before) << "a failed load must not touch the folder";
}

TEST(BadInputTest, BitFlippedShardIsAChecksumErrorNamingTheFileOnEveryRank) {
  const std::string d = FreshCopy("flipped");
  // Rank 1's file: the error must reach rank 0 too (Run reports the first rank's).
  const std::string shard = d + "/iter_0000010/shard_00001_of_00002.bin";
  FlipBit(shard, 1000);
  absl::Status s = Load(d);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_HAS(s, "checksum mismatch in shard file " + shard);
  EXPECT_HAS(s, "rank 0: rank 1:");  // rank 0 reports rank 1's failure
}

TEST(BadInputTest, LatestPointingAtDamagedCheckpointNamesTheEarlierOne) {
  const std::string d = FreshCopy("damaged_latest");
  FlipBit(d + "/iter_0000010/shard_00000_of_00002.bin", 2000);
  absl::Status s = Load(d);
  EXPECT_HAS(s, "checksum mismatch");
  EXPECT_HAS(s, "newest earlier complete checkpoint is " + d + "/iter_0000005");
  EXPECT_HAS(s, "--load-iteration=5");
  // And that one does load.
  EXPECT_TRUE(Load(d, 5).ok());
  // A damaged manifest is reported the same way.
  const std::string d2 = FreshCopy("damaged_manifest");
  FlipBit(d2 + "/iter_0000010/manifest.pb", 40);
  absl::Status m = Load(d2);
  EXPECT_HAS(m, "checksum mismatch in manifest " + d2 + "/iter_0000010/manifest.pb");
  EXPECT_HAS(m, "iter_0000005");
  // `latest` naming a folder that is gone.
  const std::string d3 = FreshCopy("missing_latest_target");
  ASSERT_TRUE(RemoveTree(d3 + "/iter_0000010").ok());
  absl::Status g = Load(d3);
  EXPECT_HAS(g, "iter_0000010, which does not exist");
  EXPECT_HAS(g, "iter_0000005");
}

TEST(BadInputTest, UnknownManifestVersion) {
  const std::string d = FreshCopy("version");
  const std::string path = d + "/iter_0000010/manifest.pb";
  auto m = DecodeManifest(*ReadFile(path), path);
  ASSERT_TRUE(m.ok());
  Manifest future = *m;
  future.set_format_version(99);
  ASSERT_TRUE(WriteFileDurably(path, EncodeManifest(future)).ok());
  absl::Status s = Load(d);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_HAS(s, "format version 99");
  EXPECT_HAS(s, path);
}

TEST(BadInputTest, ModelConfigMismatchNamesTheFieldAndBothValues) {
  absl::Status s = Load(Pristine(), std::nullopt, /*hidden=*/64);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_HAS(s, "--hidden-size is 32 in checkpoint " + Pristine() + "/iter_0000010 but 64");
}

absl::Status LoadWith(const std::string& dir, void (*edit)(train::TrainConfig*)) {
  train::TrainConfig c = testing::TinyConfig(kLayout, 10);
  edit(&c);
  c.load = dir;
  c.save = dir;
  return testing::Run(c, kLayout).status;
}

TEST(BadInputTest, LlamaFieldMismatchNamesTheFlagAndBothValues) {
  absl::Status s = LoadWith(Pristine(), [](train::TrainConfig* c) {
    c->model.normalization = layers::Normalization::kRMSNorm;
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_HAS(s, "--normalization is LayerNorm in checkpoint " + Pristine() +
                    "/iter_0000010 but RMSNorm");
  absl::Status g = LoadWith(Pristine(), [](train::TrainConfig* c) {
    c->model.add_bias_linear = false;
  });
  EXPECT_HAS(g, "--disable-bias-linear is false in checkpoint " + Pristine() +
                    "/iter_0000010 but true");
}

// A manifest written before the Llama-style fields existed (all absent)
// reads back as GPT-2.
TEST(BadInputTest, OldStyleManifestLoadsAsGpt2) {
  const std::string d = FreshCopy("old_style");
  for (const char* iter : {"/iter_0000005", "/iter_0000010"}) {
    const std::string path = d + iter + "/manifest.pb";
    auto m = DecodeManifest(*ReadFile(path), path);
    ASSERT_TRUE(m.ok());
    Manifest old = *m;
    ModelConfig* model = old.mutable_model();
    EXPECT_EQ(model->normalization(), "LayerNorm");
    model->clear_normalization();
    model->clear_position_embedding_type();
    model->clear_rotary_base();
    model->clear_rotary_percent();
    model->clear_swiglu();
    model->clear_group_query_attention();
    model->clear_num_query_groups();
    model->clear_untie_embeddings_and_output_weights();
    model->clear_disable_bias_linear();
    ASSERT_TRUE(WriteFileDurably(path, EncodeManifest(old)).ok());
  }
  EXPECT_TRUE(Load(d).ok());
  absl::Status s = LoadWith(d, [](train::TrainConfig* c) {
    c->model.swiglu = true;
    c->model.ffn_hidden_size = 128;  // as saved
  });
  EXPECT_HAS(s, "--swiglu is false in checkpoint");
}

TEST(BadInputTest, NoLatestFile) {
  const std::string d = FreshCopy("no_latest");
  ASSERT_EQ(::unlink((d + "/latest").c_str()), 0);
  absl::Status s = Load(d);
  EXPECT_HAS(s, "no `latest` file");
  EXPECT_HAS(s, "iter_0000010");
}

}  // namespace
}  // namespace loom::checkpoint
