"""The training loop: `train_and_evaluate(config, workdir)`, importable from notebooks.

Resumes automatically from the latest checkpoint of the run directory (state,
data-iterator position and step), so rerunning a command continues it. The
workdir may be local or `gs://bucket/path` (see jaxencoder.io.run_dir).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxencoder import progress
from jaxencoder.model import lora
from jaxencoder.data import kinds, packing
from jaxencoder.model.encoder import ENCODER
from jaxencoder.train import distributed, embedding_evals, finished, provenance
from jaxencoder.train.early_stopping import Patience, replayed
from jaxencoder.train.compilation_cache import use_compilation_cache
from jaxencoder.train import sharding as sharding_lib
from jaxencoder.train import steps
from jaxencoder.io.checkpoint import Checkpointer
from jaxencoder.io import run_lock, run_record
from jaxencoder.io.run_dir import RunDir
from jaxencoder.tasks.base import Task
from jaxencoder.tasks.registry import task_from_config
from jaxencoder.tokenizer import check_fits
from jaxencoder.train.metrics import MetricWriter, throughput, train_line
from jaxencoder.train.optim import make_optimizer, trainable_mask
from jaxencoder.train.parallel import GradientOptions, make_stepper
from jaxencoder.train.datasets import Pipelines, make_pipelines, tokenizer_path
from jaxencoder.train.prefetch import DevicePrefetch
from jaxencoder.train import out_of_memory as oom
from jaxencoder.train.stop import Preempted, StopSignals
from jaxencoder.train.config import check_batches, encoder_config, rng_key
from jaxencoder.train.init_from import finalized, restore_base
from jaxencoder.train.resume import check_before_restoring, check_config_unchanged

log = logging.getLogger("jaxencoder")


class NonFiniteLossError(FloatingPointError):
  """The loss or gradient became NaN/Inf; no checkpoint of that state was written."""


@dataclasses.dataclass
class Run:
  """Everything a training run holds between steps."""
  config: ml_collections.ConfigDict
  run_dir: RunDir
  task: Task
  pipelines: Pipelines
  mesh: Any
  rules: Any
  tx: Any
  schedule: Any
  shardings: steps.TrainState
  checkpointer: Checkpointer
  writer: MetricWriter
  state: steps.TrainState = None
  train_iter: Any = None
  patience: Patience = None  # evals without a better best_metric (early stopping)
  embedding_evals: Any = None  # eval_retrieval / eval_sts's Evaluators (None: neither)
  timings: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds, for the log


def build_task(config, pipelines: Pipelines) -> Task:
  """The config's task; ValueError when the data's tokenizer does not fit the model."""
  cfg = encoder_config(config)
  if pipelines.tokenizer is not None:
    check_fits(pipelines.tokenizer, cfg, f"data.tokenizer={tokenizer_path(config.data)}")
  return task_from_config(config, cfg, num_classes=pipelines.num_classes or config.num_classes)


def peek(iterator) -> dict[str, np.ndarray]:
  """The next element of a grain iterator, without consuming it."""
  saved = iterator.get_state()
  element = next(iterator)
  iterator.set_state(saved)
  return element


PACKING_BATCHES = 8  # the train batches whose fill a packed run logs at its start


def log_packing(data, iterator) -> None:
  """Logs the packing efficiency (real tokens / slots) of the first PACKING_BATCHES
  batches of a packed text run (data.packing not "pad"); the iterator stays put."""
  if not kinds.kind_of(data.kind).corpus or data.packing == "pad":
    return
  saved = iterator.get_state()
  mask = np.concatenate([next(iterator)["attention_mask"] for _ in range(PACKING_BATCHES)])
  iterator.set_state(saved)
  log.info("packing: %s, efficiency %.3f over %d rows (L=%d)", data.packing,
           packing.padding_efficiency(mask), mask.size // mask.shape[-1], mask.shape[-1])


def setup(config: ml_collections.ConfigDict, workdir, *, read_only: bool = False) -> Run:
  """Builds data, model, optimizer, mesh and checkpointer; restores or initialises state.
  `read_only`: writes nothing to the workdir (no metrics, no renamed damaged steps)."""
  run_dir = RunDir(workdir)
  steps_saved = run_dir.steps()
  newest = steps_saved[-1] if steps_saved else None
  # Before any array or dataset is read: a changed model is refused in one line.
  checked = check_before_restoring(run_dir, config, steps_saved)
  record = run_record.read(run_dir.path) if newest is not None else None
  pipelines = make_pipelines(config, provenance.tokenizer_file(run_dir, config, record))
  task = build_task(config, pipelines)
  train_iter = iter(pipelines.train)
  example = peek(train_iter)  # the data read (a damaged file fails here, nothing written)
  log_packing(config.data, train_iter)
  writes = jax.process_index() == 0 and not read_only
  data_changed = provenance.settle(run_dir, config, pipelines, record, step=newest,
                                   writes=writes)
  mesh = sharding_lib.make_mesh(config.mesh_shape)
  rules = sharding_lib.rules_from_config(config.logical_axis_rules)
  boxed = steps.boxed_param_shapes(task, example)  # the one trace of the model's init
  tx, schedule = make_optimizer(config.optim, steps.param_shapes(task, example, boxed=boxed),
                                num_layers=config.model.num_layers)
  checkpointer = run_dir.checkpointer(
      save_interval_steps=config.checkpoint_every,
      max_to_keep=config.keep_checkpoints, keep_every=config.keep_every_steps,
      best_metric=f"eval_{config.best_metric}",
      best_mode=task.metric_mode(config.best_metric), read_only=read_only)
  run = Run(config, run_dir, task, pipelines, mesh, rules, tx, schedule,
            steps.state_shardings(task, tx, example, mesh, rules, boxed=boxed), checkpointer,
            writer=None, train_iter=train_iter,
            embedding_evals=embedding_evals.from_config(config))
  started = time.perf_counter()
  run.state = restore_or_init(run, example, boxed, evaluating=read_only, checked=checked)
  run.timings["state_init_s"] = time.perf_counter() - started
  if writes:  # metrics past the restored step were never made durable
    run_dir.drop_metrics_after(int(run.state.step))
  run.writer = MetricWriter(run_dir.path, enabled=writes)
  if data_changed:
    run.writer.write(int(run.state.step), "data_changed", data_changed)
  return run


def restore_or_init(run: Run, example, boxed=None, *, evaluating: bool = False,
                    checked: int | None = None) -> steps.TrainState:
  """The newest restorable checkpoint (state + data position), else fresh params
  (+ init_from), ready on the devices. `boxed`: the params' boxed shapes, if known.
  `evaluating`: for an eval-only look at the run (logged as such, not as a resume).
  `checked`: the step whose config the caller compared with run.config already."""
  config, shows = run.config, shows_progress(run.config)
  latest = run.checkpointer.latest_step()
  if latest is not None:
    abstract = steps.abstract_state(run.task, run.tx, example, run.mesh, run.rules,
                                    shardings=run.shardings, boxed=boxed)
    with progress.phase(f"restoring step {latest}", enabled=shows):
      step, state, data_state, saved = run.checkpointer.restore_newest(abstract_state=abstract)
      state = jax.block_until_ready(state)
    if step != checked:  # an older step than the one compared: its own config
      check_config_unchanged(run.run_dir, config, saved)
    restore_data_position(run.train_iter, data_state, step, run.pipelines.train_workers)
    log.info("%s step %d (%s)", "evaluating" if evaluating else "resumed from", step,
             run.checkpointer.directory / str(step))
    return state
  log.info("%s in %s", "no checkpoint: evaluating fresh params" if evaluating else "fresh run",
           run.run_dir.path)
  with progress.phase("initialising the model state", enabled=shows):
    state = steps.init_state(run.task, run.tx, example, jax.random.key(config.seed),
                             run.mesh, run.rules, shardings=run.shardings)
    if config.init_from:
      state = load_encoder(state, config.init_from, run.shardings, config.task)
    return jax.block_until_ready(state)


def shows_progress(config: ml_collections.ConfigDict) -> bool:
  """Progress bars and phase lines: with config.progress_bar, on process 0 only."""
  return bool(config.progress_bar) and jax.process_index() == 0


# The layout of the saved iterator states: 2 = batches as a random-access dataset
# (data/pipeline.py), read by `workers` processes. States of another layout, worker
# count or process count do not apply; the batches do not depend on them.
DATA_STATE_LAYOUT = 2


def data_position(iterator, workers: int = 0) -> dict[str, Any]:
  """Every process's iterator state (gathered), for the checkpoint."""
  return {"process_count": jax.process_count(), "layout": DATA_STATE_LAYOUT,
          "workers": workers, "states": distributed.gather_json(iterator.get_state())}


