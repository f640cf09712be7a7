#!/usr/bin/env bash
# Issue 49 item 8 on one CUDA GPU, one command of under 10 minutes: (a) today's defaults of masked,
# gaussian and uniform beside candidate levers on Austen (experiment=learning_austen: one multirun,
# every job at once on the GPU, MINUTES of wall clock each), and uniform started from a masked
# model (unshifted, START), trained REST (START + REST = MINUTES), each scored by its val bound at
# the same draws and paired with its process's default (scripts/gpu_learning.py); (b) AR beside masked
# on a fixed sample of Austen for many epochs (experiment=learning_crossover, CROSS_STEPS steps),
# beside (a) on the same GPU. Installs cdlm after the carried wheels (.whl/, scripts/gpu_wheels.sh)
# as scripts/gpu_check.sh does; returns in $OUT/learning.tgz every job's CSV log, run.json,
# overrides, model card and bound.json (unpack it; cdlm-table austen start crossover),
# with $OUT/learning_gpu.{json,md} (the bounds and paired gains) and the logs beside it.
# Run from the repository root:
#   OUT=out bash scripts/gpu_learning.sh
# DRY=1 runs every step on the CPU with a tiny model, corpus and budget (tests/test_gpu_learning.py).
set -uo pipefail
OUT=${OUT:-gpu_out}
SITE=${SITE:-/tmp/cdlm_site}
RUNS=${RUNS:-/tmp/cdlm_learning}
py=${PYTHON:-python3}
DRY=${DRY:-0}
mkdir -p "$OUT" "$RUNS"
if ((DRY)); then  # the whole script in a few minutes on two CPU cores
    MINUTES=${MINUTES:-00:00:00:10} START=${START:-00:00:00:05} REST=${REST:-00:00:00:05}
    CROSS_STEPS=${CROSS_STEPS:-12} CROSS_SIZES=${CROSS_SIZES:-8,16}
    JOBS=${JOBS:-2} CROSS_JOBS=${CROSS_JOBS:-2} TRAIN_LIMIT=${TRAIN_LIMIT:-900}
    corpus=$RUNS/corpus
    mkdir -p "$corpus"
    $py -c "import gzip, sys; from cdlm.data.corpus import BUNDLED
for name in ('emma', 'persuasion'):
    text = gzip.open(BUNDLED / f'{name}.txt.gz', 'rt', encoding='utf-8').read()[:30000]
    open(f'{sys.argv[1]}/{name}.txt', 'w', encoding='utf-8').write(text)" "$corpus" || exit 1
    common=("data.path=$corpus" data.vocab_size=300 data.seq_len=16 data.batch_size=4
        network.d_model=32 network.n_layers=1 network.n_heads=2 trainer.precision=32-true
        trainer.accelerator=cpu trainer.limit_val_batches=1 trainer.val_check_interval=4
        callbacks.model_folder.bound_sequences=8 +trainer.enable_progress_bar=false)
    bound_options=(--draws 2 --sequences 16 --group 4) austen_options=()
else
    # ~45 s install, ~40 s tokenizer, TRAIN_LIMIT (start-up, MINUTES, final bound, export),
    # ~90 s of bounds: about 9.5 minutes in all
    MINUTES=${MINUTES:-00:00:03:30} START=${START:-00:00:01:30} REST=${REST:-00:00:02:00}
    CROSS_STEPS=${CROSS_STEPS:-2000}
    CROSS_SIZES=${CROSS_SIZES:-400,1600} JOBS=${JOBS:-12} CROSS_JOBS=${CROSS_JOBS:-6}
    TRAIN_LIMIT=${TRAIN_LIMIT:-380}
    common=(trainer.accelerator=gpu trainer.devices=1 "trainer.precision=${PRECISION:-bf16-mixed}"
        +trainer.enable_progress_bar=false)
    bound_options=(--draws "${DRAWS:-8}") austen_options=("data.batch_size=${BATCH:-128}")
fi

echo "== install"  # its log: $OUT/install.log
{
    if [ -d .whl ]; then
        $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" .whl/*.whl
    fi &&
        $py -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade \
            --target "$SITE" .
} >"$OUT/install.log" 2>&1 || { tail -n 5 "$OUT/install.log"; exit 1; }
export PYTHONPATH="$SITE" WANDB_MODE=disabled PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
export CDLM_CACHE=${CDLM_CACHE:-$RUNS/cache}  # one tokenizer, built once below
$py -c "import hydra_plugins.hydra_joblib_launcher" 2>/dev/null ||
    { echo "no hydra-joblib-launcher: carry it in .whl/ (scripts/gpu_wheels.sh)"; exit 1; }
