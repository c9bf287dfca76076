"""Episode records: the one versioned schema between rollouts and trainers.

An :class:`Episode` holds one or more :class:`Segment` rows. A segment is one causally conditioned
token sequence: its ``prompt_ids`` followed, turn by turn, by the ids the model generated
(``Turn.output_ids``, kept exactly as sampled, with the sampler's logprobs) and the ids appended
after them (``Turn.obs_ids``: template bridge tokens and the tool observation). A plain multi-turn
episode is one segment; context folding adds one segment per branch (FoldGRPO) or per summary
restart (SUPO); a chat template that rewrites history falls back to one segment per turn.

Token provenance codes (per token): see :class:`Source`.

:func:`build_batch` turns episodes into padded tensors for the learner. Nothing here re-tokenizes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 4
# 2: Turn.process_reward (per output token, FoldGRPO Q); version-1 records still load (see _upgrade).
# 3: tree rollouts: Turn.shared, Episode.parent_id / branch_turn; version-2 records load unchanged
#    (the new fields' defaults describe a chain episode).
# 4: Turn.temperature (the sampler's temperature where it was not rollout.temperature: a tree
#    branch's own turns under rollout.branch_temperature); version-3 records load unchanged.


class Source(IntEnum):
    """Where a token came from."""

    SYSTEM = 0  # system prompt, tool schemas, the task, chat-template scaffolding in the prompt
    MODEL = 1  # sampled by the policy (trainable)
    TOOL = 2  # environment / tool observation text
    SUMMARY = 3  # sampled by the policy as a context summary (trainable, FoldAct/SUPO)
    TEMPLATE = 4  # bridge tokens the chat template inserts between turns
    SHARED = 5  # sampled by the policy on the prefix every episode of its group shares (tree rollouts):
    # not trained (see Turn.shared)


TRAINABLE = (Source.MODEL, Source.SUMMARY)


@dataclass
class Turn:
    """One assistant turn and what followed it."""

    index: int  # turn number within the episode (0-based); the advantage's turn id
    output_ids: list[int]  # ids sampled by the generator, never re-tokenized
    output_logprobs: list[float]  # sampler logprobs of output_ids
    obs_ids: list[int] = field(default_factory=list)  # ids appended after the output (bridge + observation)
    obs_source: list[int] = field(default_factory=list)  # Source code per obs id
    kind: str = "action"  # "action" | "summary" | "branch" | "return"
    output_entropy: list[float] | None = None  # per output token, when the sampler can give it
    action_text: str = ""
    observation: str = ""
    reward: float = 0.0  # env step reward of this turn
    reward_parts: dict[str, float] = field(default_factory=dict)  # {"info_gain": 0.1, "process/failure": -3}
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    void: bool = False  # neither a tool call nor an answer (SimpleTIR)
    timings: dict[str, float] = field(default_factory=dict)  # {"generate_s": .., "env_s": ..}
    sandbox_usage: dict[str, float] | None = None
    error: str | None = None  # what went wrong with the action: failed/malformed tool call, misused branch
    finish_reason: str | None = None  # "stop" | "length"
    process_reward: list[float] | None = None  # per output token, <= 0 (FoldGRPO Q); None = not computed
    # Tree rollouts: the turn lies on the prefix that every episode of its group shares (before the
    # branch point). Its group-relative advantage sums to zero over the group, so it is left out of
    # the loss (its tokens' source is SHARED). In a branch it is the root's turn replayed (same ids
    # and sampler log-probs), not sampled again.
    shared: bool = False
    # The sampler's temperature for this turn where it differs from the run's rollout.temperature
    # (a branch's own turns under rollout.branch_temperature; output_logprobs are at it); None = the run's.
    temperature: float | None = None

    def __post_init__(self) -> None:
        if len(self.output_ids) != len(self.output_logprobs):
            raise ValueError(
                f"turn {self.index}: {len(self.output_ids)} ids but {len(self.output_logprobs)} logprobs"
            )
        if self.process_reward is not None:
            if len(self.process_reward) != len(self.output_ids):
                raise ValueError(
                    f"turn {self.index}: process_reward has {len(self.process_reward)} values for "
                    f"{len(self.output_ids)} output ids (one per generated token)"
                )
            if not all(-math.inf < q <= 0.0 for q in self.process_reward):
                raise ValueError(
                    f"turn {self.index}: process_reward values must be finite and <= 0 (penalties)"
                )
        if self.obs_ids and not self.obs_source:
            self.obs_source = [int(Source.TOOL)] * len(self.obs_ids)
        if len(self.obs_ids) != len(self.obs_source):
            raise ValueError(f"turn {self.index}: obs_ids and obs_source differ in length")


@dataclass
class Segment:
    """One training row: a prompt and the turns generated under it."""

    prompt_ids: list[int]
    turns: list[Turn] = field(default_factory=list)
    fold_id: int = 0  # 0 = main thread; k > 0 = k-th branch or summary segment
    kind: str = "main"  # "main" | "branch" | "summary" | "turn"
    prompt_source: list[int] | None = None  # per prompt id; default all SYSTEM

    def token_ids(self) -> list[int]:
        ids = list(self.prompt_ids)
        for turn in self.turns:
            ids += turn.output_ids + turn.obs_ids
        return ids


@dataclass
class Episode:
    """One rollout of one task."""

    episode_id: str
    env_id: str
    task_id: str
    segments: list[Segment]
    group_id: str = ""
    seed: int | None = None
    outcome: float = 0.0  # final (outcome) reward
    terminated: bool = False
    truncated: bool = False
    answer: str | None = None
    ground_truth: Any = None
    metrics: dict[str, float] = field(default_factory=dict)
    policy_version: int = 0
    error: str | None = None  # set when the episode failed (it is still recorded)
    timings: dict[str, float] = field(default_factory=dict)
    parent_id: str | None = None  # tree rollouts: the root episode this branch was forked from
    branch_turn: int | None = None  # tree rollouts: turns before this index are the shared prefix
    schema_version: int = SCHEMA_VERSION

    @property
    def turns(self) -> list[Turn]:
        return [t for s in self.segments for t in s.turns]

    @property
    def num_turns(self) -> int:
        return len({t.index for t in self.turns})

    @property
    def failed(self) -> bool:
        return self.error is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Episode:
        record = _upgrade(dict(record))
        record["segments"] = [
            Segment(**{**s, "turns": [Turn(**t) for t in s["turns"]]}) for s in record["segments"]
        ]
        return cls(**record)


def _upgrade(record: dict[str, Any]) -> dict[str, Any]:
    """Bring an older record to :data:`SCHEMA_VERSION` (a newer one is refused)."""
    version = record.get("schema_version")
    if version not in range(1, SCHEMA_VERSION + 1):
        raise ValueError(
            f"episode schema_version {version!r} is not one this agentrl reads (1..{SCHEMA_VERSION}); "
            f"upgrade agentrl or re-run the rollout"
        )
    if version == 1:
        # v1 had no per-token process reward; a per-turn reward_parts["process"] became one per token
        record["segments"] = [
            {**s, "turns": [_turn_v1_to_v2(t) for t in s["turns"]]} for s in record["segments"]
        ]
        record["schema_version"] = version = 2
    if version == 2:
        record["schema_version"] = version = 3  # tree fields: their defaults describe a chain episode
    if version == 3:
        record["schema_version"] = 4  # Turn.temperature: None = the run's rollout.temperature
    return record


def _turn_v1_to_v2(turn: dict[str, Any]) -> dict[str, Any]:
    q = (turn.get("reward_parts") or {}).get("process")
    return {**turn, "process_reward": None if q is None else [float(q)] * len(turn["output_ids"])}


# --------------------------------------------------------------------------- IO
def write_jsonl(episodes: Iterable[Episode], path: str | Path, *, append: bool = False) -> None:
    with open(path, "a" if append else "w", encoding="utf-8") as fh:
        for ep in episodes:
            fh.write(json.dumps(ep.to_dict(), ensure_ascii=False) + "\n")


def read_jsonl(path: str | Path) -> list[Episode]:
    return list(iter_jsonl(path))


def iter_jsonl(path: str | Path) -> Iterator[Episode]:
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield Episode.from_dict(json.loads(line))


# Free-form fields are stored as JSON text in Parquet so that differing keys round-trip exactly.
_JSON_FIELDS_EPISODE = ("ground_truth", "metrics", "timings")
_JSON_FIELDS_TURN = ("reward_parts", "tool_calls", "timings", "sandbox_usage")


def _to_parquet_record(ep: Episode) -> dict[str, Any]:
    record = ep.to_dict()
    for key in _JSON_FIELDS_EPISODE:
        record[key] = json.dumps(record[key], ensure_ascii=False)
    for seg in record["segments"]:
        for turn in seg["turns"]:
            for key in _JSON_FIELDS_TURN:
                turn[key] = json.dumps(turn[key], ensure_ascii=False)
    return record


def _from_parquet_record(record: dict[str, Any]) -> Episode:
    for key in _JSON_FIELDS_EPISODE:
        record[key] = json.loads(record[key])
    for seg in record["segments"]:
        for turn in seg["turns"]:
            for key in _JSON_FIELDS_TURN:
                turn[key] = json.loads(turn[key])
    return Episode.from_dict(record)


def write_parquet(episodes: Sequence[Episode], path: str | Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([_to_parquet_record(ep) for ep in episodes]), str(path))


def read_parquet(path: str | Path) -> list[Episode]:
    import pyarrow.parquet as pq

    return [_from_parquet_record(r) for r in pq.read_table(str(path)).to_pylist()]


def save(episodes: Sequence[Episode], path: str | Path) -> None:
    """Write episodes to ``.jsonl`` or ``.parquet`` by suffix."""
    (write_parquet if str(path).endswith(".parquet") else write_jsonl)(episodes, path)


def load(path: str | Path) -> list[Episode]:
    """Read episodes from ``.jsonl`` or ``.parquet`` by suffix."""
    return read_parquet(path) if str(path).endswith(".parquet") else read_jsonl(path)


# --------------------------------------------------------------------------- batches
@dataclass
class TokenBatch:
    """Padded (right) token batch for the learner; one row per segment.

    Position t of ``old_logprobs``/``loss_mask``/``turn_id`` describes token ``input_ids[:, t]``
    (the learner shifts: the logprob of token t comes from the logits at t-1).
    """

    input_ids: Any  # [B, L] long
    attention_mask: Any  # [B, L] long, 1 on real tokens
    loss_mask: Any  # [B, L] float, 1 on trainable (model/summary) tokens
    turn_id: Any  # [B, L] long, turn index on output tokens, -1 elsewhere
    old_logprobs: Any  # [B, L] float, sampler logprobs on output tokens, 0 elsewhere
    source: Any  # [B, L] long, Source code per token (-1 on padding)
    fold_id: Any  # [B] long
    row_episode: Any  # [B] long, index into the episode list
    process_reward: Any  # [B, L] float, FoldGRPO process reward Q from Turn.process_reward (0 elsewhere)
    entropy: Any | None = None  # [B, L] float sampler entropy where every output turn had it, else None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.input_ids.shape)  # type: ignore[return-value]


def output_source(turn: Turn) -> Source:
    """The provenance of a turn's generated tokens: SHARED on a tree group's common prefix, SUMMARY
    for a summary turn, else MODEL."""
    if turn.shared:
        return Source.SHARED
    return Source.SUMMARY if turn.kind == "summary" else Source.MODEL


def segment_arrays(segment: Segment) -> dict[str, list]:
    """Flat per-token lists of one segment: the readable definition of a :class:`TokenBatch` row.

    Keys: ids, source, mask, turn_id, logp, process, entropy (None unless every turn has one).
    :func:`build_batch` builds the same rows without per-token Python work; a test holds them equal.
    """
    ids = list(segment.prompt_ids)
    source = list(segment.prompt_source or [int(Source.SYSTEM)] * len(segment.prompt_ids))
    turn_id = [-1] * len(ids)
    logp = [0.0] * len(ids)
    process = [0.0] * len(ids)
    entropy: list[float] | None = [0.0] * len(ids)
    for turn in segment.turns:
        kind = output_source(turn)
        n = len(turn.output_ids)
        ids += turn.output_ids
        source += [int(kind)] * n
        turn_id += [turn.index] * n
        logp += list(turn.output_logprobs)
        process += list(turn.process_reward) if turn.process_reward is not None else [0.0] * n
        if entropy is not None:
            entropy = entropy + list(turn.output_entropy) if turn.output_entropy is not None else None
        ids += turn.obs_ids
        source += list(turn.obs_source)
        turn_id += [-1] * len(turn.obs_ids)
        logp += [0.0] * len(turn.obs_ids)
        process += [0.0] * len(turn.obs_ids)
        if entropy is not None:
            entropy += [0.0] * len(turn.obs_ids)
    mask = [1.0 if s in TRAINABLE else 0.0 for s in source]
    return {
        "ids": ids,
        "source": source,
        "mask": mask,
        "turn_id": turn_id,
        "logp": logp,
        "process": process,
        "entropy": entropy,
    }


def _rows(episodes: Sequence[Episode]) -> tuple[list[Segment], list[int]]:
    """The segments that become rows (failed episodes and turn-less segments give none), and owners."""
    segments, owners = [], []
    for e_idx, ep in enumerate(episodes):
        if ep.failed:
            continue
        for seg in ep.segments:
            if seg.turns:
                segments.append(seg)
                owners.append(e_idx)
    if not segments:
        raise ValueError("no trainable rows: every episode failed or had no turns")
    return segments, owners


def _check_len(length: int, max_len: int | None) -> None:
    if max_len is not None and length > max_len:
        raise ValueError(
            f"a row has {length} tokens, over max_len={max_len}; raise the limit or shorten rollouts"
        )


def build_batch(episodes: Sequence[Episode], *, pad_id: int = 0, max_len: int | None = None) -> TokenBatch:
    """Pad every segment of every episode into one :class:`TokenBatch` (right padding).

    Rows longer than ``max_len`` raise: truncating silently would train on a context the model
    never saw. Failed episodes contribute no rows. The result equals padding
    :func:`segment_arrays` row by row (:func:`reference_batch`), built without per-token Python
    work: per-token values (ids, listed sources, sampler log-probs, entropies, process rewards) are
    gathered into flat lists with ``list.extend`` and converted once per field; values constant over
    a chunk (a prompt, a turn's output, a turn's observation) are kept once per chunk and expanded
    with ``repeat_interleave``; each field is scattered into ``[B, L]`` once.
    """
    import numpy as np
    import torch

    segments, owners = _rows(episodes)
    # per chunk: length, turn id (-1 off outputs), generated or not, source (_LISTED: see `listed`)
    chunk_len: list[int] = []
    chunk_turn: list[int] = []
    chunk_out: list[bool] = []
    chunk_src: list[int] = []
    ids: list[int] = []  # every token
    listed: list[int] = []  # sources of the _LISTED chunks, in order
    logp: list[float] = []  # generated tokens only (as are process and entropy)
    process: list[float] = []
    entropy: list[float] = []
    have_entropy = True
    lengths = []
    for seg in segments:
        length = len(seg.prompt_ids)
        ids += seg.prompt_ids
        chunk_len.append(length)
        chunk_turn.append(-1)
        chunk_out.append(False)
        chunk_src.append(_chunk_source(seg.prompt_source, int(Source.SYSTEM), listed))
        for turn in seg.turns:
            n_out, n_obs = len(turn.output_ids), len(turn.obs_ids)
            ids += turn.output_ids
            ids += turn.obs_ids
            chunk_len += (n_out, n_obs)
            chunk_turn += (turn.index, -1)
            chunk_out += (True, False)
            chunk_src += (
                int(output_source(turn)),
                _chunk_source(turn.obs_source, -1, listed),
            )
            logp += turn.output_logprobs
            process += turn.process_reward if turn.process_reward is not None else [0.0] * n_out
            if turn.output_entropy is None:
                have_entropy = False
            elif have_entropy:
                entropy += turn.output_entropy
            length += n_out + n_obs
        lengths.append(length)
    width = max(lengths)
    _check_len(width, max_len)

    def flat(values: list, dtype: Any) -> torch.Tensor:  # [len(values)]
        return torch.from_numpy(np.fromiter(values, dtype=dtype, count=len(values)))

    counts = torch.tensor(chunk_len)  # [C]
    source = torch.repeat_interleave(torch.tensor(chunk_src, dtype=torch.int8), counts)  # [N]
    source[source == _LISTED] = flat(listed, np.int8)
    generated = torch.repeat_interleave(torch.tensor(chunk_out), counts)  # [N] bool

    def on_generated(values: list[float]) -> torch.Tensor:
        full = torch.zeros(len(source), dtype=torch.float32)  # [N]
        full[generated] = flat(values, np.float32)
        return full

    real = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]  # [B, L] bool
    dest = real.view(-1).nonzero().squeeze(1)  # [N] flat position of each token in [B, L]

    def pad(values: torch.Tensor, fill: float, dtype: torch.dtype) -> torch.Tensor:
        out = torch.full((len(lengths), width), fill, dtype=dtype)  # [B, L]
        out.view(-1).index_copy_(0, dest, values.to(dtype))
        return out

    source_bl = pad(source, -1, torch.long)  # [B, L]
    return TokenBatch(
        input_ids=pad(flat(ids, np.int64), pad_id, torch.long),
        attention_mask=real.long(),
        loss_mask=((source_bl == int(Source.MODEL)) | (source_bl == int(Source.SUMMARY))).float(),
        turn_id=pad(torch.repeat_interleave(torch.tensor(chunk_turn), counts), -1, torch.long),
        old_logprobs=pad(on_generated(logp), 0.0, torch.float32),
        source=source_bl,
        fold_id=torch.tensor([seg.fold_id for seg in segments], dtype=torch.long),
        row_episode=torch.tensor(owners, dtype=torch.long),
        process_reward=pad(on_generated(process), 0.0, torch.float32),
        entropy=pad(on_generated(entropy), 0.0, torch.float32) if have_entropy else None,
    )


_LISTED = -2  # chunk source code: this chunk's sources are listed per token


def _chunk_source(sources: list[int] | None, default: int, listed: list[int]) -> int:
    """One source code for a chunk whose tokens share it; else _LISTED (and the sources go to ``listed``)."""
    if not sources:
        return default
    first = int(sources[0])
    if sources.count(first) == len(sources):
        return first
    listed += sources
    return _LISTED


def reference_batch(
    episodes: Sequence[Episode], *, pad_id: int = 0, max_len: int | None = None
) -> TokenBatch:
    """:func:`build_batch` spelled out row by row from :func:`segment_arrays` (the pre-#15 code).

    Kept as the executable definition the fast path is tested against, and as the "before" row of
    the batch-building benchmark.
    """
    import torch

    segments, owners = _rows(episodes)
    rows = [segment_arrays(seg) for seg in segments]
    length = max(len(r["ids"]) for r in rows)
    _check_len(length, max_len)

    def pad(key: str, value: float, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([r[key] + [value] * (length - len(r[key])) for r in rows], dtype=dtype)

    have_entropy = all(r["entropy"] is not None for r in rows)
    return TokenBatch(
        input_ids=pad("ids", pad_id, torch.long),
        attention_mask=torch.tensor([[1] * len(r["ids"]) + [0] * (length - len(r["ids"])) for r in rows]),
        loss_mask=pad("mask", 0.0, torch.float32),
        turn_id=pad("turn_id", -1, torch.long),
        old_logprobs=pad("logp", 0.0, torch.float32),
        source=pad("source", -1, torch.long),
        fold_id=torch.tensor([seg.fold_id for seg in segments], dtype=torch.long),
        row_episode=torch.tensor(owners, dtype=torch.long),
        process_reward=pad("process", 0.0, torch.float32),
        entropy=pad("entropy", 0.0, torch.float32) if have_entropy else None,
    )


def turn_table(episodes: Sequence[Episode]) -> tuple[list[list[Turn]], int]:
    """Per episode, its turns ordered by index (deduplicated across segments), and max turn count K.

    Trainers use this to build ``[N, K]`` turn tensors (turn mask, per-turn rewards, entropies).
    """
    table = []
    for ep in episodes:
        by_index: dict[int, Turn] = {}
        for turn in ep.turns:
            by_index.setdefault(turn.index, turn)
        table.append([by_index[i] for i in sorted(by_index)])
    return table, max((len(t) for t in table), default=0)


__all__ = [
    "SCHEMA_VERSION",
    "Source",
    "TRAINABLE",
    "Turn",
    "Segment",
    "Episode",
    "TokenBatch",
    "build_batch",
    "reference_batch",
    "segment_arrays",
    "turn_table",
    "save",
    "load",
    "write_jsonl",
    "read_jsonl",
    "iter_jsonl",
    "write_parquet",
    "read_parquet",
]
