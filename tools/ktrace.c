// ktrace.c - each CUDA kernel's device start and end, the nodes of CUDA
// graphs included, from CUPTI's activity API, as a library to LD_PRELOAD:
//   KTRACE_OUT=kt.csv LD_PRELOAD=build-cuda/libktrace.so build-cuda/vllm bench ...
// One line per kernel: start_ns,end_ns,graph_id,grid x/y/z,block x,name
// (mangled). The device has no Nsight Systems, and ncu times each kernel
// alone with no graph; this shows a decode step as it runs, PDL's overlap
// and the gaps included (tools/device_profile.sh reads it).
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

#define KT_BUF (8u << 20)

static FILE *kt_out;

static void CUPTIAPI kt_buf_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, KT_BUF);
    *size = *buf ? KT_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI kt_buf_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        fprintf(kt_out, "%llu,%llu,%u,%d,%d,%d,%d,%s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                k->graphId, k->gridX, k->gridY, k->gridZ, k->blockX, k->name ? k->name : "?");
    }
    free(buf);
}

static void kt_check(CUptiResult r, const char *what) {
    if (r == CUPTI_SUCCESS) return;
    const char *s = NULL;
    cuptiGetResultString(r, &s);
    fprintf(stderr, "ktrace: %s: %s\n", what, s ? s : "?");
}

__attribute__((constructor)) static void kt_start(void) {
    const char *path = getenv("KTRACE_OUT");
    kt_out = fopen(path ? path : "ktrace.csv", "w");
    if (!kt_out) {
        perror("ktrace: KTRACE_OUT");
        return;
    }
    fprintf(kt_out, "start_ns,end_ns,graph,gx,gy,gz,bx,name\n");
    kt_check(cuptiActivityRegisterCallbacks(kt_buf_requested, kt_buf_completed), "register");
    // CONCURRENT_KERNEL, not KERNEL: the latter serializes every launch
    kt_check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable");
}

__attribute__((destructor)) static void kt_stop(void) {
    if (!kt_out) return;
    kt_check(cuptiActivityFlushAll(1), "flush");
    fclose(kt_out);
    kt_out = NULL;
}
