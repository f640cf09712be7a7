"""Evaluation: sample quality, speed and work, likelihood, reports."""