def restore_data_position(iterator, data_state, step: int, workers: int = 0) -> None:
  """Restores this process's iterator state; where the saved states do not apply (another
  process count, worker count or pipeline layout), skips the `step` batches already
  consumed instead."""
  data_state = data_state or {}
  saved = (data_state.get("process_count"), data_state.get("layout"), data_state.get("workers"))
  if saved == (jax.process_count(), DATA_STATE_LAYOUT, workers):
    iterator.set_state(data_state["states"][jax.process_index()])
    return
  log.warning("data position saved with %s processes, %s workers, layout %s; running with %d, "
              "%d, %d: skipping %d batches", *saved, jax.process_count(), workers,
              DATA_STATE_LAYOUT, step)
  for _ in range(step):
    next(iterator)


def load_encoder(state: steps.TrainState, init_from: str, shardings,
                 task: str | None = None) -> steps.TrainState:
  """Replaces the encoder params with those of another run's latest checkpoint (LoRA
  adapters, if the model has them, stay fresh). A source trained on the same `task`
  (continued pretraining, a context extension) brings its heads too, where their shapes
  match; other heads start fresh."""
  source = RunDir.open(init_from)
  base, adapters = lora.split(state.params[ENCODER])
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          base, lora.split(shardings.params[ENCODER])[0])
  try:
    encoder = restore_base(source, abstract)
  except ValueError as e:
    raise ValueError(f"init_from={init_from}: {e}") from None
  log.info("loaded encoder params from %s (step %d)", source.path, source.default_step())
  params = {**state.params, ENCODER: lora.join(encoder, adapters)}
  if task is not None and source.read_config().get("task") == task:
    params.update(_same_task_heads(source, state.params, shardings.params))
  return state.replace(params=params)


