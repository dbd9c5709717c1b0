// The safetensors reader and writer against files transformers saved
// (checkpoint/hf/testdata, made by tools/hf_reference/make_reference.py):
// every tensor's name, dtype, shape and values as the safetensors package
// read them; sharded == unsharded; write -> read bit for bit (F32, BF16, with
// torch's own bf16 rounding as the reference); and bad files give errors
// that name the file and what was wrong.
#include "checkpoint/hf/safetensors.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "checkpoint/file_util.h"
#include "checkpoint/hf/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace loom::checkpoint::hf {
namespace {

using ::loom::checkpoint::hf::testing::TempDir;
using ::loom::checkpoint::hf::testing::TestData;
using ::testing::HasSubstr;

nlohmann::json ReadJson(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  EXPECT_TRUE(text.ok()) << text.status();
  return nlohmann::json::parse(text.ok() ? *text : "{}");
}

// A safetensors file from a header JSON text and a data section.
std::string MakeFile(const std::string& header, const std::string& data) {
  std::string out;
  const uint64_t n = header.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  return out + header + data;
}

void Write(const std::string& path, const std::string& bytes) {
  ASSERT_TRUE(WriteFileDurably(path, bytes).ok()) << path;
}

void CopyFile(const std::string& from, const std::string& to) {
  absl::StatusOr<std::string> bytes = ReadFile(from);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  Write(to, *bytes);
}

// Copies a reference model folder (only the files it names) to a temp folder.
std::string CopyModel(const std::string& name, const std::vector<std::string>& files,
                      const std::string& tmp_name) {
  const std::string dir = TempDir(tmp_name);
  for (const std::string& f : files) CopyFile(TestData(name + "/" + f), dir + "/" + f);
  return dir;
}

const std::vector<std::string> kShardFiles = {
    "model.safetensors.index.json", "model-00001-of-00003.safetensors",
    "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"};

// ---------------------------------------------------------------------------
// Reference data.

class ReferenceTest : public ::testing::TestWithParam<std::string> {};

// Every tensor transformers saved, with the name, dtype, shape and values
// (sum, sum of squares, first elements) the safetensors package read.
TEST_P(ReferenceTest, EveryTensorAsTransformersSavedIt) {
  const std::string dir = TestData(GetParam());
  const nlohmann::json ref = ReadJson(dir + "/reference.json");
  absl::StatusOr<TensorSet> set = ReadSafetensorsDir(dir);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->metadata.at("format"), "pt");
  std::set<std::string> expected_names;
  for (const nlohmann::json& t : ref["tensors"]) {
    const std::string name = t["name"];
    expected_names.insert(name);
    SCOPED_TRACE(name);
    const NamedTensor* got = set->Find(name);
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(DtypeName(got->dtype), t["dtype"].get<std::string>());
    EXPECT_EQ(got->shape, t["shape"].get<std::vector<int64_t>>());
    absl::StatusOr<std::vector<float>> values = got->ToF32();
    ASSERT_TRUE(values.ok()) << values.status();
    double sum = 0, sum_sq = 0;
    for (float v : *values) {
      sum += v;
      sum_sq += static_cast<double>(v) * v;
    }
    EXPECT_NEAR(sum, t["sum"].get<double>(), 1e-9 * (1 + std::abs(sum)));
    EXPECT_NEAR(sum_sq, t["sum_sq"].get<double>(), 1e-9 * sum_sq);
    const std::vector<double> first = t["first"];
    for (size_t i = 0; i < first.size(); ++i) {
      EXPECT_EQ((*values)[i], static_cast<float>(first[i])) << "element " << i;
    }
  }
  std::vector<std::string> names = set->Names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected_names);
  EXPECT_EQ(names.size(), expected_names.size()) << "a name read twice";
}

