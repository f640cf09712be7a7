#!/usr/bin/env bash
# The decode check alone, one command for a lent GPU (about 4 minutes on an H200): install, the
# CUDA tests (the CUDA graph replays the fixed-shape step token for token), two speed models
# trained 20 s each as in the outlier's run, then scripts/gpu_decode.py; the table at the end,
# $OUT/decode.json beside it (docs/results/decode_overhead.md, "On a GPU"). Run from the root:
#   OUT=gpu_decode_out bash scripts/gpu_decode.sh
ONLY="install cuda_tests speed_model_autoregressive speed_model_block decode" \
    exec bash "$(dirname "$0")/gpu_check.sh"
