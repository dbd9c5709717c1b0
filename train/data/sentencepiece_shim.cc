// libloom_sentencepiece.so: see sentencepiece_shim.h. Includes no Abseil header.
#include "train/data/sentencepiece_shim.h"

#include <sentencepiece_processor.h>

#include <string>
#include <vector>

struct LoomSpm {
  sentencepiece::SentencePieceProcessor sp;
};

namespace {

void Report(void* ctx, LoomSpmTextFn on_error, const std::string& message) {
  if (on_error != nullptr) on_error(ctx, message.data(), message.size());
}

}  // namespace

extern "C" {

int loom_spm_abi_version(void) { return LOOM_SPM_ABI_VERSION; }

LoomSpm* loom_spm_load(const char* path, void* ctx, LoomSpmTextFn on_error) {
  LoomSpm* m = new LoomSpm();
  const sentencepiece::util::Status status = m->sp.Load(path);
  if (!status.ok()) {
    Report(ctx, on_error, status.ToString());
    delete m;
    return nullptr;
  }
  return m;
}

void loom_spm_free(LoomSpm* m) { delete m; }

int loom_spm_piece_size(const LoomSpm* m) { return m->sp.GetPieceSize(); }
int loom_spm_bos_id(const LoomSpm* m) { return m->sp.bos_id(); }
int loom_spm_eos_id(const LoomSpm* m) { return m->sp.eos_id(); }
int loom_spm_unk_id(const LoomSpm* m) { return m->sp.unk_id(); }

int loom_spm_encode(const LoomSpm* m, const char* text, size_t n, void* out_ctx,
                    LoomSpmIdsFn out, void* error_ctx, LoomSpmTextFn on_error) {
  std::vector<int> ids;
  const sentencepiece::util::Status status = m->sp.Encode(std::string_view(text, n), &ids);
  if (!status.ok()) {
    Report(error_ctx, on_error, status.ToString());
    return 1;
  }
  out(out_ctx, ids.data(), ids.size());
  return 0;
}

int loom_spm_decode(const LoomSpm* m, const int* ids, size_t n, void* out_ctx,
                    LoomSpmTextFn out, void* error_ctx, LoomSpmTextFn on_error) {
  std::string text;
  const sentencepiece::util::Status status = m->sp.Decode(std::vector<int>(ids, ids + n), &text);
  if (!status.ok()) {
    Report(error_ctx, on_error, status.ToString());
    return 1;
  }
  out(out_ctx, text.data(), text.size());
  return 0;
}

}  // extern "C"
