"""Task datasets made from the Shakespeare plays: real text, labels derived by a stated rule.

  shakespeare_span        the one character of the play a 1-3 line passage names
                          (context, answer, answer_start)
  shakespeare_multilabel  which of 8 themes a speech touches, by a fixed keyword lexicon
                          (THEMES; the words stay in the text) (text, labels)
  shakespeare_regression  the year the play was written, in decades from 1600, from one
                          speech (text, target); the years are the usual scholarly
                          estimates (PLAY_YEARS), uncertain by a year or two
  shakespeare_choice      the true next line of a speech among 4 lines of the same play
                          (text, choice_0..choice_3, label)
  shakespeare_pairs       consecutive lines of a speech as a positive pair, another line
                          of the same play as a hard negative (text, text_b, negative)
  shakespeare_speeches    the speeches of at least MIN_SPEECH_WORDS words, unlabelled
                          (text): for contrastive views (data/span_views.py)
  shakespeare_halves      the same speeches as pairs: the first half of a speech's words
                          and its second half (text, text_b), cut as shakespeare_retrieval
                          cuts its test speeches: in-batch or mined negatives
  shakespeare_retrieval   a held-out retrieval set in BEIR's format (data/beir.py): the
                          first halves of shakespeare_speeches' test speeches as queries,
                          their second halves as the corpus (`write_retrieval`)

Each is a text_records source (train.csv, test.csv) written under data_dir/raw/<name> by
`write`, from the fetched Gutenberg texts. A speech goes wholly to one split (1 in 10 to
test, by a hash of play and speech number), so no test line was seen in training.
Deterministic: the same texts give the same files.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import re
import zlib

import numpy as np
from etils import epath

from jaxencoder.data import beir, readers

SOURCES = ("shakespeare_span", "shakespeare_multilabel", "shakespeare_regression",
           "shakespeare_choice", "shakespeare_pairs", "shakespeare_speeches",
           "shakespeare_halves")
MAX_TRAIN, MAX_TEST = 12_000, 1_000  # examples per split (a seeded sample when more)
MAX_WORDS = 60  # a speech's first words kept for the speech-level tasks
MIN_SPEECH_WORDS = 8  # shakespeare_speeches: shorter ones have no two halves worth matching
RETRIEVAL = "shakespeare_retrieval"  # written from shakespeare_speeches (not a text_records set)

# Year each play was written (usual estimates; poems are left out).
PLAY_YEARS = {
    "two_gentlemen_of_verona": 1590, "taming_of_the_shrew": 1591, "henry_vi_part_1": 1591,
    "henry_vi_part_2": 1591, "henry_vi_part_3": 1591, "tragedy_of_titus_andronicus": 1592,
    "richard_iii": 1593, "comedy_of_errors": 1594, "loves_labours_lost": 1595,
    "richard_ii": 1595, "romeo_and_juliet": 1595, "midsummer_nights_dream": 1595,
    "john": 1596, "merchant_of_venice": 1597, "henry_iv_part_1": 1597,
    "merry_wives_of_windsor": 1598, "henry_iv_part_2": 1598, "much_ado_about_nothing": 1599,
    "henry_v": 1599, "julius_caesar": 1599, "as_you_like_it": 1599, "hamlet": 1600,
    "twelfth_night": 1601, "troilus_and_cressida": 1602, "measure_for_measure": 1604,
    "othello": 1604, "alls_well_that_ends_well": 1605, "timon_of_athens": 1606,
    "lear": 1606, "macbeth": 1606, "antony_and_cleopatra": 1606, "pericles": 1608,
    "coriolanus": 1608, "winters_tale": 1610, "cymbeline": 1610, "tempest": 1611,
    "henry_viii": 1613,
}
# Theme -> its words (whole words, any case). Weak labels, as a lexicon gives them.
THEMES = {
    "royalty": "king kings queen crown throne majesty royal prince princes sovereign",
    "love": "love loves loved lover lovers beloved kiss kisses woo sweetheart",
    "death": "death die dies died dead grave kill killed slain murder",
    "religion": "god gods heaven heavens pray prayers soul souls angel holy",
    "war": "war wars sword swords battle soldier soldiers fight arms enemy",
    "night": "night dark darkness moon stars sleep dream dreams",
    "family": "father mother son daughter brother sister child children uncle wife",
    "money": "gold money ducats pay purse wealth rich poor coin debt",
}

_PERSONS = re.compile(r"persons represented|dramatis person", re.I)
_BODY = re.compile(r"^(ACT|SCENE|PROLOGUE|INDUCTION)\b", re.I)
_SPEAKER = re.compile(r"^([A-Z][A-Za-z'\- ]{0,30}\.|[A-Z][A-Z'\- ]{1,30})$")  # "Hor." / "THESEUS"
_NOT_NAMES = {"Don", "Duke", "Earl", "Lady", "Lord", "Master", "Mistress", "Saint", "Sir",
              "Florentine", "Goths", "Greek", "Roman"}  # titles and peoples


@dataclasses.dataclass(frozen=True)
class Speech:
  play: str
  number: int  # the speech's place in its play
  lines: tuple[str, ...]  # stage directions removed

  @property
  def split(self) -> str:
    return "test" if zlib.crc32(f"{self.play}:{self.number}".encode()) % 10 == 0 else "train"


def read_play(path) -> tuple[list[Speech], list[str]]:
  """(speeches, character names) of one Gutenberg play file (latin-1)."""
  play = epath.Path(path).name.removesuffix("_gut.txt")
  lines = readers.read_text(path, "latin-1").splitlines()
  head = next(i for i, l in enumerate(lines) if _PERSONS.search(l))
  body = next(i for i in range(head + 1, len(lines)) if _BODY.match(lines[i].strip()))
  speeches = []
  for block in re.split(r"\n\s*\n", "\n".join(lines[body:])):
    rows = block.strip().splitlines()
    if len(rows) < 2 or not _SPEAKER.match(rows[0].strip()):
      continue
    text = re.sub(r"\[[^\]]*\]", " ", "\n".join(rows[1:]))  # stage directions
    kept = tuple(" ".join(l.split()) for l in text.splitlines() if l.strip())
    if kept:
      speeches.append(Speech(play, len(speeches), kept))
  return speeches, _names(lines[head + 1:body], speeches)


def _names(persons: list[str], speeches: list[Speech]) -> list[str]:
  """First words of the persons list that the speeches always capitalise, mid-line,
  at least 3 times (so "Horatio", not "Ghost" or "King"), titles and peoples left out."""
  words = [l.split(",")[0].split()[0].strip(".:").title() for l in persons if l.strip()]
  text = "\n".join(l for s in speeches for l in s.lines)
  names = []
  for word in sorted({w for w in words if w.isalpha() and len(w) >= 3} - _NOT_NAMES):
    mid = len(re.findall(rf"(?<=[a-z,;:!?'-] ){word}\b", text))
    if mid >= 3 and not re.search(rf"\b{word.lower()}\b", text):
      names.append(word)
  return names


def plays(raw_dir) -> list[tuple[list[Speech], list[str]]]:
  return [read_play(f) for f in sorted(epath.Path(raw_dir).glob("*_gut.txt"))
          if f.name.removesuffix("_gut.txt") in PLAY_YEARS]


def span_rows(speeches: list[Speech], names: list[str], rng) -> list[dict]:
  """Each line naming exactly one character, with its neighbours in the speech, when
  the passage names no one else."""
  if not names:
    return []
  pattern = re.compile(rf"\b({'|'.join(names)})\b")
  rows = []
  for s in speeches:
    for j in range(len(s.lines)):
      context = " ".join(s.lines[max(j - 1, 0): j + 2])
      found = list(pattern.finditer(context))
      if len(found) == 1 and pattern.search(s.lines[j]):
        rows.append({"context": context, "answer": found[0].group(0),
                     "answer_start": found[0].start(), "_split": s.split})
  return rows


def multilabel_rows(speeches: list[Speech], names, rng) -> list[dict]:
  """Speeches of 6+ words (first MAX_WORDS); labels: the THEMES whose words they use
  (a quarter of the speeches without any are kept)."""
  patterns = {theme: re.compile(rf"\b({'|'.join(words.split())})\b", re.I)
              for theme, words in THEMES.items()}
  rows = []
  for s in speeches:
    words = " ".join(s.lines).split()[:MAX_WORDS]
    labels = [t for t, p in patterns.items() if p.search(" ".join(words))]
    if len(words) >= 6 and (labels or rng.random() < 0.25):
      rows.append({"text": " ".join(words), "labels": "|".join(labels), "_split": s.split})
  return rows


def regression_rows(speeches: list[Speech], names, rng) -> list[dict]:
  """Speeches of 8+ words (first MAX_WORDS); target: (year written - 1600) / 10."""
  rows = []
  for s in speeches:
    words = " ".join(s.lines).split()[:MAX_WORDS]
    if len(words) >= 8:
      rows.append({"text": " ".join(words), "target": (PLAY_YEARS[s.play] - 1600) / 10,
                   "_split": s.split})
  return rows


def _line_pairs(speeches: list[Speech], rng, k: int):
  """(line, next line, k other lines of the play from other speeches, all distinct) for
  lines of 3+ words; a pair is skipped when 100 k draws find too few."""
  pool = [(s.number, l) for s in speeches for l in s.lines if len(l.split()) >= 3]
  for s in speeches:
    for a, b in zip(s.lines, s.lines[1:]):
      if len(a.split()) >= 3 and len(b.split()) >= 3:
        others = []
        for _ in range(100 * k):
          number, line = pool[rng.integers(len(pool))]
          if number != s.number and line not in (a, b, *others):
            others.append(line)
            if len(others) == k:
              yield s, a, b, others
              break


def choice_rows(speeches: list[Speech], names, rng, choices: int = 4) -> list[dict]:
  rows = []
  for s, line, following, others in _line_pairs(speeches, rng, choices - 1):
    label = int(rng.integers(choices))
    options = others[:label] + [following] + others[label:]
    rows.append({"text": line, **{f"choice_{i}": o for i, o in enumerate(options)},
                 "label": label, "_split": s.split})
  return rows


def pair_rows(speeches: list[Speech], names, rng) -> list[dict]:
  return [{"text": a, "text_b": b, "negative": others[0], "_split": s.split}
          for s, a, b, others in _line_pairs(speeches, rng, 1)]


def speech_rows(speeches: list[Speech], names, rng) -> list[dict]:
  rows = []
  for s in speeches:
    words = " ".join(s.lines).split()
    if len(words) >= MIN_SPEECH_WORDS:
      rows.append({"text": " ".join(words[:MAX_WORDS]), "_split": s.split})
  return rows


def halves(text: str) -> tuple[str, str]:
  """A text's first half of its words and its second half (the first one shorter when
  the count is odd)."""
  words = text.split()
  return " ".join(words[:len(words) // 2]), " ".join(words[len(words) // 2:])


def halves_rows(speeches: list[Speech], names, rng) -> list[dict]:
  return [{"text": first, "text_b": second, "_split": r["_split"]}
          for r in speech_rows(speeches, names, rng)
          for first, second in [halves(r["text"])]]


ROWS = {"shakespeare_span": span_rows, "shakespeare_multilabel": multilabel_rows,
        "shakespeare_regression": regression_rows, "shakespeare_choice": choice_rows,
        "shakespeare_pairs": pair_rows, "shakespeare_speeches": speech_rows,
        "shakespeare_halves": halves_rows}


def write(name: str, raw_dir, out) -> None:
  """Writes source `name` (train.csv, test.csv; labels.txt for multilabel) into `out`
  from the fetched Shakespeare texts in `raw_dir`."""
  rng = np.random.default_rng(zlib.crc32(name.encode()))
  rows = [r for speeches, names in plays(raw_dir) for r in ROWS[name](speeches, names, rng)]
  out = epath.Path(out)
  for split, cap in (("train", MAX_TRAIN), ("test", MAX_TEST)):
    part = [r for r in rows if r["_split"] == split]
    keep = np.sort(rng.permutation(len(part))[:cap])
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, [k for k in part[0] if k != "_split"], extrasaction="ignore")
    writer.writeheader()
    writer.writerows(part[i] for i in keep)
    (out / f"{split}.csv").write_text(text.getvalue())
  if name == "shakespeare_multilabel":
    (out / "labels.txt").write_text("\n".join(THEMES) + "\n")


def write_retrieval(speeches_csv, out) -> None:
  """The held-out retrieval set `RETRIEVAL` into `out` (BEIR's format) from
  shakespeare_speeches' test.csv: speech i's first half of its words is query `q<i>`, its
  second half document `d<i>` (judged 1), every other second half a distractor."""
  cut = [halves(row["text"]) for row in readers.read_records(speeches_csv)]
  beir.write(out, {f"q{i}": first for i, (first, _) in enumerate(cut)},
             {f"d{i}": second for i, (_, second) in enumerate(cut)},
             {f"q{i}": {f"d{i}": 1} for i in range(len(cut))})
