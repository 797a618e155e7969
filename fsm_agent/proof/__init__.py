"""Proofs about a table: every run stops, within what, and which stops each agent can reach."""

from fsm_agent.proof.check import Proof, StopPath, check

__all__ = ["Proof", "StopPath", "check"]
