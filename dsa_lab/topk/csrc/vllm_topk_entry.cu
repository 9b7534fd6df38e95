// dsa_lab's C entry point to vLLM 0.33.0's decode top-k kernels, for a process where vLLM's own
// compiled ops do not load (its wheel needs another torch). It takes raw device pointers and a
// stream, asks `dsa_topk_choose` (vllm_topk_rules.h) which kernel vLLM would run, and launches
// that kernel from vLLM's headers, which the build script takes from the 0.33.0 sdist at build
// time (scripts/build_vllm_topk.sh); none of vLLM's source is kept in this repository.
//
// Every call is stream-ordered and issues no host synchronisation, so it is captured by CUDA graphs.
// Errors come back as a non-zero status and a message, never as an exit.

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <utility>

#include "cooperative_topk.cuh"
#include "persistent_topk.cuh"
#include "sampled_topk.cuh"
#include "vllm_topk_rules.h"

namespace coop = vllm::cooperative;
namespace hist = vllm::topk_histogram_4096;
namespace radix = vllm::persistent;

// The rules' copies of vLLM's numbers, held to vLLM's own.
static_assert(DSA_TOPK_RADIX_THRESHOLD == radix::RADIX_THRESHOLD, "RADIX_THRESHOLD moved");
static_assert(DSA_TOPK_SMEM_MEDIUM == radix::kSmemMedium, "kSmemMedium moved");
static_assert(DSA_TOPK_SMEM_FIXED_LARGE == radix::kFixedSmemLarge, "kFixedSmemLarge moved");
static_assert(DSA_TOPK_RADIX_THREADS == radix::kThreadsPerBlock, "kThreadsPerBlock moved");
static_assert(DSA_TOPK_RADIX_ROW_STATE_BYTES == sizeof(radix::RadixRowState), "RadixRowState moved");
static_assert(sizeof(hist::Tie) == 8 && coop::kCoarseTieCapacity == 2048, "the tie workspace moved");
static_assert(vllm::filtered_topk::FILTERED_TOPK_SMEM_DYNAMIC == 128 * 1024, "the filtered smem moved");
static_assert(vllm::sampled_topk::kMinSampledLength<512> == 98304 &&
                  vllm::sampled_topk::kMinSampledLength<1024> == 65536 &&
                  vllm::sampled_topk::kMinSampledLength<2048> == 65536,
              "kMinSampledLength moved");

namespace {

constexpr int kMaxDevices = 64;

struct DeviceFacts {
    bool known = false;
    int sms = 0, smem_optin = 0, major = 0, minor = 0;
};

DeviceFacts g_devices[kMaxDevices];

cudaError_t device_facts(DeviceFacts *out) {
    int device = 0;
    cudaError_t status = cudaGetDevice(&device);
    if (status != cudaSuccess) return status;
    if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
    DeviceFacts &facts = g_devices[device];
    if (!facts.known) {
        int values[4] = {0, 0, 0, 0};
        const cudaDeviceAttr attrs[4] = {cudaDevAttrMultiProcessorCount, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                         cudaDevAttrComputeCapabilityMajor, cudaDevAttrComputeCapabilityMinor};
        for (int i = 0; i < 4; ++i) {
            status = cudaDeviceGetAttribute(&values[i], attrs[i], device);
            if (status != cudaSuccess) return status;
        }
        facts = {true, values[0], values[1], values[2], values[3]};
    }
    *out = facts;
    return cudaSuccess;
}

template <int K>
int radix_occupancy(int vec, uint32_t smem, void *status_out) {
    int blocks = 0;
    cudaError_t status;
    if (vec == 4) {
        status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, radix::persistent_topk_kernel<K, 4>,
                                                               radix::kThreadsPerBlock, smem);
    } else if (vec == 2) {
        status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, radix::persistent_topk_kernel<K, 2>,
                                                               radix::kThreadsPerBlock, smem);
    } else {
        status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, radix::persistent_topk_kernel<K, 1>,
                                                               radix::kThreadsPerBlock, smem);
    }
    *static_cast<cudaError_t *>(status_out) = status;
    return blocks;
}

