// Blends: the parsing of Megatron's --data-path list and its errors; the
// normalised weights, per-dataset sizes and blending indices against
// Megatron-Core's own (testdata/megatron_blend/blends.json, made by
// tools/megatron_reference/make_reference.sh); the blended dataset's samples
// and its cache.
#include "train/data/blend.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace loom::train {
namespace {

std::string Tmp(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

nlohmann::json Reference() {
  const std::string path = absl::StrCat(std::getenv("TEST_SRCDIR"), "/",
                                        std::getenv("TEST_WORKSPACE"),
                                        "/train/data/testdata/megatron_blend/blends.json");
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

TEST(BlendTest, MatchesMegatronCore) {
  const nlohmann::json reference = Reference();
  ASSERT_GE(reference["cases"].size(), 5u);
  EXPECT_EQ(reference["mid_level_dataset_surplus"].get<double>(), kMidLevelDatasetSurplus);
  for (const nlohmann::json& c : reference["cases"]) {
    // The weights as typed, each followed by a prefix, through the flag parser.
    std::vector<std::string> entries;
    for (size_t k = 0; k < c["weights"].size(); ++k) {
      entries.push_back(c["weights"][k].get<std::string>());
      entries.push_back(absl::StrCat("data/corpus_", k));
    }
    const std::string value = absl::StrJoin(entries, " ");
    SCOPED_TRACE(absl::StrCat("--data-path=\"", value, "\" size ", c["size"].get<int64_t>()));
    absl::StatusOr<BlendSpec> spec = ParseBlend("--data-path", value);
    ASSERT_TRUE(spec.ok()) << spec.status();
    ASSERT_EQ(spec->weights.size(), c["weights"].size());
    for (size_t k = 0; k < spec->weights.size(); ++k) {
      EXPECT_EQ(spec->prefixes[k], absl::StrCat("data/corpus_", k));
      // Bit for bit: Megatron's numbers as C99 hex floats.
      const std::string hex = c["normalized_weights_hex"][k].get<std::string>();
      EXPECT_EQ(spec->weights[k], std::strtod(hex.c_str(), nullptr)) << "weight " << k;
    }
    const int64_t size = c["size"].get<int64_t>();
    EXPECT_EQ(BlendSamplesPerDataset(spec->weights, size),
              c["samples_per_dataset"].get<std::vector<int64_t>>());
    EXPECT_EQ(BlendSamplesPerDataset(spec->weights, size, kMidLevelDatasetSurplus),
              c["samples_built_per_dataset"].get<std::vector<int64_t>>());
    const int64_t blend_size = c["blend_size"].get<int64_t>();
    const BlendingIndices indices = BuildBlendingIndices(spec->weights, blend_size);
    const auto dataset_index = c["dataset_index"].get<std::vector<int16_t>>();
    const auto dataset_sample_index = c["dataset_sample_index"].get<std::vector<int64_t>>();
    ASSERT_EQ(dataset_index.size(), static_cast<size_t>(blend_size));
    EXPECT_EQ(indices.dataset_index, dataset_index);
    EXPECT_EQ(indices.dataset_sample_index, dataset_sample_index);
  }
}

void ExpectError(const std::string& value, const std::vector<std::string>& words) {
  absl::StatusOr<BlendSpec> spec = ParseBlend("--train-data-path", value);
  ASSERT_FALSE(spec.ok()) << value;
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(spec.status().message());
  EXPECT_NE(message.find("--train-data-path"), std::string::npos) << message;
  for (const std::string& w : words) EXPECT_NE(message.find(w), std::string::npos) << message;
}

TEST(BlendTest, ParsesMegatronsListForms) {
  absl::StatusOr<BlendSpec> one = ParseBlend("--data-path", "data/my");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->prefixes, std::vector<std::string>{"data/my"});
  EXPECT_TRUE(one->weights.empty());
  absl::StatusOr<BlendSpec> two = ParseBlend("--data-path", "  30 data/a\t70   data/b ");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->prefixes, (std::vector<std::string>{"data/a", "data/b"}));
  EXPECT_EQ(two->weights, (std::vector<double>{30.0 / 100.0, 70.0 / 100.0}));
  // One weighted prefix is a blend of one, as in Megatron.
  absl::StatusOr<BlendSpec> weighted = ParseBlend("--data-path", "2 data/a");
  ASSERT_TRUE(weighted.ok());
  EXPECT_EQ(weighted->weights, std::vector<double>{1.0});
}

TEST(BlendTest, BadListsAreClearErrors) {
  ExpectError("", {"empty"});
  ExpectError("0.3 data/a 0.7", {"odd", "0.7 has no prefix"});
  ExpectError("0.3 data/a -0.7 data/b", {"data/b", "-0.7", "positive"});
  ExpectError("0.3 data/a 0 data/b", {"data/b", "positive"});
  ExpectError("0.3 data/a x data/b", {"\"x\"", "not a number"});
  ExpectError("data/a data/b data/c", {"3 prefixes without weights"});
  ExpectError("data/a 0.3 data/b 0.7", {"starts with the prefix \"data/a\""});
}

// Document d of a corpus holds tokens base + d*100 + 0, 1, ..., lengths[d]-1.
std::unique_ptr<IndexedDataset> MakeCorpus(const std::string& prefix, int32_t base, int documents) {
  auto w = IndexedDatasetWriter::Create(prefix, TokenType::kI32);
  EXPECT_TRUE(w.ok()) << w.status();
  for (int d = 0; d < documents; ++d) {
    std::vector<int32_t> t(5 + d % 7);
    for (size_t k = 0; k < t.size(); ++k) t[k] = base + d * 100 + static_cast<int32_t>(k);
    EXPECT_TRUE((*w)->AddSequence(t.data(), t.size()).ok());
    EXPECT_TRUE((*w)->EndDocument().ok());
  }
  EXPECT_TRUE((*w)->Finalize().ok());
  return *IndexedDataset::Open(prefix);
}

TEST(BlendTest, MissingIndexNamesTheFlagAndFile) {
  const std::string a = Tmp("present");
  MakeCorpus(a, 0, 3);
  BlendSpec spec = *ParseBlend("--valid-data-path", absl::StrCat("1 ", a, " 1 ", Tmp("absent")));
  absl::Status missing = CheckBlendFiles("--valid-data-path", spec);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("--valid-data-path"), std::string::npos) << missing;
  EXPECT_NE(missing.message().find(Tmp("absent") + ".idx"), std::string::npos) << missing;
  spec = *ParseBlend("--data-path", a + ".idx");
  missing = CheckBlendFiles("--data-path", spec);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("without the extension (" + a + ")"), std::string::npos)
      << missing;
  EXPECT_TRUE(CheckBlendFiles("--data-path", *ParseBlend("--data-path", a)).ok());
  // One corpus in a folder with a space: one prefix, not a list.
  const std::string spaced = Tmp("with space") + "/corpus";
  std::filesystem::create_directories(Tmp("with space"));
  MakeCorpus(spaced, 0, 3);
  absl::StatusOr<BlendSpec> one = ParseBlend("--data-path", spaced);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->prefixes, std::vector<std::string>{spaced});
  EXPECT_TRUE(one->weights.empty());
}

