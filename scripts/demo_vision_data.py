"""Synthetic pictures and questions about them, for the vision demo (scripts/train_demo_vision.py).

Every picture is drawn with Pillow from a ``Scene``: one to three coloured shapes on a white
background, or one coloured digit. Every question about a scene is answered from the scene alone,
so an answer is right or wrong by exact match. Deterministic: the same seed gives the same
pictures, questions and answers.

Question kinds (the accuracy table's rows):

- ``describe``: "What is in this picture?" -> "A red circle and two blue squares." (groups of equal
  shapes named left to right by their leftmost member)
- ``count``: "How many triangles are there?" -> "There are 2 triangles." / "There is 1 triangle." /
  "There are no triangles."
- ``color``: "What color is the circle?" (a shape drawn once) -> "The circle is red."
- ``number``: "What number is written?" (a digit) -> "The number is 7."
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageFont

COLORS = {
    "red": (220, 30, 30), "green": (30, 160, 50), "blue": (30, 70, 220), "yellow": (235, 200, 20),
    "purple": (140, 50, 190), "black": (20, 20, 20),
}
SHAPES = ("circle", "square", "triangle", "star")
NUMBER_WORDS = {1: "a", 2: "two", 3: "three"}
KINDS = ("describe", "count", "color", "number")

DESCRIBE = ("What is in this picture?", "What is in the picture?", "What do you see?", "Describe this picture.",
            "What is in this image?")
COUNT = ("How many {p} are there?", "How many {p} are in the picture?", "Count the {p}.")
COLOR = ("What color is the {s}?", "What colour is the {s}?", "What is the color of the {s}?")
NUMBER = ("What number is written?", "What number is this?", "Which digit is in the picture?",
          "What number do you see?")


@dataclass(frozen=True)
class Item:
    shape: str  # one of SHAPES, or "digit"
    color: str
    x: int  # centre, pixels
    y: int
    size: int  # radius of the shape's circumscribed circle (a digit: its height)
    digit: int | None = None


@dataclass(frozen=True)
class Scene:
    width: int
    height: int
    items: tuple[Item, ...]

    @property
    def digit(self) -> Item | None:
        return self.items[0] if self.items and self.items[0].shape == "digit" else None


@dataclass(frozen=True)
class Example:
    scene: Scene
    kind: str
    question: str
    answer: str


def plural(shape: str) -> str:
    return shape + "s"


def _place(rng: random.Random, width: int, height: int, count: int) -> list[tuple[int, int, int]] | None:
    """``count`` non-overlapping (x, y, radius) circles inside the canvas, or None if none fit in a few tries."""
    placed: list[tuple[int, int, int]] = []
    side = min(width, height)  # shapes scale with the canvas: the processor shrinks big pictures
    lo, hi = side // 7, side // (3 + count)
    for _ in range(60 * count):
        r = rng.randint(lo, hi)
        x, y = rng.randint(r + 2, width - r - 2), rng.randint(r + 2, height - r - 2)
        if all(math.hypot(x - px, y - py) > r + pr + 4 for px, py, pr in placed):
            placed.append((x, y, r))
            if len(placed) == count:
                return placed
    return None


def random_scene(rng: random.Random) -> Scene:
    """A picture of 1-3 shapes (often of one kind, so counts vary) or, three times in ten, a digit."""
    width, height = rng.choice((112, 112, 140, 168, 224)), rng.choice((112, 112, 140, 168, 224))
    if rng.random() < 0.3:
        size = rng.randint(min(width, height) // 2, min(width, height) * 9 // 10)
        x = rng.randint(width // 2 - width // 6, width // 2 + width // 6)
        y = rng.randint(height // 2 - height // 6, height // 2 + height // 6)
        return Scene(width, height, (Item("digit", rng.choice(list(COLORS)), x, y, size, rng.randint(0, 9)),))
    count = rng.choice((1, 1, 2, 2, 3, 3))
    while (spots := _place(rng, width, height, count)) is None:
        count -= 1
    same_shape = rng.random() < 0.4
    shape = rng.choice(SHAPES)
    items = tuple(Item(shape if same_shape else rng.choice(SHAPES), rng.choice(list(COLORS)), x, y, r)
                  for x, y, r in spots)
    return Scene(width, height, items)


def _star(x: int, y: int, r: int) -> list[tuple[float, float]]:
    return [(x + (r if i % 2 == 0 else r * 0.45) * math.sin(i * math.pi / 5),
             y - (r if i % 2 == 0 else r * 0.45) * math.cos(i * math.pi / 5)) for i in range(10)]


def draw(scene: Scene) -> Image.Image:
    image = Image.new("RGB", (scene.width, scene.height), (255, 255, 255))
    _paint(ImageDraw.Draw(image), scene, lambda index, item: COLORS[item.color])
    return image


def label_map(scene: Scene) -> Image.Image:
    """The picture's items as one 8-bit image: 0 for the background, 1 + an item's index where it is drawn (a digit's
    anti-aliased edges take values in between)."""
    image = Image.new("L", (scene.width, scene.height), 0)
    _paint(ImageDraw.Draw(image), scene, lambda index, item: index + 1)
    return image


def _paint(pen: ImageDraw.ImageDraw, scene: Scene, fill_of) -> None:
    for index, item in enumerate(scene.items):
        fill, (x, y, r) = fill_of(index, item), (item.x, item.y, item.size)
        if item.shape == "circle":
            pen.ellipse((x - r, y - r, x + r, y + r), fill=fill)
        elif item.shape == "square":
            half = round(r * 0.75)
            pen.rectangle((x - half, y - half, x + half, y + half), fill=fill)
        elif item.shape == "triangle":
            pen.polygon([(x, y - r), (x + r * 0.87, y + r * 0.5), (x - r * 0.87, y + r * 0.5)], fill=fill)
        elif item.shape == "star":
            pen.polygon(_star(x, y, r), fill=fill)
        else:  # Pillow's bundled scalable font: the same glyphs wherever Pillow has FreeType
            font = ImageFont.load_default(size=item.size)
            pen.text((x, y), str(item.digit), fill=fill, font=font, anchor="mm")


def _phrase(count: int, color: str, shape: str) -> str:
    return f"{NUMBER_WORDS[count]} {color} {shape if count == 1 else plural(shape)}"


def describe(scene: Scene) -> str:
    if scene.digit is not None:
        return f"The number {scene.digit.digit}, in {scene.digit.color}."
    groups: dict[tuple[str, str], int] = {}
    for item in sorted(scene.items, key=lambda i: i.x):
        groups[(item.color, item.shape)] = groups.get((item.color, item.shape), 0) + 1
    phrases = [_phrase(n, color, shape) for (color, shape), n in groups.items()]
    text = phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]
    return text[0].upper() + text[1:] + "."


def count_answer(scene: Scene, shape: str) -> str:
    n = sum(item.shape == shape for item in scene.items)
    if n == 0:
        return f"There are no {plural(shape)}."
    return f"There is 1 {shape}." if n == 1 else f"There are {n} {plural(shape)}."


def questions(scene: Scene, rng: random.Random) -> list[Example]:
    """Every kind of question this scene answers, one wording each (drawn from ``rng``)."""
    out = [Example(scene, "describe", rng.choice(DESCRIBE), describe(scene))]
    if scene.digit is not None:
        out.append(Example(scene, "number", rng.choice(NUMBER), f"The number is {scene.digit.digit}."))
        out.append(Example(scene, "color", rng.choice(COLOR).format(s="number"), f"The number is {scene.digit.color}."))
        return out
    # Mostly shapes that are there; sometimes one that is not (the answer is "no").
    present = sorted({item.shape for item in scene.items})
    shape = rng.choice(present) if rng.random() < 0.8 else rng.choice(SHAPES)
    out.append(Example(scene, "count", rng.choice(COUNT).format(p=plural(shape)), count_answer(scene, shape)))
    once = [item for item in scene.items if sum(other.shape == item.shape for other in scene.items) == 1]
    if once:
        item = rng.choice(once)
        out.append(Example(scene, "color", rng.choice(COLOR).format(s=item.shape), f"The {item.shape} is {item.color}."))
    return out


def examples(count: int, seed: int) -> list[Example]:
    """``count`` examples: a random scene each and one of the questions it answers, chosen uniformly."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        scene = random_scene(rng)
        asked = questions(scene, rng)
        out.append(rng.choice(asked))
    return out