nvidia-smi --query-gpu=name,memory.used --format=csv 2>/dev/null || echo "no nvidia-smi"

echo "== tokenizer"  # built once here, not by every job at once
$py -c "import sys; from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from cdlm.cli.common import config_dir
with initialize_config_dir(str(config_dir()), version_base='1.3'):
    cfg = compose('train', overrides=[o for o in sys.argv[1:] if o.startswith('data.')])
instantiate(cfg.data).setup()" "${common[@]}" || exit 1

echo "== train: austen (${MINUTES} each, ${JOBS} at a time) and crossover (${CROSS_STEPS} steps)"
# both stop at TRAIN_LIMIT whatever happens; the curves they have written still come back
timeout -k 10 "$TRAIN_LIMIT" $py -m cdlm.cli.train -m experiment=learning_austen \
    "trainer.max_time=$MINUTES" hydra/launcher=joblib "hydra.launcher.n_jobs=$JOBS" \
    "hydra.sweep.dir=$RUNS/austen" "${common[@]}" "${austen_options[@]}" ${EXTRA:-} \
    >"$OUT/austen.log" 2>&1 &
austen_pid=$!
timeout -k 10 "$TRAIN_LIMIT" $py -m cdlm.cli.train -m experiment=learning_crossover \
    "trainer.max_steps=$CROSS_STEPS" "data.train_size=$CROSS_SIZES" hydra/launcher=joblib \
    "hydra.launcher.n_jobs=$CROSS_JOBS" "hydra.sweep.dir=$RUNS/crossover" "${common[@]}" \
    ${EXTRA:-} >"$OUT/crossover.log" 2>&1 &
crossover_pid=$!
start_run() {  # the uniform-from-masked lever (docs/guide/levers.md) in the sweep's budget
    local masked=$RUNS/start/masked
    $py -m cdlm.cli.train experiment=learning_austen recipe=masked process.shift=false \
        phases=none "trainer.max_time=$START" "hydra.run.dir=$masked" "$@" &&
        $py -m cdlm.cli.train experiment=learning_austen recipe=uniform \
            process.time_conditioning=false "init_from=$masked/model.safetensors" \
            "trainer.max_time=$REST" "hydra.run.dir=$RUNS/start/uniform" "$@"
}
export -f start_run
export py RUNS START REST
timeout -k 10 "$TRAIN_LIMIT" bash -c 'start_run "$@"' start "${common[@]}" "${austen_options[@]}" \
    ${EXTRA:-} >"$OUT/start.log" 2>&1 &
start_pid=$!
wait "$austen_pid" || echo "austen rc=$?"
wait "$crossover_pid" || echo "crossover rc=$?"
wait "$start_pid" || echo "start rc=$?"
tail -n 3 "$OUT/austen.log" "$OUT/crossover.log" "$OUT/start.log"

echo "== bounds"
timeout -k 10 "${BOUND_LIMIT:-120}" $py scripts/gpu_learning.py bounds "$RUNS" \
    --out "$OUT/learning_gpu.json" "${bound_options[@]}" || echo "bounds rc=$?"

echo "== archive"  # one file: the device returns few
pack=$RUNS/pack
rm -rf "$pack"
for run in "$RUNS"/austen/*/ "$RUNS"/start/*/ "$RUNS"/crossover/*/; do
    [ -d "$run/.hydra" ] || continue
    name=$(basename "$(dirname "$run")")/$(basename "$run")
    mkdir -p "$pack/$name/.hydra" "$pack/$name/csv/version_0"
    cp "$run/.hydra/overrides.yaml" "$pack/$name/.hydra/"
    for file in run.json config.json bound.json; do
        cp "$run/$file" "$pack/$name/" 2>/dev/null || echo "$name: no $file"
    done
    cp "$(find "$run" -name metrics.csv | head -n 1)" "$pack/$name/csv/version_0/" ||
        echo "$name: no metrics.csv"
done
tar -czf "$OUT/learning.tgz" -C "$pack" .
ls -l "$OUT"
