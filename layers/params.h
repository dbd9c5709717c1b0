#ifndef LOOM_LAYERS_PARAMS_H_
#define LOOM_LAYERS_PARAMS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/shape.h"
#include "core/tensor.h"

namespace loom::layers {

// How a parameter is initialised. Values depend only on (seed, name, global
// element index), never on the layout, so every TP degree (and every
// pipeline stage holding a copy, e.g. the tied embedding) starts from the
// same full-size model.
enum class Init { kNormal, kScaledNormal, kZeros, kOnes };

// How a parameter is laid out over the TP group.
enum class TpSplit {
  kReplicated,  // every TP rank holds all of it (LayerNorm, row-parallel bias)
  kRows,        // dim 0 split: column-parallel weight [out/p, in], its bias, vocab rows
  kCols,        // dim 1 split: row-parallel weight [out, in/p]
};

// Which of an MoE layer's experts a rank holds under expert parallelism:
// experts [rank·E/size, (rank+1)·E/size) (all of them with size 1).
struct ExpertShard {
  int rank = 0;
  int size = 1;
  int64_t first(int64_t experts) const { return rank * (experts / size); }
  int64_t count(int64_t experts) const { return experts / size; }
};

struct ParamSpec {
  std::string name;       // global, layout-independent: "layers.3.attention.qkv.weight"
  core::Shape global_shape;
  TpSplit split = TpSplit::kReplicated;
  Init init = Init::kNormal;
  float std = 0.02f;              // for kNormal / kScaledNormal (already scaled)
  bool weight_decay = true;       // false for biases and LayerNorm
  // Replicated over TP but computed from 1/p of the sequence under sequence
  // parallelism: its gradient must be all-reduced over TP (LayerNorm, row bias).
  bool sequence_parallel_grad = false;
  // Rows of the global tensor that hold the model (the vocabulary before it is
  // padded for TP); the rows past them are padding, never stored. 0: all.
  int64_t unpadded_rows = 0;
  // An MoE expert's weight: split over expert parallelism (each EP rank holds
  // other experts), so its gradient is reduced over the expert-data-parallel
  // group and it is saved by that group's first rank.
  bool expert = false;
};

// A parameter's identity inside one ParamBuffer: what other packages hold
// instead of spelling its name.
struct ParamHandle {
  int index = -1;
  bool valid() const { return index >= 0; }
  bool operator==(const ParamHandle& o) const { return index == o.index; }
};

// One parameter as a rank holds it: views into the rank's flat buffers.
struct Param {
  const ParamSpec* spec = nullptr;
  core::Shape shape;    // the local shard's shape (known even while value is unbound)
  core::Tensor value;   // local shard in the compute dtype: what the layers multiply with
  core::Tensor master;  // the same shard in f32 (== value unless computing in bf16)
  core::Tensor grad;    // same shape, f32, accumulated over micro-batches
  int64_t offset = 0;  // element offset of the shard in the flat buffers
  // The shard's place in the global tensor: rows/cols [start, start + local).
  int64_t split_start = 0;
  // A second copy of a parameter that another pipeline stage also holds (the
  // last stage's tied word embedding): its gradient is summed with the
  // original's, and it is counted in the gradient norm and saved only there.
  bool tied_copy = false;
  // On the CPU with a bf16 compute dtype: the bf16 copy of `master` that the
  // Linear layers' GEMMs multiply with (there `value` stays f32, because the
  // CPU's other kernels compute in f32). Undefined elsewhere.
  core::Tensor gemm_value;
};

// All parameters of one rank in one contiguous f32 buffer, gradients in a
// second one with the same layout. Contiguity makes data-parallel buckets,
// the distributed optimizer and checkpoints plain slices of a flat array.
class ParamBuffer {
 public:
  // Lays out `specs` for TP rank `tp_rank` of `tp_size` and initialises the
  // values from `seed`. Errors name the parameter whose split dim is not
  // divisible by tp_size.
  // `multiple`: every parameter's slot in the flat buffers is padded with
  // zeros to a multiple of it (the data-parallel size), so any run of whole
  // parameters splits into equal data-parallel shards (the distributed
  // optimizer reduce-scatters bucket by bucket).
  // `device`: where the buffers live (initialised on the host, then copied).
  // `compute_dtype`: kF32, or kBF16 for a third flat buffer holding the bf16
  // copy of the values that the layers use (see SyncComputeCopy). On a GPU
  // that copy is Param::value; on the CPU it is Param::gemm_value (only the
  // GEMMs take bf16 there) and Param::value stays the f32 master.
  // `gradients`: false leaves every Param::grad undefined and allocates no
  // gradient buffer (its owner binds one later: BindGrads).
  // `values`: false allocates no value buffers at all (ZeRO-3: //distributed
  // keeps the owned shard, filled by InitialValues, and binds a unit's
  // gathered values with BindValues before it runs); every Param::value,
  // master and gemm_value stays undefined until bound (Param::shape holds
  // the shape).
  static absl::StatusOr<ParamBuffer> Create(std::vector<ParamSpec> specs, int tp_rank,
                                            int tp_size, uint64_t seed, int64_t multiple = 1,
                                            core::Device device = core::Device::CPU(),
                                            core::DType compute_dtype = core::DType::kF32,
                                            bool gradients = true, bool values = true);

