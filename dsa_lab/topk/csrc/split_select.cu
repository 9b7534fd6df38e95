// dsa_lab's top-k of a decode step's logits with each row spread over many CTAs (issue 27, lab notes round 15):
// the selection a fused step runs after logits that stay in L2. Round 14 measured a row on one SM bound by
// issue, so here every CTA takes one chunk of one row, and two launches replace one CTA's passes:
//
//  1. count: each CTA counts its chunk's scores by the top 12 bits of their order-preserving key in shared
//     memory, adds its non-zero bins to the row's histogram in global memory (L2 atomics), and the CTA that
//     arrives last for its row finds the bin holding the row's k-th score: the threshold bin.
//  2. collect: each CTA appends its chunk's positions above the threshold bin to the row's output (the row's
//     slot counter), and those inside it to the row's candidates; the CTA that arrives last resolves the
//     candidates by the key's low 20 bits (two 10-bit digits in shared memory), writes the picks the bin owes,
//     and leaves the row's histogram and counters zero for the next call.
//
// A row of at most k tokens writes its positions and -1 after. Picks are in no order. Candidates past the
// buffer's capacity are not lost: the last CTA then resolves the threshold bin from the whole row (slower,
// still exact). No host synchronisation and no cooperative launch: a CUDA graph captures it, and a CTA never
// waits for another. The state (histograms, counters) must be zero before the first call; every call leaves it so.

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cub/block/block_scan.cuh>

namespace {

constexpr int kThreads = 512;
constexpr int kTopBits = 12;
constexpr int kBins = 1 << kTopBits;  // the threshold bin's digit
constexpr int kLowShift = 32 - kTopBits;
constexpr int kDigitBits = 10;  // the low 20 bits: two digits
constexpr int kDigitBins = 1 << kDigitBits;
constexpr int kStaged = 4096;  // candidates the resolving CTA holds in shared memory

// A row's counters in `state[row * kStateInts + ...]`.
constexpr int kArrivedCount = 0, kArrivedCollect = 1, kAboveSlots = 2, kCandidates = 3, kThreshold = 4, kAbove = 5;
constexpr int kStateInts = 8;

__device__ __forceinline__ uint32_t order_key(float x) {
    const uint32_t bits = __float_as_uint(x);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);  // unsigned order = float order
}

// A row's length, within the logits' width and the grid's columns (a row longer than the call's max_len is
// cut there, as every CTA of the row counts on the same number of arrivals).
__device__ __forceinline__ int row_length(const int *lengths, int row, int width, int chunk) {
    return min(min(max(lengths[row], 0), width), static_cast<int>(gridDim.x) * chunk);
}

// Calls f(key, position) for every position of [begin, end) of `row`, four scores a thread a step.
template <class F>
__device__ __forceinline__ void for_each_key(const float *__restrict__ row, int begin, int end, F f) {
    const bool aligned = ((reinterpret_cast<uintptr_t>(row + begin) & 15) == 0);
    for (int i = begin + 4 * static_cast<int>(threadIdx.x); i < end; i += 4 * kThreads) {
        if (aligned && i + 3 < end) {
            const float4 q = *reinterpret_cast<const float4 *>(row + i);
            f(order_key(q.x), i), f(order_key(q.y), i + 1), f(order_key(q.z), i + 2), f(order_key(q.w), i + 3);
        } else {
            for (int j = i; j < min(i + 4, end); ++j) f(order_key(row[j]), j);
        }
    }
}

// Writes `value` at dst[*slots + its rank among the warp's writers] for each lane with `write` (one atomic a
// warp); a slot at or past `limit` is dropped, the count still taken.
__device__ __forceinline__ void append(int *dst, int *slots, bool write, int value, int limit) {
    const unsigned together = __activemask();  // the lanes here now: each group of them appends on its own
    const unsigned writers = __ballot_sync(together, write);
    if (!writers) return;
    const int lane = threadIdx.x & 31, leader = __ffs(writers) - 1;
    int base = 0;
    if (lane == leader) base = atomicAdd(slots, __popc(writers));
    base = __shfl_sync(together, base, leader);
    const int slot = base + __popc(writers & ((1u << lane) - 1));
    if (write && slot < limit) dst[slot] = value;
}

// Whether this CTA is the last of `arrivals` to reach `counter` (after its writes are visible to the others).
__device__ __forceinline__ bool arrives_last(int *counter, int arrivals) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1) == arrivals - 1;
    __syncthreads();
    if (last) __threadfence();
    return last;
}