// Reading only the header gives the same names, dtypes and shapes.
TEST_P(ReferenceTest, HeaderMatchesFullRead) {
  const std::string dir = TestData(GetParam());
  const nlohmann::json ref = ReadJson(dir + "/reference.json");
  for (const std::string file : ref["files"]) {
    absl::StatusOr<TensorSet> header = ReadSafetensorsHeader(dir + "/" + file);
    absl::StatusOr<TensorSet> full = ReadSafetensors(dir + "/" + file);
    ASSERT_TRUE(header.ok()) << header.status();
    ASSERT_TRUE(full.ok()) << full.status();
    ASSERT_EQ(header->Names(), full->Names());
    for (size_t i = 0; i < full->tensors.size(); ++i) {
      EXPECT_EQ(header->tensors[i].dtype, full->tensors[i].dtype);
      EXPECT_EQ(header->tensors[i].shape, full->tensors[i].shape);
      EXPECT_TRUE(header->tensors[i].data.empty());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ReferenceTest,
                         ::testing::Values("gpt2_tiny", "llama_tiny", "llama_tiny_sharded",
                                           "llama_tiny_bf16"));

// GPT-2 ties lm_head to wte: transformers saves no lm_head; Llama here is
// untied and grouped-query (k/v projections have 2 of 4 heads).
TEST(ReferenceModels, Gpt2TiedLlamaUntiedWithGqa) {
  absl::StatusOr<TensorSet> gpt2 = ReadSafetensorsDir(TestData("gpt2_tiny"));
  absl::StatusOr<TensorSet> llama = ReadSafetensorsDir(TestData("llama_tiny"));
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(gpt2->tensors.size(), 2u + 12u * 2 + 2);
  EXPECT_EQ(gpt2->Find("lm_head.weight"), nullptr);
  ASSERT_NE(gpt2->Find("transformer.h.1.attn.c_attn.weight"), nullptr);
  EXPECT_EQ(gpt2->Find("transformer.h.1.attn.c_attn.weight")->shape,
            (std::vector<int64_t>{32, 96}));  // Conv1D: [in, out]
  EXPECT_EQ(llama->tensors.size(), 2u + 9u * 2 + 1);
  ASSERT_NE(llama->Find("lm_head.weight"), nullptr);
  ASSERT_NE(llama->Find("model.layers.0.self_attn.k_proj.weight"), nullptr);
  EXPECT_EQ(llama->Find("model.layers.0.self_attn.k_proj.weight")->shape,
            (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(llama->Find("model.layers.0.mlp.gate_proj.weight")->shape,
            (std::vector<int64_t>{64, 32}));
}

// The reference logits file holds the shape reference.json gives.
TEST(ReferenceModels, LogitsFilesHaveTheirShape) {
  for (const char* name : {"gpt2_tiny", "llama_tiny", "llama_tiny_sharded"}) {
    SCOPED_TRACE(name);
    const nlohmann::json ref = ReadJson(TestData(std::string(name) + "/reference.json"));
    const std::vector<int64_t> shape = ref["logits_shape"];
    ASSERT_EQ(shape, (std::vector<int64_t>{2, 16, 96}));
    EXPECT_EQ(ref["input_ids"].size(), 2u);
    EXPECT_EQ(ref["input_ids"][0].size(), 16u);
    absl::StatusOr<std::string> logits =
        ReadFile(TestData(std::string(name) + "/" + ref["logits_file"].get<std::string>()));
    ASSERT_TRUE(logits.ok()) << logits.status();
    EXPECT_EQ(logits->size(), 2u * 16 * 96 * sizeof(float));
  }
}

// The sharded copy (3 files and an index) reads as the single file, bit for bit.
TEST(ReferenceModels, ShardedEqualsUnshardedBitForBit) {
  absl::StatusOr<TensorSet> one = ReadSafetensorsDir(TestData("llama_tiny"));
  absl::StatusOr<TensorSet> sharded = ReadSafetensorsDir(TestData("llama_tiny_sharded"));
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  const nlohmann::json index = ReadJson(TestData("llama_tiny_sharded/model.safetensors.index.json"));
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file.get<std::string>());
  EXPECT_GE(shards.size(), 2u);
  ASSERT_EQ(one->tensors.size(), sharded->tensors.size());
  for (const NamedTensor& t : one->tensors) {
    SCOPED_TRACE(t.name);
    const NamedTensor* s = sharded->Find(t.name);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->dtype, t.dtype);
    EXPECT_EQ(s->shape, t.shape);
    EXPECT_TRUE(s->data == t.data);
  }
  // Through the index path too.
  absl::StatusOr<TensorSet> by_index =
      ReadShardedSafetensors(TestData("llama_tiny_sharded/model.safetensors.index.json"));
  ASSERT_TRUE(by_index.ok()) << by_index.status();
  EXPECT_EQ(by_index->Names(), sharded->Names());
}

// ---------------------------------------------------------------------------
// Writing.

TEST(SafetensorsWrite, F32RoundTripBitForBit) {
  absl::StatusOr<TensorSet> in = ReadSafetensorsDir(TestData("llama_tiny"));
  ASSERT_TRUE(in.ok()) << in.status();
  const std::string path = TempDir("f32") + "/model.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, in->tensors).ok());
  absl::StatusOr<TensorSet> out = ReadSafetensors(path);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->Names(), in->Names());  // file order kept
  for (size_t i = 0; i < in->tensors.size(); ++i) {
    EXPECT_EQ(out->tensors[i].dtype, Dtype::kF32);
    EXPECT_EQ(out->tensors[i].shape, in->tensors[i].shape);
    EXPECT_TRUE(out->tensors[i].data == in->tensors[i].data) << in->tensors[i].name;
  }
  EXPECT_EQ(out->metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  // Data 8-byte aligned, and writing what was read gives the same bytes again.
  absl::StatusOr<std::string> bytes = ReadFile(path);
  ASSERT_TRUE(bytes.ok());
  uint64_t n;
  std::memcpy(&n, bytes->data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  absl::StatusOr<std::string> again = SerializeSafetensors(out->tensors);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(*again == *bytes);
}

// Our f32 -> bf16 rounding is torch's: writing llama_tiny as BF16 gives the
// bytes of llama_tiny_bf16 (torch .to(bfloat16)); BF16 -> BF16 is exact.
TEST(SafetensorsWrite, Bf16MatchesTorchAndRoundTrips) {
  absl::StatusOr<TensorSet> f32 = ReadSafetensorsDir(TestData("llama_tiny"));
  absl::StatusOr<TensorSet> torch_bf16 = ReadSafetensorsDir(TestData("llama_tiny_bf16"));
  ASSERT_TRUE(f32.ok()) << f32.status();
  ASSERT_TRUE(torch_bf16.ok()) << torch_bf16.status();
  const std::string dir = TempDir("bf16");
  WriteOptions bf16;
  bf16.float_dtype = Dtype::kBF16;
  ASSERT_TRUE(WriteSafetensors(dir + "/a.safetensors", f32->tensors, bf16).ok());
  absl::StatusOr<TensorSet> ours = ReadSafetensors(dir + "/a.safetensors");
  ASSERT_TRUE(ours.ok()) << ours.status();
  ASSERT_EQ(ours->tensors.size(), torch_bf16->tensors.size());
  for (const NamedTensor& t : ours->tensors) {
    SCOPED_TRACE(t.name);
    const NamedTensor* ref = torch_bf16->Find(t.name);
    ASSERT_NE(ref, nullptr);
    EXPECT_EQ(t.dtype, Dtype::kBF16);
    EXPECT_EQ(ref->dtype, Dtype::kBF16);
    EXPECT_EQ(t.shape, ref->shape);
    EXPECT_TRUE(t.data == ref->data);
  }
  // BF16 in, BF16 out: the same bytes.
  ASSERT_TRUE(WriteSafetensors(dir + "/b.safetensors", ours->tensors, bf16).ok());
  absl::StatusOr<TensorSet> again = ReadSafetensors(dir + "/b.safetensors");
  ASSERT_TRUE(again.ok()) << again.status();
  for (size_t i = 0; i < ours->tensors.size(); ++i) {
    EXPECT_TRUE(again->tensors[i].data == ours->tensors[i].data);
  }
  // Widened on request: exactly the bf16 values as f32; f32 -> f32 keeps them.
  ReadOptions widen;
  widen.to_f32 = true;
  absl::StatusOr<TensorSet> wide = ReadSafetensors(dir + "/b.safetensors", widen);
  ASSERT_TRUE(wide.ok()) << wide.status();
  for (size_t i = 0; i < wide->tensors.size(); ++i) {
    const NamedTensor& w = wide->tensors[i];
    ASSERT_EQ(w.dtype, Dtype::kF32);
    const std::vector<float> orig = *f32->Find(w.name)->ToF32();
    const std::vector<float> got = *w.ToF32();
    ASSERT_EQ(got.size(), orig.size());
    for (size_t j = 0; j < got.size(); ++j) {
      ASSERT_EQ(got[j], Bf16ToF32(F32ToBf16(orig[j]))) << w.name << "[" << j << "]";
    }
  }
  ASSERT_TRUE(WriteSafetensors(dir + "/c.safetensors", wide->tensors).ok());
  absl::StatusOr<TensorSet> c = ReadSafetensors(dir + "/c.safetensors");
  ASSERT_TRUE(c.ok());
  for (size_t i = 0; i < c->tensors.size(); ++i) {
    EXPECT_TRUE(c->tensors[i].data == wide->tensors[i].data);
  }
}

TEST(SafetensorsWrite, I64KeptF16WidenedMetadataKept) {
  NamedTensor ids;
  ids.name = "ids";
  ids.dtype = Dtype::kI64;
  ids.shape = {3};
  const int64_t v[3] = {-1, 0, int64_t{1} << 40};
  ids.data.assign(reinterpret_cast<const char*>(v), sizeof(v));
  NamedTensor half;
  half.name = "half";
  half.dtype = Dtype::kF16;
  half.shape = {2, 2};
  const uint16_t h[4] = {0x3c00, 0xc000, 0x0001, 0x7bff};  // 1, -2, 2^-24, 65504
  half.data.assign(reinterpret_cast<const char*>(h), sizeof(h));
  NamedTensor scalar = NamedTensor::FromF32("scalar", {}, {0.5f});
  WriteOptions options;
  options.metadata = {{"format", "pt"}, {"made_by", "loom"}};
  const std::string path = TempDir("mixed") + "/m.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, {ids, half, scalar}, options).ok());
  absl::StatusOr<TensorSet> got = ReadSafetensors(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->metadata, options.metadata);
  ASSERT_EQ(got->Names(), (std::vector<std::string>{"ids", "half", "scalar"}));
  EXPECT_EQ(got->tensors[0].dtype, Dtype::kI64);
  EXPECT_TRUE(got->tensors[0].data == ids.data);
  EXPECT_EQ(got->tensors[1].dtype, Dtype::kF32);
  EXPECT_EQ(*got->tensors[1].ToF32(), (std::vector<float>{1.0f, -2.0f, std::ldexp(1.0f, -24), 65504.0f}));
  EXPECT_EQ(got->tensors[2].shape, std::vector<int64_t>{});
  EXPECT_EQ(*got->tensors[2].ToF32(), std::vector<float>{0.5f});
  EXPECT_FALSE(got->tensors[0].ToF32().ok());
}

TEST(SafetensorsWrite, RefusesBadTensors) {
  NamedTensor a = NamedTensor::FromF32("a", {2}, {1, 2});
  NamedTensor short_data = NamedTensor::FromF32("s", {3}, {1, 2});
  const std::string dir = TempDir("write_bad");
  absl::Status dup = WriteSafetensors(dir + "/dup.safetensors", {a, a});
  EXPECT_EQ(dup.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dup.message(), HasSubstr("dup.safetensors"));
  EXPECT_THAT(dup.message(), HasSubstr("'a' appears twice"));
  absl::Status size = WriteSafetensors(dir + "/size.safetensors", {short_data});
  EXPECT_EQ(size.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(size.message(), HasSubstr("'s' has 8 bytes for F32[3]"));
  WriteOptions f16;
  f16.float_dtype = Dtype::kF16;
  absl::Status dtype = WriteSafetensors(dir + "/f16.safetensors", {a}, f16);
  EXPECT_EQ(dtype.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(PathExists(dir + "/dup.safetensors"));
}

// ---------------------------------------------------------------------------
// Conversions.

TEST(Conversions, Bf16RoundsToNearestEvenKeepsSpecials) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie -> even (down)
  EXPECT_EQ(F32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(F32ToBf16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
  uint32_t snan_bits = 0x7f800001u;  // a NaN whose payload is all in the low half
  float snan;
  std::memcpy(&snan, &snan_bits, 4);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(snan))));
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToF32(0xc000), -2.0f);
}

TEST(Conversions, F16ToF32Exact) {
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0x3555), 0.333251953125f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16ToF32(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(F16ToF32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToF32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(F16ToF32(0x7e00)));
  EXPECT_TRUE(std::signbit(F16ToF32(0x8000)));
}

// ---------------------------------------------------------------------------
// Bad files: each error names the file as given and what was wrong.

void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& path,
                 const std::vector<std::string>& words) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(path));
  for (const std::string& w : words) EXPECT_THAT(std::string(s.message()), HasSubstr(w));
}

