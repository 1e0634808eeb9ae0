/* gemm.c — mk_linear, the hot op of decode: dispatches to the fastest path for the weight kind
 * and spreads output features over the thread pool. (Scalar for now: calls the reference.) */
#include "ops/ops.h"

void mk_linear(mk_pool *pool, const mk_wmat *W, const float *x, int m, float *y, int round_bf16,
               float *scratch) {
    (void)pool;
    mk_linear_ref(W, x, m, y, round_bf16, scratch);
}
