"""vLLM's decisions for the indexer's decode step: `query` (what a policy is asked and answers: a platform, a
configuration, a decision), `vllm` (per release and platform, pure functions), `steps` (per step: a ragged step's
route) and `cli` (`dsa-lab policy`). The face hands on what notebooks use."""

from dsa_lab.policy.query import Decision, Platform, PolicyQuery
from dsa_lab.policy.vllm import RELEASES, all_platforms, decision_matrix, vllm_0_33_0

__all__ = ["RELEASES", "Decision", "Platform", "PolicyQuery", "all_platforms", "decision_matrix", "vllm_0_33_0"]