def _same_task_heads(source: RunDir, params, shardings) -> dict[str, Any]:
  """The source's params of each head this model has (same name and shapes)."""
  heads = {}
  for name in sorted((source.param_names() & set(params)) - {ENCODER}):
    abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            params[name], shardings[name])
    try:
      heads[name] = source.restore_subtree(abstract, name)
    except ValueError as e:  # another shape (e.g. a vocabulary): the head starts fresh
      log.warning("init_from: head %r not loaded (%s); it starts fresh", name,
                  str(e).splitlines()[0])
      continue
    log.info("loaded head %r from %s (same task)", name, source.path)
  return heads


def evaluate(run: Run, eval_step, signals: StopSignals | None = None, *,
             make_batches=None) -> dict[str, float] | None:
  """Deterministic metrics over the whole eval split (or `make_batches()`'s), the eval
  split's with eval_retrieval / eval_sts's too; None if a stop signal cut it short."""
  totals = batch = None
  compiled = lambda: eval_step.lower(run.state.params, batch).compile()  # noqa: E731
  with steps.mesh_context(run.mesh, run.rules), oom.named(_out_of_memory(run, "eval", compiled)):
    for host_batch in (make_batches or run.pipelines.make_eval)():
      if signals is not None and signals.requested():
        return None
      batch = sharding_lib.put_batch(host_batch, run.mesh)
      sums = eval_step(run.state.params, batch)
      totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    if totals is None:
      raise ValueError("the eval split is empty")
    metrics = run.task.summarize(jax.device_get(totals))
  if make_batches is None and run.embedding_evals:  # the eval split's row: eval_retrieval, ...
    metrics.update(run.embedding_evals(embedding_evals.embedder(
        run.config, encoder_config(run.config), run.state.params, run.pipelines.tokenizer)))
  return metrics


def check_finite(state: steps.TrainState) -> None:
  bad_step = int(state.nonfinite_step)
  if bad_step >= 0:
    raise NonFiniteLossError(f"loss or gradient became NaN/Inf at step {bad_step + 1}; "
                             "stopped without saving that state")