TEST(SafetensorsErrors, MissingFile) {
  const std::string path = TempDir("missing") + "/nope.safetensors";
  ExpectError(ReadSafetensors(path).status(), absl::StatusCode::kNotFound, path, {"no such file"});
}

TEST(SafetensorsErrors, ShorterThanTheLength) {
  const std::string path = TempDir("short") + "/short.safetensors";
  Write(path, "abc");
  ExpectError(ReadSafetensors(path).status(), absl::StatusCode::kDataLoss, path,
              {"truncated", "3 bytes"});
}

TEST(SafetensorsErrors, HeaderClaimsMoreBytesThanTheFile) {
  const std::string path = TempDir("long_header") + "/h.safetensors";
  std::string file = MakeFile("{}", "");
  const uint64_t n = 1000;
  std::memcpy(file.data(), &n, 8);
  Write(path, file);
  ExpectError(ReadSafetensors(path).status(), absl::StatusCode::kDataLoss, path,
              {"truncated", "header length says 1000 bytes", "only 2 follow"});
}

// A real file cut short: the last tensor's data_offsets run past the end.
TEST(SafetensorsErrors, TruncatedDataNamesTheTensor) {
  const std::string dir = TempDir("truncated");
  absl::StatusOr<std::string> bytes = ReadFile(TestData("llama_tiny/model.safetensors"));
  ASSERT_TRUE(bytes.ok());
  const std::string path = dir + "/model.safetensors";
  Write(path, bytes->substr(0, bytes->size() - 100));
  absl::StatusOr<TensorSet> header = ReadSafetensorsHeader(TestData("llama_tiny/model.safetensors"));
  ASSERT_TRUE(header.ok());
  const std::string last = header->tensors.back().name;
  for (const absl::Status& s : {ReadSafetensors(path).status(), ReadSafetensorsHeader(path).status(),
                                ReadSafetensorsDir(dir).status()}) {
    ExpectError(s, absl::StatusCode::kDataLoss, path, {"'" + last + "'", "truncated", "past the end"});
  }
}

