#!/bin/bash
# usage: run.sh NAME SEED [env...] -- runs the quickstart from /work/wt's code
name=$1; seed=$2; shift 2
cd /work/wt
mkdir -p /work/q17/$name
/usr/bin/time -v -o /work/q17/$name/time.txt env PYTHONPATH=/work/wt "$@" /work/main/.venv/bin/python -m agentrl.cli train configs/quickstart.yaml train.seed=$seed train.out_dir=/work/q17/$name/run > /work/q17/$name/stdout.log 2>&1
