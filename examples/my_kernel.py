"""An example backend of your own, in one file: paged MQA logits in float32 PyTorch.

A backend is a `LogitsBackend` subclass registered with `@register_backend`; its `logits` takes one
`LogitsCall` (DeepGEMM's calling convention as one object, host-checked when it was made), and its class
attributes are its descriptor (who wrote it, how charts draw it, which sweep presets it joins, the shapes
it takes). Load this file with
`dsa-lab bench --backend-module examples/my_kernel.py --backend my-kernel ...`, or name it in
`DSA_LAB_BACKEND_MODULES` so that notebooks and `dsa-lab report` see it too
(docs/add_a_kernel.md walks through it).

The kernel here dequantises each request's K (`dsa_lab.batch.cache.gather_request_keys`) and scores
it with two einsums: simple and slow, but not the reference's exact float64 sums, so the check
against the reference measures a real (float32-sized) difference.
"""

from __future__ import annotations

import torch

from dsa_lab.batch.cache import PagedCache, gather_request_keys
from dsa_lab.kernels import LogitsBackend, LogitsCall, register_backend


@register_backend
class MyKernel(LogitsBackend):
    """logits[t, s] = sum_h w[t, h] * relu(q[t, h] . k[s]) for s < context_lens[t], -inf past it."""

    name = "my-kernel"  # what --backend, runs and charts call it
    family = "my-kernel"  # backends of one family compete as one (e.g. two builds of one library)
    label = "my kernel (float32 PyTorch)"
    marker = "*"  # its marker in every chart (the strategy owns the colour)
    color = "#17becf"
    presets = ("ci",)  # `dsa-lab bench --preset ci` runs it beside the reference

    def logits(self, call: LogitsCall) -> torch.Tensor:
        call.check_values()  # context lens and block ids within the cache: a host read, fine off a GPU
        q, weights, lens_per_row = call.q, call.weights, call.context_lens
        self.check_shape(q.shape[2], q.shape[3], call.cache_dtype)
        batch, next_n, heads, dim = q.shape
        cache = PagedCache(call.kv_cache, call.block_table, dim, call.cache_dtype)
        out = torch.full((call.rows, call.max_context_len), float("-inf"), dtype=torch.float32, device=q.device)
        for b in range(batch):
            lens = lens_per_row[b].long()  # [next_n]: the tokens each of the request's rows sees
            longest = int(lens.max())
            if longest == 0:  # a padding request
                continue
            keys = gather_request_keys(cache, b, longest)  # float32 [longest, D]
            scores = torch.einsum("nhd,sd->nhs", q[b].float(), keys).relu_()
            rows = torch.einsum("nhs,nh->ns", scores, weights[b * next_n : (b + 1) * next_n])
            past = torch.arange(longest, device=q.device)[None, :] >= lens[:, None]
            out[b * next_n : (b + 1) * next_n, :longest] = rows.masked_fill_(past, float("-inf"))
        return out
