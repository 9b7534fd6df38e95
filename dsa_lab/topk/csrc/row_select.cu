// dsa_lab's own top-k of a decode step's logits (issue 27): the selection a fused step would run after its
// logits, timed alone against vLLM's before anything is fused. One CTA of 1024 threads a row: three passes fix
// the k-th score's 32-bit order-preserving key by digits of 11, 11 and 10 bits (a shared-memory histogram a
// pass, in kCopies copies that warps share round-robin, a plain atomic a score: a row on one SM is bound by
// issue, so the fewest instructions a score win; lab notes round 14), then one pass writes the positions above
// that key and the first of those equal to it. A row of at most k tokens writes its positions and -1 after.
// Picks are in no order.
//
// Stream-ordered, no host synchronisation: a CUDA graph captures it. Errors come back as a non-zero status and
// a message.

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cub/block/block_scan.cuh>

namespace {

constexpr int kThreads = 1024;
constexpr int kBins = 2048;  // the first two digits' 11 bits (the last digit uses 1024 of them)
constexpr int kUnroll = 4;   // float4 loads in flight a thread
constexpr int kCopies = 4;   // histograms a pass: warp w counts into copy w % kCopies
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ uint32_t order_key(float x) {
    const uint32_t bits = __float_as_uint(x);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);  // unsigned order = float order
}

// Calls f(value, inside, position) for every position below n; every lane of a warp calls it equally often.
template <class F>
__device__ __forceinline__ void for_each_score(const float *__restrict__ row, int n, F f) {
    const bool aligned = (reinterpret_cast<uintptr_t>(row) & 15) == 0;
    for (int base = 0; base < n; base += kThreads * 4 * kUnroll) {
        float v[kUnroll][4];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int i = base + (u * kThreads + static_cast<int>(threadIdx.x)) * 4;
            if (aligned && i + 3 < n) {
                const float4 q = __ldg(reinterpret_cast<const float4 *>(row + i));
                v[u][0] = q.x, v[u][1] = q.y, v[u][2] = q.z, v[u][3] = q.w;
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j) v[u][j] = i + j < n ? row[i + j] : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int i = base + (u * kThreads + static_cast<int>(threadIdx.x)) * 4 + j;
                f(v[u][j], i < n, i);
            }
        }
    }
}

// Adds one to hist[bin] when the lane keeps its score, into the warp's copy: a plain shared atomic, the fewest
// instructions a score (a row on one SM is bound by issue, not by its loads).
__device__ __forceinline__ void count(int (*hist)[kBins], bool keep, uint32_t bin) {
    if (keep) atomicAdd(&hist[(threadIdx.x >> 5) % kCopies][bin], 1);
}

// Writes position i at dst[*slots + its rank among the warp's writers] for each lane with `write`.
__device__ __forceinline__ void append(int *dst, int *slots, bool write, int i, int limit) {
    const unsigned writers = __ballot_sync(kFull, write);
    if (!writers) return;
    const int lane = threadIdx.x & 31;
    int base = 0;
    if (lane == __ffs(writers) - 1) base = atomicAdd(slots, __popc(writers));
    base = __shfl_sync(kFull, base, __ffs(writers) - 1);
    const int slot = base + __popc(writers & ((1u << lane) - 1));
    if (write && slot < limit) dst[slot] = i;
}

__global__ __launch_bounds__(kThreads) void row_select_kernel(const float *__restrict__ logits, int64_t stride,
                                                              const int *__restrict__ lengths, int width, int k,
                                                              int *__restrict__ out) {
    using Scan = cub::BlockScan<int, kThreads>;
    __shared__ int hist[kCopies][kBins];
    __shared__ typename Scan::TempStorage scan;
    __shared__ uint32_t chosen_prefix;
    __shared__ int chosen_remaining, taken_over, taken_equal;

    const int n = min(max(lengths[blockIdx.x], 0), width);
    const float *row = logits + static_cast<int64_t>(blockIdx.x) * stride;
    int *dst = out + static_cast<int64_t>(blockIdx.x) * k;
    if (n <= k) {
        for (int i = threadIdx.x; i < k; i += kThreads) dst[i] = i < n ? i : -1;
        return;
    }
    uint32_t prefix = 0;
    int remaining = k;  // picks still to make among the scores whose key starts with `prefix`
    for (int digit = 0; digit < 3; ++digit) {
        const int shift = digit == 0 ? 21 : (digit == 1 ? 10 : 0);
        const uint32_t low = digit == 2 ? 1023u : 2047u;
        const uint32_t high = digit == 0 ? 0u : (0xffffffffu << (32 - 11 * digit));  // the bits fixed so far
        for (int b = threadIdx.x; b < kCopies * kBins; b += kThreads) hist[b / kBins][b % kBins] = 0;
        __syncthreads();
        for_each_score(row, n, [&](float value, bool inside, int) {
            const uint32_t key = order_key(value);
            count(hist, inside && (key & high) == prefix, (key >> shift) & low);
        });
        __syncthreads();
        const int top = kBins - 1 - 2 * static_cast<int>(threadIdx.x);  // this thread's two bins, from the top
        int upper = 0, lower = 0;
#pragma unroll
        for (int c = 0; c < kCopies; ++c) upper += hist[c][top], lower += hist[c][top - 1];
        int above = 0;
        Scan(scan).ExclusiveSum(upper + lower, above);
        if (above < remaining && above + upper >= remaining) {
            chosen_prefix = prefix | (static_cast<uint32_t>(top) << shift);
            chosen_remaining = remaining - above;
        } else if (above + upper < remaining && above + upper + lower >= remaining) {
            chosen_prefix = prefix | (static_cast<uint32_t>(top - 1) << shift);
            chosen_remaining = remaining - above - upper;
        }
        __syncthreads();
        prefix = chosen_prefix;
        remaining = chosen_remaining;
        __syncthreads();
    }
    if (threadIdx.x == 0) taken_over = 0, taken_equal = 0;
    __syncthreads();
    int *equal_dst = dst + (k - remaining);
    for_each_score(row, n, [&](float value, bool inside, int i) {
        const uint32_t key = order_key(value);
        append(dst, &taken_over, inside && key > prefix, i, k - remaining);
        append(equal_dst, &taken_equal, inside && key == prefix, i, remaining);
    });
}

}  // namespace

extern "C" int dsa_row_select(const float *logits, int64_t stride, const int *lengths, int rows, int width, int k,
                              int *out, void *stream, char *message, size_t message_len) {
    if (rows < 0 || width < 0 || k < 1 || stride < width) {
        snprintf(message, message_len, "rows=%d, width=%d, k=%d, stride=%lld: rows and width >= 0, k >= 1, "
                 "stride >= width", rows, width, k, static_cast<long long>(stride));
        return 1;
    }
    if (rows == 0) return 0;
    row_select_kernel<<<rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(logits, stride, lengths, width, k, out);
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) {
        snprintf(message, message_len, "row_select launch: %s", cudaGetErrorString(status));
        return 1;
    }
    return 0;
}