struct Corpora {
  std::unique_ptr<IndexedDataset> a, b;
  std::string prefix_a, prefix_b;
};

Corpora TwoCorpora(const std::string& name) {
  Corpora c;
  c.prefix_a = Tmp(name + "_a");
  c.prefix_b = Tmp(name + "_b");
  c.a = MakeCorpus(c.prefix_a, 0, 40);        // tokens below 100000
  c.b = MakeCorpus(c.prefix_b, 100000, 25);   // tokens from 100000 on
  return c;
}

absl::StatusOr<std::unique_ptr<BlendedDataset>> BuildBlend(const Corpora& c,
                                                           std::vector<double> weights,
                                                           int64_t num_samples,
                                                           const std::string& cache_dir) {
  BlendedDatasetOptions o;
  o.seq_length = 8;
  o.num_samples = num_samples;
  o.split = "969,30,1";
  o.cache_dir = cache_dir;
  std::vector<BlendSource> sources = {
      {c.a.get(), c.prefix_a, {0, int64_t(c.a->num_documents())}},
      {c.b.get(), c.prefix_b, {0, int64_t(c.b->num_documents())}}};
  return BlendedDataset::Build(std::move(sources), std::move(weights), o);
}

TEST(BlendTest, SamplesComeFromTheIndexedDatasets) {
  Corpora c = TwoCorpora("samples");
  const std::vector<double> weights = ParseBlend("--data-path", "0.3 a 0.7 b")->weights;
  ASSERT_EQ(weights.size(), 2u);
  auto blend = BuildBlend(c, weights, 300, "");
  ASSERT_TRUE(blend.ok()) << blend.status();
  const BlendedDataset& ds = **blend;
  const std::vector<int64_t> shares = BlendSamplesPerDataset(weights, 300);
  EXPECT_EQ(ds.num_samples(), shares[0] + shares[1]);
  EXPECT_EQ(ds.dataset(0).num_samples(), BlendSamplesPerDataset(weights, 300, 0.005)[0]);
  std::vector<int64_t> from(2, 0);
  std::vector<int32_t> tokens(9), direct(9);
  for (int64_t i = 0; i < ds.num_samples(); ++i) {
    absl::StatusOr<BlendedDataset::Location> at = ds.Locate(i);
    ASSERT_TRUE(at.ok());
    ASSERT_TRUE(ds.SampleTokens(i, 0, 9, tokens.data()).ok());
    ASSERT_TRUE(ds.dataset(at->dataset).SampleTokens(at->sample, 0, 9, direct.data()).ok());
    EXPECT_EQ(tokens, direct);
    // Every token of the sample is of the corpus the index names.
    for (int32_t t : tokens) EXPECT_EQ(t >= 100000, at->dataset == 1) << "sample " << i;
    // Each dataset's samples are taken in order, each once.
    EXPECT_EQ(at->sample, from[at->dataset]++);
    // The running share never strays more than a sample from the weight.
    EXPECT_LE(std::abs(double(from[0]) - 0.3 * double(i + 1)), 1.0) << "sample " << i;
  }
  EXPECT_EQ(from[0], shares[0]);
  EXPECT_EQ(from[1], shares[1]);
  EXPECT_FALSE(ds.Locate(ds.num_samples()).ok());
}