// Over `bins` counts in `hist` (shared or global, read through `load`), the bin holding the `rank`-th largest
// (1-based) counting from the top bin down, and how many lie in bins above it; thread 0's answer is everyone's.
template <int kBinsScanned, class Load>
__device__ __forceinline__ void find_bin(Load load, int rank, int *bin_out, int *above_out) {
    constexpr int kPer = kBinsScanned / kThreads;
    using Scan = cub::BlockScan<int, kThreads>;
    __shared__ typename Scan::TempStorage scan;
    const int top = kBinsScanned - 1 - kPer * static_cast<int>(threadIdx.x);  // this thread's bins, from the top
    int counts[kPer], sum = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) counts[j] = load(top - j), sum += counts[j];
    int above = 0;
    Scan(scan).ExclusiveSum(sum, above);
    if (above < rank && above + sum >= rank) {
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
            if (above < rank && above + counts[j] >= rank) *bin_out = top - j, *above_out = above;
            above += counts[j];
        }
    }
    __syncthreads();
}

__global__ __launch_bounds__(kThreads) void count_kernel(const float *__restrict__ logits, int64_t stride,
                                                         const int *__restrict__ lengths, int width, int k,
                                                         int chunk, int *__restrict__ hist, int *__restrict__ state) {
    __shared__ int local[kBins];
    __shared__ int threshold, above;
    const int row = blockIdx.y, n = row_length(lengths, row, width, chunk), begin = blockIdx.x * chunk;
    if (n <= k || begin >= n) return;
    for (int b = threadIdx.x; b < kBins; b += kThreads) local[b] = 0;
    __syncthreads();
    for_each_key(logits + row * stride, begin, min(n, begin + chunk),
                 [&](uint32_t key, int) { atomicAdd(&local[key >> kLowShift], 1); });
    __syncthreads();
    int *row_hist = hist + static_cast<int64_t>(row) * kBins;
    for (int b = threadIdx.x; b < kBins; b += kThreads)
        if (local[b]) atomicAdd(&row_hist[b], local[b]);
    int *row_state = state + row * kStateInts;
    if (!arrives_last(&row_state[kArrivedCount], (n + chunk - 1) / chunk)) return;
    find_bin<kBins>([&](int b) { return __ldcg(&row_hist[b]); }, k, &threshold, &above);
    if (threadIdx.x == 0) {
        row_state[kThreshold] = threshold;
        row_state[kAbove] = above;
        row_state[kArrivedCount] = 0;
    }
}

