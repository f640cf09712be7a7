#!/usr/bin/env bash
# Downloads into .whl/ the wheels that cdlm needs on the H200 machine and that its image lacks
# (docs/results/gpu.md): Hydra and its two dependencies, and Hydra's joblib launcher with joblib
# (the multiruns of scripts/gpu_learning.sh and gpu_crossover.sh). Every other dependency (torch, lightning,
# transformers, tokenizers, safetensors, scipy, numpy, pyyaml, packaging, pytest) is already
# there; wandb is imported only by runs that log to W&B, and scripts/gpu_check.sh uses
# logger=csv. Run once, here, in the repository root; .whl/ must be ignored by git
# (.git/info/exclude) and named in the device tool's carry.
set -euo pipefail
# The versions this project's tests run with; all are pure Python (py3-none-any).
WHEELS=(hydra-core==1.3.8 omegaconf==2.3.1 hydra-joblib-launcher==1.2.0 joblib==1.6.0)
mkdir -p .whl
rm -f .whl/*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
# omegaconf 2.3 pins antlr4-python3-runtime 4.9.*, which PyPI has only as a source archive:
# build its pure-Python wheel here.
python3 -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
ls -l .whl
du -ch .whl/*.whl | tail -n 1
