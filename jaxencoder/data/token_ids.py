"""Token ids of text examples: stored once by `prepare --tokenizer`, or made per chunk.

A text_corpus prepared with a tokenizer keeps, beside its array_record files, every
example's full encoding ([CLS]/[SEP] included, untruncated) in shards of at most about
SHARD_TOKENS tokens, written while tokenising (memory does not grow with the corpus):

  token_ids/<split>-NNNNN.tokens.bin   int32 [t, 2]  (token id, word index; -1 on specials)
  token_ids/<split>-NNNNN.offsets.bin  int64 [n+1]   example j of the shard is tokens
                                                     [offsets[j], offsets[j+1])
  token_ids/manifest.json              the shards of each split (examples, tokens), the
                                       tokenizer's digest; written last

Examples are in record order, split by split; an example never spans two shards. A
dataset without manifest.json is incomplete (a prepare that stopped half-way) and is
never read. Reading a chunk of rows is two rounds of ranged reads (offsets, then tokens;
`byte_ranges`): local files by pread, gs:// objects by concurrent ranged GETs, so a
reader's memory does not grow with the corpus either; read-ahead threads
(pipeline.Reading.num_threads) share one reader. A run whose tokenizer has another
digest gets a DataError instead of ids from the wrong vocabulary.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import multiprocessing
import os
import re
import types
from collections.abc import Sequence

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from jaxencoder import progress as progress_lib
from jaxencoder.data import readers
from jaxencoder.data.byte_ranges import BlockCache, RangeReader
from jaxencoder.data.readers import DataError, as_text, check_not_empty

log = logging.getLogger("jaxencoder")

DIR = "token_ids"
FINGERPRINT = "fingerprint.json"
MANIFEST = "manifest.json"
FORMAT = 2  # manifest "format": 1 was one ids/words/offsets .npy per split
SHARD_TOKENS = 1 << 25  # tokens per shard (256 MiB of (id, word) pairs), at least one example
SPAWN_MIN_RECORDS = 20_000  # a split of fewer records is tokenised in the calling process
SPAWN_MIN_BYTES = 16 << 20  # text files of fewer bytes in all are tokenised in the caller
TASK_BYTES = 4 << 20  # text per tokenising task (about; from the bytes per record seen)
_ENCODE_BATCH = 1024  # texts per tokenizer call when writing
# texts x the longest one's bytes per tokenizer call when writing: the tokenizer holds
# about 190 bytes per character while it encodes (100 MB a call)
_ENCODE_BYTES = 1 << 19
_OFFSET_BLOCK = 512  # offsets per cached read (4 KiB)
PREFIX_CHARS = 16  # encode_rows first tokenises this many characters per token of seq_len
_WORD_END = re.compile(r"\S(?=\s)")


def tokenizer_digest(tokenizer) -> str:
  """sha256 of the tokenizer's definition (vocab, normaliser, specials, template), without
  its per-call truncation and padding settings."""
  definition = json.loads(tokenizer.hf.to_str())
  definition.pop("truncation", None)
  definition.pop("padding", None)
  return hashlib.sha256(json.dumps(definition, sort_keys=True).encode("utf-8")).hexdigest()


# --- writing ---------------------------------------------------------------------------
def write(dataset_dir, tokenizer, text_key: str = "text", *, processes: int | None = None,
          progress: bool = True) -> None:
  """Tokenises every split of the prepared dataset at `dataset_dir` (local) into
  token_ids/ shards, then writes the manifest. `processes`: tokenising processes
  (default: the cores; a split of few records is tokenised in this one)."""
  info = tfds.builder_from_directory(str(dataset_dir)).info
  out = epath.Path(dataset_dir) / DIR
  out.mkdir(parents=True, exist_ok=True)
  splits = {}
  for split in info.splits:
    total = info.splits[split].num_examples
    writer = _ShardWriter(out, split)
    with _progress(total, f"token ids ({split})", progress) as bar:
      for tokens_Tx2, lengths_N in _encoded(dataset_dir, split, total, tokenizer, text_key,
                                            processes):
        writer.add(tokens_Tx2, lengths_N)
        bar.update(len(lengths_N))
    splits[split] = writer.close()
  _write_manifest(out, tokenizer, splits)


def write_files(dataset_dir, files: dict[str, list], tokenizer, *, unit: str, encoding: str,
                processes: int | None = None, progress: bool = True) -> None:
  """Tokenises text files {split: files} straight into `dataset_dir`'s token_ids/ (local),
  a file per task, in `processes` processes (default: the cores when the files hold at
  least SPAWN_MIN_BYTES); documents as `readers.read_documents(unit, encoding)` reads them,
  in the order of the files. Each task writes its file's shards; the manifest lists them
  in order, last."""
  out = epath.Path(dataset_dir) / DIR
  out.mkdir(parents=True, exist_ok=True)
  tasks = [(str(out), f"{split}-{i:05d}", str(path), unit, encoding)
           for split, paths in files.items() for i, path in enumerate(paths)]
  sizes = [epath.Path(task[2]).stat().length for task in tasks]
  if processes is None:
    processes = 1 if sum(sizes) < SPAWN_MIN_BYTES else min(len(tasks), os.cpu_count() or 1)
  entries = {}
  with _progress(sum(sizes), "token ids", progress, unit="B") as bar:
    for task, size, entry in zip(tasks, sizes, _run(_encode_file, tasks, tokenizer, processes)):
      split = task[1].rsplit("-", 1)[0]
      whole = entries.setdefault(split, {"examples": 0, "tokens": 0, "shards": []})
      for key in ("examples", "tokens", "shards"):
        whole[key] += entry[key]
      bar.update(size)
  _write_manifest(out, tokenizer, entries)


def _write_manifest(out: epath.Path, tokenizer, splits: dict) -> None:
  manifest = {"format": FORMAT, "tokenizer": {"sha256": tokenizer_digest(tokenizer)},
              "splits": splits}
  (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def _run(fn, tasks, tokenizer, processes: int):
  """fn(*task) for each task, in order: in this process, or in `processes` spawned ones
  (a bounded window of tasks in flight)."""
  if processes == 1:
    _init_worker(tokenizer, in_process=True)
    for task in tasks:
      yield fn(*task)
    return
  with multiprocessing.get_context("spawn").Pool(processes, _init_worker, (tokenizer,)) as pool:
    pending = []
    for task in tasks:
      pending.append(pool.apply_async(fn, task))
      if len(pending) >= 2 * processes:
        yield pending.pop(0).get()
    for result in pending:
      yield result.get()


def _encode_file(out: str, name: str, path: str, unit: str, encoding: str) -> dict:
  """Writes the token ids of one text file's documents as shards `name-NNNNN`; their
  manifest entry."""
  writer = _ShardWriter(epath.Path(out), name)
  for group in _text_batches(readers.read_documents(path, unit=unit, encoding=encoding), "text"):
    tokens_Tx2, lengths_N = _encode_group(group, "text")
    writer.add(tokens_Tx2, lengths_N)
  return writer.close()


def _progress(total: int, desc: str, enabled: bool, unit: str = "examples"):
  return progress_lib.bar(total, desc, unit=unit, enabled=enabled)


class _ShardWriter:
  """Appends a split's encoded examples to its shards; a shard is closed once it holds
  SHARD_TOKENS tokens (an example is never cut)."""

  def __init__(self, out: epath.Path, split: str):
    self.out, self.split, self.shards = out, split, []
    self._tokens = self._offsets = None

  def _open(self) -> None:
    self._close_shard()
    name = f"{self.split}-{len(self.shards):05d}"
    self.shards.append({"name": name, "examples": 0, "tokens": 0})
    self._tokens = open(self.out / f"{name}.tokens.bin", "wb")
    self._offsets = open(self.out / f"{name}.offsets.bin", "wb")
    self._offsets.write(np.zeros(1, "<i8").tobytes())

  def add(self, tokens_Tx2: np.ndarray, lengths_N: np.ndarray) -> None:
    ends_N = np.cumsum(lengths_N)
    i = 0
    while i < len(lengths_N):
      if self._tokens is None or self.shards[-1]["tokens"] >= SHARD_TOKENS:
        self._open()
      shard, base = self.shards[-1], int(ends_N[i - 1]) if i else 0
      j = max(i + 1, int(np.searchsorted(ends_N, base + SHARD_TOKENS - shard["tokens"],
                                         side="right")))
      self._tokens.write(np.ascontiguousarray(tokens_Tx2[base:ends_N[j - 1]], "<i4").tobytes())
      self._offsets.write((shard["tokens"] + ends_N[i:j] - base).astype("<i8").tobytes())
      shard["examples"] += j - i
      shard["tokens"] += int(ends_N[j - 1]) - base
      i = j

  def _close_shard(self) -> None:
    for f in (self._tokens, self._offsets):
      if f is not None:
        f.close()

  def close(self) -> dict:
    """The split's manifest entry: its shards and their totals."""
    self._close_shard()
    return {"examples": sum(s["examples"] for s in self.shards),
            "tokens": sum(s["tokens"] for s in self.shards), "shards": self.shards}


