#ifndef LOOM_TRAIN_DATA_SENTENCEPIECE_SHIM_H_
#define LOOM_TRAIN_DATA_SENTENCEPIECE_SHIM_H_

// The C interface of libloom_sentencepiece.so, a small shared library over
// Debian's libsentencepiece that SentencePieceTokenizer loads with dlopen
// (RTLD_LOCAL | RTLD_DEEPBIND) instead of linking it. Why: libsentencepiece.so
// carries its own copy of protobuf 3.14 and exports its symbols; linked into a
// process that also has the system's libprotobuf (3.21: //checkpoint, hence
// the trainer), one of the two copies takes the other's calls and the program
// aborts at start-up ("compiled against version 3.14.0 ... installed version
// 3.21.12") or crashes. Loaded this way, libsentencepiece binds to its own
// copy and nothing of it is visible to the rest of the process.
//
// Plain C types only: no Abseil (sentencepiece_processor.h defines its own
// absl::string_view, which clashes with Abseil's), no ownership crossing the
// boundary (results go to callbacks).

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_SPM_ABI_VERSION 1

typedef struct LoomSpm LoomSpm;
typedef void (*LoomSpmIdsFn)(void* ctx, const int* ids, size_t n);
typedef void (*LoomSpmTextFn)(void* ctx, const char* text, size_t n);

int loom_spm_abi_version(void);
// NULL on failure, after on_error(ctx, message).
LoomSpm* loom_spm_load(const char* path, void* ctx, LoomSpmTextFn on_error);
void loom_spm_free(LoomSpm* m);
int loom_spm_piece_size(const LoomSpm* m);
int loom_spm_bos_id(const LoomSpm* m);  // -1: none
int loom_spm_eos_id(const LoomSpm* m);
int loom_spm_unk_id(const LoomSpm* m);
// 0 on success (the result passed to out(out_ctx, ...)), else
// on_error(error_ctx, message) was called.
int loom_spm_encode(const LoomSpm* m, const char* text, size_t n, void* out_ctx,
                    LoomSpmIdsFn out, void* error_ctx, LoomSpmTextFn on_error);
int loom_spm_decode(const LoomSpm* m, const int* ids, size_t n, void* out_ctx,
                    LoomSpmTextFn out, void* error_ctx, LoomSpmTextFn on_error);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // LOOM_TRAIN_DATA_SENTENCEPIECE_SHIM_H_
