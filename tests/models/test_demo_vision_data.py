"""The vision demo's training data (scripts/demo_vision_data.py): deterministic, and every answer true of its picture."""
from __future__ import annotations

import re

import numpy as np

from testutil import load_script

data = load_script("demo_vision_data")
WORDS = {"a": 1, "two": 2, "three": 3}


def test_the_same_seed_gives_the_same_pictures_questions_and_answers():
    first, again, other = data.examples(40, 7), data.examples(40, 7), data.examples(40, 8)
    assert first == again and first != other
    for a, b in zip(first[:10], again[:10]):
        assert data.draw(a.scene).tobytes() == data.draw(b.scene).tobytes()


def test_every_kind_of_question_is_asked():
    kinds = {e.kind for e in data.examples(200, 1)}
    assert kinds == set(data.KINDS)


def _has_color(picture: np.ndarray, color: str) -> bool:
    return bool((np.abs(picture.astype(int) - data.COLORS[color]).sum(-1) < 10).any())


def test_every_answer_is_true_of_its_scene_and_picture():
    for example in data.examples(300, 3):
        scene, answer = example.scene, example.answer
        picture = np.asarray(data.draw(scene))
        assert picture.shape == (scene.height, scene.width, 3)
        for item in scene.items:  # each item is drawn, in its colour
            assert _has_color(picture, item.color), (example, item)
        if example.kind == "describe" and scene.digit is None:
            groups = re.findall(r"(a|two|three) (\w+) (\w+?)s?(?:,| and|\.)", answer.lower())
            named = sorted((color, shape) for count, color, shape in groups for _ in range(WORDS[count]))
            assert named == sorted((i.color, i.shape) for i in scene.items), example
        elif example.kind == "describe":
            assert answer == f"The number {scene.digit.digit}, in {scene.digit.color}."
        elif example.kind == "count":
            shape = re.search(r"the (\w+)s|many (\w+)s", example.question.lower())
            shape = shape.group(1) or shape.group(2)
            n = sum(i.shape == shape for i in scene.items)
            assert answer == {0: f"There are no {shape}s.", 1: f"There is 1 {shape}."}.get(n, f"There are {n} {shape}s.")
        elif example.kind == "color":
            shape, color = re.fullmatch(r"The (\w+) is (\w+)\.", answer).groups()
            owners = [i for i in scene.items if i.shape == ("digit" if shape == "number" else shape)]
            assert len(owners) == 1 and owners[0].color == color and shape in example.question, example
        else:
            assert example.kind == "number" and answer == f"The number is {scene.digit.digit}."


def test_shapes_do_not_touch_and_stay_inside_the_picture():
    for example in data.examples(200, 4):
        items = [i for i in example.scene.items if i.shape != "digit"]  # a digit's size is its height
        for i, a in enumerate(items):
            assert a.size <= a.x < example.scene.width - a.size and a.size <= a.y < example.scene.height - a.size
            for b in items[i + 1:]:
                assert np.hypot(a.x - b.x, a.y - b.y) > a.size + b.size