// Cut anywhere, a file is refused (never read short or crashed on), naming it.
TEST(SafetensorsErrors, CutAtEveryLength) {
  const std::string dir = TempDir("cut");
  const std::string whole = dir + "/whole.safetensors";
  ASSERT_TRUE(WriteSafetensors(whole, {NamedTensor::FromF32("a", {2}, {1, 2}),
                                       NamedTensor::FromF32("b", {1, 3}, {3, 4, 5})})
                  .ok());
  absl::StatusOr<std::string> bytes = ReadFile(whole);
  ASSERT_TRUE(bytes.ok());
  ASSERT_TRUE(ReadSafetensors(whole).ok());
  const std::string path = dir + "/cut.safetensors";
  for (size_t n = 0; n < bytes->size(); ++n) {
    SCOPED_TRACE(n);
    Write(path, bytes->substr(0, n));
    const absl::Status s = ReadSafetensors(path).status();
    ASSERT_FALSE(s.ok());
    EXPECT_TRUE(s.code() == absl::StatusCode::kDataLoss ||
                s.code() == absl::StatusCode::kInvalidArgument)
        << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(path));
  }
}

TEST(SafetensorsErrors, BadHeaderJson) {
  const std::string path = TempDir("bad_json") + "/j.safetensors";
  Write(path, MakeFile("{\"a\": {\"dtype\": \"F32\",", "xxxx"));
  ExpectError(ReadSafetensors(path).status(), absl::StatusCode::kInvalidArgument, path,
              {"bad safetensors header JSON"});
  Write(path, MakeFile("[1, 2]", ""));
  ExpectError(ReadSafetensors(path).status(), absl::StatusCode::kInvalidArgument, path,
              {"bad header JSON", "expected an object"});
  Write(path, MakeFile(R"({"a": {"dtype": "F32", "shape": [1]}})", "xxxx"));
  ExpectError(ReadSafetensors(path).status(), absl::StatusCode::kInvalidArgument, path,
              {"tensor 'a'", "data_offsets"});
  Write(path, MakeFile(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", "xxxx"));
  ExpectError(ReadSafetensors(path).status(), absl::StatusCode::kInvalidArgument, path,
              {"tensor 'a'", "shape [-1]"});
}

TEST(SafetensorsErrors, UnknownDtype) {
  const std::string path = TempDir("dtype") + "/d.safetensors";
  Write(path, MakeFile(R"({"w": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}})", "xxxx"));
  ExpectError(ReadSafetensors(path).status(), absl::StatusCode::kInvalidArgument, path,
              {"tensor 'w'", "unknown dtype 'F8_E4M3'"});
}

TEST(SafetensorsErrors, DuplicatedNames) {
  const std::string path = TempDir("dup") + "/d.safetensors";
  Write(path, MakeFile(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                       R"( "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                       "xxxxyyyy"));
  ExpectError(ReadSafetensors(path).status(), absl::StatusCode::kInvalidArgument, path,
              {"'w' appears twice"});
}

TEST(SafetensorsErrors, SizeMismatchAndOverlap) {
  const std::string path = TempDir("overlap") + "/o.safetensors";
  Write(path, MakeFile(R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})",
                       std::string(16, 'x')));
  ExpectError(ReadSafetensors(path).status(), absl::StatusCode::kDataLoss, path,
              {"tensor 'w'", "hold 12 bytes", "F32[2, 2] needs 16"});
  Write(path, MakeFile(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                       R"( "b": {"dtype": "BF16", "shape": [2], "data_offsets": [6, 10]}})",
                       std::string(10, 'x')));
  ExpectError(ReadSafetensors(path).status(), absl::StatusCode::kDataLoss, path,
              {"'a'", "'b'", "overlap"});
}

