#!/bin/bash
# Issue 15 models at 320-token sequences (a 64-token prompt + 256 new tokens): same width as the
# quickstart, ~4k tokens per step. AR and masked and block4 from scratch; block 4/8/16 from AR.
# usage: experiments/train_speed_models.sh ROOT STEPS FT_STEPS [extra overrides...]
set -u
ROOT=$1; STEPS=$2; FT=$3; shift 3
COMMON="experiment=quickstart data.seq_len=320 data.batch_size=12 trainer.max_time=null lr_scheduler=warmup_cosine logger=csv callbacks.samples.every_n_steps=100000 $*"
t() { local dir=$1; shift; [ -f $ROOT/$dir/model.safetensors ] && return 0; echo "== $dir $(date +%T)"; python -m cdlm.cli.train $COMMON "$@" hydra.run.dir=$ROOT/$dir > $ROOT/$dir.log 2>&1 || echo "FAILED $dir"; }
mkdir -p $ROOT
t ar process=autoregressive trainer.max_steps=$STEPS trainer.val_check_interval=$STEPS
for n in 4 8 16; do
  t block${n}_from_ar process=block process.block_size=$n init_from=$ROOT/ar/model.safetensors trainer.max_steps=$FT trainer.val_check_interval=$FT
done
t block4 process=block process.block_size=4 trainer.max_steps=$STEPS trainer.val_check_interval=$STEPS
t masked process=masked trainer.max_steps=$STEPS trainer.val_check_interval=$STEPS
echo "== done $(date +%T)"
