#!/usr/bin/env bash
# Issue 39's data-constrained runs on one CUDA GPU (docs/results/worlds_learned.md): AR and masked on a
# fixed 50k- and 200k-token sample of the character world (AR 2,500 steps, masked 6,000),
# JOBS at a time on the one GPU (PROCESSES: which of the two). Installs cdlm after the carried wheels (.whl/, scripts/gpu_wheels.sh) as
# scripts/gpu_check.sh does; returns each run's metrics.csv and cost record in $OUT/curves.tgz. Run
# from the repository root: OUT=out bash scripts/gpu_crossover.sh
set -euo pipefail
OUT=${OUT:-gpu_out}
SITE=${SITE:-/tmp/cdlm_site}
RUNS=${RUNS:-/tmp/cdlm_crossover}
py=${PYTHON:-python3}
mkdir -p "$OUT"
if [ -d .whl ]; then
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl
fi
$py -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade \
    --target "$SITE" .
export PYTHONPATH="$SITE:$PWD/experiments" WANDB_MODE=disabled PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used --format=csv || true
# the runs stop at SECONDS whatever happens; the curves they have written still come back
timeout -k 10 "${SECONDS_LIMIT:-450}" $py experiments/worlds_learned.py --runs "$RUNS" \
    --phases crossover --jobs "${JOBS:-4}" \
    --cross-processes "${PROCESSES:-autoregressive,masked}" ${STEPS:+--cross-steps "$STEPS"} \
    --cross-extra "trainer.accelerator=gpu trainer.devices=1 ${EXTRA:-}" >"$OUT/crossover.log" 2>&1 ||
    echo "crossover rc=$?"
tail -n 5 "$OUT/crossover.log"
cp "$RUNS/state.json" "$OUT/" || true
rm -rf /tmp/curves && mkdir -p /tmp/curves
for run in "$RUNS"/crossover/*/; do
    name=$(basename "$run")
    mkdir -p "/tmp/curves/$name"
    cp "$run/duo_run.json" "/tmp/curves/$name/" 2>/dev/null || echo "$name: unfinished"
    cp "$(find "$run" -name metrics.csv | head -n 1)" "/tmp/curves/$name/metrics.csv" || true
done
tar -czf "$OUT/curves.tgz" -C /tmp/curves .  # one file: the device returns few