TEST(BlendTest, SinglePrefixIsTheDatasetAsIs) {
  Corpora c = TwoCorpora("single");
  BlendedDatasetOptions o;
  o.seq_length = 8;
  o.num_samples = 50;
  auto blend = BlendedDataset::Build({{c.a.get(), c.prefix_a, {0, 40}}}, {}, o);
  ASSERT_TRUE(blend.ok()) << blend.status();
  EXPECT_EQ((*blend)->num_samples(), 50);
  EXPECT_EQ((*blend)->dataset(0).num_samples(), 50);
  EXPECT_TRUE((*blend)->indices().dataset_index.empty());
  EXPECT_EQ((*blend)->Locate(17)->sample, 17);
  EXPECT_EQ((*blend)->Locate(17)->dataset, 0);
}

std::vector<std::string> Files(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(BlendTest, IndicesAreCachedAndRebuiltWhenAnInputChanges) {
  Corpora c = TwoCorpora("cache");
  const std::string cache = Tmp("blend_cache");
  auto first = BuildBlend(c, {0.25, 0.75}, 200, cache);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE((*first)->indices_loaded_from_cache());
  const std::string path = (*first)->cache_path();
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  // Nothing half-written is left: only finished files, no temporaries.
  for (const std::string& name : Files(cache)) {
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;
  }

  auto again = BuildBlend(c, {0.25, 0.75}, 200, cache);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE((*again)->indices_loaded_from_cache());
  EXPECT_EQ((*again)->cache_path(), path);
  EXPECT_EQ((*again)->indices().dataset_index, (*first)->indices().dataset_index);
  EXPECT_EQ((*again)->indices().dataset_sample_index, (*first)->indices().dataset_sample_index);

  // Other weights, another size: other files.
  auto weights = BuildBlend(c, {0.5, 0.5}, 200, cache);
  ASSERT_TRUE(weights.ok());
  EXPECT_FALSE((*weights)->indices_loaded_from_cache());
  EXPECT_NE((*weights)->cache_path(), path);
  auto size = BuildBlend(c, {0.25, 0.75}, 201, cache);
  ASSERT_TRUE(size.ok());
  EXPECT_FALSE((*size)->indices_loaded_from_cache());

  // A damaged file is rebuilt, not trusted, and written whole again.
  const auto whole = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, whole - 3);
  auto damaged = BuildBlend(c, {0.25, 0.75}, 200, cache);
  ASSERT_TRUE(damaged.ok()) << damaged.status();
  EXPECT_FALSE((*damaged)->indices_loaded_from_cache());
  EXPECT_EQ((*damaged)->indices().dataset_index, (*first)->indices().dataset_index);
  EXPECT_EQ(std::filesystem::file_size(path), whole);

  // A corpus written anew (another size and mtime): rebuilt under another name.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  c.b = MakeCorpus(c.prefix_b, 100000, 26);
  auto rewritten = BuildBlend(c, {0.25, 0.75}, 200, cache);
  ASSERT_TRUE(rewritten.ok());
  EXPECT_FALSE((*rewritten)->indices_loaded_from_cache());
  EXPECT_NE((*rewritten)->cache_path(), path);
}

}  // namespace
}  // namespace loom::train
