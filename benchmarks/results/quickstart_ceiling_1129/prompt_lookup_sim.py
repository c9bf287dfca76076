import json, sys
def draft(ctx, k, nmax=3):
    for n in range(nmax, 0, -1):
        if len(ctx) < n: continue
        pat = ctx[-n:]
        for s in range(len(ctx)-n-1, -1, -1):
            if ctx[s:s+n] == pat:
                return ctx[s+n:s+n+k]
    return []
tot_tok=0; tot_steps={}; per_turn={}
for line in open(sys.argv[1]):
    d=json.loads(line)
    for seg in d['segments']:
        ctx=list(seg['prompt_ids'])
        for t in seg['turns']:
            out=t['output_ids']
            for k in (2,4,8):
                j=0; steps=0; c=list(ctx)
                while j < len(out):
                    dr=draft(c, k); a=0
                    while a < len(dr) and j+a < len(out) and dr[a]==out[j+a]: a+=1
                    adv=min(a+1, len(out)-j)
                    c+=out[j:j+adv]; j+=adv; steps+=1
                tot_steps[k]=tot_steps.get(k,0)+steps
                per_turn.setdefault((t['index'],k),[0,0]); per_turn[(t['index'],k)][0]+=len(out); per_turn[(t['index'],k)][1]+=steps
            tot_tok+=len(out)
            ctx+=out+t['obs_ids']
print("tokens", tot_tok, {k: round(tot_tok/v,2) for k,v in tot_steps.items()}, "tokens per forward")
for key in sorted(per_turn): print("turn",key[0],"k",key[1], "tok/fwd", round(per_turn[key][0]/per_turn[key][1],2))
