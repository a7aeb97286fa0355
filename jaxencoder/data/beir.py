"""Retrieval sets in BEIR's format: a folder of

  corpus.jsonl   {"_id": "d1", "title": "...", "text": "..."} a line (title optional)
  queries.jsonl  {"_id": "q1", "text": "..."} a line
  qrels.tsv      a header row `query-id<TAB>corpus-id<TAB>score`, then one judgement a
                 line; score an integer (graded: nDCG's gain; > 0: relevant)

BEIR's own downloads keep the judgements in qrels/test.tsv: read when qrels.tsv is absent.
A document's text is its title and text joined by a space (as BEIR embeds them). Only the
queries with a judgement are read. Errors are one line naming file:line. Local or gs://.
"""

from __future__ import annotations

import dataclasses
import json

from etils import epath

from jaxencoder.data.readers import DataError, json_lines, read_text, where

CORPUS, QUERIES, QRELS = "corpus.jsonl", "queries.jsonl", "qrels.tsv"
BEIR_QRELS = "qrels/test.tsv"  # BEIR's download layout
QRELS_HEADER = ("query-id", "corpus-id", "score")


@dataclasses.dataclass
class RetrievalSet:
  """Queries, a corpus and judgements: qrels[query index] = {corpus index: score}."""
  query_ids: list[str]
  queries: list[str]
  corpus_ids: list[str]
  corpus: list[str]
  qrels: list[dict[int, int]]


def read(folder) -> RetrievalSet:
  """The retrieval set in `folder` (see the module docstring)."""
  folder = epath.Path(folder)
  qrels_path = folder / QRELS
  if not qrels_path.exists() and (folder / BEIR_QRELS).exists():
    qrels_path = folder / BEIR_QRELS
  missing = [p.name for p in (folder / CORPUS, folder / QUERIES, qrels_path) if not p.exists()]
  if missing:
    raise FileNotFoundError(f"{folder}: no {', '.join(missing)}; a retrieval set (BEIR's "
                            f"format) is a folder of {CORPUS}, {QUERIES} and {QRELS}")
  corpus = _jsonl(folder / CORPUS, ("_id", "text"))
  queries = _jsonl(folder / QUERIES, ("_id", "text"))
  judged = _qrels(qrels_path, {r["_id"]: i for i, r in enumerate(queries)},
                  {r["_id"]: i for i, r in enumerate(corpus)})
  kept = sorted(judged)
  return RetrievalSet([queries[q]["_id"] for q in kept], [queries[q]["text"] for q in kept],
                      [r["_id"] for r in corpus],
                      [" ".join(filter(None, (r.get("title", ""), r["text"]))) for r in corpus],
                      [judged[q] for q in kept])


def _jsonl(path, fields: tuple[str, ...]) -> list[dict]:
  """One JSON object a line, each with `fields` (strings) and a new `_id`."""
  rows, seen = [], {}
  for no, row in json_lines(path, fields):
    if row["_id"] in seen:
      raise DataError(f"{where(path, no)}: _id {row['_id']!r} again (first at line "
                      f"{seen[row['_id']]})")
    seen[row["_id"]] = no
    rows.append({**row, "title": row.get("title") or ""})
  if not rows:
    raise DataError(f"{where(path)}: no rows")
  return rows


def _qrels(path, query_index: dict[str, int], corpus_index: dict[str, int]
           ) -> dict[int, dict[int, int]]:
  """{query index: {corpus index: score}} of a qrels file; unknown ids are errors."""
  lines = read_text(path).splitlines()
  if tuple(lines[0].strip().split("\t")) != QRELS_HEADER:
    raise DataError(f"{where(path, 1)}: header {lines[0]!r}; needs "
                    f"{chr(9).join(QRELS_HEADER)!r} (tab-separated)")
  judged: dict[int, dict[int, int]] = {}
  for no, line in enumerate(lines[1:], 2):
    if not line.strip():
      continue
    fields = line.rstrip("\r\n").split("\t")
    if len(fields) != 3:
      raise DataError(f"{where(path, no)}: {len(fields)} tab-separated fields; needs "
                      "query-id, corpus-id, score")
    query, doc, score = fields
    if query not in query_index or doc not in corpus_index:
      what = f"query-id {query!r} is not in {QUERIES}" if query not in query_index else (
          f"corpus-id {doc!r} is not in {CORPUS}")
      raise DataError(f"{where(path, no)}: {what}")
    try:
      judged.setdefault(query_index[query], {})[corpus_index[doc]] = int(score)
    except ValueError:
      raise DataError(f"{where(path, no)}: score {score!r} is not an integer") from None
  if not judged:
    raise DataError(f"{where(path)}: no judgements below the header")
  return judged


def write(folder, queries: dict[str, str], corpus: dict[str, str],
          qrels: dict[str, dict[str, int]]) -> epath.Path:
  """Writes a retrieval set ({id: text} each, qrels {query id: {corpus id: score}})."""
  folder = epath.Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  lines = lambda rows: "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
  (folder / CORPUS).write_text(lines({"_id": i, "title": "", "text": t}
                                     for i, t in corpus.items()))
  (folder / QUERIES).write_text(lines({"_id": i, "text": t} for i, t in queries.items()))
  judgements = [f"{q}\t{d}\t{s}\n" for q, docs in qrels.items() for d, s in docs.items()]
  (folder / QRELS).write_text("\t".join(QRELS_HEADER) + "\n" + "".join(judgements))
  return folder