def save(run: Run, eval_metrics: dict[str, float] | None, *, force: bool = False) -> None:
  check_finite(run.state)
  step = int(run.state.step)
  metrics = {f"eval_{k}": v for k, v in eval_metrics.items()} if eval_metrics else None
  started = time.perf_counter()
  position = data_position(run.train_iter, run.pipelines.train_workers)
  if run.checkpointer.save(step, run.state, data_state=position,
                           config=run.config.to_dict(), metrics=metrics, force=force):
    log.info("checkpoint step %d: %.1f s, finishing in the background", step,
             time.perf_counter() - started)


def train_and_evaluate(config: ml_collections.ConfigDict,
                       workdir) -> dict[str, float]:
  """Trains per `config` in `workdir` (resuming if it holds checkpoints); final eval metrics.

  SIGTERM / SIGINT save the latest finished step and raise `Preempted` (see train/stop.py).
  One trainer per workdir: another one holding it raises run_lock.RunDirLockedError.
  """
  started = time.perf_counter()
  config = finalized(config, workdir)
  sharding_lib.use_cpu_devices(config.cpu_devices)
  check_batches(config, jax.device_count())  # before the lock writes anything
  use_compilation_cache(config.compilation_cache_dir)
  lock = run_lock.hold(workdir, config.lock_timeout_s, leader=jax.process_index() == 0,
                       share=lambda refusal: distributed.gather_json(refusal)[0])
  # The lock is let go first: a run that failed before its first checkpoint leaves no
  # directory behind (finished.removed_if_unfinished).
  with finished.removed_if_unfinished(workdir, enabled=jax.process_index() == 0), lock:
    run_dir = RunDir(workdir)
    done = finished.done_line(config, run_dir)
    if done is not None:  # a rerun of a finished run: nothing compiled or evaluated
      check_before_restoring(run_dir, config, run_dir.steps())  # a changed model: refused
      log.info("%s", done)
      return finished.recorded_metrics(run_dir, run_dir.latest_step())
    return _train_and_test(config, workdir, started)


def _train_and_test(config: ml_collections.ConfigDict, workdir, started: float
                    ) -> dict[str, float]:
  """train_and_evaluate's run, under its lock."""
  with StopSignals() as signals:
    run = setup(config, workdir)
    run.timings["setup_s"] = time.perf_counter() - started
    try:
      metrics = _train(run, signals)
      if config.load_best_at_end:
        metrics = load_best(run)
      elif jax.process_index() == 0:
        run.run_dir.record_best(None)  # readers take the latest step
      if run.pipelines.make_test is not None:
        metrics = {**metrics, **test_best(run)}
    finally:
      run.checkpointer.wait()
      last = run.checkpointer.latest_step()
      run.checkpointer.close()
      run.writer.close()
  log.info("done at step %s: checkpoints in %s, metrics in %s, TensorBoard events in %s",
           last, run.checkpointer.directory, run.run_dir.metrics_file,
           run.run_dir.tensorboard_dir)
  return metrics


def test_best(run: Run) -> dict[str, float]:
  """`data.test_split`'s metrics (keys `test_*`) of the checkpoint kept as best on the eval
  split (`best_metric`; the newest without one): the split that picks the checkpoint is not
  the one reported."""
  step = _restore_best(run)
  metrics = evaluate(run, steps.jit_eval_step(run.task, run.shardings, run.mesh),
                     make_batches=run.pipelines.make_test)
  run.writer.write(step, "test", metrics)
  log.info("test split %r with step %d (best eval %s): %s", run.config.data.test_split, step,
           run.config.best_metric, _fmt(metrics))
  return {f"test_{k}": v for k, v in metrics.items()}


def _best_step(run: Run) -> int:
  """The step best on best_metric: the first eval to reach the best value (as early
  stopping counts) while it is saved, else the checkpointer's (retention keeps the
  latest of equal values), else the newest."""
  run.checkpointer.wait()
  first = run.patience.best_step if run.patience is not None else None
  if first is not None and first in run.checkpointer.all_steps():
    return first
  return run.checkpointer.best_step() or run.checkpointer.latest_step()


