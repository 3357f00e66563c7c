"""The demo model's agent training data (scripts/demo_agent_corpus.py) and its shared-prefix rows (scripts/demo_packing.py).

What the model learns must be what the loop asks at run time: each turn's
prompt is the server's rendering of the loop's request, byte for byte, and
rows that share the prompt's prefix compute what whole turns would.
"""
from __future__ import annotations

import json
import random
import re
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from edge_infer.agent.actions import SYSTEM_PROMPT, TOOLS
from edge_infer.agent.loop import NO_CHANGE
from edge_infer.agent.phone import LABELS, SETTINGS_SECTIONS
from edge_infer.agent.tasks import by_id
from edge_infer.models.checkpoint import demo_model_dir
from edge_infer.models.tokenizer import Tokenizer
from edge_infer.server.protocol import ChatCompletionRequest
from edge_infer.server.serving_chat import template_messages
from edge_infer.server.tool_parsers import HermesParser, extract

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))  # scripts/ is not a package; its modules import each other by name

import demo_agent_corpus  # noqa: E402
import demo_packing  # noqa: E402


@pytest.fixture(scope="module")
def turns():
    return demo_agent_corpus.generate_agent_dialogues(400, seed=5)


def test_each_prompt_is_the_servers_rendering_of_the_loops_request(turns):
    tokenizer = Tokenizer(demo_model_dir())  # the shipped chat template, as `edge-infer serve` loads it
    for turn in turns[:60]:
        request = ChatCompletionRequest.model_validate({"model": "demo", "messages": turn.messages[:-1], "tools": TOOLS})
        tools = [t.model_dump(exclude_none=True) for t in request.tools]
        assert tokenizer.apply_chat_template(template_messages(request), tools=tools) == turn.prompt()
        assert turn.messages[0] == {"role": "system", "content": SYSTEM_PROMPT} and turn.tools is TOOLS


def test_each_answer_is_one_call_the_servers_parser_reads(turns):
    for turn in turns:
        answer = turn.answer()
        content, calls, recoveries = extract(HermesParser(TOOLS), answer)
        ((_, call),) = [(m["content"], c) for m in turn.messages[-1:] for c in m["tool_calls"]]
        assert answer.endswith("\n</tool_call>") and recoveries == []
        assert content.strip() == turn.messages[-1]["content"]
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [(call["function"]["name"], call["function"]["arguments"])]
        assert turn.category == f"agent_{calls[0].name}"


def test_a_reading_states_what_the_screen_shows_and_what_the_task_asks(turns):
    readings = [t for t in turns if t.messages[-1]["content"]]
    assert 0.1 < len(readings) / len(turns) < 0.5
    for turn in readings:
        prompt = turn.messages[1]["content"]
        for line, wanted in re.findall(r'(\[\d+\] Switch "[^"]+" (?:on|off)); task: (on|off)\.(?: |$)', turn.messages[-1]["content"]):
            assert f"\n{line}\n" in prompt
            task = prompt.rpartition("Task: ")[2]
            assert re.search(r"\bon\b|enable", task, re.I) if wanted == "on" else re.search(r"\boff\b|disable", task, re.I)
    # Both states meet both wishes, so the reading, not the data's share, decides between tap and done.
    pairs = Counter((re.findall(r'" (on|off); task: (on|off)', t.messages[-1]["content"])[-1], t.category) for t in readings)
    for state in ("on", "off"):
        assert pairs[((state, state), "agent_task_complete")] > 0
        assert pairs[((state, "off" if state == "on" else "on"), "agent_tap")] > 0


def test_the_corpus_is_deterministic_and_varied(turns):
    assert turns == demo_agent_corpus.generate_agent_dialogues(400, seed=5)
    assert turns != demo_agent_corpus.generate_agent_dialogues(400, seed=6)
    assert set(Counter(t.category for t in turns)) == {f"agent_{name}" for name in
                                                       ("open_app", "tap", "type_text", "press_key", "task_complete")}
    prompts = [t.messages[1]["content"] for t in turns]
    assert max(Counter(prompts).values()) <= demo_agent_corpus.MAX_COPIES
    assert any("WLAN" in p or "Flight mode" in p or "Connections" in p for p in prompts)  # renamed labels
    assert any('"Wi-Fi calling"' in p or '"Wi-Fi hotspot"' in p for p in prompts)  # decoys
    assert any(p.startswith('Screen:\n[0] ImageButton "Navigate up"') and "Last actions" not in p for p in prompts)


SECTION_TITLES = {LABELS[s] for s in SETTINGS_SECTIONS} | {w for s in SETTINGS_SECTIONS for w in
                                                           demo_agent_corpus.SYNONYMS.get(s, ())}


def _on_section_page(prompt: str) -> bool:
    title = re.match(r'Screen:\n\[0\] ImageButton "Navigate up"\n\[1\] TextView "([^"]*)"', prompt)
    return title is not None and title[1] in SECTION_TITLES


def test_turns_on_section_pages_come_in_the_share_asked_for():
    task = by_id("wifi_on_already")
    played = demo_agent_corpus.play(task, task.device(), None, random.Random(0))
    assert [(t.name, t.on_section_page) for t in played] == [("open_app", False), ("tap", False), ("task_complete", True)]
    focused = demo_agent_corpus.generate_agent_dialogues(300, seed=5, section_page_share=0.5)
    assert sum(_on_section_page(t.messages[1]["content"]) for t in focused) == 150
    assert max(Counter(t.messages[1]["content"] for t in focused).values()) <= demo_agent_corpus.MAX_COPIES
    # Both answers a switch's page asks for: the switch's tap, and done when it already holds.
    on_page = Counter(t.category for t in focused if _on_section_page(t.messages[1]["content"]))
    assert on_page["agent_tap"] > 30 and on_page["agent_task_complete"] > 30


