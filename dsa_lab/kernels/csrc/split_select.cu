// dsa_lab's top-k of a decode step's logits with each row spread over many CTAs (issue 27, lab notes round 15):
// the selection a fused step runs after logits that stay in L2. Round 14 measured a row on one SM bound by
// issue; here every CTA takes one chunk of one row, in two launches that never wait for each other:
//
//  1. count: each CTA counts its chunk's scores by the top 12 bits of their order-preserving key in shared
//     memory and adds its non-zero bins to the row's histogram in global memory (L2 atomics); the CTA that
//     arrives last for its row finds the bin holding the row's k-th score (the threshold bin) and how many
//     scores lie above it.
//  2. collect: each CTA stages its chunk's positions above the threshold bin, and those inside it, in shared
//     memory (a shared atomic a kept score, one compare a score), then writes each list with one global atomic:
//     the first to the row's output, the second to its candidates. The CTA that arrives last for its row picks
//     the candidates the threshold bin owes by the key's low 20 bits (two 10-bit digits in shared memory), from
//     the whole row instead when they overflowed the buffer (counted in `fallbacks`).
//
// Round 15 measured four designs on the H100 (lab notes): counting every score, then collecting through global
// atomics a warp; counting a sample for a floor, then filtering; counting every score, then staging the
// collected lists in shared memory (an L2 atomic a list a CTA); and, this file, the third with four loads a
// thread in flight and each launch started early (programmatic dependent launch: a kernel waits for the one
// before it inside, not in the stream). A row of at most k tokens writes its positions and -1 after. Picks are in no order.
// No host synchronisation and no cooperative launch: a CUDA graph captures it, and a CTA never waits for
// another. The state (histograms, counters) must be zero before the first call; every call leaves it so.

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cub/block/block_scan.cuh>

namespace {

constexpr int kThreads = 512;
constexpr int kTopBits = 12;
constexpr int kBins = 1 << kTopBits;  // the threshold bin's digit
constexpr int kLowShift = 32 - kTopBits;
constexpr int kLowBins = 1 << 10;  // the low 20 bits: two digits
constexpr int kStaged = 2048;      // positions a CTA stages a list before writing it out
constexpr int kUnroll = 4;         // float4 loads a thread keeps in flight
constexpr int kCapacity = 8192;    // candidates a row, all staged in shared memory by the resolving CTA
constexpr size_t kResolveShared = kCapacity * (sizeof(uint32_t) + sizeof(int));

// A row's counters in `state[row * kStateInts + ...]`.
constexpr int kArrivedCount = 0, kArrivedCollect = 1, kAboveSlots = 2, kCandidates = 3, kThreshold = 4, kAbove = 5;
constexpr int kStateInts = 8;

__device__ __forceinline__ uint32_t order_key(float x) {
    const uint32_t bits = __float_as_uint(x);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);  // unsigned order = float order
}

// A row's length, within the logits' width and the grid's columns (a row longer than the call's max_len is
// cut there, so that every CTA of the row counts on the same number of arrivals).
__device__ __forceinline__ int row_length(const int *lengths, int row, int width, int chunk) {
    return min(min(max(lengths[row], 0), width), static_cast<int>(gridDim.x) * chunk);
}

