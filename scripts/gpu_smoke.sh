#!/usr/bin/env bash
# A first check of cdlm on one CUDA GPU, sized for one 10-minute command (docs/gpu.md): the
# quickstart recipe for TRAIN_SECONDS of wall clock (bf16-mixed where the GPU has it) and its
# samples, then process=masked for a few steps under trainer=ddp and under trainer=fsdp, then
# a look for torn checkpoint files. Run from the repository root with cdlm importable:
#   OUT=gpu_out bash scripts/gpu_smoke.sh
# Logs and summary.txt go to $OUT (the runs themselves to $RUNS); each step's exit status and
# wall time are in summary.txt, whatever fails.
set -u
OUT=${OUT:-gpu_out}
RUNS=${RUNS:-/tmp/cdlm_gpu_runs}
TRAIN_SECONDS=${TRAIN_SECONDS:-120}
STEPS=${STEPS:-30}
mkdir -p "$OUT" "$RUNS"
export PYTHONPATH="${PYTHONPATH:-}:$PWD" WANDB_MODE=disabled PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

step() {  # step NAME MODULE ARGS...: one command, its log, its status and wall time
    local name=$1 start=$SECONDS
    shift
    echo "== $name"
    $py -m "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc seconds=$((SECONDS - start))" | tee -a "$OUT/summary.txt"
    tail -n 4 "$OUT/$name.log"
}

{
    nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
    $py -c "import torch, lightning; print('torch', torch.__version__, 'lightning', \
lightning.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name())"
} | tee "$OUT/summary.txt"

clock=$(printf "00:00:%02d:%02d" $((TRAIN_SECONDS / 60)) $((TRAIN_SECONDS % 60)))
step quickstart cdlm.cli.train experiment=quickstart "trainer.max_time=$clock" \
    logger=csv "hydra.run.dir=$RUNS/quickstart"
cp "$RUNS"/quickstart/csv/*/metrics.csv "$OUT/quickstart_metrics.csv" 2>/dev/null \
    || find "$RUNS/quickstart" -name metrics.csv -exec cp {} "$OUT/quickstart_metrics.csv" \;
step sample cdlm.cli.sample "ckpt=$RUNS/quickstart" sampler=rolling steps=128
for strategy in ddp fsdp; do
    step "masked_$strategy" cdlm.cli.train process=masked "trainer=$strategy" \
        "trainer.max_steps=$STEPS" "trainer.val_check_interval=$STEPS" logger=csv \
        "hydra.run.dir=$RUNS/masked_$strategy"
done
torn=$(find "$RUNS" -name "*.tmp" | wc -l)
whole=$(find "$RUNS" -name "*.ckpt" | wc -l)
echo "checkpoints: $whole whole, $torn temporary files left" | tee -a "$OUT/summary.txt"
