"""Subject-verb agreement minimal pairs with attractors, for activation patching
(`jaxencoder-probe --patch PAIRS`; `python -m jaxencoder.data fetch agreement_pairs`).

  pairs = agreement.pairs(count=200, seed=0)   # [{"clean", "corrupted", "target_clean", ...}]
  agreement.write(path)                        # the same as JSON lines

Each pair is one template filled twice: the clean sentence has a subject of one number,
the corrupted the same sentence with the subject's other number; the attractor (a noun
between subject and verb, in a prepositional phrase or a relative clause) and every
other word stay. The verb is masked; the targets are the verb forms that agree with
the clean and the corrupted subject:

  {"clean": "the keys to the cabinet [MASK] here .", "corrupted": "the key to the cabinet
   [MASK] here .", "target_clean": "are", "target_corrupted": "is", "template": "pp",
   "attractor": "singular"}

Every noun, in both numbers, and every verb form is one word piece of the uncased BERT
vocabulary (MiniLM's, make train's), so a pair's two sentences tokenise to the same
length and a template's pairs share one. Deterministic: the same seed gives the same
pairs; nothing is downloaded.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

# (singular, plural): subjects and attractors.
NOUNS = (("key", "keys"), ("author", "authors"), ("pilot", "pilots"), ("dog", "dogs"),
         ("teacher", "teachers"), ("farmer", "farmers"), ("doctor", "doctors"),
         ("student", "students"), ("manager", "managers"), ("senator", "senators"),
         ("officer", "officers"), ("singer", "singers"), ("soldier", "soldiers"),
         ("lawyer", "lawyers"), ("actor", "actors"), ("judge", "judges"))
ATTRACTORS = (("cabinet", "cabinets"), ("table", "tables"), ("guard", "guards"),
              ("king", "kings"), ("car", "cars"), ("book", "books"), ("house", "houses"),
              ("window", "windows"), ("building", "buildings"), ("picture", "pictures"),
              ("box", "boxes"), ("letter", "letters"), ("report", "reports"),
              ("player", "players"))
PREPOSITIONS = ("to", "near", "behind", "with", "beside")
RELATIVE_VERBS = ("saw", "liked", "met", "knew")  # past tense: no agreement of their own
# (singular, plural) verb and the words that end the sentence after it.
VERBS = ((("is", "are"), "here"), (("was", "were"), "late"), (("has", "have"), "left"),
         (("is", "are"), "ready"), (("was", "were"), "there"), (("has", "have"), "arrived"))
TEMPLATES = {
    "pp": "the {subject} {preposition} the {attractor} [MASK] {end} .",
    "rc": "the {subject} that the {attractor} {relative} [MASK] {end} .",
}
FIELDS = ("clean", "corrupted", "target_clean", "target_corrupted")
FILE = "pairs.jsonl"  # what `write_source` writes into a fetch source's directory


def pairs(count: int = 240, *, seed: int = 0) -> list[dict]:
  """`count` minimal pairs drawn with `seed`, templates in turn; half the clean subjects
  are plural, and the attractor's number is drawn independently (so half the attractors
  disagree with the clean subject)."""
  rng = np.random.default_rng(seed)
  names = sorted(TEMPLATES)
  out = []
  for i in range(count):
    template = names[i % len(names)]
    subject, attractor = NOUNS[rng.integers(len(NOUNS))], ATTRACTORS[rng.integers(len(ATTRACTORS))]
    verb, end = VERBS[rng.integers(len(VERBS))]
    clean_number, attractor_number = int(rng.integers(2)), int(rng.integers(2))
    words = {"attractor": attractor[attractor_number], "end": end,
             "preposition": PREPOSITIONS[rng.integers(len(PREPOSITIONS))],
             "relative": RELATIVE_VERBS[rng.integers(len(RELATIVE_VERBS))]}
    fill = lambda number: TEMPLATES[template].format(subject=subject[number], **words)
    out.append({"clean": fill(clean_number), "corrupted": fill(1 - clean_number),
                "target_clean": verb[clean_number], "target_corrupted": verb[1 - clean_number],
                "template": template,
                "attractor": ("singular", "plural")[attractor_number],
                "subject": ("singular", "plural")[clean_number]})
  return out


def write(path, count: int = 240, *, seed: int = 0) -> pathlib.Path:
  """`pairs(count, seed=seed)` as JSON lines at `path` (one pair a line)."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(p) + "\n" for p in pairs(count, seed=seed)))
  return path


def write_source(out) -> None:
  """The fetch source `agreement_pairs`: `out`/pairs.jsonl, the default pairs (seed 0)."""
  (out / FILE).write_text("".join(json.dumps(p) + "\n" for p in pairs()))