TEST(SafetensorsErrors, NoCheckpointInFolder) {
  const std::string dir = TempDir("empty_model");
  ExpectError(ReadSafetensorsDir(dir).status(), absl::StatusCode::kNotFound, dir,
              {"model.safetensors.index.json", "model.safetensors"});
}

TEST(ShardedErrors, MissingShard) {
  const std::string dir = CopyModel("llama_tiny_sharded", kShardFiles, "missing_shard");
  ASSERT_TRUE(ReadSafetensorsDir(dir).ok());
  ASSERT_TRUE(RemoveTree(dir + "/model-00002-of-00003.safetensors").ok());
  ExpectError(ReadSafetensorsDir(dir).status(), absl::StatusCode::kNotFound,
              dir + "/model.safetensors.index.json",
              {"shard " + dir + "/model-00002-of-00003.safetensors", "is missing"});
}

TEST(ShardedErrors, ListedInIndexButAbsentFromShard) {
  const std::string dir = CopyModel("llama_tiny_sharded", kShardFiles, "absent_tensor");
  nlohmann::ordered_json index = ReadJson(dir + "/model.safetensors.index.json");
  index["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00001-of-00003.safetensors";
  Write(dir + "/model.safetensors.index.json", index.dump(2));
  ExpectError(ReadSafetensorsDir(dir).status(), absl::StatusCode::kNotFound,
              dir + "/model.safetensors.index.json",
              {"'model.layers.9.mlp.up_proj.weight'", "absent from its shard",
               dir + "/model-00001-of-00003.safetensors"});
}

TEST(ShardedErrors, ShardHoldsTensorTheIndexMapsElsewhereOrNotAtAll) {
  const std::string dir = CopyModel("llama_tiny_sharded", kShardFiles, "unlisted_tensor");
  nlohmann::ordered_json index = ReadJson(dir + "/model.safetensors.index.json");
  const std::string shard = index["weight_map"]["lm_head.weight"];
  index["weight_map"].erase("lm_head.weight");
  Write(dir + "/model.safetensors.index.json", index.dump(2));
  ExpectError(ReadSafetensorsDir(dir).status(), absl::StatusCode::kInvalidArgument,
              dir + "/" + shard, {"'lm_head.weight'", "does not list"});
}

TEST(ShardedErrors, DuplicatedNameInIndexAndBadIndex) {
  const std::string dir = CopyModel("llama_tiny_sharded", kShardFiles, "dup_index");
  const std::string index_path = dir + "/model.safetensors.index.json";
  Write(index_path, R"({"weight_map": {"lm_head.weight": "model-00001-of-00003.safetensors",)"
                    R"( "lm_head.weight": "model-00003-of-00003.safetensors"}})");
  ExpectError(ReadSafetensorsDir(dir).status(), absl::StatusCode::kInvalidArgument, index_path,
              {"'lm_head.weight' appears twice"});
  Write(index_path, R"({"metadata": {}})");
  ExpectError(ReadSafetensorsDir(dir).status(), absl::StatusCode::kInvalidArgument, index_path,
              {"weight_map"});
  Write(index_path, R"({"weight_map": {"lm_head.weight": "../elsewhere.safetensors"}})");
  ExpectError(ReadSafetensorsDir(dir).status(), absl::StatusCode::kInvalidArgument, index_path,
              {"../elsewhere.safetensors"});
  ExpectError(ReadShardedSafetensors(dir + "/nope.json").status(), absl::StatusCode::kNotFound,
              dir + "/nope.json", {"no such file"});
}

}  // namespace
}  // namespace loom::checkpoint::hf