def _encoded(dataset_dir, split: str, total: int, tokenizer, text_key: str,
             processes: int | None):
  """(tokens [T, 2], lengths [N]) of the split's records in order, a task at a time; the
  tasks' record counts follow the bytes per record seen (about TASK_BYTES of text each)."""
  if processes is None:  # the cores, for a split worth starting processes for
    processes = 1 if total < SPAWN_MIN_RECORDS else os.cpu_count() or 1
  args = (str(dataset_dir), split, text_key)
  seen = {"records": 0, "bytes": 0}

  def tasks():
    start = 0
    while start < total:
      per_record = seen["bytes"] / seen["records"] if seen["records"] else 0
      size = int(np.clip(TASK_BYTES // per_record if per_record else 1, 1, 16384))
      yield start, min(start + size, total)
      start += size

  def counted(result):
    tokens_Tx2, lengths_N, text_bytes = result
    seen["records"] += len(lengths_N)
    seen["bytes"] += text_bytes
    return tokens_Tx2, lengths_N

  for result in _run(_encode_range, ((*args, a, b) for a, b in tasks()), tokenizer, processes):
    yield counted(result)


_WORKER = {}  # this process's tokenizer and open splits (tokenising processes)


def _init_worker(tokenizer, in_process: bool = False) -> None:
  if not in_process:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the processes use the cores
  _WORKER.clear()
  _WORKER["tokenizer"] = tokenizer


def _encode_range(dataset_dir: str, split: str, text_key: str, start: int,
                  stop: int) -> tuple[np.ndarray, np.ndarray, int]:
  """(tokens [T, 2] int32, lengths [N] int64, text bytes) of records [start, stop)."""
  key = (dataset_dir, split)
  if key not in _WORKER:
    _WORKER[key] = tfds.builder_from_directory(dataset_dir).as_data_source(split=split)
  examples = _WORKER[key].__getitems__(range(start, stop))
  tokens, lengths = [], []
  for group in _text_batches(examples, text_key):
    tokens_Tx2, lengths_N = _encode_group(group, text_key)
    tokens.append(tokens_Tx2)
    lengths.append(lengths_N)
  if not lengths:
    return np.zeros((0, 2), np.int32), np.zeros(0, np.int64), 0
  return (np.concatenate(tokens), np.concatenate(lengths),
          sum(len(ex[text_key]) for ex in examples))


def _encode_group(group: Sequence[dict], text_key: str) -> tuple[np.ndarray, np.ndarray]:
  """(tokens [T, 2] (id, word index; -1 on specials), lengths [N]) of `group`'s texts,
  in one tokenizer call of this worker's tokenizer."""
  encodings = _WORKER["tokenizer"].encodings([as_text(ex[text_key]) for ex in group])
  ids_T = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), np.int32)
  # word indices, None on specials: as floats None is NaN, which becomes -1
  word_T = np.array(list(itertools.chain.from_iterable(e.word_ids for e in encodings)), float)
  words_T = np.where(np.isnan(word_T), -1, word_T).astype(np.int32)
  lengths_N = np.array([len(e.ids) for e in encodings], np.int64)
  _check_words(words_T, lengths_N, group)
  return np.stack([ids_T, words_T], axis=1), lengths_N


