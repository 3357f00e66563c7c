"""The shipped demo model: checkpoint format, chat template, and that it answers.

The checkpoint is loaded with Hugging Face `transformers` (the reference
implementation), so these tests hold whatever edge-infer's own loader does.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors import safe_open

from testutil import load_script
from edge_infer.models.checkpoint import demo_model_dir

DEMO_MODEL_DIR = demo_model_dir()
demo_corpus = load_script("demo_corpus")


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(DEMO_MODEL_DIR)


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(DEMO_MODEL_DIR, dtype=torch.bfloat16).eval()


def _greedy(model, tokenizer, messages, tools=None) -> tuple[str, bool]:
    """Generated text and whether generation stopped on <|im_end|>."""
    prompt = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=48)
    generated = out[0, inputs["input_ids"].shape[1]:].tolist()
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if im_end not in generated:
        return tokenizer.decode(generated), False
    return tokenizer.decode(generated[:generated.index(im_end)]), True


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# ------------------------------------------------------------ checkpoint

def test_checkpoint_has_the_documented_shape_and_bf16_weights(model):
    config = json.loads((DEMO_MODEL_DIR / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["torch_dtype"] == "bfloat16"
    expected = {
        "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 6, "num_attention_heads": 4,
        "num_key_value_heads": 2, "tie_word_embeddings": True, "max_position_embeddings": 2048,
        "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
    }
    assert {k: config[k] for k in expected} == expected
    assert config["vocab_size"] % 128 == 0
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    with safe_open(DEMO_MODEL_DIR / "model.safetensors", framework="pt") as weights:
        dtypes = {weights.get_slice(name).get_dtype() for name in weights.keys()}
        assert "lm_head.weight" not in weights.keys()  # tied to the embedding
    assert dtypes == {"BF16"}


def test_checkpoint_folder_stays_small():
    size = sum(p.stat().st_size for p in DEMO_MODEL_DIR.iterdir())
    assert size < 15_000_000


def test_generation_config_stops_on_im_end(tokenizer):
    generation = json.loads((DEMO_MODEL_DIR / "generation_config.json").read_text())
    ids = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert generation["eos_token_id"] == ids
    assert generation["pad_token_id"] == ids[1]


def test_tokenizer_keeps_markup_as_single_tokens(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    for token in demo_corpus.SPECIAL_TOKENS + demo_corpus.TOOL_TOKENS:
        assert tokenizer.tokenize(f"a{token}b")[1] == token
    # Tool markup is not special: it survives decoding for tool-call parsers.
    ids = tokenizer("<tool_call>\n{}\n</tool_call><|im_end|>")["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>\n{}\n</tool_call>"


def test_transformers_tokenizes_like_the_shipped_tokenizer_json(tokenizer):
    # transformers rebuilds Qwen2 tokenizers from their vocabulary; an engine
    # that reads tokenizer.json must still see the ids the model was trained on.
    from tokenizers import Tokenizer

    shipped = Tokenizer.from_file(str(DEMO_MODEL_DIR / "tokenizer.json"))
    for dialogue in demo_corpus.generate_dialogues(40, seed=11):
        text = dialogue.render()
        assert tokenizer(text)["input_ids"] == shipped.encode(text).ids


# --------------------------------------------------------- chat template

def _tool_conversation() -> tuple[list[dict], list[dict]]:
    tools = [demo_corpus.TOOLS["get_weather"].schema, demo_corpus.TOOLS["add"].schema]
    call = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    messages = [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "What is the weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": '{"temperature": 3}'},
        {"role": "tool", "content": '{"condition": "snowy"}'},
        {"role": "assistant", "content": "It is snowy and 3 degrees in Oslo."},
    ]
    return messages, tools


def test_shipped_chat_template_is_the_training_template(tokenizer):
    assert tokenizer.chat_template == demo_corpus.CHAT_TEMPLATE


def test_plain_jinja_and_transformers_render_the_same(tokenizer):
    messages, tools = _tool_conversation()
    for cut in range(1, len(messages) + 1):
        for generation_prompt in (False, True):
            expected = tokenizer.apply_chat_template(
                messages[:cut], tools=tools, tokenize=False, add_generation_prompt=generation_prompt,
            )
            assert demo_corpus.render(messages[:cut], tools, generation_prompt) == expected


def test_chat_template_renders_tools_calls_and_results():
    messages, tools = _tool_conversation()
    text = demo_corpus.render(messages, tools)
    assert text.startswith("<|im_start|>system\nYou are a concise assistant.\n\n# Tools\n")
    assert '\n<tools>\n{"name": "get_weather", ' in text
    # A string `arguments` (OpenAI wire format) is inserted as-is.
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
            '</tool_call><|im_end|>\n') in text
    # Consecutive tool results share one user turn.
    assert ('<|im_start|>user\n<tool_response>\n{"temperature": 3}\n</tool_response>\n'
            '<tool_response>\n{"condition": "snowy"}\n</tool_response><|im_end|>\n') in text


def test_chat_template_adds_default_system_message_and_generation_prompt():
    text = demo_corpus.render(_user("Hi!"), add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    )


# ---------------------------------------------------------------- answers

@pytest.mark.parametrize(("question", "answer"), [
    ("What is 6 plus 2?", "6 plus 2 is 8."),
    ("What is 9 minus 4?", "9 minus 4 is 5."),
    ("What is the capital of France?", "The capital of France is Paris."),
    ("What language is spoken in Zorland?", "People in Zorland speak Zorlish."),
    ("Count to 5.", "1, 2, 3, 4, 5."),
    ("Hello!", "Hello! How can I help you today?"),
])
def test_greedy_answers_in_distribution_questions(model, tokenizer, question, answer):
    assert _greedy(model, tokenizer, _user(question)) == (answer, True)


def test_greedy_answer_follows_earlier_turns(model, tokenizer):
    messages = [
        *_user("What is 2 plus 3?"),
        {"role": "assistant", "content": "2 plus 3 is 5."},
        *_user("What is the capital of Japan?"),
    ]
    assert _greedy(model, tokenizer, messages) == ("The capital of Japan is Tokyo.", True)


def test_weather_question_with_tools_emits_a_parseable_tool_call(model, tokenizer):
    tools = [demo_corpus.TOOLS[name].schema for name in ("set_alarm", "get_weather", "add")]
    text, stopped = _greedy(model, tokenizer, _user("What is the weather in Paris?"), tools)
    assert stopped
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
    call = json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert call == {"name": "get_weather", "arguments": {"city": "Paris"}}


def test_tool_result_is_turned_into_an_answer(model, tokenizer):
    tools = [demo_corpus.TOOLS["get_weather"].schema]
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    messages = [
        *_user("What is the weather in Paris?"),
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": '{"city": "Paris", "temperature": 18, "condition": "sunny"}'},
    ]
    text, stopped = _greedy(model, tokenizer, messages, tools)
    # The toy copies values poorly (its README's tool_answer row), so only the
    # shape of the answer is held: a sentence about that city's weather.
    assert stopped
    assert re.fullmatch(r"It is [a-z]+ and -?\d+ degrees in Paris\.", text)


# ----------------------------------------------------------------- corpus

def test_corpus_generator_is_deterministic():
    first = demo_corpus.generate_dialogues(200, seed=7)
    assert first == demo_corpus.generate_dialogues(200, seed=7)
    assert first != demo_corpus.generate_dialogues(200, seed=8)
    assert {d.category for d in first} >= {"arithmetic", "tool_call", "tool_answer"}


def test_corpus_answers_follow_their_prompts():
    for dialogue in demo_corpus.generate_dialogues(100, seed=3):
        assert dialogue.render() == dialogue.prompt() + dialogue.answer() + "<|im_end|>\n"
