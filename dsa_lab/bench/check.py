"""The harness's one correctness measure: the reference first, then the candidate's calls, each held to it,
and the candidate's inputs verified untouched, before any measurement.

Every mode checks a point this way before measuring it (timing, torch.profiler, Nsight
Compute), so a configuration that computes the wrong numbers is never timed or profiled.

Inputs are not the candidate's to keep. The reference scores the sampled requests first, on
inputs no candidate has touched; then the candidate's step runs `CHECKED_CALLS` times on every
device and each call's outputs are held to that reference (a kernel right only on its first
call, or only from its second, fails); then every tensor it was handed (q, weights, the KV
cache, the block tables, the context lengths: `handed_inputs`) must be bit for bit what it was
before (`InputGuard`), and a point whose candidate wrote into one fails naming it.

How "unchanged" is verified: a fingerprint per tensor (`fingerprint`), computed on its device
before and after, not a copy. A copy of the KV cache would double a workload's largest
allocation (gigabytes at B = 128, L = 64K) and cost a point its place in memory; a
fingerprint reads the tensor once, in passes with 32 MiB temporaries. It is two wrapping int64
sums over the bytes read as 32-bit words: the plain sum, which changes with any change confined
to one word, and the sum weighted by each word's position, which changes with any swap of two
different words (a zeroed cache, two swapped block ids) for tensors under 32 GiB. What it cannot
see is a write crafted to keep both sums, a kernel written against this check.

On CUDA a first call tells the byte size of each output allocation (it is held to the reference
too); NaN-filled blocks of exactly those sizes are then handed back to the caching allocator
before each later call, which gives them to that call's outputs, so an element the kernel never
writes stays NaN (the row says whether every output really landed in poisoned memory). The
reference scores a sample of requests (all of them when that is cheap) and the error is
||out - ref|| / ||ref|| over the valid positions only, since some kernels leave the tail past
each context unspecified. A point passes when every held call's error is at most its bound and
no valid position is NaN. The bound is the spec's `check_tolerance` (1e-3) unless the backend's
arithmetic on this platform is coarser (`bench.numerics`, with the reason: DeepGEMM on SM100,
1e-2); it is decided here, so every mode checks against the same bound, and the result says
which and why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from dsa_lab.batch.metadata import DecodeMetadata
from dsa_lab.batch.workload import DecodeBatch, DecodeInputs
from dsa_lab.bench.numerics import backend_numerics
from dsa_lab.kernels import LogitsBackend, LogitsCall, baseline_backend

CHECKED_CALLS = 2  # calls of the step held to the reference on every device (CUDA runs one more first, also held)
FINGERPRINT_WORDS = 1 << 22  # words a fingerprint pass reads: bounds its temporaries (32 MiB of int64 each)
_ODD = 0x5851F42D4C957F2D  # an odd 63-bit multiplier of word positions (any odd number keeps positions apart)


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    rel_err: float  # the largest of the held calls'
    checked_requests: int
    checked_tokens: int
    poisoned: bool  # every output of every call after the first landed in NaN-filled memory (False off CUDA)
    message: str = ""
    tolerance: float | None = None  # the bound rel_err was held to
    tolerance_reason: str = ""  # why that bound (`bench.numerics`)
    inputs_changed: tuple[str, ...] = ()  # the inputs the candidate wrote into, by name
    calls: int = 0  # calls of the step held to the reference


def checked_requests(batch: DecodeBatch, limit: int, count: int) -> list[int]:
    """Every request when the check is cheap; else the first, the last and the longest (up to `count`)."""
    work = sum(batch.token_context_lens())
    if work <= limit:
        return [b for b in range(batch.batch_size) if batch.decode_lens[b]]
    longest = max(range(batch.batch_size), key=lambda b: batch.seq_lens[b])
    picks = dict.fromkeys([0, batch.batch_size - 1, longest])
    return [b for b in picks if batch.decode_lens[b]][: max(1, count)]


# ---------------------------------------------------------------- inputs untouched


def _words(t: torch.Tensor) -> torch.Tensor:
    """`t`'s bytes as one flat tensor of 32-bit words (bytes when its size or offset allows no words)."""
    raw = t.detach().reshape(-1).view(torch.uint8) if t.dim() else t.detach().reshape(1).view(torch.uint8)
    try:
        return raw.view(torch.int32)
    except RuntimeError:  # a byte count or storage offset not a multiple of 4
        return raw


