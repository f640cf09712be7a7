#!/usr/bin/env bash
# Issue 39's data-constrained runs on one CUDA GPU (docs/results/worlds_learned.md): AR and masked on a
# fixed 50k- and 200k-token sample of the character world (experiment=worlds_learned_crossover),
# JOBS at a time on the one GPU (PROCESSES: which of the two). Installs cdlm after the carried wheels (.whl/, scripts/gpu_wheels.sh) as
# scripts/gpu_check.sh does; returns each job's metrics.csv, overrides and run.json in $OUT/curves.tgz
# (a folder cdlm-table reads). Run
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
export PYTHONPATH="$SITE" WANDB_MODE=disabled PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used --format=csv || true
# the runs stop at SECONDS whatever happens; the curves they have written still come back
for process in ${PROCESSES//,/ }; do  # AR 2,500 steps, masked 6,000 (each its own sweep folder)
    steps=${STEPS:-$([ "$process" = masked ] && echo 6000 || echo 2500)}
    timeout -k 10 "${SECONDS_LIMIT:-450}" $py -m cdlm.cli.train -m experiment=worlds_learned_crossover \
        "process=$process" "trainer.max_steps=$steps" hydra/launcher=joblib \
        "hydra.launcher.n_jobs=${JOBS:-2}" "hydra.sweep.dir=$RUNS/$process" \
        trainer.accelerator=gpu trainer.devices=1 ${EXTRA:-} >"$OUT/crossover-$process.log" 2>&1 &
done
wait || echo "crossover rc=$?"
cat "$OUT"/crossover-*.log > "$OUT/crossover.log"
tail -n 5 "$OUT/crossover.log"
rm -rf /tmp/curves && mkdir -p /tmp/curves
for run in "$RUNS"/*/*/; do
    name=$(basename "$(dirname "$run")")-$(basename "$run")
    mkdir -p "/tmp/curves/$name/.hydra"
    cp "$run/run.json" "/tmp/curves/$name/" 2>/dev/null || echo "$name: unfinished"
    cp "$run/.hydra/overrides.yaml" "/tmp/curves/$name/.hydra/" || true
    mkdir -p "/tmp/curves/$name/csv/version_0"
    cp "$(find "$run" -name metrics.csv | head -n 1)" "/tmp/curves/$name/csv/version_0/" || true
done
tar -czf "$OUT/curves.tgz" -C /tmp/curves .  # one file: the device returns few
