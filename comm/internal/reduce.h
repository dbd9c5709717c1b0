#ifndef LOOM_COMM_INTERNAL_REDUCE_H_
#define LOOM_COMM_INTERNAL_REDUCE_H_

// Element-wise reduction kernels used by our own collective algorithms (local
// and UCX backends) and by the MPI backend's user-defined ops for bf16/f16.

#include <cstddef>
#include <cstdint>

#include "comm/comm.h"
#include "core/dtype.h"

namespace loom::comm::internal {

// bf16 <-> f32 is core/cpu/convert.h's (FloatToBf16Bits, Bf16BitsToFloat).
// f16 has its own here: NaN becomes the canonical quiet NaN (0x7e00 with the
// sign), where core's F16C conversion keeps the payload; otherwise the same.
float F16ToF32(uint16_t bits);
uint16_t F32ToF16(float value);  // round to nearest even

// acc[i] = acc[i] op src[i] for i < count. kAvg accumulates a sum (finish
// with FinishAvg). bf16/f16 are computed in f32.
void ReduceInto(void* acc, const void* src, size_t count, core::DType dtype, ReduceOp op);

// dst[i] = a[i] op b[i]; dst may be a (then it is ReduceInto), never b. Lets
// an out-of-place collective reduce straight from its input, without first
// copying the input to the output.
void ReduceTo(void* dst, const void* a, const void* b, size_t count, core::DType dtype,
              ReduceOp op);

// buf[i] = buf[i] / n (integers: truncating division).
void FinishAvg(void* buf, size_t count, core::DType dtype, int n);

}  // namespace loom::comm::internal

#endif  // LOOM_COMM_INTERNAL_REDUCE_H_
