"""Regenerate the shipped corpora (deterministic; no downloads, no licence question).

    python -m trainfit.data.corpora.generate            # rewrites the three files here

tiny-corpus.txt        ~700 KB of generated English-like prose, arithmetic facts and lists:
                       enough structure that a few-million-parameter model's loss falls
                       visibly within a couple of minutes on a laptop CPU.
tiny-chat.jsonl        {"messages": [...]} conversations (user question, assistant answer).
tiny-preferences.jsonl {"prompt", "chosen", "rejected"} pairs: the chosen answer is correct
                       and polite, the rejected one wrong or curt, so DPO has a real signal.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 20240601

NAMES = ["Ada", "Ben", "Clara", "Dev", "Elena", "Farid", "Grace", "Hugo", "Iris", "Jonas",
         "Kira", "Liam", "Maya", "Noor", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tara"]
ANIMALS = ["cat", "dog", "fox", "owl", "horse", "rabbit", "goat", "heron", "otter", "crow"]
PLACES = ["the river", "the old mill", "the market", "the harbour", "the hill", "the library",
          "the orchard", "the station", "the forest", "the bridge", "the garden", "the school"]
ADJECTIVES = ["quiet", "bright", "small", "tired", "curious", "brave", "cold", "green", "patient",
              "busy", "gentle", "clever", "heavy", "warm", "careful", "sleepy"]
VERBS = ["walked to", "looked at", "painted", "waited near", "ran past", "cleaned", "visited",
         "counted the boats at", "read a book at", "sang near", "found a key at", "slept beside"]
OBJECTS = ["apples", "letters", "stones", "candles", "books", "shells", "lamps", "baskets",
           "coins", "feathers", "maps", "cups"]
TIMES = ["In the morning", "At noon", "Later that day", "In the evening", "At night", "On Sunday",
         "After the rain", "Before dinner", "At dawn", "In winter", "In spring", "Every day"]
WEATHER = ["rain fell softly", "the wind was strong", "the sky was clear", "snow covered the roofs",
           "fog rolled in from the sea", "the sun was warm", "clouds moved slowly"]
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
                "seventeen", "eighteen", "nineteen", "twenty"]
COLOURS = ["red", "blue", "green", "yellow", "white", "black", "brown", "grey"]


def _sentence(rng: random.Random) -> str:
    kind = rng.randrange(7)
    name, other = rng.sample(NAMES, 2)
    if kind == 0:
        return f"{rng.choice(TIMES)}, {name} {rng.choice(VERBS)} {rng.choice(PLACES)}."
    if kind == 1:
        return f"The {rng.choice(ADJECTIVES)} {rng.choice(ANIMALS)} {rng.choice(VERBS)} {rng.choice(PLACES)}."
    if kind == 2:
        n = rng.randrange(2, 13)
        return f"{name} gave {other} {NUMBER_WORDS[n]} {rng.choice(COLOURS)} {rng.choice(OBJECTS)}."
    if kind == 3:
        return f"{rng.choice(TIMES)} {rng.choice(WEATHER)}, and {name} stayed near {rng.choice(PLACES)}."
    if kind == 4:
        a, b = rng.randrange(0, 11), rng.randrange(0, 10)
        return f"{NUMBER_WORDS[a].capitalize()} plus {NUMBER_WORDS[b]} is {NUMBER_WORDS[a + b]}."
    if kind == 5:
        return f"{name} said to {other}: \"The {rng.choice(OBJECTS)} are at {rng.choice(PLACES)}.\""
    return f"Because {rng.choice(WEATHER)}, the {rng.choice(ANIMALS)} was {rng.choice(ADJECTIVES)}."


def corpus_text(rng: random.Random, target_bytes: int = 700_000) -> str:
    paragraphs, size, chapter = [], 0, 1
    while size < target_bytes:
        if len(paragraphs) % 40 == 0:
            paragraphs.append(f"Chapter {chapter}")
            chapter += 1
        para = " ".join(_sentence(rng) for _ in range(rng.randrange(3, 8)))
        paragraphs.append(para)
        size += len(para) + 1
    return "\n".join(paragraphs) + "\n"


def _qa(rng: random.Random) -> tuple[str, str, str]:
    """(question, good answer, bad answer)."""
    kind = rng.randrange(4)
    if kind == 0:
        a, b = rng.randrange(0, 11), rng.randrange(0, 10)
        wrong = (a + b + rng.choice([-3, -2, -1, 1, 2, 3])) % 21
        return (f"What is {NUMBER_WORDS[a]} plus {NUMBER_WORDS[b]}?",
                f"{NUMBER_WORDS[a].capitalize()} plus {NUMBER_WORDS[b]} is {NUMBER_WORDS[a + b]}.",
                f"It is {NUMBER_WORDS[wrong]}, obviously.")
    if kind == 1:
        animal, adj = rng.choice(ANIMALS), rng.choice(ADJECTIVES)
        return (f"Tell me one short sentence about a {adj} {animal}.",
                f"The {adj} {animal} {rng.choice(VERBS)} {rng.choice(PLACES)}.",
                "No. Ask someone else.")
    if kind == 2:
        name, place = rng.choice(NAMES), rng.choice(PLACES)
        return (f"Where did {name} go {rng.choice(TIMES).lower()}?",
                f"{name} went to {place} and stayed there for a while.",
                "I do not care where anyone went.")
    n = rng.randrange(2, 10)
    obj = rng.choice(OBJECTS)
    items = ", ".join(NUMBER_WORDS[i] for i in range(1, n + 1))
    return (f"Count from one to {NUMBER_WORDS[n]}, please.",
            f"Here you go: {items}.",
            f"{NUMBER_WORDS[n].capitalize()} {obj}. Done.")


def main() -> None:
    rng = random.Random(SEED)
    (HERE / "tiny-corpus.txt").write_text(corpus_text(rng), encoding="utf-8")
    with open(HERE / "tiny-chat.jsonl", "w", encoding="utf-8") as fh:
        for _ in range(600):
            q, good, _bad = _qa(rng)
            msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": good}]
            fh.write(json.dumps({"messages": msgs}) + "\n")
    with open(HERE / "tiny-preferences.jsonl", "w", encoding="utf-8") as fh:
        for _ in range(400):
            q, good, bad = _qa(rng)
            fh.write(json.dumps({"prompt": q, "chosen": good, "rejected": bad}) + "\n")


if __name__ == "__main__":
    main()
