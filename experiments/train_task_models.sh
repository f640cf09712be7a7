#!/bin/bash
# Issue 25's models, three sets, each training every process at one budget on the same data:
# - Austen at the quickstart budget (10 minutes of wall clock here): AR trained to fill in the
#   middle, masked, gaussian, block;
# - code (the standard library's source, experiments/code_data.py) at half of it: AR-FIM, masked;
# - plan (Sudoku and Countdown lines, experiments/plan_data.py; one line per sequence) at 12
#   minutes: AR (as Ye et al. 2025 train it, no FIM) and masked.
# A model already trained is skipped. usage: experiments/train_task_models.sh ROOT [overrides...]
set -u
ROOT=$1; shift
HERE=$(dirname "$0")
t() { local dir=$1; shift; [ -f $ROOT/$dir/model.safetensors ] && return 0; echo "== $dir $(date +%T)"; python -m cdlm.cli.train experiment=quickstart logger=csv "$@" hydra.run.dir=$ROOT/$dir > $ROOT/$dir.log 2>&1 || echo "FAILED $dir"; }
mkdir -p $ROOT/data
[ -f $ROOT/data/plan.txt ] || python $HERE/plan_data.py $ROOT/data/plan.txt
[ -f $ROOT/data/stdlib.py ] || python $HERE/code_data.py $ROOT/data/stdlib.py
FIM="process=autoregressive process.fim_rate=0.5"
t ar_fim $FIM "$@"
t masked process=masked "$@"
t gaussian "$@"
t block process=block "$@"
CODE="data.path=$(realpath $ROOT/data/stdlib.py) trainer.max_time=00:00:05:00"
t code_ar_fim $FIM $CODE "$@"
t code_masked process=masked $CODE "$@"
PLAN="data.path=$(realpath $ROOT/data/plan.txt) data.packing=false data.vocab_size=512 trainer.max_time=00:00:12:00"
t plan_ar process=autoregressive $PLAN "$@"
t plan_masked process=masked $PLAN "$@"
echo "== done $(date +%T)"
