#!/bin/bash
# held-out eval at the training temperature (0.6) of an existing model: NAME MODELDIR SEED
cd /work/main
name=$1; model=$2; seed=$3
.venv/bin/agentrl train configs/quickstart.yaml rollout.branches=0 rollout.branch_concurrency=null rollout.group_size=8 rollout.tasks_per_step=8 rollout.folding=branch rollout.max_new_tokens=64 train.sft_fold_share=1.0 train.fold_oracle=agentrl.envs.search.oracle:FoldingSearchOracle train.seed=$seed train.out_dir=/work/fs/$name train.steps=0 train.eval_episodes=128 train.sft_warmup_steps=0 model.adapter=$model train.bf16_autocast=true train.eval_sampler_dtype=bfloat16 train.eval_temperature=0.6 > /work/fs/$name.log 2>&1
