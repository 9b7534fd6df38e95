"""Bad input to the metadata builders and their result types: refused by a ValueError naming the argument."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_lab.batch.metadata import (
    AtomPiece,
    DecodeMetadata,
    KernelLaunch,
    build_atom_metadata,
    build_flatten_metadata,
    build_metadata,
    build_native_metadata,
    plan_atoms,
)
from dsa_lab.batch.workload import DecodeBatch, uniform_batch

BATCH = uniform_batch(2, 130, 3, num_heads=32, head_dim=64)  # 130 tokens: 3 blocks of 64
TABLE = torch.arange(6, dtype=torch.int32).view(2, 3)
LAUNCH = build_native_metadata(BATCH, TABLE).launches[0]


def launch(**change) -> KernelLaunch:
    return KernelLaunch(
        **{
            "token_rows": LAUNCH.token_rows,
            "context_lens": LAUNCH.context_lens,
            "block_table": LAUNCH.block_table,
            **change,
        }
    )


CASES = {
    "batch not a batch": (lambda: build_native_metadata((130, 130), TABLE), r"batch: expected a DecodeBatch"),
    "table float": (lambda: build_native_metadata(BATCH, TABLE.float()), r"block_table: expected int32"),
    "table int64": (lambda: build_flatten_metadata(BATCH, TABLE.long()), r"block_table: expected int32"),
    "table 1-D": (lambda: build_native_metadata(BATCH, TABLE.reshape(-1)), r"block_table: expected int32"),
    "table list": (lambda: build_native_metadata(BATCH, TABLE.tolist()), r"block_table: expected int32"),
    "table rows": (lambda: build_native_metadata(BATCH, TABLE[:1]), r"block_table: 1 rows"),
    "table too narrow": (lambda: build_flatten_metadata(BATCH, TABLE[:, :2]), r"block_table: 2 blocks per request"),
    "strategy": (lambda: build_metadata("interleave", BATCH, TABLE, (1, 2, 4)), r"strategy='interleave'"),
    "native_sizes string": (lambda: build_metadata("native", BATCH, TABLE, "124"), r"native_sizes="),
    "native_sizes zero": (lambda: build_metadata("atom", BATCH, TABLE, (0, 2)), r"native_sizes\[0\]=0"),
    "native_sizes empty": (lambda: build_metadata("atom", BATCH, TABLE, ()), r"native_sizes"),
    "plan next_n zero": (lambda: plan_atoms(0, (1, 2, 4)), r"next_n=0"),
    "plan next_n float": (lambda: plan_atoms(4.0, (1, 2, 4)), r"next_n=4\.0"),
    "plan next_n 17": (lambda: plan_atoms(17, (1, 2, 4)), r"next_n=17"),
    "plan size float": (lambda: plan_atoms(3, (1.5, 2)), r"native_sizes\[0\]=1\.5"),
    "plan padding string": (lambda: plan_atoms(3, (1, 2), allow_padding="no"), r"allow_padding='no'"),
    "plan impossible": (lambda: plan_atoms(3, (2,), allow_padding=False), r"next_n=3"),
    "piece size zero": (lambda: AtomPiece(0, 0), r"size=0"),
    "piece size float": (lambda: AtomPiece(1.5, 0), r"size=1\.5"),
    "piece offset bool": (lambda: AtomPiece(2, True), r"offset=True"),
    "pieces gap": (lambda: build_atom_metadata(BATCH, TABLE, (AtomPiece(1, 0), AtomPiece(1, 2))), r"pieces="),
    "pieces overlap": (lambda: build_atom_metadata(BATCH, TABLE, (AtomPiece(2, 0), AtomPiece(2, 1))), r"pieces="),
    "pieces tuples": (lambda: build_atom_metadata(BATCH, TABLE, ((2, 0), (1, 2))), r"pieces="),
    "launch rows dtype": (lambda: launch(token_rows=LAUNCH.token_rows.int()), r"token_rows: dtype"),
    "launch lens shape": (lambda: launch(context_lens=LAUNCH.context_lens[:, :2]), r"context_lens: expected shape"),
    "launch lens dtype": (lambda: launch(context_lens=LAUNCH.context_lens.float()), r"context_lens: dtype"),
    "launch table rows": (lambda: launch(block_table=TABLE[:1]), r"block_table: expected shape"),
    "metadata no launches": (lambda: DecodeMetadata("native", (), 6, 130), r"launches"),
    "metadata launch list": (lambda: DecodeMetadata("native", [LAUNCH], 6, 130), r"launches"),
    "metadata strategy": (lambda: DecodeMetadata("paged", (LAUNCH,), 6, 130), r"strategy='paged'"),
    "metadata tokens float": (lambda: DecodeMetadata("native", (LAUNCH,), 6.0, 130), r"num_tokens=6\.0"),
    "metadata max len negative": (lambda: DecodeMetadata("native", (LAUNCH,), 6, -1), r"max_context_len=-1"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_metadata_refuses_bad_input_by_name(case: str) -> None:
    call, name = CASES[case]
    with pytest.raises(ValueError, match=name):
        call()


@settings(max_examples=40, deadline=None)
@given(
    next_n=st.one_of(st.integers(max_value=0), st.integers(min_value=17, max_value=10**6), st.floats(), st.booleans())
)
def test_plan_atoms_refuses_any_next_n_outside_1_to_16(next_n: object) -> None:
    """next_n=0 used to return an empty plan: a step with no launch at all."""
    with pytest.raises(ValueError, match=r"next_n="):
        plan_atoms(next_n, (1, 2, 4))


@settings(max_examples=40, deadline=None)
@given(lens=st.lists(st.integers(1, 300), min_size=1, max_size=4), short=st.integers(1, 4))
def test_a_table_too_narrow_for_the_longest_request_is_refused(lens: list[int], short: int) -> None:
    batch = DecodeBatch(tuple(lens), (1,) * len(lens), 1)
    need = -(-max(lens) // 64)
    table = torch.zeros(len(lens), max(0, need - short), dtype=torch.int32)
    for strategy in ("native", "flatten", "atom"):
        with pytest.raises(ValueError, match=r"block_table: \d+ blocks per request"):
            build_metadata(strategy, batch, table, (1, 2, 4))