__global__ __launch_bounds__(kThreads, 1) void collect_kernel(const float *__restrict__ logits, int64_t stride,
                                                           const int *__restrict__ lengths, int width, int k,
                                                           int chunk, int *__restrict__ out, int *__restrict__ hist,
                                                           int *__restrict__ state, int *__restrict__ candidates,
                                                           int capacity) {
    __shared__ uint32_t staged_keys[kStaged];
    __shared__ int staged_positions[kStaged];
    __shared__ int digit_hist[kDigitBins];
    __shared__ int chosen, chosen_above, taken_over, taken_equal;
    const int row = blockIdx.y, n = row_length(lengths, row, width, chunk), begin = blockIdx.x * chunk;
    int *dst = out + static_cast<int64_t>(row) * k;
    if (n <= k) {
        if (blockIdx.x == 0)
            for (int i = threadIdx.x; i < k; i += kThreads) dst[i] = i < n ? i : -1;
        return;
    }
    if (begin >= n) return;
    int *row_state = state + row * kStateInts;
    const float *values = logits + row * stride;
    const uint32_t threshold = static_cast<uint32_t>(__ldcg(&row_state[kThreshold]));
    const int above = __ldcg(&row_state[kAbove]);
    int *row_candidates = candidates + static_cast<int64_t>(row) * capacity;
    for_each_key(values, begin, min(n, begin + chunk), [&](uint32_t key, int i) {
        const uint32_t bin = key >> kLowShift;
        append(dst, &row_state[kAboveSlots], bin > threshold, i, above);
        append(row_candidates, &row_state[kCandidates], bin == threshold, i, capacity);
    });
    if (!arrives_last(&row_state[kArrivedCollect], (n + chunk - 1) / chunk)) return;

    // The last CTA: `k - above` picks owed by the threshold bin, resolved over the key's low 20 bits.
    const int count = __ldcg(&row_state[kCandidates]);
    const bool staged = count <= min(capacity, kStaged);
    if (staged) {
        for (int j = threadIdx.x; j < count; j += kThreads) {
            const int position = __ldcg(&row_candidates[j]);
            staged_positions[j] = position, staged_keys[j] = order_key(values[position]);
        }
    }
    __syncthreads();
    auto for_each_candidate = [&](auto f) {  // every key of the threshold bin, with its position
        if (staged) {
            for (int j = threadIdx.x; j < count; j += kThreads) f(staged_keys[j], staged_positions[j]);
        } else {
            for_each_key(values, 0, n, [&](uint32_t key, int i) {
                if ((key >> kLowShift) == threshold) f(key, i);
            });
        }
    };
    uint32_t prefix = threshold << kLowShift, fixed = ~0u << kLowShift;
    int remaining = k - above;
    for (int shift = kLowShift - kDigitBits; shift >= 0; shift -= kDigitBits) {
        for (int b = threadIdx.x; b < kDigitBins; b += kThreads) digit_hist[b] = 0;
        __syncthreads();
        for_each_candidate([&](uint32_t key, int) {
            if ((key & fixed) == prefix) atomicAdd(&digit_hist[(key >> shift) & (kDigitBins - 1)], 1);
        });
        __syncthreads();
        find_bin<kDigitBins>([&](int b) { return digit_hist[b]; }, remaining, &chosen, &chosen_above);
        prefix |= static_cast<uint32_t>(chosen) << shift;
        fixed |= static_cast<uint32_t>(kDigitBins - 1) << shift;
        remaining -= chosen_above;
        __syncthreads();
    }
    if (threadIdx.x == 0) taken_over = 0, taken_equal = 0;
    __syncthreads();
    // `prefix` is now the k-th score's whole key: the bin's keys above it are all picked, `remaining` of its equals.
    for_each_candidate([&](uint32_t key, int i) {
        append(dst + above, &taken_over, key > prefix, i, k - above - remaining);
        append(dst + k - remaining, &taken_equal, key == prefix, i, remaining);
    });
    int *row_hist = hist + static_cast<int64_t>(row) * kBins;
    for (int b = threadIdx.x; b < kBins; b += kThreads) row_hist[b] = 0;
    if (threadIdx.x == 0) row_state[kArrivedCollect] = 0, row_state[kAboveSlots] = 0, row_state[kCandidates] = 0;
}

}  // namespace

extern "C" int dsa_split_select_state_ints(int rows) { return rows * (kBins + kStateInts); }

extern "C" int dsa_split_select_capacity() { return kStaged; }  // candidates a row: more are never staged

// `state` holds `dsa_split_select_state_ints(rows)` int32, zero before the first call (each call leaves it zero);
// `candidates` holds rows * capacity int32. `chunk`: the scores a CTA takes, a positive multiple of 4.
extern "C" int dsa_split_select(const float *logits, int64_t stride, const int *lengths, int rows, int width, int k,
                                int max_len, int chunk, int *out, int *state, int *candidates, int capacity,
                                void *stream, char *message, size_t message_len) {
    if (rows < 0 || width < 0 || k < 1 || stride < width || chunk < 4 || chunk % 4 || capacity < 1 || max_len < 0) {
        snprintf(message, message_len, "rows=%d, width=%d, k=%d, stride=%lld, chunk=%d, capacity=%d, max_len=%d: "
                 "rows, width, max_len >= 0, k >= 1, stride >= width, chunk a positive multiple of 4, capacity >= 1",
                 rows, width, k, static_cast<long long>(stride), chunk, capacity, max_len);
        return 1;
    }
    if (rows == 0) return 0;
    if (rows > 65535) {
        snprintf(message, message_len, "rows=%d: at most 65535 (the grid's y)", rows);
        return 1;
    }
    const int span = max(min(max_len, width), k + 1);  // a short row's CTA 0 still writes its picks
    const dim3 grid((span + chunk - 1) / chunk, rows);
    int *hist = state + static_cast<int64_t>(rows) * kStateInts;
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    count_kernel<<<grid, kThreads, 0, s>>>(logits, stride, lengths, width, k, chunk, hist, state);
    collect_kernel<<<grid, kThreads, 0, s>>>(logits, stride, lengths, width, k, chunk, out, hist, state, candidates,
                                              capacity);
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) {
        snprintf(message, message_len, "split_select launch: %s", cudaGetErrorString(status));
        return 1;
    }
    return 0;
}