def fingerprint(t: torch.Tensor) -> torch.Tensor:
    """Two int64 sums over `t`'s bytes read as words, on its device (module docstring): the plain sum and the
    sum weighted by each word's position; wrapping arithmetic, read in passes of `FINGERPRINT_WORDS`."""
    words = _words(t)
    weights = torch.arange(min(words.numel(), FINGERPRINT_WORDS), dtype=torch.int64, device=words.device) * _ODD
    sums = torch.zeros(2, dtype=torch.int64, device=words.device)
    for start in range(0, words.numel(), FINGERPRINT_WORDS):
        part = words[start : start + FINGERPRINT_WORDS].long()
        plain = part.sum()
        offset = (start * _ODD + (1 << 63)) % (1 << 64) - (1 << 63)  # start * _ODD as a wrapped int64
        sums[0] += plain
        sums[1] += (part * weights[: part.numel()]).sum() + plain * offset
    return sums


@dataclass(frozen=True)
class InputGuard:
    """Named tensors fingerprinted now; `changed()` names those whose bytes differ later. Take it before a
    candidate runs on them, verify after (the check does; `bench.walk.prepare` takes one per point for the
    sweep, and a 'logits+topk' check may verify its own calls with one)."""

    names: tuple[str, ...]
    tensors: tuple[torch.Tensor, ...]
    before: tuple[torch.Tensor, ...]

    @classmethod
    def of(cls, named: Mapping[str, torch.Tensor]) -> InputGuard:
        """A guard over `named`; a tensor given under two names (a launch's block table that is the cache's) is
        fingerprinted once, under its first name."""
        seen: dict[tuple[int, int, tuple[int, ...], torch.dtype], str] = {}
        for name, tensor in named.items():
            if not isinstance(tensor, torch.Tensor):
                raise ValueError(f"{name}: expected a torch.Tensor to guard, got {type(tensor).__name__}")
            seen.setdefault((tensor.data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.dtype), name)
        kept = {name: named[name] for name in seen.values()}
        return cls(tuple(kept), tuple(kept.values()), tuple(fingerprint(t) for t in kept.values()))

    def changed(self) -> tuple[str, ...]:
        """The names of the guarded tensors whose bytes are not what they were (one host copy for all)."""
        if not self.names:
            return ()
        now = [fingerprint(t) for t in self.tensors]
        differ = [bool((a != b).any()) for a, b in zip(torch.stack(now).cpu(), torch.stack(self.before).cpu())]
        return tuple(name for name, changed in zip(self.names, differ, strict=True) if changed)


def workload_inputs(inputs: DecodeInputs) -> dict[str, torch.Tensor]:
    """The step's own tensors by name: its q and weights, the KV cache and the cache's block table."""
    return {
        "KV cache": inputs.cache.data,
        "block table": inputs.cache.block_table,
        "q": inputs.q,
        "weights": inputs.weights,
    }


def launch_inputs(launches: Sequence[LogitsCall]) -> dict[str, torch.Tensor]:
    """Each launch's packed q, weights, context lengths and block table (its call's), by name."""
    named = {}
    for i, p in enumerate(launches):
        where = f" (launch {i})"
        named.update(
            {
                f"q{where}": p.q,
                f"weights{where}": p.weights,
                f"context lens{where}": p.context_lens,
                f"block table{where}": p.block_table,
            }
        )
    return named