def _restore_best(run: Run) -> int:
  """Restores into run.state the checkpoint best on best_metric (the newest without one);
  its step."""
  step = _best_step(run)
  if step != int(run.state.step):  # the final state gives the shapes and shardings
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                            run.state)
    run.state = run.checkpointer.restore(step, abstract_state=abstract, with_data=False)[0]
  return step


def load_best(run: Run) -> dict[str, float]:
  """load_best_at_end: the eval metrics of the checkpoint best on best_metric, evaluated
  again; recorded in best.json, so predict, convert and export take that step too."""
  step = _restore_best(run)
  metrics = evaluate(run, steps.jit_eval_step(run.task, run.shardings, run.mesh))
  name = run.config.best_metric
  log.info("load_best_at_end: step %d, best on eval %s (%.4g), for the final eval, test, "
           "predict and convert", step, name, metrics[name])
  if jax.process_index() == 0:
    run.run_dir.record_best(step, f"eval_{name}", float(metrics[name]))
  return metrics


def evaluate_run(config: ml_collections.ConfigDict | None, workdir) -> dict[str, float]:
  """Eval-only: the eval metrics of a run's newest restorable checkpoint (nothing written).
  `config` None: the config stored with the run."""
  source = RunDir.open(workdir)
  if config is None:
    config = ml_collections.ConfigDict(source.read_config())
    config.init_from = ""  # the run's own checkpoint holds the weights
  config = finalized(config, workdir)
  sharding_lib.use_cpu_devices(config.cpu_devices)
  check_batches(config, jax.device_count(), train=False)
  use_compilation_cache(config.compilation_cache_dir)
  run = setup(config, workdir, read_only=True)  # no lock: a trainer may hold it
  try:
    eval_step = steps.jit_eval_step(run.task, run.shardings, run.mesh)
    metrics = evaluate(run, eval_step)
  finally:
    run.checkpointer.close()
    run.writer.close()
  log.info("step %d eval %s", int(run.state.step), _fmt(metrics))
  return metrics


def _stop(run: Run, signals: StopSignals) -> Preempted:
  """Waits for pending saves; the exception that names the durable step."""
  run.checkpointer.wait()
  return Preempted(signals.received, run.checkpointer.latest_step(), run.checkpointer.directory)


def _diverged(run: Run, error: NonFiniteLossError) -> NonFiniteLossError:
  """`error` with the last durable step and what to change before resuming from it."""
  optim = run.config.optim
  return NonFiniteLossError(
      f"{error}; {_durable(run)}; lower optim.learning_rate (now {optim.learning_rate}) or "
      f"optim.grad_clip_norm (now {optim.grad_clip_norm}) and rerun with the same --workdir")


def _durable(run: Run) -> str:
  """Which step is the last durable one (pending saves waited for)."""
  run.checkpointer.wait()
  durable = run.checkpointer.latest_step()
  return (f"step {durable} in {run.checkpointer.directory} is the last durable one"
          if durable is not None else "no step was saved")


def _out_of_memory(run: Run, step: str, compiled):
  """oom.named's line for the `step` (train | eval) of this run; `compiled()`: the step
  compiled. A train step's names the last durable step too (an eval's step is saved)."""
  def line(error: Exception) -> str:
    fixed = run.state if step == "train" else run.state.params
    text = oom.describe(step, error, run.config, fixed, compiled)
    if step != "train":
      return text
    return f"{text}; {_durable(run)}"  # a resume may split the rows: batch_size x accum kept
  return line


