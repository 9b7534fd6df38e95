/* Which of vLLM 0.33.0's decode top-k kernels runs for a step, and with what geometry.
 *
 * dsa_lab's own statement of the rules vLLM applies around its compiled top-k ops: the Python
 * dispatch (`SparseIndexerTopk` with the 'auto' backend, vllm/model_executor/layers/indexer_topk.py)
 * and the host code that launches each kernel (csrc/topk.cu, csrc/cooperative_topk.cu). Plain C
 * with no CUDA, so the CPU tests compile it with the system compiler and hold it against vLLM's
 * Python dispatch; `vllm_topk_entry.cu` reads the same function before every launch and checks
 * the constants below against vLLM's headers at compile time.
 */
#ifndef DSA_VLLM_TOPK_RULES_H
#define DSA_VLLM_TOPK_RULES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The kernels (values are stable: the Python side names them by these numbers). */
enum {
    DSA_TOPK_REFUSED = 0,
    DSA_TOPK_COOPERATIVE = 1, /* one cluster of CTAs a row, rows <= 64 */
    DSA_TOPK_SAMPLED = 2,     /* one CTA a row, a sampled threshold first: many long rows */
    DSA_TOPK_FILTERED = 3,    /* one CTA a row, a coarse histogram filter */
    DSA_TOPK_RADIX = 4        /* persistent CTA groups splitting each row, radix passes */
};

/* How the step asks: vLLM's 'auto' chain, or one kernel family forced (its kernel_config). */
enum { DSA_TOPK_AUTO = 0, DSA_TOPK_FORCE_COOPERATIVE = 1, DSA_TOPK_FORCE_PERSISTENT = 2 };

/* vLLM's numbers the rules read (checked against its headers where the kernels are compiled). */
#define DSA_TOPK_COOPERATIVE_MAX_ROWS 64u
#define DSA_TOPK_RADIX_THREADS 1024u
#define DSA_TOPK_RADIX_THRESHOLD 32768u  /* a row longer than this takes the cross-CTA radix passes */
#define DSA_TOPK_SMEM_MEDIUM 35968u      /* the radix kernel's smallest dynamic shared memory */
#define DSA_TOPK_SMEM_FIXED_LARGE 2080u  /* its histograms and scalars, before the chunk */
#define DSA_TOPK_SAMPLED_SMEM_NEEDED (144u * 1024u)
#define DSA_TOPK_FILTERED_SMEM_NEEDED (128u * 1024u)
#define DSA_TOPK_RADIX_ROW_STATE_BYTES 3088u /* one group's cross-CTA state in the workspace */

typedef struct {
    uint32_t rows;        /* logits rows (B * next_n) */
    uint32_t stride;      /* the logits' row stride in floats (vLLM: max_model_len) */
    uint32_t width;       /* the logits' columns */
    uint32_t k;           /* picks a row: 512, 1024 or 2048 */
    uint32_t max_seq_len; /* the batch's longest context (a host int, vLLM's max_seq_len) */
    uint64_t address;     /* the logits' base address (its alignment picks the vector width) */
    int policy;           /* DSA_TOPK_AUTO or a forced family */
    int sms;              /* multiprocessors */
    int smem_optin;       /* shared memory a block may opt into, bytes */
    int cc_major, cc_minor;
} dsa_topk_query;

typedef struct {
    int kernel;               /* DSA_TOPK_* */
    int cluster;              /* cooperative: CTAs per row */
    int vec;                  /* radix: floats a load */
    uint32_t smem;            /* radix: dynamic shared memory bytes */
    uint32_t chunk;           /* radix: columns a CTA */
    uint32_t ctas_per_group;  /* radix: CTAs sharing a row */
    uint32_t groups;          /* radix: rows in flight */
    uint32_t length_bound;    /* sampled: the bound its rows are clipped to */
    size_t workspace_bytes;   /* what the launch needs of the 1 MiB workspace */
} dsa_topk_plan;

/* Blocks of the radix kernel an SM holds at this vector width and shared memory (the caller asks
 * the runtime; the tests give a number). */
typedef int (*dsa_topk_occupancy_fn)(int vec, uint32_t smem, void *context);

static inline uint32_t dsa_topk_min_sampled_length(uint32_t k) { return k == 512u ? 98304u : 65536u; }

static inline uint32_t dsa_topk_ceil_div(uint32_t a, uint32_t b) { return (a + b - 1u) / b; }

/* The cooperative family's own conditions (vLLM's `_cooperative_constraints`): 0 when it applies. */
static inline int dsa_topk_cooperative_applies(const dsa_topk_query *q) {
    int k_ok = q->k == 512u || q->k == 1024u || q->k == 2048u;
    int arch_ok = q->cc_major >= 9 && q->cc_major != 12;
    return k_ok && q->rows <= DSA_TOPK_COOPERATIVE_MAX_ROWS && q->stride % 4u == 0u && arch_ok;
}