// Calls f(key, position) for every position of [begin, end) of `row`: kUnroll float4 loads a thread in flight
// before any is used (a streaming pass over a serving batch's rows is bound by the loads in flight), then four
// scores each.
template <class F>
__device__ __forceinline__ void for_each_key(const float *__restrict__ row, int begin, int end, F f) {
    constexpr int kStep = 4 * kThreads;  // the CTA's scores a float4 load
    const bool aligned = (reinterpret_cast<uintptr_t>(row + begin) & 15) == 0;
    for (int base = begin + 4 * static_cast<int>(threadIdx.x); base < end; base += kStep * kUnroll) {
        float4 q[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int i = base + u * kStep;
            if (aligned && i + 3 < end) {
                q[u] = *reinterpret_cast<const float4 *>(row + i);
            } else {
                q[u].x = i < end ? row[i] : 0.0f, q[u].y = i + 1 < end ? row[i + 1] : 0.0f;
                q[u].z = i + 2 < end ? row[i + 2] : 0.0f, q[u].w = i + 3 < end ? row[i + 3] : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int i = base + u * kStep;
            if (i < end) f(order_key(q[u].x), i);
            if (i + 1 < end) f(order_key(q[u].y), i + 1);
            if (i + 2 < end) f(order_key(q[u].z), i + 2);
            if (i + 3 < end) f(order_key(q[u].w), i + 3);
        }
    }
}

// Programmatic dependent launch (sm_90): a kernel launched with it starts while the one before it finishes and
// waits here, before its first read, for that one's writes; `let_next_start` lets the next kernel's CTAs start.
__device__ __forceinline__ void wait_for_previous_kernel() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void let_next_start() { asm volatile("griddepcontrol.launch_dependents;" :::); }

// A list of positions a CTA gathers in shared memory, then writes out with one global atomic (`flush`); past
// kStaged it writes straight to global memory, an atomic a position.
struct StagedList {
    int *staged;  // kStaged ints of shared memory
    int *count;   // shared
    int *dst;     // global
    int *slots;   // global: the row's next free slot of dst
    int limit;    // slots of dst

    __device__ __forceinline__ void add(int value) const {
        const int slot = atomicAdd(count, 1);
        if (slot < kStaged) {
            staged[slot] = value;
        } else {
            const int spilled = atomicAdd(slots, 1);
            if (spilled < limit) dst[spilled] = value;
        }
    }

    // After a __syncthreads that follows every add.
    __device__ __forceinline__ void flush(int *base) const {
        const int n = min(*count, kStaged);
        if (threadIdx.x == 0) *base = n ? atomicAdd(slots, n) : 0;
        __syncthreads();
        for (int j = threadIdx.x; j < n; j += kThreads)
            if (*base + j < limit) dst[*base + j] = staged[j];
    }
};

// Writes `value` at dst[*slots + its rank among the writers of the lanes here] for each lane with `write` (one
// atomic a group of lanes that has a writer); a slot at or past `limit` is dropped, the count still taken.
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

// Over `kBinsScanned` counts (read through `load`), the bin holding the `rank`-th largest (1-based) counting from
// the top bin down, and how many lie in bins above it; `bin_out` is left as it was when fewer than `rank` exist.
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

// One 10-bit digit of an exact radix select in one CTA: among the keys `for_each` gives whose fixed bits equal
// `prefix`, the bin of `shift`'s digit holding the `remaining`-th largest; narrows prefix, fixed and remaining.
template <class ForEach>
__device__ __forceinline__ void select_digit(ForEach for_each, int *hist, int shift, uint32_t &prefix,
                                             uint32_t &fixed, int &remaining) {
    __shared__ int chosen, chosen_above;
    for (int b = threadIdx.x; b < kLowBins; b += kThreads) hist[b] = 0;
    if (threadIdx.x == 0) chosen = 0, chosen_above = 0;
    __syncthreads();
    for_each([&](uint32_t key, int) {
        if ((key & fixed) == prefix) atomicAdd(&hist[(key >> shift) & (kLowBins - 1)], 1);
    });
    __syncthreads();
    find_bin<kLowBins>([&](int b) { return hist[b]; }, remaining, &chosen, &chosen_above);
    prefix |= static_cast<uint32_t>(chosen) << shift;
    fixed |= static_cast<uint32_t>(kLowBins - 1) << shift;
    remaining -= chosen_above;
    __syncthreads();
}

// The `owed` best keys of the threshold bin (`for_each` gives at least that many, all of the bin), into
// dst[0, owed), by the key's low 20 bits.
template <class ForEach>
__device__ __forceinline__ void select_in_bin(ForEach for_each, int *hist, uint32_t threshold, int owed, int *dst) {
    __shared__ int taken_over, taken_equal;
    uint32_t prefix = threshold << kLowShift, fixed = ~0u << kLowShift;
    int remaining = owed;
    select_digit(for_each, hist, 10, prefix, fixed, remaining);
    select_digit(for_each, hist, 0, prefix, fixed, remaining);
    if (threadIdx.x == 0) taken_over = 0, taken_equal = 0;
    __syncthreads();
    // `prefix` is now the k-th key: the bin's keys above it are all picked, and `remaining` of those equal to it.
    for_each([&](uint32_t key, int i) {
        append(dst, &taken_over, key > prefix, i, owed - remaining);
        append(dst + owed - remaining, &taken_equal, key == prefix, i, remaining);
    });
}

__global__ __launch_bounds__(kThreads) void count_kernel(const float *__restrict__ logits, int64_t stride,
                                                         const int *__restrict__ lengths, int width, int k,
                                                         int chunk, int *__restrict__ hist, int *__restrict__ state) {
    __shared__ int local[kBins];
    __shared__ int threshold, above;
    wait_for_previous_kernel();
    let_next_start();
    const int row = blockIdx.y, n = row_length(lengths, row, width, chunk), begin = blockIdx.x * chunk;
    if (n <= k || begin >= n) return;
    for (int b = threadIdx.x; b < kBins; b += kThreads) local[b] = 0;
    if (threadIdx.x == 0) threshold = 0, above = 0;
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
    for (int b = threadIdx.x; b < kBins; b += kThreads) row_hist[b] = 0;
    if (threadIdx.x == 0) row_state[kThreshold] = threshold, row_state[kAbove] = above, row_state[kArrivedCount] = 0;
}

__global__ __launch_bounds__(kThreads, 1) void collect_kernel(const float *__restrict__ logits, int64_t stride,
                                                              const int *__restrict__ lengths, int width, int k,
                                                              int chunk, int *__restrict__ out,
                                                              int *__restrict__ state, int *__restrict__ candidates,
                                                              int *__restrict__ fallbacks) {
    extern __shared__ unsigned char resolve_shared[];
    __shared__ int staged_above[kStaged], staged_in_bin[kStaged], hist[kLowBins];
    __shared__ int count_above, count_in_bin, base;
    wait_for_previous_kernel();
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
    int *row_candidates = candidates + static_cast<int64_t>(row) * kCapacity;
    if (threadIdx.x == 0) count_above = 0, count_in_bin = 0;
    __syncthreads();
    const StagedList picks{staged_above, &count_above, dst, &row_state[kAboveSlots], above};
    const StagedList in_bin{staged_in_bin, &count_in_bin, row_candidates, &row_state[kCandidates], kCapacity};
    for_each_key(values, begin, min(n, begin + chunk), [&](uint32_t key, int i) {
        const uint32_t bin = key >> kLowShift;
        if (bin > threshold) picks.add(i);
        else if (bin == threshold) in_bin.add(i);
    });
    __syncthreads();
    picks.flush(&base);
    __syncthreads();
    in_bin.flush(&base);
    if (!arrives_last(&row_state[kArrivedCollect], (n + chunk - 1) / chunk)) return;

    // The last CTA of the row: the `k - above` picks the threshold bin owes, from its candidates or the whole row.
    const int count = __ldcg(&row_state[kCandidates]);
    if (count <= kCapacity) {
        uint32_t *keys = reinterpret_cast<uint32_t *>(resolve_shared);
        int *positions = reinterpret_cast<int *>(keys + kCapacity);
        for (int j = threadIdx.x; j < count; j += kThreads) {
            const int position = __ldcg(&row_candidates[j]);
            positions[j] = position, keys[j] = order_key(values[position]);
        }
        __syncthreads();
        select_in_bin(
            [&](auto f) {
                for (int j = threadIdx.x; j < count; j += kThreads) f(keys[j], positions[j]);
            },
            hist, threshold, k - above, dst + above);
    } else {
        if (threadIdx.x == 0) atomicAdd(fallbacks, 1);
        select_in_bin(
            [&](auto f) {
                for_each_key(values, 0, n, [&](uint32_t key, int i) {
                    if ((key >> kLowShift) == threshold) f(key, i);
                });
            },
            hist, threshold, k - above, dst + above);
    }
    for (int i = threadIdx.x; i < kStateInts; i += kThreads) row_state[i] = 0;
}

}  // namespace

