"""Rollout generation: seeded, verifiable sampling with per-token log-probs and TOPLOC proofs.

Invariant: every generated token is the one the seeded Gumbel-max sampler picks from the policy's logits,
so anyone who recomputes the logits can check each token; the worker's numbers (rewards, log-probs) are
recorded for inspection but never trusted downstream.
"""
