cd /work/main
for pc in 8192 16384 32768; do
  .venv/bin/agentrl train configs/quickstart.yaml model.name=/tmp/x/warm_s0/model train.sft_warmup_steps=0 train.steps=1 train.eval_episodes=8 rollout.prefix_cache_tokens=$pc train.out_dir=/tmp/x/pc_$pc > /tmp/x/pc_$pc.log 2>&1
  echo "$pc: $(tr '\r' '\n' < /tmp/x/pc_$pc.log | grep 'rollout:.*done in' | tail -1) | $(grep 'peak memory' /tmp/x/pc_$pc.log) | $(python3 -c "
import json
for l in open('/tmp/x/pc_$pc/metrics.jsonl'):
    r=json.loads(l)
    if 'perf/prefix_reused_share' in r: print('reused', round(r['perf/prefix_reused_share'],3), 'reward', r.get('rollout/reward', r.get('reward')))
")"
done
