import random, sys
import agentrl.train.sft as sft
from agentrl.trajectory import build_batch
def fake(policy, demos, *, steps, lr, batch_size, micro_batch_size, seed=0, pad_id=0, **kw):
    usable = [ep for ep in demos if not ep.failed and ep.outcome > 0]
    rng = random.Random(seed)
    real = padded = sortpad = 0; lens_all=[]
    for step in range(steps):
        chosen = rng.sample(usable, min(batch_size, len(usable)))
        t = build_batch(chosen, pad_id=pad_id)
        lens = [int(x) for x in t.attention_mask.sum(1)]
        lens_all += lens
        real += sum(lens)
        for s in range(0, len(lens), micro_batch_size):
            part = lens[s:s+micro_batch_size]; padded += max(part)*len(part)
        sl = sorted(lens)
        for s in range(0, len(sl), micro_batch_size):
            part = sl[s:s+micro_batch_size]; sortpad += max(part)*len(part)
        lm = t.loss_mask.sum()
    import statistics
    print("demo tokens: mean", statistics.mean(lens_all), "min", min(lens_all), "max", max(lens_all))
    print("real", real, "padded", padded, "sorted", sortpad, "waste", 1-real/padded, "sorted waste", 1-real/sortpad)
    sys.exit(0)
sft.sft_warmup = fake
from agentrl.cli import main
sys.argv = ["agentrl"] + sys.argv[1:]
main()
