"""A ``cdlm-train`` run: its parts built from the config, and its run folder."""