def _train(run: Run, signals: StopSignals) -> dict[str, float]:
  config, shows = run.config, shows_progress(run.config)
  stepper = None
  named = _out_of_memory(run, "train", lambda: stepper and stepper.compiled)
  with oom.named(named), progress.phase("compiling the train step", enabled=shows):
    grads = GradientOptions(micro_batches=config.optim.grad_accum_steps,
                            trainable=trainable_mask(run.state.params, config.optim))
    stepper = make_stepper(config.parallelism, run.task, run.tx, rng_key(config, 1),
                           run.shardings, run.mesh, run.rules, run.state, peek(run.train_iter),
                           grads)
  eval_step = steps.jit_eval_step(run.task, run.shardings, run.mesh)
  start = int(run.state.step)
  run.patience = _patience(run, start)
  startup = _log_startup(run, stepper, resumed=start > 0)
  # Counts finished steps. A log file gets one line per interval: the log's own, or where
  # INFO is not shown (a notebook), the bar's plain line.
  bar = progress.bar(config.num_train_steps, "train", unit="step", initial=start,
                     every=config.log_every, enabled=shows and start < config.num_train_steps,
                     lines=not log.isEnabledFor(logging.INFO), seconds_per_item=True)
  # A thread reads batches ahead; checkpoints record the position of the next unconsumed one.
  prefetched = run.train_iter = DevicePrefetch(run.train_iter, stepper.put)
  try:
    with bar, oom.named(named):
      eval_metrics = _steps(run, signals, stepper, eval_step, startup, bar, prefetched)
    check_finite(run.state)
  except NonFiniteLossError as e:
    raise _diverged(run, e) from None
  finally:
    prefetched.close()
  if signals.should_stop(int(run.state.step)):
    raise _stop(run, signals)
  if not eval_metrics:  # e.g. rerun of a finished run: report the final state
    eval_metrics = evaluate(run, eval_step, signals)
    if eval_metrics is None:
      raise _stop(run, signals)
  return eval_metrics


def _steps(run: Run, signals: StopSignals, stepper, eval_step, startup, bar,
           prefetched: DevicePrefetch) -> dict[str, float]:
  """The train steps from run.state's step on; the last eval's metrics ({} if none).
  The stepper holds the state while steps run; run.state takes it to log, eval, save.
  `bar` counts finished steps only: a step whose results were waited for."""
  config, start = run.config, int(run.state.step)
  eval_metrics: dict[str, float] = {}
  window, tick, sums, done = [], time.perf_counter(), None, start
  patience = run.patience or Patience("loss", "min")  # None: never stops
  if patience.exhausted:  # stopped early before this resume
    log.info("stopped early at step %d: %s", start, patience.reason())
    return eval_metrics
  for step in range(start, config.num_train_steps):
    if jax.process_count() == 1:
      run.checkpointer.check()  # a save that failed for lack of space stops the run now
    host_batch, batch = next(prefetched)
    previous, sums = sums, stepper.step(batch)
    # One step queued behind the running one, no more: dispatch runs ahead otherwise, and a
    # signal would stop (and save) several steps past the one running when it came.
    jax.block_until_ready(previous)
    _count_finished(bar, step)  # every step before this one
    window.append(sums)
    done = step + 1
    stop = signals.should_stop(done)
    at_end = done == config.num_train_steps
    log_now = done % config.log_every == 0 or at_end
    eval_now = (done % config.eval_every == 0 or at_end) and not stop
    save_now = done % config.checkpoint_every == 0 or at_end or stop
    if log_now or eval_now or save_now:
      run.state = stepper.state
    if log_now:
      tick = _log_train(run, window, done, tick, host_batch, stepper.flops, bar,
                        prefetched.take_wait_seconds())
      window = []
      _count_finished(bar, done)  # its metrics were read back
      if startup:  # once per process start, after the first train row
        run.writer.write(start + 1, "startup", startup)
        startup = None
    if eval_now:
      eval_metrics = _evaluate_durably(run, eval_step, signals)
      if eval_metrics is None:  # a signal during eval: save this step without its metrics
        stop = save_now = True
      else:
        run.writer.write(done, "eval", eval_metrics)
        log.info("step %d eval %s", done, _fmt(eval_metrics))
        patience.update(done, eval_metrics)
        at_end = at_end or patience.exhausted  # early stopping: this step is the last
        save_now = save_now or at_end
    if save_now:
      save(run, eval_metrics if eval_now and not stop else None, force=at_end or stop)
    if stop or signals.requested():
      if not save_now:  # a signal during logging or saving: save this step too
        run.state = stepper.state
        save(run, None, force=True)
      raise _stop(run, signals)
    if at_end and done < config.num_train_steps:
      log.info("early stopping at step %d of %d: %s", done, config.num_train_steps,
               patience.reason())
      break
  jax.block_until_ready(sums)
  _count_finished(bar, done)
  return eval_metrics


