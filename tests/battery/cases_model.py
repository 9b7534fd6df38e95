"""`dsa-lab model` and the model's functions: one next_n range, shapes no kernel has labelled, seeds in range."""

from __future__ import annotations

import json
from pathlib import Path

from tests.battery import CLEAR, UNCLEAR, WRONG, Result, case, cli_refused, refused, run_cli

AREA = "model"


def model_json(*flags: str) -> tuple[dict | None, Result | None]:
    done = run_cli(["model", "--json", *flags])
    if done.code != 0:
        return None, Result(UNCLEAR, f"exit {done.code}: {done.err.strip()[-300:]}")
    return json.loads(done.out), None


for _value in ("17", "33", "0", "-1", "1000"):
    case(AREA, f"model --next-n {_value} names next_n and one range [1, 16]")(
        lambda tmp, v=_value: cli_refused(["model", "--next-n", v], f"next_n={v}", "[1, 16]")
    )

for _flags, _name in (
    (["--batch", "0"], "batch"),
    (["--batch", "-5"], "batch"),
    (["--heads", "0"], "heads"),
    (["--head-dim", "0"], "head_dim"),
    (["--head-dim", "-128"], "head_dim"),
    (["--context", "0"], "context"),
    (["--context", "mixed:9-3"], "context"),
    (["--context", "64K", "--next-n", "16", "--batch", str(2**40)], "batch"),
    (["--context", "mixed:1K-64K", "--seed", str(2**70)], "seed"),
    (["--context", "mixed:1K-64K", "--seed", "-1"], "seed"),
    (["--cache-dtype", "int8"], "cache"),
    (["--gpu", "TPU"], "--gpu"),
    (["--backend", "nope"], "backend='nope'"),
    (["--strategy", "diagonal"], "strategy='diagonal'"),
    (["--next-n", "1.5"], "--next-n"),
    (["--context", "8", "--next-n", "16"], "seq_lens"),
):
    case(AREA, f"model {' '.join(_flags)[:60]}")(lambda tmp, f=_flags, n=_name: cli_refused(["model", *f], n))

for _flags, _what in (
    (["--heads", "3"], "heads=3"),
    (["--heads", "65"], "heads=65"),
    (["--heads", "128"], "heads=128"),
    (["--head-dim", "64", "--backend", "deepgemm"], "head_dim=64"),
    (["--head-dim", "100"], "head_dim=100"),
    (["--head-dim", "256"], "head_dim=256"),
):

    def _extrapolated(tmp: Path, flags=_flags, what=_what) -> Result:
        record, failed = model_json(*flags)
        if failed is not None:
            return Result(CLEAR, failed.detail) if what.split("=")[0] in failed.detail else failed
        notes = " ".join(record.get("assumptions", []))
        if "extrapolat" in notes and what in notes:
            return Result(CLEAR, notes[:200])
        return Result(WRONG, f"{what} modeled without a word: assumptions {notes[:200]!r}")

    case(AREA, f"model {' '.join(_flags)}: labelled as an extrapolation")(_extrapolated)


@case(AREA, "model --heads 64 --head-dim 128 carries no extrapolation label")
def _(tmp: Path) -> Result:
    record, failed = model_json("--heads", "64", "--head-dim", "128")
    if failed is not None:
        return failed
    notes = " ".join(record.get("assumptions", []))
    return Result(WRONG, f"a kernel's own shape labelled: {notes}") if "extrapolat" in notes else Result(CLEAR, "plain")


@case(AREA, "model's human output escapes nothing it should not and shows the assumptions")
def _(tmp: Path) -> Result:
    done = run_cli(["model", "--heads", "3"])
    if done.code != 0 or done.raised is not None:
        return Result(UNCLEAR, f"{done.raised!r} {done.err[-300:]}")
    return Result(CLEAR, "printed") if "extrapolat" in done.out else Result(WRONG, "no label in the table output")


def _predict(**kwargs):
    from dsa_lab.model.indexer import predict

    args = {"gpu": "H200", "backend": "deepgemm", "strategy": "native", "seq_lens": [4096] * 4, "next_n": 1}
    return predict(**{**args, **kwargs})


for _kwargs, _name in (
    ({"next_n": 17}, "next_n"),
    ({"next_n": True}, "next_n"),
    ({"next_n": 2.0}, "next_n"),
    ({"heads": True}, "heads"),
    ({"heads": 64.0}, "heads"),
    ({"head_dim": 0}, "head_dim"),
    ({"head_dim": "128"}, "head_dim"),
    ({"seq_lens": []}, "seq_lens"),
    ({"seq_lens": [0]}, "seq_lens"),
    ({"seq_lens": "4096"}, "seq_lens"),
    ({"gpu": "H100"}, "gpu"),
    ({"cache_dtype": "mxfp4"}, "mxfp4"),
):
    case(AREA, f"predict({_kwargs})"[:80])(lambda tmp, k=_kwargs, n=_name: refused(lambda: _predict(**k), n))


def _decode_step(**kwargs):
    from dsa_lab.model.decode_step import decode_step

    args = {"gpu": "H200", "batch": 8, "context": 4096, "next_n": 2, "indexer_us": 10.0, "draft_indexer_us": 5.0}
    return decode_step(**{**args, **kwargs})


for _kwargs, _name in (
    ({"next_n": 17}, "next_n"),
    ({"batch": 0}, "batch"),
    ({"context": -1}, "context"),
    ({"indexer_us": -5.0}, "indexer_us"),
    ({"indexer_us": float("nan")}, "indexer_us"),
    ({"draft_indexer_us": float("inf")}, "draft_indexer_us"),
    ({"context": 1.5}, "context"),
):
    case(AREA, f"decode_step({_kwargs})")(lambda tmp, k=_kwargs, n=_name: refused(lambda: _decode_step(**k), n))


@case(AREA, "model --next-n 16 (the top of the range) is modeled")
def _(tmp: Path) -> Result:
    record, failed = model_json("--next-n", "16", "--context", "64K")
    return failed or Result(CLEAR, f"{record['time_us']:.0f} us")
