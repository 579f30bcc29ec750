"""An offline stand-in for what RULER's NIAH generator downloads: the essay haystack.

lm-eval's RULER generator (`lm_eval.tasks.ruler.prepare_niah`) takes its essay haystack from Paul Graham's
essays (the Hub data set `baber/paul_graham_essays`) and places needles between sentences that nltk's Punkt
splitter finds, with the `punkt_tab` data that the module downloads when it is imported. Offline:

- `essay_words()`: generated essay-like English prose, cut into words the way `prepare_niah.get_haystack`
  cuts the essays. It is deterministic (fixed seed, no global state), has no digits (needle values are
  numbers and UUIDs), no abbreviations, and every sentence ends with `.`, `?` or `!` followed by a capital:
  any Punkt model splits it into the same sentences. 120,000 words: about 150K dolma2 tokens of haystack.

Punkt's data, which the module downloads when it is imported, comes offline from `olmo_repo.upstream.nltk`.
"""

from __future__ import annotations

import random
from functools import cache

__all__ = ["ESSAY_WORDS", "essay_words"]

ESSAY_WORDS = 120_000

_PEOPLE = [
    "the founder", "a good writer", "the young painter", "a careful reader", "the teacher", "an engineer",
    "the old gardener", "a new programmer", "the investor", "a traveller", "the scientist", "the editor",
    "my neighbour", "the carpenter", "a new author", "the mayor", "the historian", "a student",
    "the designer", "a stranger", "the shop owner", "the composer", "my grandmother", "the critic",
    "a sailor", "the librarian", "the chef", "a musician", "the architect", "the farmer",
]  # fmt: skip
_DID = [
    "rewrote", "questioned", "ignored", "admired", "postponed", "discovered", "measured", "abandoned",
    "studied", "defended", "simplified", "borrowed", "explained", "noticed", "rebuilt", "doubted",
    "finished", "mapped", "described", "tested", "copied", "praised", "forgot", "sketched",
]  # fmt: skip
_THINGS = [
    "the first draft", "a simple idea", "the hardest problem", "an old habit", "the rules", "a quiet street",
    "the map", "a difficult question", "the plan", "the unfinished essay", "the market", "a worn notebook",
    "the garden wall", "a strange rumour", "the long report", "an empty room", "the budget", "a small boat",
    "the old bridge", "a good argument", "the recipe", "the harbour", "the schedule", "a borrowed book",
    "the kitchen table", "a forgotten letter", "the evening train", "the village school", "a blank page",
]  # fmt: skip
_IDEAS = [
    "curiosity", "patience", "ambition", "taste", "habit", "fear", "luck", "attention", "doubt", "discipline",
    "imagination", "honesty", "boredom", "confidence", "practice", "kindness", "stubbornness", "memory",
    "solitude", "work", "leisure", "ambiguity", "craft", "money", "friendship", "ignorance", "style",
]  # fmt: skip
_QUALITIES = [
    "useful", "rare", "overrated", "hard to teach", "easy to fake", "underrated", "contagious", "fragile",
    "cheap", "expensive", "learned slowly", "invisible from outside", "worth defending", "surprisingly common",
    "difficult to measure", "a kind of luck", "mostly a habit", "older than it looks", "easy to lose",
]  # fmt: skip
_HOW = [
    "slowly", "eventually", "almost by accident", "without much fuss", "again and again", "at last",
    "with great care", "in a single afternoon", "over many years", "reluctantly", "in secret", "quite happily",
    "for no obvious reason", "with some help", "in the middle of winter", "before breakfast",
]  # fmt: skip
_WHY = [
    "because nobody else would", "because the work demanded it", "since the deadline was near",
    "while the others were asleep", "before anyone could object", "after a long argument",
    "although it seemed pointless", "because it was the honest thing to do", "when the money ran out",
    "as soon as the rain stopped", "because the old way had stopped working", "once the noise died down",
]  # fmt: skip
_TEMPLATES = [
    "{person} {did} {thing} {how}.",
    "{person} {did} {thing} {why}.",
    "{idea} is {quality}, and {idea2} is {quality2}.",
    "It is easy to underestimate {idea}.",
    "Why would anyone ignore {thing}?",
    "The point is not {idea} but {idea2}.",
    "In the end, {person} {did} {thing}.",
    "Nobody expected {person} to care about {thing}.",
    "If you look closely, {idea} turns out to be {quality}.",
    "Most of the time, {thing} matters less than {idea}.",
    "{person} once told me that {idea} is {quality}.",
    "That is why {person} {did} {thing}.",
    "This is not a new observation.",
    "Consider {thing}.",
    "There is a difference between {idea} and {idea2}.",
    "Over the years, {person} {did} {thing} {how}.",
    "Few things are {quality} in the way that {idea} is.",
    "Perhaps {idea} is simply {quality}.",
    "When {person} {did} {thing}, {person2} {did2} {thing2}.",
    "{person} {did} {thing}, and {person2} {did2} {thing2}.",
    "You can learn a lot from {thing}.",
    "The surprising thing is how often {idea} turns out to be {quality}.",
    "Is {idea} {quality}? Not always.",
    "What did {person} see in {thing}?",
    "Think about what {idea} really means!",
    "It took a long time to see that {idea} and {idea2} are connected.",
]


def _sentence(rng: random.Random) -> str:
    slots = dict(
        person=rng.choice(_PEOPLE), person2=rng.choice(_PEOPLE), did=rng.choice(_DID), did2=rng.choice(_DID),
        thing=rng.choice(_THINGS), thing2=rng.choice(_THINGS), idea=rng.choice(_IDEAS),
        idea2=rng.choice(_IDEAS), quality=rng.choice(_QUALITIES), quality2=rng.choice(_QUALITIES),
        how=rng.choice(_HOW), why=rng.choice(_WHY),
    )  # fmt: skip
    text = rng.choice(_TEMPLATES).format(**slots)
    return text[0].upper() + text[1:]


@cache
def essay_words(n_words: int = ESSAY_WORDS) -> tuple[str, ...]:
    """The offline essay haystack: `n_words` words of generated prose (the same on every call and machine)."""
    rng = random.Random(20251216)
    words: list[str] = []
    while len(words) < n_words:
        words.extend(_sentence(rng).split(" "))
    return tuple(words[:n_words])
