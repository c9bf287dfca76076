#!/bin/bash
# usage: run.sh NAME SEED [env...] -- runs the README's command with train.seed=SEED, timed
name=$1; seed=$2; shift 2
cd /work/main
mkdir -p /work/q21/$name
/usr/bin/time -v -o /work/q21/$name/time.txt env "$@" nice -n -5 .venv/bin/agentrl train configs/quickstart.yaml train.seed=$seed train.out_dir=/work/q21/$name/run > /work/q21/$name/stdout.log 2>&1