int occupancy_for_k(int vec, uint32_t smem, void *context) {
    auto *ctx = static_cast<std::pair<uint32_t, cudaError_t> *>(context);
    switch (ctx->first) {
        case 512: return radix_occupancy<512>(vec, smem, &ctx->second);
        case 1024: return radix_occupancy<1024>(vec, smem, &ctx->second);
        default: return radix_occupancy<2048>(vec, smem, &ctx->second);
    }
}

int fail(char *message, size_t size, const char *what, const char *detail) {
    if (message != nullptr && size > 0) std::snprintf(message, size, "%s%s%s", what, *detail ? ": " : "", detail);
    return 1;
}

template <uint32_t K, uint32_t CS>
cudaError_t launch_cooperative(const coop::CooperativeTopKParams<K> &params, size_t smem, cudaStream_t stream) {
    void (*kernel)(coop::CooperativeTopKParams<K>);
    if constexpr (CS == 16) {
        kernel = coop::cooperative_topk_cs16<K>;
        cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        if (status != cudaSuccess) return status;
    } else if constexpr (CS == 8) {
        kernel = coop::cooperative_topk_cs8<K>;
    } else if constexpr (CS == 4) {
        kernel = coop::cooperative_topk_cs4<K>;
    } else {
        kernel = coop::cooperative_topk_cs2<K>;
    }
    cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (status != cudaSuccess) return status;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(params.num_rows, CS);
    config.blockDim = dim3(hist::kBlockSize);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute cluster[1];
    cluster[0].id = cudaLaunchAttributeClusterDimension;
    cluster[0].val.clusterDim.x = 1;
    cluster[0].val.clusterDim.y = CS;
    cluster[0].val.clusterDim.z = 1;
    config.attrs = cluster;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, kernel, params);
}

template <uint32_t K>
cudaError_t run_cooperative(const dsa_topk_plan &plan, const float *logits, const int32_t *lengths, int32_t *out,
                            void *workspace, uint32_t rows, uint32_t stride, cudaStream_t stream) {
    coop::CooperativeTopKParams<K> params;
    params.input = logits;
    params.output = out;
    params.lengths = lengths;
    params.num_rows = rows;
    params.stride = stride;
    params.tie_ws = static_cast<hist::Tie *>(workspace);
    switch (plan.cluster) {
        case 16: return launch_cooperative<K, 16>(params, coop::kSmemSize8, stream);
        case 8: return launch_cooperative<K, 8>(params, coop::kSmemSize8, stream);
        case 4: return launch_cooperative<K, 4>(params, coop::kSmemSize4, stream);
        default: return launch_cooperative<K, 2>(params, coop::kSmemSize2, stream);
    }
}

template <int K>
cudaError_t run_persistent(const dsa_topk_plan &plan, const float *logits, const int32_t *lengths, int32_t *out,
                           void *workspace, uint32_t rows, uint32_t stride, uint32_t max_seq_len,
                           cudaStream_t stream) {
    if (plan.kernel == DSA_TOPK_SAMPLED) {
        auto kernel = vllm::sampled_topk::sampled_topk_kernel<K>;
        constexpr size_t smem = vllm::filtered_topk::FILTERED_TOPK_SMEM_DYNAMIC;
        cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (status != cudaSuccess) return status;
        kernel<<<rows, vllm::sampled_topk::kThreads, smem, stream>>>(logits, lengths, out, (int64_t)stride,
                                                                      (int)plan.length_bound);
        return cudaGetLastError();
    }
    if (plan.kernel == DSA_TOPK_FILTERED) {
        return vllm::FilteredTopKRaggedTransform<float, int32_t, K>(logits, out, lengths, rows, (uint32_t)K, stride,
                                                                    stream);
    }
    // the radix kernel: its cross-CTA state zeroed in the stream first (a node of its own in a graph)
    cudaError_t status = cudaMemsetAsync(workspace, 0, plan.workspace_bytes, stream);
    if (status != cudaSuccess) return status;
    radix::PersistentTopKParams params;
    params.input = logits;
    params.output = out;
    params.lengths = lengths;
    params.num_rows = rows;
    params.stride = stride;
    params.top_k = (uint32_t)K;
    params.chunk_size = plan.chunk;
    params.row_states = static_cast<radix::RadixRowState *>(workspace);
    params.ctas_per_group = plan.ctas_per_group;
    params.max_seq_len = max_seq_len;
    void (*kernel)(radix::PersistentTopKParams) = plan.vec == 4   ? radix::persistent_topk_kernel<K, 4>
                                                  : plan.vec == 2 ? radix::persistent_topk_kernel<K, 2>
                                                                  : radix::persistent_topk_kernel<K, 1>;
    status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)plan.smem);
    if (status != cudaSuccess) return status;
    kernel<<<plan.groups * plan.ctas_per_group, radix::kThreadsPerBlock, plan.smem, stream>>>(params);
    return cudaGetLastError();
}

}  // namespace

