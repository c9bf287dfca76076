#!/bin/bash
# usage: run.sh NAME SEED [env...] -- [overrides]
name=$1; seed=$2; shift 2
cd /work/main
mkdir -p /work/q16/$name
/usr/bin/time -v -o /work/q16/$name/time.txt env "$@" .venv/bin/agentrl train configs/quickstart.yaml train.seed=$seed train.out_dir=/work/q16/$name/run > /work/q16/$name/stdout.log 2>&1
