#!/usr/bin/env bash
# The prepared check of cdlm on one CUDA GPU, sized for one 10-minute command (docs/results/gpu.md):
# install cdlm (after the carried wheels in .whl/), the tests marked cuda, the quickstart for
# TRAIN_SECONDS at batch BATCH in bf16-mixed and its samples, AR / block / speculative decoding
# timed at batch 1 and 16 on two models trained SPEED_TRAIN_SECONDS each, and STEPS steps under
# trainer=ddp and trainer=fsdp; then the decode check (scripts/gpu_decode.py: AR with and without
# the fixed-shape step and its CUDA graph, block decoding and its batch-1 outlier). Every step runs
# under `timeout` and fails on its own; the end is one table (step, status, wall seconds, key
# figures), also in $OUT/summary.md and .json. ONLY="install decode ..." runs those steps alone
# (scripts/gpu_decode.sh).
# On a CPU the CUDA parts are skipped, and say so. Run from the repository root:
#   OUT=gpu_out bash scripts/gpu_check.sh
set -u
OUT=${OUT:-gpu_out}
RUNS=${RUNS:-/tmp/cdlm_gpu_runs}
SITE=${SITE:-/tmp/cdlm_site}                 # pip install --target: the wheels and cdlm
TRAIN_SECONDS=${TRAIN_SECONDS:-180}
SPEED_TRAIN_SECONDS=${SPEED_TRAIN_SECONDS:-20}
STEPS=${STEPS:-10}
BUDGET_SECONDS=${BUDGET_SECONDS:-570}        # the whole script; later steps get what is left
SLACK=${SLACK:-120}          # a training step's time beyond its wall clock: start, validation, export
SAMPLE_STEPS=${SAMPLE_STEPS:-128}
py=${PYTHON:-python3}
mkdir -p "$OUT" "$RUNS"
: >"$OUT/steps.tsv"
export PYTHONPATH="$SITE:${PYTHONPATH:-}" WANDB_MODE=disabled PYTHONUNBUFFERED=1
here=$PWD

record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$OUT/steps.tsv"; }
skip() { echo "== $1 skipped: $2"; record "$1" "skip:$2" 0; }

step() {  # step NAME SECONDS COMMAND...: its log, exit status and wall time, whatever happens
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then
        skip "$name" "not in ONLY"
        return
    fi
    local left=$((BUDGET_SECONDS - SECONDS))
    if ((left < 15)); then
        skip "$name" "out of the ${BUDGET_SECONDS} s budget"
        return
    fi
    ((limit > left)) && limit=$left
    echo "== $name (at most $limit s)"
    # through bash -c: timeout runs programs, and the steps below may be this file's functions
    timeout -k 10 "$limit" bash -c '"$@"' "$name" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    record "$name" "$rc" $((SECONDS - start))
    echo "$name rc=$rc seconds=$((SECONDS - start))"
    tail -n 3 "$OUT/$name.log"
}

install_cdlm() {  # the carried wheels, then cdlm itself, into $SITE; then an import away from here
    if [ -d .whl ]; then
        $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" .whl/*.whl || return
    fi
    $py -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade \
        --target "$SITE" . || return
    (cd /tmp && $py -c "import cdlm, hydra, omegaconf, torch, lightning
print('cdlm', cdlm.__file__, 'hydra', hydra.__version__, 'torch', torch.__version__,
      'lightning', lightning.__version__, 'cuda', torch.cuda.is_available()
      and torch.cuda.get_device_name())")
}

train() {  # train NAME ARGS...: a cdlm-train run into $RUNS/NAME, its metrics.csv into $OUT
    local name=$1
    shift
    $py -m cdlm.cli.train logger=csv "hydra.run.dir=$RUNS/$name" "$@" || return
    cp "$(find "$RUNS/$name" -name metrics.csv | head -n 1)" "$OUT/${name}_metrics.csv"
}

clock() { printf "00:00:%02d:%02d" $(($1 / 60)) $(($1 % 60)); }

export OUT RUNS SITE py
export -f install_cdlm train
step install 150 install_cdlm
if $py -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    cuda=1 batch=${BATCH:-128} precision=${PRECISION:-bf16-mixed} batches=${SPEED_BATCHES:-1 16}
    decode_len=${DECODE_SEQ_LEN:-128}
else
    cuda=0 batch=${BATCH:-32} precision=${PRECISION:-auto} batches=${SPEED_BATCHES:-1 4}
    decode_len=${DECODE_SEQ_LEN:-32}
    echo "no CUDA device: the CUDA parts are skipped, the rest runs on the CPU at batch $batch"
fi

# without CUDA each test skips, saying so, and the table reads "skipped"
step cuda_tests 150 $py -m pytest -q -n 0 -p no:cacheprovider -m cuda -rs tests/test_cuda.py
common=("data.batch_size=$batch" "trainer.precision=$precision")
step quickstart $((TRAIN_SECONDS + SLACK)) train quickstart experiment=quickstart \
    "trainer.max_time=$(clock "$TRAIN_SECONDS")" "${common[@]}"
step sample 120 $py -m cdlm.cli.sample "ckpt=$RUNS/quickstart" sampler=rolling "steps=$SAMPLE_STEPS"
for process in autoregressive block; do
    step "speed_model_$process" $((SPEED_TRAIN_SECONDS + SLACK)) train "speed_model_$process" \
        experiment=quickstart "process=$process" "trainer.max_time=$(clock "$SPEED_TRAIN_SECONDS")" \
        "${common[@]}"
done
# shellcheck disable=SC2086  # batches: a list of numbers
step speed 240 $py scripts/gpu_check.py speed --ar "$RUNS/speed_model_autoregressive" \
    --block "$RUNS/speed_model_block" --out "$OUT/speed.json" --batches $batches \
    --repeats "${SPEED_REPEATS:-3}"
# shellcheck disable=SC2086  # batches: a list of numbers
step decode 300 $py scripts/gpu_decode.py --ar "$RUNS/speed_model_autoregressive" \
    --block "$RUNS/speed_model_block" --out "$OUT/decode.json" --batches $batches \
    --seq-len "$decode_len" --repeats "${SPEED_REPEATS:-3}"
steps=("trainer.max_steps=$STEPS" "trainer.val_check_interval=$STEPS" "${common[@]}")
step ddp $((SLACK + 30)) train ddp process=masked trainer=ddp "${steps[@]}"
if ((cuda)); then
    step fsdp $((SLACK + 30)) train fsdp process=masked trainer=fsdp "${steps[@]}"
else
    skip fsdp "no CUDA device; Lightning's FSDP needs a GPU"
fi
cd "$here" && $py scripts/gpu_check.py summary "$OUT"
