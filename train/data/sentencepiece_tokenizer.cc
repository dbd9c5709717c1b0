#include "train/data/sentencepiece_tokenizer.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "train/data/sentencepiece_shim.h"
#include "tools/cpp/runfiles/runfiles.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define LOOM_SANITIZER_RUNTIME 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define LOOM_SANITIZER_RUNTIME 1
#endif
#endif

namespace loom::train {

// The shim's entry points, resolved once per process.
struct SentencePieceLibrary {
  decltype(&loom_spm_load) load;
  decltype(&loom_spm_free) free;
  decltype(&loom_spm_piece_size) piece_size;
  decltype(&loom_spm_bos_id) bos_id;
  decltype(&loom_spm_eos_id) eos_id;
  decltype(&loom_spm_encode) encode;
  decltype(&loom_spm_decode) decode;
};

namespace {

constexpr char kShim[] = "loom/train/data/libloom_sentencepiece.so";

void AppendText(void* ctx, const char* text, size_t n) {
  static_cast<std::string*>(ctx)->append(text, n);
}

void AppendIds(void* ctx, const int* ids, size_t n) {
  auto* out = static_cast<std::vector<int32_t>*>(ctx);
  out->insert(out->end(), ids, ids + n);
}

[[maybe_unused]] std::string ShimPath() {
  if (const char* env = std::getenv("LOOM_SENTENCEPIECE_SHIM"); env != nullptr && *env) {
    return env;
  }
  using bazel::tools::cpp::runfiles::Runfiles;
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  std::string argv0 = n > 0 ? std::string(exe, n) : std::string();
  std::string error;
  std::unique_ptr<Runfiles> runfiles(Runfiles::Create(argv0, &error));
  if (runfiles == nullptr) return "";
  return runfiles->Rlocation(kShim);
}

absl::StatusOr<const SentencePieceLibrary*> LoadLibrary() {
#ifndef LOOM_HAVE_SENTENCEPIECE
  return absl::FailedPreconditionError(
      "--tokenizer-type=SentencePieceTokenizer: Loom was built without libsentencepiece "
      "(apt-get install libsentencepiece-dev, or run tools/setup.sh, then rebuild)");
#else
  static absl::StatusOr<const SentencePieceLibrary*>* loaded = [] {
    auto* result = new absl::StatusOr<const SentencePieceLibrary*>();
    const std::string path = ShimPath();
    if (path.empty()) {
      *result = absl::NotFoundError(absl::StrCat(
          "SentencePieceTokenizer: cannot find ", kShim,
          " in the binary's runfiles (run it through bazel, or set LOOM_SENTENCEPIECE_SHIM)"));
      return result;
    }
    int flags = RTLD_NOW | RTLD_LOCAL;
#ifdef LOOM_SANITIZER_RUNTIME
    // ASan/TSan refuse RTLD_DEEPBIND. Without it libsentencepiece binds to the
    // first protobuf in the process: fine unless the system's is loaded.
    if (dlsym(RTLD_DEFAULT, "_ZN6google8protobuf8internal13VerifyVersionEiiPKc") != nullptr) {
      *result = absl::FailedPreconditionError(
          "SentencePieceTokenizer: this sanitizer build also links protobuf, whose symbols "
          "libsentencepiece's bundled copy would bind to (RTLD_DEEPBIND, which keeps them apart, "
          "is incompatible with sanitizers)");
      return result;
    }
#else
    flags |= RTLD_DEEPBIND;
#endif
    void* handle = dlopen(path.c_str(), flags);
    if (handle == nullptr) {
      *result = absl::FailedPreconditionError(
          absl::StrCat("SentencePieceTokenizer: cannot load ", path, ": ", dlerror()));
      return result;
    }
    auto version = reinterpret_cast<decltype(&loom_spm_abi_version)>(
        dlsym(handle, "loom_spm_abi_version"));
    auto* lib = new SentencePieceLibrary();
    bool ok = version != nullptr && version() == LOOM_SPM_ABI_VERSION;
#define LOOM_SPM_SYM(field, name) \
  ok = ok && (lib->field = reinterpret_cast<decltype(lib->field)>(dlsym(handle, name)))
    LOOM_SPM_SYM(load, "loom_spm_load");
    LOOM_SPM_SYM(free, "loom_spm_free");
    LOOM_SPM_SYM(piece_size, "loom_spm_piece_size");
    LOOM_SPM_SYM(bos_id, "loom_spm_bos_id");
    LOOM_SPM_SYM(eos_id, "loom_spm_eos_id");
    LOOM_SPM_SYM(encode, "loom_spm_encode");
    LOOM_SPM_SYM(decode, "loom_spm_decode");
#undef LOOM_SPM_SYM
    if (!ok) {
      delete lib;
      *result = absl::FailedPreconditionError(
          absl::StrCat("SentencePieceTokenizer: ", path, " is not the expected library version"));
      return result;
    }
    *result = lib;  // kept for the life of the process, as is the handle
    return result;
  }();
  return *loaded;
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Load(
    const std::string& model_file) {
  if (!std::ifstream(model_file).good()) {
    return absl::NotFoundError(absl::StrCat("--tokenizer-model=", model_file,
                                            ": cannot open (expected a SentencePiece model file)"));
  }
  absl::StatusOr<const SentencePieceLibrary*> lib = LoadLibrary();
  if (!lib.ok()) return lib.status();
  std::string error;
  LoomSpm* model = (*lib)->load(model_file.c_str(), &error, &AppendText);
  if (model == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokenizer-model=", model_file, " is not a SentencePiece model: ", error));
  }
  std::unique_ptr<SentencePieceTokenizer> t(new SentencePieceTokenizer());
  t->lib_ = *lib;
  t->model_ = model;
  t->vocab_size_ = (*lib)->piece_size(model);
  t->bos_id_ = (*lib)->bos_id(model);
  t->eos_id_ = (*lib)->eos_id(model);
  return t;
}

SentencePieceTokenizer::~SentencePieceTokenizer() {
  if (model_ != nullptr) lib_->free(model_);
}

std::vector<int32_t> SentencePieceTokenizer::Encode(const std::string& text) const {
  std::vector<int32_t> ids;
  std::string error;
  if (lib_->encode(model_, text.data(), text.size(), &ids, &AppendIds, &error, &AppendText) != 0) {
    // Encoding only fails for a model that failed to load; keep the message.
    std::fprintf(stderr, "SentencePieceTokenizer: encode failed: %s\n", error.c_str());
  }
  return ids;
}

std::string SentencePieceTokenizer::Decode(const std::vector<int32_t>& ids) const {
  // Ids outside the vocabulary are skipped (as the other tokenizers do);
  // SentencePiece would refuse the whole sequence.
  std::vector<int> valid;
  valid.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < vocab_size_) valid.push_back(id);
  }
  std::string text, error;
  if (lib_->decode(model_, valid.data(), valid.size(), &text, &AppendText, &error,
                   &AppendText) != 0) {
    std::fprintf(stderr, "SentencePieceTokenizer: decode failed: %s\n", error.c_str());
  }
  return text;
}

}  // namespace loom::train
