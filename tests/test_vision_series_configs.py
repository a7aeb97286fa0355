"""UCR/UEA sets by name (`ucr/<NAME>`): fetched and prepared on first use, no network here
(the aeon wheel is replaced by a zip of the same layout); the two configs read them."""

import importlib.util
import pathlib
import zipfile

import ml_collections
import numpy as np
import pytest

from jaxencoder.data import fetch as fetch_lib
from jaxencoder.data.pipeline import Reading
from jaxencoder.data import pipeline, sources
from jaxencoder.data.readers import DataError
from jaxencoder.data.splits import resolve_source

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEAD = "@problemName Tiny\n@univariate false\n@classLabel true up down\n@data\n"
TRAIN = HEAD + "1,2,3:4,5,6:up\n7,8,9:1,2,3:down\n"
TEST = HEAD + "3,2,1:6,5,4:down\n"


def _fake_wheel(tmp: pathlib.Path) -> pathlib.Path:
  """A zip laid out like aeon's wheel: aeon/datasets/data/<NAME>/<NAME>_{TRAIN,TEST}.ts."""
  path = tmp / "aeon-1.6.0-py3-none-any.whl"
  with zipfile.ZipFile(path, "w") as whl:
    whl.writestr("aeon/datasets/data/Tiny/Tiny_TRAIN.ts", TRAIN)
    whl.writestr("aeon/datasets/data/Tiny/Tiny_TEST.ts", TEST)
    whl.writestr("aeon/datasets/data/Other/Other_TRAIN.ts", TRAIN)
    whl.writestr("aeon/__init__.py", "")
  return path


@pytest.fixture
def downloads(monkeypatch):
  specs = []
  def fake_download(spec, tmp):
    specs.append(spec)
    return _fake_wheel(tmp)
  monkeypatch.setattr(fetch_lib, "_pip_download", fake_download)
  return specs


def _data_cfg(source, data_dir):
  return ml_collections.ConfigDict({"source": source, "data_dir": str(data_dir)})


def test_a_ucr_set_is_fetched_and_prepared_on_first_use(tmp_path, downloads):
  path = resolve_source(_data_cfg("ucr/Tiny", tmp_path))
  assert downloads == ["aeon==1.6.0"]
  assert pathlib.Path(path) == tmp_path / "tfds" / "time_series" / "ucr_Tiny" / "1.0.0"
  assert sources.label_names(path) == ["up", "down"]
  test = sources.open_source(path, "test")
  np.testing.assert_array_equal(test[0]["series"], [[3, 6], [2, 5], [1, 4]])
  assert len(sources.open_source(path, "train")) == 2


def test_a_second_ucr_set_reuses_the_fetched_archive(tmp_path, downloads):
  resolve_source(_data_cfg("ucr/Tiny", tmp_path))
  resolve_source(_data_cfg("ucr/other", tmp_path))  # any case finds Other
  assert downloads == ["aeon==1.6.0"]


def test_an_unknown_ucr_set_is_one_line_naming_the_available_ones(tmp_path, downloads):
  with pytest.raises(DataError) as info:
    resolve_source(_data_cfg("ucr/GunPont", tmp_path))
  assert "\n" not in str(info.value)
  assert "'GunPont'" in str(info.value) and "available (2): Other, Tiny" in str(info.value)


def test_multichannel_series_batches_keep_every_channel(tmp_path, downloads):
  path = resolve_source(_data_cfg("ucr/Tiny", tmp_path))
  batch = next(iter(pipeline.series_pipeline(sources.open_source(path, "train"), length=4,
                                             batch_size=2,
                                             read=Reading(shard_index=0, shard_count=1))))
  assert batch["inputs"].shape == (2, 4, 2)
  np.testing.assert_array_equal(batch["attention_mask"].sum(1), [3, 3])


def _config(name):
  spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def test_the_configs_read_fetchable_sources():
  from jaxencoder.data import builders
  series, vit = _config("time_series"), _config("vit_fashion_mnist")
  assert builders.fetched(series.data.source) is not None and vit.data.source in builders.FETCHED
  assert builders.fetched(series.data.source)[0] == series.data.kind == "time_series"
  assert builders.fetched(vit.data.source)[0] == vit.data.kind == "image_arrays"


def test_the_fetch_cli_takes_one_ucr_set_by_name(tmp_path, downloads, capsys):
  from jaxencoder.data.__main__ import main
  main(["fetch", "ucr/Tiny", "--data-dir", str(tmp_path)])
  assert capsys.readouterr().out.strip() == str(tmp_path / "raw" / "ucr" / "Tiny")
  with pytest.raises(SystemExit):
    main(["fetch", "imagenet", "--data-dir", str(tmp_path)])
  assert "unknown source 'imagenet'" in capsys.readouterr().err


def test_series_augmentation_shifts_inside_the_mask_and_scales():
  source = [{"series": np.arange(1, 7, dtype=np.float32)[:, None], "label": 0}]
  seen_shifts, seen_scales = set(), set()
  for seed in range(30):
    (b,) = list(pipeline.series_pipeline(source, length=8, batch_size=1,
                                         random_shift=2, random_scale=0.5,
                                         read=Reading(seed=seed, shard_index=0, shard_count=1)))
    x, mask = b["inputs"][0, :, 0], b["attention_mask"][0]
    kept = x[mask > 0]
    assert (x[mask == 0] == 0).all()
    factor = kept[1] - kept[0]  # consecutive values 1, 2, ... times the scale
    assert 0.5 <= factor <= 1.5
    np.testing.assert_allclose(np.diff(kept), factor, rtol=1e-5)
    first = int(np.argmax(mask))
    seen_shifts.add(first - int(round(kept[0] / factor)) + 1)
    seen_scales.add(round(float(factor), 3))
  assert seen_shifts == {-2, -1, 0, 1, 2} and len(seen_scales) > 10
  (plain,) = list(pipeline.series_pipeline(source, length=8, batch_size=1,
                                           read=Reading(seed=0, shard_index=0, shard_count=1)))
  assert plain["inputs"][0, :, 0].tolist() == [1, 2, 3, 4, 5, 6, 0, 0]
