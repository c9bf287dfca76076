"""Objectives library: advantage estimators, policy/value losses and KL estimators (torch only).

This docstring is the one place to look. Definitions and sources: ``/work/shared/ALGORITHMS.md``;
anything marked [U] there is a reconstruction, exposed as a parameter.

Shapes: ``R`` rollouts, ``B`` training rows (``B == R`` unless a rollout is split into several
rows: fold branches, SUPO segments), ``L`` tokens per row, ``K`` turns per row. Bool masks may be
given as 0/1 tensors of any dtype.

Advantage estimators (``agentrl.algos.advantages``; call on detached tensors)
=============================================================================
==========================================================================  =================
call                                                                        returns
==========================================================================  =================
``grpo(outcome[R], group_id[R], *, std_normalize=True, eps=1e-6,            ``[R]``
unbiased=True)``; Dr. GRPO = ``std_normalize=False``
``gae(rewards[B,L], values[B,L], mask[B,L], *, gamma=1.0, lam=1.0)``        ``(adv[B,L], returns[B,L])``
(masked tokens skipped; rewards on them credited to the previous generated token)
``info_gain(gt_logprob[B,K+1], turn_mask[B,K], *,                           ``[B,K]``
kind="log_prob_diff"|"prob_diff")``
``igpo(outcome[B], info_gain[B,K], turn_mask[B,K], group_id[B], *,          ``[B,K]``
gamma=1.0, pool="separate"|"joint"|"none", eps=1e-6, var_eps=1e-8)``
``turn_mean(x[B,L], turn_id[B,L], mask[B,L], num_turns=None)``              ``(mean[B,K], turn_mask[B,K])``
``empg(base[B], step_entropy[B,K], turn_mask[B,K], *, k=1.0,                ``[B,K]``
k_future=1.0, zeta=0.1, center=True)``
``empg_grpo(outcome[B], group_id[B], entropy[B,L], turn_id[B,L],            ``[B,K]``
loss_mask[B,L], *, std_normalize=True, **empg_options)``
``gigpo(outcome[B], group_id[B], step_reward[B,K], anchor_id[B,K],          ``[B,K]``
turn_mask[B,K], *, gamma=0.95, omega=1.0, std_normalize=True, eps=1e-6,
singleton="zero"|"raw")``
``foldgrpo(outcome[R], row_rollout[B], process_reward[B,L],                 ``[B,L]``
rollout_group[R], *, eps=1e-6, unbiased=True)``
``supo(outcome[R], rollout_group[R], finished[R], *, std_normalize=True,    ``[R]``
mask_unfinished=True, baseline_includes_unfinished=True)``
``tree_grpo(outcome[R], group_id[R], task_group[R], *, intra=1.0,          ``[R]``
inter=1.0, std_normalize=True, eps=1e-6, unbiased=True)``
``to_tokens(turn_adv[B,K], turn_id[B,L])`` (0 where ``turn_id < 0``)        ``[B,L]``
==========================================================================  =================

Losses (``agentrl.algos.losses``; each returns ``(scalar loss, metrics: dict[str, float])``)
===========================================================================================
- ``ppo_clip(logp, old_logp, adv, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None,
  ratio="token"|"turn"|"sequence", turn_id=None, agg="token-mean"|"seq-mean-token-mean"|
  "seq-mean-token-sum"|"constant", seq_id=None, norm_constant=None, ratio_max=None, is_weight=None)``, all
  ``[B,L]`` (``seq_id`` ``[B]``). ``turn`` = ST-PPO's Turn-PPO, ``sequence`` = GSPO, DAPO =
  ``clip_high=0.28`` + ``token-mean``, Dr. GRPO = ``agg="constant"``.
- ``turn_ratio(logp, old_logp, mask, turn_id) -> [B,L]`` (1 off the mask).
- Sampler-learner mismatch (``agentrl.algos.mismatch``; all ``[B,L]``): ``mismatch_metrics(learner_logp,
  sampler_logp, mask, *, cap=2.0) -> dict``; ``tis_weight(...) -> [B,L]`` (``min(exp(learner - sampler),
  cap)``, ppo_clip's ``is_weight``); ``token_keep(...) -> [B,L]`` and ``sequence_keep(...) -> [B]``
  (ratio within ``[1/cap, cap]``; the masking corrections).
- ``clip_bias_norm(logp, old_logp, adv, mask, **ppo_clip options)`` -> ``(S_c, metrics)``: a
  surrogate whose gradient is S-PPO's clipping-bias term C [U]. Trainer (S-PPO / ST-PPO)::

      s_c, _ = clip_bias_norm(logp, old_logp, adv, mask, ratio=..., ...)
      scale, c_norm = clip_bias_scale(s_c, params)      # 1 / max(1, ||C||_2), graph retained
      loss.backward(); scale_grads_(params, scale)       # never enlarges the gradient

  With gradient accumulation, ``C`` is summed over every micro-batch of the optimizer step first
  and ``clip_bias_scale_from_norm(||C||)`` gives the one scale (what ``agentrl.train`` does, with
  the loss's own ratio and clip options).

- ``value_loss(values, old_values, returns, mask, *, clip=0.5, agg="token-mean")``.
- ``foldact(logp, old_logp, adv, mask, token_kind, full_ctx_logp, *, w_summary=0.3, w_action=0.7,
  w_consistency=0.1, clip=0.2, dual_clip=None, ratio_max=10.0, summary_kinds=(Source.SUMMARY,),
  action_kinds=(Source.MODEL,), consistency_on="all")``.
- ``agg_loss(values[B,L], mask[B,L], agg, *, seq_id=None, norm_constant=None) -> scalar``: use it
  for the KL and entropy terms so they aggregate like the policy loss.

KL (``agentrl.algos.kl``)
=========================
``kl(logp[B,L], ref_logp[B,L], kind="k1"|"k2"|"k3", *, mask=None, clamp=None) -> [B,L]``;
as losses, k1's gradient is 0 in expectation, k2's the reverse-KL gradient, k3's (verl's
``low_var_kl``) the forward-KL gradient.

Shaping (``agentrl.algos.shaping``)
===================================
``overlong_penalty(length[R], *, max_len, cache_len) -> [R]`` (DAPO),
``dynamic_sampling_keep(outcome[R], group_id[R]) -> [R] bool`` (DAPO),
``rollout_row_mask(keep[R], row_rollout[B], loss_mask[B,L]) -> [B,L]`` (SUPO overlong masking,
overlong filtering, SimpleTIR void turns).

Calling by name (the trainer never branches on names)
=====================================================
Importing this package registers every entry in ``agentrl.registry``:

- ``ADVANTAGES``: grpo, drgrpo, gae, igpo, empg, gigpo, foldgrpo, supo, tree_grpo, tree_intra,
  tree_inter (:class:`spec.Estimator`);
- ``LOSSES``: ppo_clip, grpo, drgrpo, dapo, gspo, turn_ppo, foldgrpo, foldact, clip_bias_norm,
  value (:class:`spec.Loss`);
- ``KL_ESTIMATORS``: k1, k2, k3, low_var_kl (= k3): ``fn(logp, ref_logp, *, mask, clamp) -> [B,L]``.

An estimator is declared by its function (``spec.Estimator``; ``@spec.estimator(name, level)``
registers your own): the function's positional parameters are the canonical field names below,
from which ``Estimator.needs`` is derived, its keyword-only parameters the options; a field no
producer makes yet comes with its producer (``producers=``), and its diagnostics with their labels.
Entries are callable exactly like the raw functions (with their presets), declare what they read
(``Estimator.needs``, ``Loss.needs(options)``) and the options they take (``option_defaults()``:
function defaults, then presets; ``resolve(explicit)``: an explicit value always wins), and have
``from_batch``, which hands the raw function exactly the declared needs::

    adv, returns = ADVANTAGES.get(name).from_batch(batch, **options)
    loss, metrics = LOSSES.get(name).from_batch(batch, adv, **options)
    vloss, vmetrics = LOSSES.get("value").from_batch(batch, returns, clip=0.5)
    kl_tok = KL_ESTIMATORS.get(kind)(batch["logp"], batch["ref_logp"], mask=batch["loss_mask"])

``Estimator.from_batch`` returns token advantages ``[B,L]`` (0 off ``loss_mask``) and GAE's returns
(else None), broadcasting rollout-level ``[R]`` and turn-level ``[B,K]`` outputs itself, under
``torch.no_grad``. ``spec.pairing_problem(estimator, loss, options)`` says why a pair cannot train
(a sequence-level ratio needs a rollout-level advantage; auxiliary losses are not policy losses).
Canonical field names (each has exactly one producer in ``agentrl.train.fields``):

- per token ``[B,L]``: ``loss_mask``, ``turn_id`` (-1 off assistant turns), ``logp`` (with grad),
  ``old_logp``, ``entropy`` (rollout policy), ``values``, ``old_values``, ``token_rewards`` (GAE),
  ``process_reward`` (FoldGRPO Q), ``token_kind`` (``agentrl.trajectory.Source`` codes: the one
  definition of token kinds; FoldAct's summaries are ``SUMMARY``, its actions ``MODEL``) and
  ``full_ctx_logp`` (FoldAct; NaN = not scored);
- per row ``[B]``: ``row_rollout``, ``seq_id`` (aggregation unit with ``agg_unit="rollout"``);
- per rollout ``[R]``: ``outcome``, ``group_id``, ``finished`` (SUPO);
- per turn ``[B,K]``: ``gt_logprob`` ``[B,K+1]`` (IGPO; option ``info_gain_kind``), ``step_reward``
  and ``anchor_id`` (GiGPO).
"""