extern "C" int dsa_split_select_state_ints(int rows) { return rows * (kBins + kStateInts); }

extern "C" int dsa_split_select_capacity() { return kCapacity; }  // candidates a row

// `state` holds `dsa_split_select_state_ints(rows)` int32, zero before the first call (each call leaves it zero);
// `candidates` holds rows * capacity int32; `fallbacks` one int32 the calls add their whole-row selections to.
// `chunk`: the scores a CTA takes, a positive multiple of 4.
extern "C" int dsa_split_select(const float *logits, int64_t stride, const int *lengths, int rows, int width, int k,
                                int max_len, int chunk, int *out, int *state, int *candidates, int *fallbacks,
                                void *stream, char *message, size_t message_len) {
    if (rows < 0 || width < 0 || k < 1 || stride < width || chunk < 4 || chunk % 4 || max_len < 0) {
        snprintf(message, message_len, "rows=%d, width=%d, k=%d, stride=%lld, chunk=%d, max_len=%d: rows, width, "
                 "max_len >= 0, k >= 1, stride >= width, chunk a positive multiple of 4",
                 rows, width, k, static_cast<long long>(stride), chunk, max_len);
        return 1;
    }
    if (rows == 0) return 0;
    if (rows > 65535) {
        snprintf(message, message_len, "rows=%d: at most 65535 (the grid's y)", rows);
        return 1;
    }
    const cudaError_t opted_in =  // per device, so every call (a host call: no stream work, fine in a capture)
        cudaFuncSetAttribute(collect_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kResolveShared);
    if (opted_in != cudaSuccess) {
        snprintf(message, message_len, "split_select: %zu B of shared memory refused: %s", kResolveShared,
                 cudaGetErrorString(opted_in));
        return 1;
    }
    const int span = max(min(max_len, width), k + 1);  // a short row's CTA 0 still writes its picks
    const dim3 grid((span + chunk - 1) / chunk, rows);
    int *hist = state + static_cast<int64_t>(rows) * kStateInts;
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    cudaLaunchAttribute early[1];
    early[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    early[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid, config.blockDim = dim3(kThreads), config.stream = s;
    config.attrs = early, config.numAttrs = 1;
    cudaError_t status = cudaLaunchKernelEx(&config, count_kernel, logits, stride, lengths, width, k, chunk, hist, state);
    config.dynamicSmemBytes = kResolveShared;
    if (status == cudaSuccess)
        status = cudaLaunchKernelEx(&config, collect_kernel, logits, stride, lengths, width, k, chunk, out, state,
                                    candidates, fallbacks);
    if (status == cudaSuccess) status = cudaGetLastError();
    if (status != cudaSuccess) {
        snprintf(message, message_len, "split_select launch: %s", cudaGetErrorString(status));
        return 1;
    }
    return 0;
}
