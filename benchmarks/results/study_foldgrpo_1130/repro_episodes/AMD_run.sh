#!/bin/bash
# $1 = out name
mkdir -p runs/repro
exec agentrl train configs/quickstart.yaml rollout.branches=0 rollout.branch_concurrency=null rollout.group_size=8 rollout.tasks_per_step=8 rollout.folding=branch rollout.max_new_tokens=64 train.sft_fold_share=1.0 train.fold_oracle=agentrl.envs.search.oracle:FoldingSearchOracle train.steps=2 train.eval_episodes=8 train.save_episodes=true train.seed=1 train.out_dir=runs/repro/$1 > runs/repro/$1.log 2>&1