from __future__ import annotations

from agentrl.algos import advantages, kl, losses, shaping, spec
from agentrl.algos.advantages import (
    empg,
    empg_grpo,
    foldgrpo,
    gae,
    gigpo,
    grpo,
    igpo,
    info_gain,
    supo,
    to_tokens,
    tree_grpo,
    turn_mean,
)
from agentrl.algos.kl import kl as kl_estimate
from agentrl.algos.losses import (
    agg_loss,
    clip_bias_norm,
    clip_bias_scale,
    clip_bias_scale_from_norm,
    foldact,
    ppo_clip,
    scale_grads_,
    turn_ratio,
    value_loss,
)
from agentrl.registry import ADVANTAGES, KL_ESTIMATORS, LOSSES

for _entry in spec.ESTIMATORS:
    ADVANTAGES.register(_entry.name, _entry, override=True)
for _loss in spec.LOSS_ENTRIES:
    LOSSES.register(_loss.name, _loss, override=True)
for _kind in ("k1", "k2", "k3"):
    KL_ESTIMATORS.register(_kind, spec.kl_estimator(_kind), override=True)
KL_ESTIMATORS.register("low_var_kl", KL_ESTIMATORS.get("k3"), override=True)

__all__ = [
    "advantages",
    "agg_loss",
    "clip_bias_norm",
    "clip_bias_scale",
    "clip_bias_scale_from_norm",
    "empg",
    "empg_grpo",
    "foldact",
    "foldgrpo",
    "gae",
    "gigpo",
    "grpo",
    "igpo",
    "info_gain",
    "kl",
    "kl_estimate",
    "losses",
    "ppo_clip",
    "scale_grads_",
    "shaping",
    "spec",
    "supo",
    "to_tokens",
    "tree_grpo",
    "turn_mean",
    "turn_ratio",
    "value_loss",
]