def test_a_random_step_is_played_but_not_learnt():
    task = by_id("wifi_on")
    assert [t.name for t in demo_agent_corpus.play(task, task.device(), None, random.Random(3))] == [
        "open_app", "tap", "tap", "task_complete"]
    learnt = demo_agent_corpus.play(task, task.device(), 1, random.Random(3))
    # The expert's first step; the random second one is not learnt; the turn after it shows it in the history.
    assert learnt[0].name == "open_app" and learnt[-1].name == "task_complete"
    history = learnt[1].messages[1]["content"].split("Last actions:\n")[1].split("\nTask:")[0].split("\n")
    assert history[0] == 'open_app(name="Settings")' and history[1] != "tap(index=1)"


class _Scripted(demo_agent_corpus.Teacher):
    step: tuple[str, dict] = ("tap", {"index": 0})

    def _wrong_steps(self):
        return [self.step]


def test_an_episode_the_oracle_fails_is_dropped(monkeypatch):
    monkeypatch.setattr(demo_agent_corpus, "Teacher", type("Toggler", (_Scripted,), {"step": ("tap", {"index": 4})}))
    task = by_id("wifi_on")
    # On the network page, the random step toggles Airplane mode: the expert still turns Wi-Fi on, the oracle fails it.
    assert demo_agent_corpus.play(task, task.device(), 2, random.Random(0)) == []


def test_a_step_that_changes_nothing_is_followed_by_the_loops_note(monkeypatch):
    monkeypatch.setattr(demo_agent_corpus, "Teacher", _Scripted)
    task = by_id("wifi_on")
    learnt = demo_agent_corpus.play(task, task.device(), 1, random.Random(0))  # taps the Settings title
    assert [t.name for t in learnt] == ["open_app", "tap", "tap", "task_complete"]
    assert learnt[1].messages[1]["content"].endswith(f"tap(index=0)\n{NO_CHANGE}\nTask: Turn on Wi-Fi.")


def test_shared_prefix_rows_compute_what_whole_turns_do(turns):
    from tokenizers import Tokenizer as HFTokenizer
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = HFTokenizer.from_file(str(demo_model_dir() / "tokenizer.json"))
    prefix = turns[0].render()[:turns[0].render().index("<|im_start|>user\n") + len("<|im_start|>user\n")]
    texts = [t.render() for t in turns[:12]]
    rows = demo_packing.pack_branches(texts, prefix, tokenizer, seq_len=512, pad_id=0)
    assert len(rows.rows.input_ids) < len(texts)  # several turns to a row
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
    )).eval()
    r, cut = rows.rows, len(rows.prefix_ids)
    with torch.no_grad():
        prefix_logits, cache = demo_packing.shared_prefix_forward(model, rows.prefix_ids, 2)
        logits = model(input_ids=r.input_ids[:2], position_ids=r.position_ids[:2], cache=cache,
                       attention_mask=demo_packing.branch_mask(r.segments[:2], cut), use_cache=True).logits
        wholes = [torch.tensor(ids) for ids in (e.ids for e in tokenizer.encode_batch(texts))]
        for row in range(2):
            for segment in range(int(r.segments[row].max()) + 1):
                where = (r.segments[row] == segment).nonzero().flatten()
                # Rows are filled first-fit, so a row's turns need not be consecutive texts: find this one's.
                branch = torch.cat([rows.prefix_ids, r.input_ids[row, where]])
                [whole] = [w for w in wholes if torch.equal(w, branch)]
                expected = model(input_ids=whole[None]).logits[0]
                torch.testing.assert_close(logits[row, where], expected[cut:], atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(prefix_logits, expected[:cut], atol=1e-4, rtol=1e-4)
    # Only answers carry weight (decisions after a reading the most); the first token of each branch is learnt from the prefix.
    starts = r.position_ids == cut
    assert (r.weights[starts] == 0).all()
    assert torch.equal(r.weights.unique(), torch.tensor([0.0, demo_packing.PROMPT_LOSS_WEIGHT, 1.0, demo_packing.DECISION_WEIGHT]))


def test_a_turn_that_does_not_start_with_the_prefix_is_refused(turns):
    from tokenizers import Tokenizer as HFTokenizer

    tokenizer = HFTokenizer.from_file(str(demo_model_dir() / "tokenizer.json"))
    with pytest.raises(ValueError, match="does not start with the shared prefix"):
        demo_packing.pack_branches([turns[0].render()], "<|im_start|>system\nsomething else", tokenizer, 512, 0)



def test_the_decisions_of_a_reading_weigh_more_than_the_rest_of_the_answer(turns):
    from tokenizers import Tokenizer as Bpe

    bpe = Bpe.from_file(str(demo_model_dir() / "tokenizer.json"))
    for turn in turns[:80]:
        text = turn.render()
        encoding = bpe.encode(text)
        weights = demo_packing.token_weights(text, encoding.offsets)
        heavy = [encoding.tokens[i] for i, w in enumerate(weights) if w == demo_packing.DECISION_WEIGHT]
        name = turn.messages[-1]["tool_calls"][0]["function"]["name"]
        # Only in an answer with a reading: each state it copied, and the call's first token; every other answer
        # token keeps weight 1.
        states = ["Ġ" + state for state in re.findall(r'" (on|off); task:', turn.messages[-1]["content"])]
        assert heavy == ([*states, bpe.encode(name).tokens[0]] if states else [])
        assert set(weights) <= {0.0, demo_packing.PROMPT_LOSS_WEIGHT, 1.0, demo_packing.DECISION_WEIGHT}