def handed_inputs(inputs: DecodeInputs, launches: Sequence[LogitsCall]) -> dict[str, torch.Tensor]:
    """Every tensor a backend is handed for the step, by name: the step's own (`workload_inputs`) and each
    launch's (`launch_inputs`)."""
    return {**workload_inputs(inputs), **launch_inputs(launches)}


def changed_message(changed: Sequence[str]) -> str:
    """What a row says of a candidate that wrote into its inputs."""
    return f"the backend changed its inputs: {', '.join(changed)} (inputs are not the candidate's to keep)"


# ---------------------------------------------------------------- the calls


def _poison(sizes: Sequence[int], device: torch.device) -> set[int]:
    """Hand NaN-filled blocks back to the CUDA caching allocator, which gives a request of the
    same byte size the same (best-fit, lowest-address) block next: the outputs start as NaN.
    Returns the blocks' addresses, so the check can tell whether each output really landed there."""
    blocks = [torch.full((n,), 0xFF, dtype=torch.uint8, device=device) for n in sizes]  # 0xFFFFFFFF is a NaN
    addresses = {t.data_ptr() for t in blocks}
    del blocks
    return addresses


def run_launches(backend: LogitsBackend, launches: Sequence[LogitsCall]) -> list[torch.Tensor]:
    """Every launch of one decode step, as timed: the raw outputs, nothing gathered (launches
    checked once beforehand by `decode.check_launches`; no device sync here)."""
    return [backend.logits(call) for call in launches]


def _sizes(outputs: Sequence[torch.Tensor]) -> list[int]:
    return [out.untyped_storage().nbytes() for out in outputs]


def poisoned(run: Callable[[], list[torch.Tensor]], device: torch.device) -> tuple[list[torch.Tensor], bool]:
    """`run`'s outputs written into poisoned memory on CUDA (a first run, which JIT-compiles, tells each
    output's byte size; all bits set: NaN as float32, -1 as int32), and whether every output really landed
    there (False off CUDA)."""
    if device.type != "cuda":
        return run(), False
    addresses = _poison(_sizes(run()), device)
    outputs = run()
    return outputs, all(out.untyped_storage().data_ptr() in addresses for out in outputs)


def poisoned_run(
    backend: LogitsBackend, launches: Sequence[LogitsCall], device: torch.device
) -> tuple[list[torch.Tensor], bool]:
    """Every launch of the step run into NaN-poisoned memory on CUDA (`poisoned`)."""
    return poisoned(lambda: run_launches(backend, launches), device)


@dataclass(frozen=True)
class _Sample:
    """The sampled requests' tokens, where each lands in the gathered outputs, and their reference."""

    tokens: list[int]
    position: torch.Tensor  # token -> its row among the sampled (-1: not sampled)
    contexts: torch.Tensor
    valid: torch.Tensor  # [tokens, max_len]: inside each token's context
    ref: torch.Tensor  # float64 on the valid positions


def _reference(inputs: DecodeInputs, requests: Sequence[int], max_len: int) -> _Sample:
    """The baseline's logits of the sampled requests, computed before any candidate call."""
    batch, device = inputs.batch, inputs.q.device
    owners, wanted = batch.token_requests(), set(requests)
    tokens = [t for t, b in enumerate(owners) if b in wanted]
    position = torch.full((batch.num_decode_tokens,), -1, dtype=torch.long, device=device)
    position[torch.tensor(tokens, device=device)] = torch.arange(len(tokens), device=device)
    contexts = torch.tensor(batch.token_context_lens(), dtype=torch.int32, device=device)[tokens]
    table = inputs.cache.block_table[torch.tensor([owners[t] for t in tokens], device=device)]
    call = LogitsCall(
        inputs.q[tokens][:, None].contiguous(),
        inputs.cache.data,
        inputs.weights[tokens].contiguous(),
        contexts[:, None].contiguous(),
        table.contiguous(),
        max_len,
        cache_dtype=inputs.cache.cache_dtype,
    )
    ref = baseline_backend().logits(call)
    valid = torch.arange(max_len, device=device)[None, :] < contexts[:, None]
    return _Sample(tokens, position, contexts, valid, ref[valid].double())


