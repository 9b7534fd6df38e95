"""vLLM's decisions for the indexer's decode step: `vllm` (per release and platform, pure functions), `steps`
(per step: a ragged step's route) and `cli` (`dsa-lab policy`). The face hands on what notebooks use."""

from dsa_lab.policy.vllm import RELEASES, Decision, Platform, PolicyQuery, all_platforms, decision_matrix, vllm_0_33_0

__all__ = ["RELEASES", "Decision", "Platform", "PolicyQuery", "all_platforms", "decision_matrix", "vllm_0_33_0"]
