"""The snippet-reading oracle (measured as the quickstart's warm-up, not shipped): it answers from a search result's snippet
where the snippet shows the field whole, and opens the page where it does not."""

import agentrl
from agentrl.envs.search.oracle import PlanningSearchOracle, SnippetPlanningSearchOracle, snippet_fields
from agentrl.envs.search.wiki import RELATIONS


def play(oracle_cls, hops: str, seed: int):
    """One episode through the project's episode loop: reward, the actions, the first observation
    and each action's observation."""
    from agentrl.rollout.agent import play_text

    env = agentrl.make("agentrl/Search-v0", hops=hops, split="train", max_obs_chars=600)
    episode = play_text(env, oracle_cls(), seed=seed)
    turns = episode.segments[0].turns
    return episode.outcome, [t.action_text for t in turns], [None, *(t.observation for t in turns)]


def test_snippet_fields_keeps_whole_fields_only():
    shown = "Lekeix Dynamics is a company. Founder: Methyand Bili Headquarters: Fepim Employees: 158,280"
    assert snippet_fields(shown) == "Founder: Methyand Bili\nHeadquarters: Fepim\nEmployees: 158,280"
    cut = "Rithiond is a city. Country: Caeshiondia Birth year: 1120 Mayor: Proshyth..."  # Mayor was cut
    assert snippet_fields(cut) == "Country: Caeshiondia\nBirth year: 1120"
    assert snippet_fields("prose only, no infobox") == ""


def test_single_hop_answers_from_the_snippet_in_two_turns_and_opens_otherwise():
    """Real env, 60 tasks: every one solved; where the first search shows the target's field whole
    the episode is search then the cited answer, quoting that search's own text; else it opens."""
    two = opened = 0
    for seed in range(60):
        reward, actions, observations = play(SnippetPlanningSearchOracle, "single", seed)
        assert reward == 1.0
        assert actions[0].startswith("Looking for: ")
        label = actions[0].split("\n")[0].removeprefix("Looking for: ")
        line, answer = actions[-1].split("\n")
        assert line.startswith(f"{label}: ") and answer == f"<answer>{line.split(': ', 1)[1]}</answer>"
        if len(actions) == 2:
            two += 1
            assert line in observations[1]  # the snippet's own text
        else:
            opened += 1
            assert any('"name": "open"' in a for a in actions)
    assert two >= 45 and opened >= 1  # most show the field; some do not (cut snippets or observations)


def test_multi_hop_is_solved_in_fewer_turns_than_opening_every_page():
    played = [play(SnippetPlanningSearchOracle, "multi", seed) for seed in range(30)]
    assert all(reward == 1.0 for reward, _, _ in played)
    snippet = [len(actions) for _, actions, _ in played]
    pages = [len(play(PlanningSearchOracle, "multi", seed)[1]) for seed in range(30)]
    assert sum(snippet) < sum(pages) and all(s <= p for s, p in zip(snippet, pages, strict=True))


def test_a_result_cut_by_the_observation_budget_is_opened_not_read():
    """An entry followed by the over-long observation's cut marker may end mid-value: the oracle
    opens the page instead of answering ``Proshyth Ja``."""
    env = agentrl.make("agentrl/Search-v0", hops="single", split="train")
    env.reset(seed=0)
    task = env.unwrapped.task
    oracle = SnippetPlanningSearchOracle()
    oracle.reset(task)
    oracle.act("")  # the first search
    field = RELATIONS[oracle.relations[-1]][0]
    cut = (f'Results for "{oracle.name}":\n[1] d000001 | {oracle.name}\n    {oracle.name} is here. {field}: Prosh'
           "\n[... 500 characters cut: observation over 600 ...]\nUse open(doc_id) to read a whole page.")  # fmt: skip
    assert '"name": "open"' in oracle.act(cut)
    whole = cut.replace("\n[... 500 characters cut: observation over 600 ...]", "")
    oracle.reset(task)
    oracle.act("")
    assert oracle.act(whole).endswith("<answer>Prosh</answer>")