def _patience(run: Run, start: int) -> Patience:
  """The early-stopping count at step `start`, replayed from the run's eval rows
  (process 0 reads them; every process takes its count)."""
  metric = run.config.best_metric
  patience = Patience(metric, run.task.metric_mode(metric), run.config.early_stopping_patience)
  if jax.process_index() == 0:
    replayed(run.run_dir.read_metrics(), patience, start)
  shared = distributed.gather_json(dataclasses.asdict(patience))[0]
  return Patience(**shared)


def _evaluate_durably(run: Run, eval_step, signals: StopSignals) -> dict[str, float] | None:
  """evaluate() at run.state's step; if it raises (e.g. a batch that does not fit, an
  eval_batch_size raised on resume), that step is saved first, so the steps trained since
  the last save are kept, and the error's line says so."""
  jax.block_until_ready(run.state)  # a failed train step is the train step's, not eval's
  try:
    return evaluate(run, eval_step, signals)
  except Exception as e:
    kept = _saved_after(run, e)
    if kept is e:
      raise
    raise kept from e


def _saved_after(run: Run, error: Exception) -> Exception:
  """`error` once run.state's step is saved (no eval metrics) and durable, its line
  saying so; `error` itself where the state cannot be saved or the line not extended."""
  step = int(run.state.step)
  try:
    save(run, None, force=True)
    run.checkpointer.wait()
  except Exception as e:  # NaN, a full disk: the eval's error stands
    log.warning("step %d not saved after its eval failed: %s", step, e)
    return error
  saved = (f"step {step} is saved in {run.checkpointer.directory}: rerun with the same "
           "--workdir to continue from it")
  if len(error.args) == 1 and isinstance(error.args[0], str):
    with contextlib.suppress(Exception):  # a type that takes other arguments
      return type(error)(f"{error.args[0]}; {saved}")
  log.warning("the eval at step %d failed; %s", step, saved)
  return error


def _count_finished(bar: progress.Progress, steps_done: int) -> None:
  """Advances `bar` to `steps_done` finished steps (never back)."""
  if steps_done > bar.n:
    bar.update(steps_done - bar.n)


def _log_startup(run: Run, stepper, resumed: bool) -> dict[str, float]:
  """Logs the seconds to a ready state and to compile the train step; the same values
  for metrics.jsonl (split "startup", written with the first train row)."""
  times = {**run.timings, "compile_s": stepper.compile_seconds,
           "trace_s": stepper.trace_seconds}
  log.info("setup %.1f s (state %s %.1f s), first step compiled in %.1f s (tracing %.1f s)",
           times["setup_s"], "restore" if resumed else "init", times["state_init_s"],
           times["compile_s"], times["trace_s"])
  return times


def _log_train(run: Run, window, done: int, tick: float, batch, flops, bar,
               input_wait_s: float) -> float:
  """Writes the mean train metrics of the last window, throughput and the fraction of the
  window's time the loop waited for input batches; returns a new tick."""
  check_finite(run.state)
  host = jax.device_get(window)
  now = time.perf_counter()
  sums = {k: np.sum([w[k] for w in host], axis=0) for k in host[0]
          if k not in ("grad_norm", "loss")}  # every metric of the window, as eval's
  values = run.task.summarize(sums)
  values["grad_norm"] = float(np.mean([w["grad_norm"] for w in host]))
  values["learning_rate"] = float(run.schedule(done - 1))  # what update `done` applied
  mask = batch.get("attention_mask")  # this process's rows of the global batch
  tokens = int(np.prod(mask.shape)) * jax.process_count() if mask is not None else 0
  examples = int(next(iter(batch.values())).shape[0]) * jax.process_count()
  values.update(throughput((now - tick) / len(window), tokens, examples, flops,
                           jax.device_count()))
  values["input_wait_fraction"] = input_wait_s / max(now - tick, 1e-9)
  run.writer.write(done, "train", values)
  bar.set_postfix(loss=f"{values['loss']:.4f}", lr=f"{values['learning_rate']:.2e}")
  log.info("%s", train_line(done, run.config.num_train_steps, values, run.config.best_metric))
  return now


def _fmt(values: dict[str, float]) -> str:
  return " ".join(f"{k}={v:.4g}" for k, v in values.items())
