/* ktrace.c — kernel timestamps inside replayed CUDA graphs, for the GPU machine's benchmarks.
 *
 * ncu times each kernel alone (serialized, no programmatic-dependent-launch overlap) and CUDA events
 * cannot be placed between a graph's nodes, so neither says what a kernel costs inside the captured
 * decode step. CUPTI's activity records can: every kernel's start and end on the GPU's clock, graph
 * nodes included (graphId, graphNodeId). This is a library to preload into any CUDA program
 * (bench/gpu/run.sh's DSV4_KTRACE=1 preloads it into bench_dsv4_cuda):
 *
 *   KTRACE_OUT=trace.csv LD_PRELOAD=build-cuda/libktrace.so ./build-cuda/bench_dsv4_cuda ...
 *
 * It enables CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL when loaded (nothing happens without KTRACE_OUT)
 * and writes one CSV line per kernel as CUPTI hands back its buffers (a worker thread, flushed every
 * 50 ms and at exit): start_ns,end_ns,graph_id,graph_node_id,stream,grid x/y/z,block x,name.
 * bench/gpu/ktrace_summary.py turns a file into the per-kernel chain of one graph replay. Build:
 *
 *   gcc -O2 -shared -fPIC -I$CUDA/include bench/gpu/ktrace.c -L<libcupti dir> -lcupti -o libktrace.so
 */
#include <cupti.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KT_BUF (1u << 20) /* bytes per activity buffer */

static FILE *kt_out;
static pthread_mutex_t kt_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long kt_dropped;

static void CUPTIAPI kt_buf_req(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = aligned_alloc(8, KT_BUF);
    *size = *buf ? KT_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI kt_buf_done(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    pthread_mutex_lock(&kt_lock);
    while (kt_out && cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        fprintf(kt_out, "%llu,%llu,%u,%llu,%u,%d,%d,%d,%d,%s\n", (unsigned long long)k->start,
                (unsigned long long)k->end, k->graphId, (unsigned long long)k->graphNodeId, k->streamId, k->gridX,
                k->gridY, k->gridZ, k->blockX, k->name ? k->name : "?");
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS) kt_dropped += dropped;
    pthread_mutex_unlock(&kt_lock);
    free(buf);
}

static void kt_check(CUptiResult r, const char *what) {
    if (r == CUPTI_SUCCESS) return;
    const char *msg = NULL;
    cuptiGetResultString(r, &msg);
    fprintf(stderr, "ktrace: %s failed: %s\n", what, msg ? msg : "?");
}

__attribute__((constructor)) static void kt_init(void) {
    const char *path = getenv("KTRACE_OUT");
    if (!path || !*path) return;
    kt_out = fopen(path, "w");
    if (!kt_out) {
        fprintf(stderr, "ktrace: cannot write %s\n", path);
        return;
    }
    fprintf(kt_out, "start_ns,end_ns,graph_id,graph_node_id,stream,grid_x,grid_y,grid_z,block_x,name\n");
    kt_check(cuptiActivityRegisterCallbacks(kt_buf_req, kt_buf_done), "cuptiActivityRegisterCallbacks");
    kt_check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(CONCURRENT_KERNEL)");
    kt_check(cuptiActivityFlushPeriod(50), "cuptiActivityFlushPeriod");
}

__attribute__((destructor)) static void kt_fini(void) {
    if (!kt_out) return;
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    pthread_mutex_lock(&kt_lock);
    if (kt_dropped) fprintf(stderr, "ktrace: %llu records dropped\n", kt_dropped);
    fclose(kt_out);
    kt_out = NULL;
    pthread_mutex_unlock(&kt_lock);
}