  ParamBuffer() = default;
  ParamBuffer(ParamBuffer&&) = default;
  ParamBuffer& operator=(ParamBuffer&&) = default;

  // The parameter named `name` (crashes on an unknown name: a programming bug).
  Param& at(const std::string& name);
  const Param& at(const std::string& name) const;
  bool contains(const std::string& name) const { return index_.count(name) > 0; }
  // The handle of `name`, invalid if this rank does not hold it.
  ParamHandle Find(const std::string& name) const;
  Param& at(ParamHandle h) { return params_[h.index]; }
  const Param& at(ParamHandle h) const { return params_[h.index]; }
  // [offset, end of its padded slot) of parameter `h` in the flat buffers.
  int64_t SlotEnd(ParamHandle h) const;
  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }

  // f32[padded numel] (master); undefined under ZeRO-3 (Create's `values`).
  const core::Tensor& flat_values() const { return values_; }
  // Whether the values are held whole here (false: ZeRO-3, see BindValues).
  bool holds_values() const { return values_.defined(); }
  // f32[padded numel] while the whole gradient buffer is bound (see
  // BindGrads); undefined under ZeRO-2, where //distributed keeps only a
  // shard.
  const core::Tensor& flat_grads() const { return grads_; }
  // The bf16 compute copy of flat_values(), same layout (Param::value on a
  // GPU, Param::gemm_value on the CPU); undefined when computing in f32.
  const core::Tensor& flat_compute() const { return compute_; }
  core::Device device() const { return device_; }
  core::DType compute_dtype() const { return compute_dtype_; }
  // Elements of the parameters (without padding) and of the flat buffers.
  int64_t numel() const { return numel_; }
  int64_t padded_numel() const { return padded_numel_; }
  absl::Status ZeroGrads();
  // Where the gradients live. Create binds a whole f32 buffer of the flat
  // layout (what a model computing alone needs). Data parallelism
  // (//distributed:gradient_sync) owns the storage instead: BindGrads(flat)
  // points every Param::grad into `flat` (f32[padded_numel()] on device(),
  // or undefined: no gradient storage at all, every Param::grad undefined);
  // the buffer this held is released with its last reference.
  absl::Status BindGrads(const core::Tensor& flat);
  // Points the gradients of the parameters whose slots lie in the flat range
  // [begin, end) at `buffer` (f32, at least end - begin elements, element
  // `begin` at buffer[0]): ZeRO-2 binds a transient bucket buffer before
  // the bucket's backward. Undefined `buffer`: unbinds them.
  absl::Status BindGrads(int64_t begin, int64_t end, const core::Tensor& buffer);
  // ZeRO-3. The initial values (Create's, from the seed) of the flat range
  // [begin, end) into host f32 `out[0, end - begin)` (padding zero).
  absl::Status InitialValues(int64_t begin, int64_t end, float* out) const;
  // Points the values of the parameters whose slots lie in [begin, end) at
  // `master` (f32, element `begin` at [0]) and, when computing in bf16, at
  // `compute` (its bf16 copy: Param::value on a GPU, Param::gemm_value on
  // the CPU); undefined `master` unbinds them. Only without value buffers.
  absl::Status BindValues(int64_t begin, int64_t end, const core::Tensor& master,
                          const core::Tensor& compute);
  // A host buffer with this one's parameters, layout and padding (values
  // zero, no compute copy): where device parameters are staged for
  // checkpoints. Copy flat_values() across with core::ops::Copy.
  absl::StatusOr<ParamBuffer> HostMirror() const;
  // Refreshes the bf16 compute copy from the f32 values (after an optimizer
  // step or a checkpoint load); a no-op when computing in f32.
  absl::Status SyncComputeCopy();
  // The same for the flat range [begin, end) only.
  absl::Status SyncComputeCopy(int64_t begin, int64_t end);

 private:
  size_t IndexOf(const std::string& name) const;  // aborts on an unknown name

  std::vector<ParamSpec> specs_;
  std::vector<Param> params_;
  std::map<std::string, size_t> index_;
  core::Tensor values_, grads_;
  core::Tensor compute_;  // bf16 copy of values_ (undefined when computing in f32)
  int64_t numel_ = 0, padded_numel_ = 0;
  uint64_t seed_ = 0;
  core::Device device_ = core::Device::CPU();
  core::DType compute_dtype_ = core::DType::kF32;
};

// The initial value of global element `index` of parameter `spec`.
float InitialValue(const ParamSpec& spec, uint64_t seed, int64_t index);

}  // namespace loom::layers

#endif  // LOOM_LAYERS_PARAMS_H_