static inline void dsa_topk_radix(const dsa_topk_query *q, dsa_topk_occupancy_fn occupancy_of, void *context,
                           dsa_topk_plan *p) {
    uint32_t optin = (uint32_t)q->smem_optin;
    uint32_t effective = optin;
    if (q->rows <= 4u) {
        effective = optin < DSA_TOPK_SMEM_MEDIUM ? optin : DSA_TOPK_SMEM_MEDIUM;
    } else if (q->rows <= 8u) {
        effective = optin < 48u * 1024u ? optin : 48u * 1024u;
    }
    int vec = 1;
    if (q->stride % 4u == 0u && q->address % 16u == 0u) {
        vec = 4;
    } else if (q->stride % 2u == 0u && q->address % 8u == 0u) {
        vec = 2;
    }
    uint32_t max_chunk = (effective - DSA_TOPK_SMEM_FIXED_LARGE) / 4u;
    max_chunk = max_chunk / (uint32_t)vec * (uint32_t)vec;
    if (max_chunk < (uint32_t)vec * DSA_TOPK_RADIX_THREADS) max_chunk = (uint32_t)vec * DSA_TOPK_RADIX_THREADS;
    uint32_t per_group = dsa_topk_ceil_div(q->stride, max_chunk);
    uint32_t chunk = dsa_topk_ceil_div(dsa_topk_ceil_div(q->stride, per_group), (uint32_t)vec) * (uint32_t)vec;
    if (chunk > max_chunk) chunk = max_chunk;
    uint32_t smem = DSA_TOPK_SMEM_FIXED_LARGE + chunk * 4u;
    if (smem < DSA_TOPK_SMEM_MEDIUM) smem = DSA_TOPK_SMEM_MEDIUM;
    int occupancy = occupancy_of(vec, smem, context);
    if (occupancy < 1) occupancy = 1;
    /* CTAs past a row's first wait on each other only when some row is long enough for the radix passes */
    int cooperative = q->max_seq_len > DSA_TOPK_RADIX_THRESHOLD;
    uint32_t resident = (uint32_t)q->sms * (uint32_t)occupancy;
    uint32_t budget = resident;
    if (cooperative) {
        uint32_t headroom = occupancy > 1 ? (uint32_t)q->sms : 1u;
        if (budget >= headroom + per_group) budget -= headroom;
    }
    uint32_t groups = budget / per_group < q->rows ? budget / per_group : q->rows;
    if (groups == 0u) groups = 1u;
    if (cooperative && groups * per_group > resident) {
        /* the cross-CTA barrier would not fit on the chip: vLLM takes the filtered kernel instead */
        p->kernel = DSA_TOPK_FILTERED;
        return;
    }
    p->kernel = DSA_TOPK_RADIX;
    p->vec = vec;
    p->smem = smem;
    p->chunk = chunk;
    p->ctas_per_group = per_group;
    p->groups = groups;
    p->workspace_bytes = (size_t)groups * DSA_TOPK_RADIX_ROW_STATE_BYTES;
}

/* The plan for a query, or a refusal (kernel DSA_TOPK_REFUSED) with its reason in `why`. */
static inline dsa_topk_plan dsa_topk_choose(const dsa_topk_query *q, dsa_topk_occupancy_fn occupancy_of,
                                            void *context, const char **why) {
    dsa_topk_plan p = {DSA_TOPK_REFUSED, 0, 0, 0u, 0u, 0u, 0u, 0u, 0};
    *why = "";
    if (q->k != 512u && q->k != 1024u && q->k != 2048u) {
        *why = "k: vLLM's decode top-k takes 512, 1024 or 2048";
        return p;
    }
    if (q->cc_major < 9) {
        *why = "device: vLLM's decode top-k kernels need compute capability 9.0 or newer";
        return p;
    }
    if (q->stride < q->width) {
        *why = "stride: the logits' row stride is below their width";
        return p;
    }
    int cooperative = dsa_topk_cooperative_applies(q);
    if (q->policy == DSA_TOPK_FORCE_COOPERATIVE && !cooperative) {
        *why = "policy: the cooperative kernel takes <= 64 rows, a row stride divisible by 4 and SM90+ (not SM12x)";
        return p;
    }
    if (q->policy != DSA_TOPK_FORCE_PERSISTENT && cooperative) {
        p.kernel = DSA_TOPK_COOPERATIVE;
        p.cluster = q->rows <= 4u && q->cc_major >= 10 ? 16 : q->rows <= 8u ? 8 : q->rows <= 33u ? 4 : 2;
        p.workspace_bytes = (size_t)q->rows * 2048u * 8u; /* one tie buffer of 2048 (score, index) pairs a row */
        return p;
    }
    uint32_t optin = (uint32_t)q->smem_optin;
    if (q->rows > 64u && q->max_seq_len >= dsa_topk_min_sampled_length(q->k) &&
        optin >= DSA_TOPK_SAMPLED_SMEM_NEEDED) {
        p.kernel = DSA_TOPK_SAMPLED;
        p.length_bound = q->max_seq_len < q->width ? q->max_seq_len : q->width;
        return p;
    }
    if (q->rows > 32u && optin >= DSA_TOPK_FILTERED_SMEM_NEEDED) {
        p.kernel = DSA_TOPK_FILTERED;
        return p;
    }
    if (optin < DSA_TOPK_FILTERED_SMEM_NEEDED) {
        *why = "device: below 128 KiB of shared memory vLLM falls back to a per-row kernel this build leaves out";
        return p;
    }
    dsa_topk_radix(q, occupancy_of, context, &p);
    return p;
}

#ifdef __cplusplus
}
#endif

#endif /* DSA_VLLM_TOPK_RULES_H */
