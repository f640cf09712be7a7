#!/bin/bash
# Issue 25's Austen models: every process at the quickstart budget (10 minutes of wall clock on
# this machine, the same data and width), the AR baseline trained to fill in the middle.
# usage: experiments/train_task_models.sh ROOT [overrides...]
set -u
ROOT=$1; shift
t() { local dir=$1; shift; [ -f $ROOT/$dir/model.safetensors ] && return 0; echo "== $dir $(date +%T)"; python -m cdlm.cli.train experiment=quickstart logger=csv "$@" hydra.run.dir=$ROOT/$dir > $ROOT/$dir.log 2>&1 || echo "FAILED $dir"; }
mkdir -p $ROOT
t ar_fim process=autoregressive process.fim_rate=0.5 "$@"
t masked process=masked "$@"
t gaussian "$@"
t block process=block "$@"
echo "== done $(date +%T)"
