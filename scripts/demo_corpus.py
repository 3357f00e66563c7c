"""Templated chat corpus for the edge-infer demo model.

Everything the demo model knows comes from here: short ChatML dialogues built
from tables and phrasings written for this project (no downloaded text).
A dialogue is drawn from a seeded `random.Random`, so the same seed always
gives the same corpus. The training script, its held-out evaluation and the
tests all use this module.

Every dialogue's answer is fully determined by its prompt, so greedy decoding
of a well-trained model can be checked for exact answers.

The tasks are sized for a few minutes of training on two CPU cores. Copying
an arbitrary span from the context (induction) is what such a small, briefly
trained model fails to learn: at learning rates low enough for it to appear,
nothing else is learnt in time. So every value an answer takes from its
prompt is short and sits at a predictable place (a city, a name, a two-digit
number, a time), and phrases to repeat are at most three words.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from jinja2.sandbox import ImmutableSandboxedEnvironment

CHAT_TEMPLATE = Path(__file__).with_name("demo_chat_template.jinja").read_text()

# Tokens that must stay single tokens; the first three are special.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

Message = dict[str, Any]  # an OpenAI-style chat message, as chat templates take it


@dataclass(frozen=True)
class Dialogue:
    """One conversation; its last message is the assistant answer to learn."""

    category: str
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None

    def render(self) -> str:
        return render(self.messages, self.tools)

    def prompt(self) -> str:
        """The conversation up to the last answer, with the generation prompt."""
        return render(self.messages[:-1], self.tools, add_generation_prompt=True)

    def answer(self) -> str:
        """The text the model should generate after `prompt()`, before <|im_end|>."""
        full, prompt = self.render(), self.prompt()
        assert full.startswith(prompt), "chat template must render prompts as prefixes"
        return full[len(prompt):].removesuffix("<|im_end|>\n")


def _tojson(value: Any) -> str:
    # Same output as transformers' chat-template filter (no HTML escaping).
    return json.dumps(value, ensure_ascii=False)


_ENVIRONMENT = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
_ENVIRONMENT.filters["tojson"] = _tojson
_TEMPLATE = _ENVIRONMENT.from_string(CHAT_TEMPLATE)


def render(
    messages: list[Message],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
) -> str:
    return _TEMPLATE.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt)


def generate_dialogues(count: int, seed: int) -> list[Dialogue]:
    rng = random.Random(seed)
    kinds = [kind for kind, _ in _MIX]
    weights = [weight for _, weight in _MIX]
    return [_BUILDERS[kind](rng) for kind in rng.choices(kinds, weights, k=count)]


# ---------------------------------------------------------------- knowledge

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a concise assistant.",
    "You are a friendly assistant that gives short answers.",
    "You are the edge-infer demo assistant.",
)

SMALL_TALK = (
    (("Hello!", "Hi!", "Hey there!", "Good morning!", "Hello there."), "Hello! How can I help you today?"),
    (("How are you?", "How are you doing today?"), "I am doing well, thank you. How can I help you?"),
    (("Thank you!", "Thanks a lot.", "Thanks!"), "You are welcome!"),
    (("Goodbye!", "Bye!", "See you later."), "Goodbye! Have a nice day."),
    (
        ("Who are you?", "What are you?", "What can you do?", "Tell me about yourself."),
        "I am a tiny demo model that ships with edge-infer. I can add and subtract small numbers, "
        "count, repeat text, answer a few simple questions and call tools.",
    ),
)

REAL_CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Japan": "Tokyo", "China": "Beijing", "India": "New Delhi", "Brazil": "Brasilia",
    "Canada": "Ottawa", "Egypt": "Cairo", "Kenya": "Nairobi", "Australia": "Canberra",
    "Mexico": "Mexico City", "Norway": "Oslo", "Peru": "Lima", "Poland": "Warsaw",
}

# A small made-up world: its lands, their capitals and languages.
MADE_UP_LANDS = {
    "Zorland": ("Mirelle", "Zorlish"),
    "Quentara": ("Lusk", "Quentari"),
    "Bravonia": ("Tessel", "Bravonic"),
    "Eldmark": ("Hollin", "Eldish"),
    "Varnia": ("Cadrel", "Varnese"),
    "Dunmere": ("Falsk", "Dunmeric"),
    "Kethria": ("Arlo", "Kethrian"),
    "Solvane": ("Pennow", "Solvani"),
}

CAPITALS = {**REAL_CAPITALS, **{land: capital for land, (capital, _) in MADE_UP_LANDS.items()}}

COLORS = {
    "a banana": "yellow", "grass": "green", "the sky": "blue", "snow": "white",
    "coal": "black", "a tomato": "red", "a carrot": "orange", "a lemon": "yellow",
    "milk": "white", "a leaf": "green", "chocolate": "brown", "a ruby": "red",
    "the ocean": "blue", "a plum": "purple", "an emerald": "green", "the sun": "yellow",
}

OPPOSITE_PAIRS = (
    ("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"), ("day", "night"),
    ("light", "dark"), ("happy", "sad"), ("open", "closed"), ("early", "late"), ("full", "empty"),
    ("wet", "dry"), ("high", "low"), ("left", "right"), ("loud", "quiet"), ("hard", "soft"),
    ("strong", "weak"), ("rich", "poor"), ("young", "old"), ("push", "pull"), ("win", "lose"),
)
OPPOSITES = {**dict(OPPOSITE_PAIRS), **{b: a for a, b in OPPOSITE_PAIRS}}

ECHO_WORDS = (
    "red blue green small big cat dog bird fish tree river stone house road moon star sun rain "
    "snow wind happy quiet loud fast slow old new warm cold bright dark apple bread milk tea "
    "book door window garden city music song light shadow cloud paper table chair friend "
    "morning evening night summer winter yellow silver golden little gentle brave clever"
).split()

CITIES = (
    "Paris", "Berlin", "Rome", "Madrid", "Tokyo", "Cairo", "Oslo", "Lima", "Nairobi", "Toronto",
    "London", "Chicago", "Sydney", "Seoul", "Lisbon", "Dublin", "Vienna", "Prague", "Boston",
    "Denver", "Mirelle", "Lusk", "Tessel", "Hollin", "Falsk", "Arlo",
)
CONTACTS = ("Alice", "Bob", "Carol", "Dave", "Emma", "Frank", "Grace", "Henry", "Ivy", "Jack", "Mia", "Noah")
MESSAGE_TEXTS = (
    "see you soon", "I am running late", "happy birthday", "call me back", "dinner is ready",
    "the meeting moved to noon", "good luck today", "thanks for the help", "I am home",
    "let us meet at the park", "do not forget the keys", "the train is on time",
)
WEATHER_CONDITIONS = ("sunny", "cloudy", "rainy", "snowy", "windy", "foggy")


def _pick(rng: random.Random, options: tuple[str, ...] | list[str]) -> str:
    return options[rng.randrange(len(options))]


def _exchange(question: str, answer: str) -> list[Message]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def _capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]


# ---------------------------------------------------------- single exchanges

def _small_talk(rng: random.Random) -> list[Message]:
    questions, answer = SMALL_TALK[rng.randrange(len(SMALL_TALK))]
    return _exchange(_pick(rng, questions), answer)


def _arithmetic(rng: random.Random) -> list[Message]:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    if rng.random() < 0.5:
        question = _pick(rng, (
            "What is {a} plus {b}?", "How much is {a} plus {b}?", "What is {a} + {b}?", "Can you add {a} and {b}?",
        ))
        return _exchange(question.format(a=a, b=b), f"{a} plus {b} is {a + b}.")
    a, b = max(a, b), min(a, b)
    question = _pick(rng, (
        "What is {a} minus {b}?", "How much is {a} minus {b}?", "What is {a} - {b}?", "Subtract {b} from {a}.",
    ))
    return _exchange(question.format(a=a, b=b), f"{a} minus {b} is {a - b}.")


def _counting(rng: random.Random) -> list[Message]:
    end = rng.randint(2, 10)
    question = _pick(rng, ("Count to {n}.", "Please count to {n}.", "Can you count to {n}?", "Count from 1 to {n}."))
    return _exchange(question.format(n=end), ", ".join(str(n) for n in range(1, end + 1)) + ".")


def _echo(rng: random.Random) -> list[Message]:
    phrase = " ".join(rng.choice(ECHO_WORDS) for _ in range(rng.randint(1, 3)))
    question = _pick(rng, ("Repeat after me: {p}", "Say exactly this: {p}", "Please repeat: {p}", "Echo this: {p}"))
    return _exchange(question.format(p=phrase), phrase)


def _capital(rng: random.Random) -> list[Message]:
    land = _pick(rng, list(CAPITALS))
    question = _pick(rng, (
        "What is the capital of {x}?", "Which city is the capital of {x}?", "Tell me the capital of {x}.",
    ))
    return _exchange(question.format(x=land), f"The capital of {land} is {CAPITALS[land]}.")


def _language(rng: random.Random) -> list[Message]:
    land = _pick(rng, list(MADE_UP_LANDS))
    question = _pick(rng, ("What language is spoken in {x}?", "What language do people speak in {x}?"))
    return _exchange(question.format(x=land), f"People in {land} speak {MADE_UP_LANDS[land][1]}.")


def _color(rng: random.Random) -> list[Message]:
    thing = _pick(rng, list(COLORS))
    question = _pick(rng, ("What color is {x}?", "What is the color of {x}?"))
    return _exchange(question.format(x=thing), f"{_capitalize(thing)} is {COLORS[thing]}.")


def _opposite(rng: random.Random) -> list[Message]:
    word = _pick(rng, list(OPPOSITES))
    question = _pick(rng, ("What is the opposite of {x}?", "What is the opposite of the word {x}?"))
    return _exchange(question.format(x=word), f"The opposite of {word} is {OPPOSITES[word]}.")


def _fact(rng: random.Random) -> list[Message]:
    return _pick_builder(rng, (_capital, _capital, _language, _color, _opposite))(rng)


_SINGLE_EXCHANGES: dict[str, Callable[[random.Random], list[Message]]] = {
    "small_talk": _small_talk,
    "arithmetic": _arithmetic,
    "counting": _counting,
    "echo": _echo,
    "fact": _fact,
}


def _pick_builder(rng: random.Random, builders: tuple[Callable, ...]) -> Callable:
    return builders[rng.randrange(len(builders))]


def _with_system(rng: random.Random, messages: list[Message]) -> list[Message]:
    # Most dialogues rely on the template's default system message.
    if rng.random() < 0.3:
        return [{"role": "system", "content": _pick(rng, SYSTEM_PROMPTS)}, *messages]
    return messages


def _single(kind: str) -> Callable[[random.Random], Dialogue]:
    """Dialogues of one to three exchanges of one kind: several answers share
    one system prompt, which makes training cheaper per answer."""
    def build(rng: random.Random) -> Dialogue:
        messages = [m for _ in range(rng.randint(1, 3)) for m in _SINGLE_EXCHANGES[kind](rng)]
        return Dialogue(kind, _with_system(rng, messages))
    return build


def _multi_turn(rng: random.Random) -> Dialogue:
    builders = tuple(_SINGLE_EXCHANGES.values())
    messages = [m for _ in range(rng.randint(2, 4)) for m in _pick_builder(rng, builders)(rng)]
    return Dialogue("multi_turn", _with_system(rng, messages))


# -------------------------------------------------------------------- tools

@dataclass(frozen=True)
class _Tool:
    schema: dict[str, Any]
    # Draws one request: (user question, call arguments, tool result, final answer).
    request: Callable[[random.Random], tuple[str, dict[str, Any], dict[str, Any], str]]


def _function(name: str, description: str, parameters: dict[str, str]) -> dict[str, Any]:
    # Parameters carry only their JSON type: every schema token costs training time.
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {p: {"type": t} for p, t in parameters.items()},
                "required": list(parameters),
            },
        },
    }


def _weather_request(rng: random.Random):
    city = _pick(rng, CITIES)
    question = _pick(rng, (
        "What is the weather in {c}?", "How is the weather in {c} today?", "Is it raining in {c}?",
        "Tell me the weather for {c}.", "What's the weather like in {c}?",
    )).format(c=city)
    condition, degrees = _pick(rng, WEATHER_CONDITIONS), rng.randint(10, 35)
    result = {"city": city, "temperature": degrees, "condition": condition}
    return question, {"city": city}, result, f"It is {condition} and {degrees} degrees in {city}."


def _time_request(rng: random.Random):
    city = _pick(rng, CITIES)
    question = _pick(rng, ("What time is it in {c}?", "Tell me the current time in {c}.")).format(c=city)
    clock = f"{rng.randint(0, 23):02d}:{_pick(rng, ('00', '15', '30', '45'))}"
    return question, {"city": city}, {"time": clock}, f"It is {clock} in {city}."


def _alarm_request(rng: random.Random):
    clock = f"{rng.randint(0, 23):02d}:{_pick(rng, ('00', '15', '30', '45'))}"
    question = _pick(rng, ("Set an alarm for {t}.", "Wake me up at {t}.", "Please set an alarm at {t}.")).format(t=clock)
    return question, {"time": clock}, {"status": "ok"}, f"Your alarm is set for {clock}."


def _add_request(rng: random.Random):
    # Numbers beyond the model's own arithmetic: this is what the tool is for.
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    question = _pick(rng, (
        "Add {a} and {b}.", "What is {a} plus {b}?", "Please add {a} and {b}.", "Use the calculator to add {a} and {b}.",
    )).format(a=a, b=b)
    return question, {"a": a, "b": b}, {"result": a + b}, f"{a} plus {b} is {a + b}."


def _message_request(rng: random.Random):
    contact, text = _pick(rng, CONTACTS), _pick(rng, MESSAGE_TEXTS)
    question = _pick(rng, ("Send a message to {n} saying {t}.", "Text {n}: {t}.", "Tell {n} that {t}.")).format(n=contact, t=text)
    return question, {"to": contact, "text": text}, {"status": "sent"}, f"Your message to {contact} has been sent."


TOOLS = {
    "get_weather": _Tool(
        _function("get_weather", "Get the current weather in a city.", {"city": "string"}), _weather_request,
    ),
    "get_time": _Tool(_function("get_time", "Get the local time in a city.", {"city": "string"}), _time_request),
    "set_alarm": _Tool(_function("set_alarm", "Set an alarm at a time (HH:MM).", {"time": "string"}), _alarm_request),
    "add": _Tool(_function("add", "Add two numbers.", {"a": "number", "b": "number"}), _add_request),
    "send_message": _Tool(
        _function("send_message", "Send a text message to a contact.", {"to": "string", "text": "string"}),
        _message_request,
    ),
}


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_list(rng: random.Random, required: str | None) -> list[dict[str, Any]]:
    names = rng.sample(sorted(TOOLS), rng.randint(1, 3))
    if required is not None and required not in names:
        names[rng.randrange(len(names))] = required
    return [TOOLS[name].schema for name in names]


def _tool_call(rng: random.Random) -> Dialogue:
    """A request one listed tool answers; half of them go on with its result."""
    name = _pick(rng, sorted(TOOLS))
    tools = _tool_list(rng, name)
    question, arguments, result, final = TOOLS[name].request(rng)
    messages = [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "tool_calls": [_call(name, arguments)]},
    ]
    if rng.random() < 0.5:
        messages += [{"role": "tool", "content": json.dumps(result)}, {"role": "assistant", "content": final}]
        return Dialogue("tool_answer", _with_system(rng, messages), tools)
    return Dialogue("tool_call", _with_system(rng, messages), tools)


def _two_cities(rng: random.Random) -> Dialogue:
    """Two calls in one answer, then one reply built from both results."""
    tools = _tool_list(rng, "get_weather")
    first, second = rng.sample(CITIES, 2)
    question = _pick(rng, ("Compare the weather in {a} and {b}.", "What is the weather in {a} and in {b}?"))
    messages = [
        {"role": "user", "content": question.format(a=first, b=second)},
        {"role": "assistant", "content": "", "tool_calls": [
            _call("get_weather", {"city": first}), _call("get_weather", {"city": second}),
        ]},
    ]
    if rng.random() < 0.5:
        reports = []
        for city in (first, second):
            condition, degrees = _pick(rng, WEATHER_CONDITIONS), rng.randint(10, 35)
            messages.append({"role": "tool", "content": json.dumps(
                {"city": city, "temperature": degrees, "condition": condition},
            )})
            reports.append(f"{condition} and {degrees} degrees in {city}")
        messages.append({"role": "assistant", "content": f"It is {reports[0]}, and {reports[1]}."})
        return Dialogue("tool_answer", _with_system(rng, messages), tools)
    return Dialogue("tool_call", _with_system(rng, messages), tools)


def _tools_unused(rng: random.Random) -> Dialogue:
    """Tools are offered but the question needs none: answer directly."""
    builder = _pick_builder(rng, (_small_talk, _counting, _echo, _fact))
    return Dialogue("tools_unused", _with_system(rng, builder(rng)), _tool_list(rng, None))


_BUILDERS: dict[str, Callable[[random.Random], Dialogue]] = {
    **{kind: _single(kind) for kind in _SINGLE_EXCHANGES},
    "multi_turn": _multi_turn,
    "tool_call": _tool_call,
    "two_cities": _two_cities,
    "tools_unused": _tools_unused,
}

# Relative frequency of each builder in the corpus.
_MIX = (
    ("small_talk", 4), ("arithmetic", 22), ("counting", 7), ("echo", 6), ("fact", 16),
    ("multi_turn", 12), ("tool_call", 18), ("two_cities", 2), ("tools_unused", 3),
)
