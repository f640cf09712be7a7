#!/bin/bash
# Issue 24 models at 320-token sequences (a 64-token prompt + 256 new tokens): the quickstart
# width, 12 sequences (3840 tokens) per step. AR from scratch; shifted block 4/8/16 from it
# (process=block defaults: shift, causal clean stream, joint next-token loss); an SDTT student of
# block 4 (rounds 4 -> 2 -> 1 steps per block, each round's student kept); a shifted masked model
# from the same AR model (the masked rows' model, at the block models' budget).
# usage: [FT_BATCH=12] experiments/train_speed_models.sh ROOT AR_STEPS FT_STEPS SDTT_MINUTES [overrides...]
set -u
ROOT=$1; STEPS=$2; FT=$3; SDTT=$4; shift 4
FTB=${FT_BATCH:-12}
COMMON="experiment=quickstart data.seq_len=320 trainer.max_time=null lr_scheduler=warmup_cosine logger=csv callbacks.samples.every_n_steps=100000 $*"
t() { local dir=$1; shift; [ -f $ROOT/$dir/model.safetensors ] && return 0; echo "== $dir $(date +%T)"; python -m cdlm.cli.train $COMMON "$@" hydra.run.dir=$ROOT/$dir > $ROOT/$dir.log 2>&1 || echo "FAILED $dir"; }
mkdir -p $ROOT
t ar data.batch_size=12 process=autoregressive trainer.max_steps=$STEPS trainer.val_check_interval=$STEPS
for n in 4 8 16; do
  t block${n}_from_ar data.batch_size=$FTB process=block process.block_size=$n init_from=$ROOT/ar/model.safetensors trainer.max_steps=$FT trainer.val_check_interval=$FT
done
t masked_from_ar data.batch_size=$FTB process=masked process.shift=true init_from=$ROOT/ar/model.safetensors trainer.max_steps=$FT trainer.val_check_interval=$FT
t block4_sdtt data.batch_size=$FTB module=distill_sdtt teacher=$ROOT/block4_from_ar/model.safetensors module.start_steps=4 module.end_steps=1 module.round_dir=$ROOT/block4_sdtt_rounds trainer.max_steps=-1 "trainer.max_time=00:00:${SDTT}:00" lr_scheduler=wallclock_cosine
echo "== done $(date +%T)"
