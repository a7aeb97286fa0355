"""Train-step time of a small model on a CPU host split into 1, 2, ... JAX devices
(config.cpu_devices: data parallel, one device per core) against 1 device (the baseline),
measured in the same run. Each count runs in its own process (the count is fixed when
JAX starts): configs/vit_fashion_mnist.py for `--steps`, median step time of the logged
windows after the first.

  python -m jaxencoder.data fetch fashion_mnist --data-dir data
  python bench/cpu_devices.py --data-dir data [--counts 1,2 --steps 600]

Prints one JSON line per count, then a table with the speed-up over 1 device.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]


def step_times(count: int, data_dir: str, steps: int) -> list[float]:
  """step_time_s of each logged window of a `steps`-step run with `count` CPU devices."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # no preset device count
  env["JAX_PLATFORMS"] = "cpu"
  with tempfile.TemporaryDirectory() as workdir:
    subprocess.run(
        [sys.executable, str(REPO / "train.py"), "--config", str(REPO / "configs/vit_fashion_mnist.py"),
         "--workdir", workdir, f"--config.cpu_devices={count}", f"--config.num_train_steps={steps}",
         f"--config.eval_every={steps}", f"--config.checkpoint_every={steps}",
         "--config.log_every=100", "--config.progress_bar=false", f"--config.data.data_dir={data_dir}"],
        check=True, env=env, capture_output=True)
    rows = [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").open()]
  return [r["step_time_s"] for r in rows if r["split"] == "train"][1:]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--data-dir", default="data")
  parser.add_argument("--counts", default="1,2")
  parser.add_argument("--steps", type=int, default=600)
  args = parser.parse_args()
  results = []
  for count in (int(c) for c in args.counts.split(",")):
    times = step_times(count, args.data_dir, args.steps)
    results.append({"cpu_devices": count, "cores": os.cpu_count(), "steps": args.steps,
                    "median_step_time_s": round(statistics.median(times), 5)})
    print(json.dumps(results[-1]), flush=True)
  base = next((r for r in results if r["cpu_devices"] == 1), results[0])
  print(f"{'cpu_devices':>11} {'step s':>8} {'speed-up vs 1':>14}")
  for r in results:
    print(f"{r['cpu_devices']:>11} {r['median_step_time_s']:>8.4f} "
          f"{base['median_step_time_s'] / r['median_step_time_s']:>14.2f}")


if __name__ == "__main__":
  main()
