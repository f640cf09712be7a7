"""Tasks where a diffusion LM should beat left-to-right decoding, each with fixed seeded inputs
from the held-out split and an acceptance check (``cdlm-eval task=...``, docs/results/historical/tasks.md)."""