def _held(
    sample: _Sample, metadata: DecodeMetadata, outputs: Sequence[torch.Tensor], max_len: int
) -> tuple[int, float]:
    """One call's outputs against the reference: (NaN count, relative error) on the valid positions."""
    got = torch.full((len(sample.tokens), max_len), float("nan"), dtype=torch.float32, device=sample.ref.device)
    for launch, out in zip(metadata.launches, outputs, strict=True):
        rows = launch.token_rows.reshape(-1)
        slot = torch.where(rows >= 0, sample.position[rows.clamp(min=0)], torch.full_like(rows, -1))
        keep = slot >= 0
        got[slot[keep]] = out[keep, :max_len].float()
    got_valid = got[sample.valid].double()
    nans = int(torch.isnan(got_valid).sum())
    return nans, float((got_valid - sample.ref).norm() / sample.ref.norm().clamp(min=1e-30))


def check_point(
    inputs: DecodeInputs,
    metadata: DecodeMetadata,
    backend: LogitsBackend,
    launches: Sequence[LogitsCall],
    tolerance: float,
    full_check_limit: int,
    sample_requests: int,
) -> CheckResult:
    """The reference first, then the step `CHECKED_CALLS` times (one more first on CUDA, which sizes the poisoned
    outputs), each call's ||out - ref|| / ||ref|| on the valid positions of sampled requests; then the inputs the
    candidate was handed verified unchanged.

    `tolerance` is the spec's `check_tolerance`; the backend's numerics on this device may
    loosen it (`bench.numerics.backend_numerics`), never tighten it.
    """
    device = inputs.q.device
    tolerance, tolerance_reason = backend_numerics(backend, device).check_tolerance(tolerance)
    max_len = metadata.max_context_len
    guard = InputGuard.of(handed_inputs(inputs, launches))
    requests = checked_requests(inputs.batch, full_check_limit, sample_requests)
    sample = _reference(inputs, requests, max_len)
    calls = CHECKED_CALLS + (device.type == "cuda")
    errors: list[tuple[int, float]] = []
    sizes: list[int] | None = None
    poisoned = device.type == "cuda"
    for _ in range(calls):
        addresses = _poison(sizes, device) if sizes is not None else None
        outputs = run_launches(backend, launches)
        if device.type == "cuda" and sizes is None:
            sizes = _sizes(outputs)
        elif addresses is not None:
            poisoned &= all(out.untyped_storage().data_ptr() in addresses for out in outputs)
        errors.append(_held(sample, metadata, outputs, max_len))
        del outputs
        if changed := guard.changed():  # after each call: a change the next call undoes is seen too
            break
    rel_err = max((err for _, err in errors), key=lambda err: (math.isnan(err), err))  # a NaN error wins
    result = {
        "rel_err": rel_err,
        "checked_requests": len(requests),
        "checked_tokens": len(sample.tokens),
        "poisoned": poisoned,
        "tolerance": tolerance,
        "tolerance_reason": tolerance_reason,
        "inputs_changed": changed,
        "calls": calls,
    }
    if changed:
        return CheckResult(False, message=changed_message(changed), **result)
    for call, (nans, err) in enumerate(errors, start=1):
        which = f"call {call} of {calls}" + ("" if call == 1 else f" (call 1: {errors[0][1]:.3e})")
        if nans:
            valid = int(sample.valid.sum())
            return CheckResult(
                False, message=f"{which}: {nans} NaN among {valid} valid positions (unwritten?)", **result
            )
        if not err <= tolerance:
            return CheckResult(False, message=f"{which}: relative error {err:.3e} > {tolerance:g}", **result)
    return CheckResult(True, **result)
