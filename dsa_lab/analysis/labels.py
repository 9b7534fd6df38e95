"""How people read an axis value: one title per axis of the axis table, used by every chart, table, reading and
explorer (the stored label is a key, never prose: `width model:163840` reads 'logits 160K wide (vLLM's
max_model_len)', `context 65536` reads '64K', `True` reads 'yes').

`TITLES` holds a title function per axis (`axes.AXES`, and the top-k implementation axis where a run carries
it); `tests/test_plots_style.py` holds that every axis has one. `workload_title` names a serving workload from
its axes: the context, then every other axis away from its old-run value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from dsa_lab import axes
from dsa_lab.analysis.frames import STUDY_SHAPE
from dsa_lab.batch.acceptance import AcceptanceSpec
from dsa_lab.batch.plan import LogitsWidth
from dsa_lab.batch.workload import ContextSpec, format_tokens
from dsa_lab.kernels import backend_names, get_backend
from dsa_lab.topk.registry import label_of

TOPK_AXIS = axes.axis("topk_impl")  # which top-k follows the logits on a 'logits+topk' step (its old-run value: torch)


def context_title(label: str) -> str:
    """'65536' -> '64K'; 'mixed:1024-65536' -> 'mixed 1K-64K'; 'lognormal:16384:1.2' -> 'lognormal 16K σ1.2'
    (tokens cached per request)."""
    return ContextSpec.parse(label).short


def acceptance_title(label: str) -> str:
    """'none' -> 'every draft accepted'; 'accept:0.8,0.6' -> 'accept 0.8, 0.6'; a published curve keeps its
    name and shows its rates ('v4flash-vllm41044 (0.7, 0.287)'; 'NAME:K': 'NAME, first K (...)')."""
    spec = AcceptanceSpec.parse(label)
    if spec.rates is None:
        return "every draft accepted"
    rates = ", ".join(f"{r:.3g}" for r in spec.rates)
    if spec.name is None:
        return f"accept {rates}"
    name, _, count = spec.name.partition(":")
    return f"{name}{f', first {count}' if count else ''} ({rates})"


def width_title(label: str) -> str:
    """'batch' -> 'logits as wide as the longest context'; 'model:163840' -> "logits 160K wide (vLLM's max_model_len)"."""
    width = LogitsWidth.parse(label)
    if width.model_len is None:
        return "logits as wide as the longest context"
    return f"logits {format_tokens(width.model_len)} wide (vLLM's max_model_len)"


def backend_title(name: str) -> str:
    """A backend's own label ('DeepGEMM PR #340'), the stored name for one this checkout does not register."""
    return get_backend(name).label if name in backend_names() else name


def baseline_label(backends: Sequence[str]) -> str:
    """What a comparison is held to, by name: 'the best DeepGEMM option (deepgemm, deepgemm-pr340)' (the kernels'
    own labels, a build of a PR named once); one backend: 'the best deepgemm option'."""
    if len(backends) == 1:
        return f"the best {backends[0]} option"
    titles = dict.fromkeys(backend_title(b).split(" PR ")[0] for b in backends)
    return f"the best {' / '.join(titles)} option ({', '.join(backends)})"


def pieces_title(pieces: str) -> str:
    """An atom split as stored ('4+2', '4[pad 1]') for people: '4+2', '4 (1 padding row)'."""
    return re.sub(r"\[pad (\d+)\]", lambda m: f" ({m[1]} padding row{'s' if m[1] != '1' else ''})", pieces)


TITLES: Mapping[str, Callable[[str], str]] = {
    "backend": backend_title,
    "strategy": str,
    "batch": lambda v: f"B = {v}",
    "context": context_title,
    "next_n": lambda v: f"next_n = {v}",
    "cache_dtype": lambda v: v.upper(),
    "heads": lambda v: f"{v} heads",
    "head_dim": lambda v: f"head dim {v}",
    "acceptance": acceptance_title,
    "logits_width": width_title,
    "timed": lambda v: {"logits": "logits only", "logits+topk": "logits + top-k"}.get(v, v),
    "timer": lambda v: {"events": "CUDA events", "graph": "CUDA graph", "replay": "one graph, ragged steps"}.get(v, v),
    "config": lambda v: "the backend's own rule" if v == axes.axis("config").old_value else v,
    TOPK_AXIS.name: label_of,  # each top-k's own label (`dsa_lab.topk`), which says when it is not vLLM's
}


SHORT: Mapping[str, Callable[[str], str]] = {  # a workload's name: the same words, without the rates and reasons
    "acceptance": lambda v: f"acceptance {v.replace(':', ', first ')}",
    "logits_width": lambda v: width_title(v).removesuffix(" (vLLM's max_model_len)"),
}


def axis_value_title(name: str, value: object) -> str:
    """How a chart, table or explorer writes one value of an axis for people (True/False: yes/no)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    title = TITLES.get(name)
    return title(str(value)) if title is not None else str(value)


def workload_title(row: Mapping[str, object]) -> str:
    """A serving workload for people: the context, then each other workload axis away from its old-run value
    ('mixed 2K-128K · logits 160K wide (vLLM's max_model_len)'); a step with a top-k names which top-k (a run
    without the axis ran torch's, not vLLM's); the shape when not DeepSeek-V3.2's indexer (64 heads of 128, FP8)."""
    parts = [context_title(str(row["context"]))]
    for name in (k for k in axes.SETTING_KEYS if k != TOPK_AXIS.name):
        if row[name] == axes.axis(name).old_value:
            continue
        topk = str(row.get(TOPK_AXIS.name, TOPK_AXIS.old_value)) if row[name] == "logits+topk" else None
        parts.append(f"logits + {label_of(topk)}" if topk else SHORT.get(name, TITLES[name])(str(row[name])))
    if any(row[k] != v for k, v in STUDY_SHAPE.items()):
        parts.append(", ".join(axis_value_title(k, row[k]) for k in STUDY_SHAPE))
    return " · ".join(parts)
