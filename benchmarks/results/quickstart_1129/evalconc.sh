cd /work/main
for spec in "16 8192" "32 16384" "64 32768" "32 8192"; do
  set -- $spec
  .venv/bin/agentrl train configs/quickstart.yaml model.name=/tmp/x/warm_s0/model train.sft_warmup_steps=0 train.steps=0 rollout.concurrency=$1 rollout.prefix_cache_tokens=$2 train.out_dir=/tmp/x/ev_$1_$2 > /tmp/x/ev_$1_$2.log 2>&1
  echo "$spec: $(grep 'eval before RL.*done' /tmp/x/ev_$1_$2.log | tr '\r' '\n' | tail -1) $(grep 'peak memory' /tmp/x/ev_$1_$2.log)"
done