def _check_words(words_T: np.ndarray, lengths_G: np.ndarray, group) -> None:
  """A DataError naming the first example of `group` with no word token."""
  has_word_G = np.add.reduceat((words_T >= 0).astype(np.int64),
                               np.concatenate([[0], np.cumsum(lengths_G)[:-1]])) > 0
  if not has_word_G.all():
    check_not_empty(np.full((1, 1), -1), [group[int(np.argmin(has_word_G))]])


def _text_batches(examples: Sequence[dict], text_key: str):
  """`examples` in order, in lists of at most _ENCODE_BATCH whose count times the
  longest text's bytes is at most _ENCODE_BYTES (or one longer text), so that one
  tokenizer call stays bounded."""
  group, longest = [], 0
  for ex in examples:
    size = len(ex[text_key])
    if group and (len(group) == _ENCODE_BATCH
                  or (len(group) + 1) * max(longest, size) > _ENCODE_BYTES):
      yield group
      group, longest = [], 0
    group.append(ex)
    longest = max(longest, size)
  if group:
    yield group


# --- reading ---------------------------------------------------------------------------
class StoredIds:
  """One split's stored token ids; `rows(indices, seq_len, pad_id)` gathers padded rows.

  Reads the manifest on first use and rows by range (a small cache of offset blocks),
  so that pickling it for a worker process copies a path, and memory stays flat.
  """

  def __init__(self, dataset_dir, split: str):
    self.dir, self.split = str(dataset_dir), split
    self._entry, self._reader, self._offsets = None, RangeReader(), BlockCache(4096)

  def __getstate__(self):
    return {"dir": self.dir, "split": self.split, "_entry": self._entry,
            "_reader": RangeReader(), "_offsets": BlockCache(4096)}

  @property
  def entry(self) -> dict:
    """The split's manifest entry, with `first` [S+1]: each shard's first example."""
    if self._entry is None:
      manifest = read_manifest(self.dir)
      if self.split not in manifest["splits"]:
        raise DataError(f"{self.dir}: no stored token ids for split {self.split!r} (has "
                        f"{sorted(manifest['splits'])}): prepare it again with --tokenizer")
      entry = dict(manifest["splits"][self.split])
      entry["first"] = np.cumsum([0] + [s["examples"] for s in entry["shards"]])
      self._entry = entry
    return self._entry

  def __len__(self) -> int:
    return self.entry["examples"]

  def _paths(self, kind: str) -> list[str]:
    """Each shard's `kind` ("tokens" / "offsets") file."""
    key = f"{kind}_paths"
    if key not in self.entry:
      self.entry[key] = [f"{self.dir}/{DIR}/{shard['name']}.{kind}.bin"
                         for shard in self.entry["shards"]]
    return self.entry[key]

  def spans(self, indices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(shard [N], first token [N], end token [N]) of examples `indices`, their token
    ranges within their shard. Offsets are read in blocks of _OFFSET_BLOCK + 1 (block b:
    offsets b * _OFFSET_BLOCK ... + _OFFSET_BLOCK, so an example's two lie in one),
    the last few thousand blocks kept."""
    idx_N = np.asarray(indices, np.int64)
    if len(idx_N) and (idx_N.min() < 0 or idx_N.max() >= len(self)):
      raise IndexError(f"example {idx_N.max()} of {len(self)} ({self.dir}, {self.split})")
    shard_N = np.searchsorted(self.entry["first"], idx_N, side="right") - 1
    local_N = idx_N - self.entry["first"][shard_N]
    keys, key_N = np.unique(shard_N << 32 | local_N // _OFFSET_BLOCK, return_inverse=True)
    blocks = list(zip(*(part.tolist() for part in np.divmod(keys, 1 << 32))))  # (shard, block)
    have = dict(zip(blocks, self._offsets.get_many(blocks)))  # here: other threads evict
    have.update(self._read_offset_blocks([k for k, block in have.items() if block is None]))
    parts = [have[k] for k in blocks]
    base_K = np.cumsum([0] + [len(p) for p in parts[:-1]])
    flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    at_N = base_K[key_N.reshape(-1)] + local_N % _OFFSET_BLOCK
    return shard_N, flat[at_N], flat[at_N + 1]

  def _read_offset_blocks(self, blocks: list[tuple[int, int]]) -> dict:
    """{block: its offsets} read (and cached) for `blocks`."""
    counts = [self.entry["shards"][s]["examples"] + 1 for s, _ in blocks]
    starts = [b * _OFFSET_BLOCK * 8 for _, b in blocks]
    stops = [min((b + 1) * _OFFSET_BLOCK + 1, n) * 8 for (_, b), n in zip(blocks, counts)]
    paths = self._paths("offsets")
    data = self._reader.read_many([paths[s] for s, _ in blocks], starts, stops)
    read = {block: np.frombuffer(raw, "<i8") for block, raw in zip(blocks, data)}
    for block, offsets in read.items():
      self._offsets.put(block, offsets)
    return read

  def rows(self, indices, seq_len: int, pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`input_ids`, `word_ids` [B, seq_len] and lengths [B] of examples `indices`, each
    truncated as the tokenizer truncates one text: its first seq_len - 1 tokens and its
    last (the closing special): one ranged read per row, two for a truncated one (fewer
    where rows lie side by side: byte_ranges.coalesce)."""
    shard_B, start_B, end_B = self.spans(indices)
    lengths_B = np.minimum(end_B - start_B, seq_len)
    cut_B = end_B - start_B > seq_len
    rows_P = np.concatenate([np.arange(len(shard_B)), np.flatnonzero(cut_B)])  # pieces
    starts_P = np.concatenate([start_B, end_B[cut_B] - 1])
    stops_P = np.concatenate([start_B + lengths_B - cut_B, end_B[cut_B]])
    order = np.argsort(rows_P, kind="stable")  # a row's head, then its last token
    paths = self._paths("tokens")
    data = self._reader.read_many([paths[s] for s in shard_B[rows_P[order]].tolist()],
                                  (starts_P[order] * 8).tolist(), (stops_P[order] * 8).tolist())
    tokens_Tx2 = np.frombuffer(b"".join(data), "<i4").reshape(-1, 2)
    row_T = np.repeat(np.arange(len(shard_B)), lengths_B)
    col_T = np.arange(len(row_T)) - np.repeat(np.cumsum(lengths_B) - lengths_B, lengths_B)
    ids_BxL = np.full((len(shard_B), seq_len), pad_id, np.int32)
    words_BxL = np.full((len(shard_B), seq_len), -1, np.int32)
    ids_BxL[row_T, col_T], words_BxL[row_T, col_T] = tokens_Tx2[:, 0], tokens_Tx2[:, 1]
    return ids_BxL, words_BxL, lengths_B


class IdsOnly:
  """A split of a text corpus prepared with --ids-only, as a source: its length and
  stored ids (`stored` finds them); no texts to read."""

  def __init__(self, dataset_dir, split: str):
    self.dataset_info = types.SimpleNamespace(data_dir=str(dataset_dir))
    self.split = split
    self._ids = StoredIds(dataset_dir, split)

  def __len__(self) -> int:
    return len(self._ids)

  def __getitem__(self, i):
    raise DataError(f"{self.dataset_info.data_dir} holds token ids only (prepared with "
                    "--ids-only): this reads the texts; prepare it without --ids-only")

  __getitems__ = __getitem__


def read_manifest(dataset_dir) -> dict:
  """token_ids/manifest.json of a prepared dataset; a DataError when it is missing (the
  ids are incomplete: a prepare stopped half-way) or of another format."""
  path = epath.Path(str(dataset_dir)) / DIR / MANIFEST
  if not path.exists():
    raise DataError(f"{dataset_dir}: its token ids are incomplete ({path} is missing: a "
                    "prepare stopped half-way, or an older jaxencoder wrote them); prepare "
                    "it again with --tokenizer")
  manifest = json.loads(path.read_text())
  if manifest.get("format") != FORMAT:
    raise DataError(f"{path}: token ids in format {manifest.get('format')}, this jaxencoder "
                    f"reads format {FORMAT}: prepare it again with --tokenizer")
  return manifest


def is_complete(dataset_dir) -> bool:
  """Whether the dataset's token ids are complete and in this jaxencoder's format."""
  try:
    read_manifest(dataset_dir)
    return True
  except (DataError, ValueError):
    return False


def stored(source, tokenizer) -> tuple[StoredIds, object] | None:
  """(the stored ids behind `source`, `records(i_N)`: the record index of its examples
  i_N, None for all in order); None when `source` stores no ids; ids made by another
  tokenizer are a DataError. `source` is a prepared split, or a view with `.source` and
  `.records(i_N)` (data/splits.py's held-out views)."""
  views = []
  while not hasattr(source, "dataset_info") and hasattr(source, "source"):
    views.append(source)
    source = source.source
  info = getattr(source, "dataset_info", None)
  data_dir = getattr(info, "data_dir", None)
  if data_dir is None or not (epath.Path(data_dir) / FINGERPRINT).exists():
    return None
  made_by = json.loads((epath.Path(data_dir) / FINGERPRINT).read_text()).get("tokenizer")
  if made_by is None:
    return None
  if made_by["sha256"] != tokenizer_digest(tokenizer):
    raise DataError(f"{data_dir} stores token ids made by the tokenizer {made_by['path']} "
                    f"(sha256 {made_by['sha256'][:12]}), not by this run's (sha256 "
                    f"{tokenizer_digest(tokenizer)[:12]}): prepare it again with this "
                    "tokenizer (--tokenizer), or set data.tokenizer to that one")
  read_manifest(data_dir)  # complete, and in this format
  if not views:
    return StoredIds(data_dir, str(source.split)), None

  def records(i_N):
    for view in views:  # the outermost view first
      i_N = view.records(np.asarray(i_N, np.int64))
    return i_N

  return StoredIds(data_dir, str(source.split)), records


# --- tokenising per chunk (no stored ids) ---------------------------------------------
def encode_rows(examples: Sequence[dict], tokenizer, seq_len: int,
                text_key: str = "text") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """`input_ids`, `word_ids` [B, seq_len] (pad id / -1 after each row's end) and lengths
  [B] of `examples`' texts, in batched tokenizer calls.

  A text is tokenised from its first PREFIX_CHARS x seq_len characters, cut where a
  whitespace run starts, and from 16 times more while its tokens do not fill seq_len and
  there is more: the rows are those of the whole texts, and a call holds about
  B x PREFIX_CHARS x seq_len characters for texts of any length.
  """
  texts = [as_text(ex[text_key]) for ex in examples]
  rows = {k: np.zeros((len(texts), seq_len), np.int32) for k in ("input_ids", "word_ids")}
  lengths_B = np.zeros(len(texts), np.int64)
  todo, limit = np.arange(len(texts)), PREFIX_CHARS * seq_len
  while len(todo):
    cut = [_prefix(texts[i], limit) for i in todo]
    batch = tokenizer.encode_batch(cut, max_length=seq_len, pad_to=seq_len)
    for k in rows:
      rows[k][todo] = batch[k]
    lengths_B[todo] = batch["attention_mask"].sum(axis=1)
    more = np.array([len(c) < len(texts[i]) for c, i in zip(cut, todo)], bool)
    todo, limit = todo[more & (lengths_B[todo] < seq_len)], limit * 16
  check_not_empty(rows["word_ids"], examples)
  return rows["input_ids"], rows["word_ids"], lengths_B


def _prefix(text: str, limit: int) -> str:
  """`text` up to the first whitespace run that starts at or after `limit` characters
  (whole if there is none): it tokenises as the whole text's first tokens."""
  if len(text) <= limit:
    return text
  end = _WORD_END.search(text, max(limit - 1, 0))
  return text[:end.end()] if end else text