extern "C" {

// The plan vLLM's rules give this step on the current device (no launch); 0, or 1 with the reason.
int dsa_vllm_topk_plan(uint32_t rows, uint32_t stride, uint32_t width, uint32_t k, uint32_t max_seq_len,
                       uint64_t address, int policy, dsa_topk_plan *plan, char *message, size_t message_size) {
    DeviceFacts facts;
    cudaError_t status = device_facts(&facts);
    if (status != cudaSuccess) return fail(message, message_size, "device", cudaGetErrorString(status));
    dsa_topk_query query = {rows,   stride,    width,            k,           max_seq_len, address,
                            policy, facts.sms, facts.smem_optin, facts.major, facts.minor};
    std::pair<uint32_t, cudaError_t> context(k, cudaSuccess);
    const char *why = "";
    *plan = dsa_topk_choose(&query, occupancy_for_k, &context, &why);
    if (context.second != cudaSuccess) return fail(message, message_size, "occupancy", cudaGetErrorString(context.second));
    if (plan->kernel == DSA_TOPK_REFUSED) return fail(message, message_size, why, "");
    return 0;
}

// vLLM's decode top-k of `rows` rows of fp32 logits (row stride `stride` floats, `width` columns): the k best
// columns of row r among its first lengths[r] (clipped to max_seq_len), -1 past a short row, into out[rows, k].
int dsa_vllm_topk_run(const float *logits, const int32_t *lengths, int32_t *out, void *workspace,
                      size_t workspace_bytes, uint32_t rows, uint32_t stride, uint32_t width, uint32_t k,
                      uint32_t max_seq_len, int policy, void *stream, dsa_topk_plan *plan, char *message,
                      size_t message_size) {
    if (rows == 0) return 0;
    if (logits == nullptr || lengths == nullptr || out == nullptr || workspace == nullptr)
        return fail(message, message_size, "pointers", "logits, lengths, out and workspace must be device pointers");
    if (dsa_vllm_topk_plan(rows, stride, width, k, max_seq_len, (uint64_t)(uintptr_t)logits, policy, plan, message,
                           message_size))
        return 1;
    if (plan->workspace_bytes > workspace_bytes) {
        char detail[96];
        std::snprintf(detail, sizeof detail, "needs %zu bytes, got %zu", plan->workspace_bytes, workspace_bytes);
        return fail(message, message_size, "workspace", detail);
    }
    auto s = static_cast<cudaStream_t>(stream);
    cudaError_t status;
    if (plan->kernel == DSA_TOPK_COOPERATIVE) {
        status = k == 512    ? run_cooperative<512>(*plan, logits, lengths, out, workspace, rows, stride, s)
                 : k == 1024 ? run_cooperative<1024>(*plan, logits, lengths, out, workspace, rows, stride, s)
                             : run_cooperative<2048>(*plan, logits, lengths, out, workspace, rows, stride, s);
    } else {
        status = k == 512 ? run_persistent<512>(*plan, logits, lengths, out, workspace, rows, stride, max_seq_len, s)
                 : k == 1024
                     ? run_persistent<1024>(*plan, logits, lengths, out, workspace, rows, stride, max_seq_len, s)
                     : run_persistent<2048>(*plan, logits, lengths, out, workspace, rows, stride, max_seq_len, s);
    }
    if (status != cudaSuccess) return fail(message, message_size, "launch", cudaGetErrorString(status));
    return 0;
}

}  // extern "C"
