"""Restore benchmark: CheckpointManager.restore (find the newest committed step, check every checksum, load into
PyTorch tensors) against a raw read of the same bytes, from the local disk and from a Cloud Storage emulator.
`python -m bench.restore [--size-mb 2048] [--quick] [--json] [--dir DIR] [--repeats 3] [--warm]`.

The state: --size-mb of float32 tensors (8 of them) saved once by CheckpointManager (256 MiB data files). In the
same run, each pair interleaved --repeats times, medians reported:
  local.raw_read     `cat`: the step's data files and skeleton read sequentially into one reused 8 MiB buffer
  local.restore      CheckpointManager(local_dir=DIR).restore(like=live): into the tensors of a model of the same
                     shapes that exists already (TrainingLoop restores into its objects' state_dict()s this way)
  local.restore_fresh  the same restore() without like=: into newly allocated tensors, for reference (first-touch
                     page faults of a second copy of the state)
  gcs.raw_read       plain GETs of the same objects, the requests the restore makes (the skeleton whole, each data
                     file in fmt.slice_bytes ranges: whole objects with the default state), on GCSStore's `workers`
                     connections, http.client reading into reused buffers: no checksum, no tensors
  gcs.raw_client     the same GETs through google-cloud-storage (Blob.download_as_bytes), for reference
  gcs.restore        CheckpointManager(gs://..., an empty local dir).restore(like=live)
  gcs.restore_fresh  the same without like=, for reference
  restore_vs_raw_read  raw read seconds / restore seconds (goal >= 0.8, issue #25)
The page cache is dropped before every local read (`echo 3 > /proc/sys/vm/drop_caches`, root only); where that is
refused, or with --warm (what --quick does: a CI run shares the machine, and a dropped page cache makes every
other test's next import read from the disk), `cache` says "warm" and both local reads run from the page cache. The
emulator is gcp-storage-emulator (in memory) on this machine's loopback, sharing its cores with the benchmark.
Every restore is compared with the saved tensors (`same_bytes`); the live tensors are zeroed before each restore
into them.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote, urlsplit

BUCKET = "respawn-bench"
RAW_BUFFER = 8 << 20


def drop_caches() -> bool:
    """Drop the page cache (root only); False where the kernel refuses."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def raw_local(step_dir: str, names: list[str]) -> tuple[int, float]:
    """(bytes, seconds) of a cat-like sequential read of these files of a step directory."""
    buf = bytearray(RAW_BUFFER)
    n = 0
    t0 = time.perf_counter()
    for name in names:
        with open(os.path.join(step_dir, name), "rb", buffering=0) as f:
            while k := f.readinto(buf):
                n += k
    return n, time.perf_counter() - t0


def raw_gcs(endpoint: str, gets: list[tuple[str, int | None, int | None]], workers: int) -> tuple[int, float]:
    """(bytes, seconds) of plain GETs on `workers` keep-alive connections into reused buffers: `gets` are (object,
    start, end) with start None for the whole object, the requests the restore makes (gcs_requests)."""
    url = urlsplit(endpoint)
    local = threading.local()

    def get(request: tuple[str, int | None, int | None]) -> int:
        name, start, end = request
        if getattr(local, "conn", None) is None:
            local.conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
            local.buf = memoryview(bytearray(RAW_BUFFER))
        headers = {} if start is None else {"Range": f"bytes={start}-{end - 1}"}
        local.conn.request("GET", f"/download/storage/v1/b/{BUCKET}/o/{quote(name, safe='')}?alt=media",
                           headers=headers)
        response = local.conn.getresponse()
        if response.status not in (200, 206):
            raise RuntimeError(f"GET {name}: HTTP {response.status}")
        n = 0
        while k := response.readinto(local.buf):
            n += k
        return n

    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        n = sum(ex.map(get, gets))
    return n, time.perf_counter() - t0


def gcs_requests(prefix: str, manifest: dict, workers: int) -> list[tuple[str, int | None, int | None]]:
    """The GETs a restore of this step makes (GCSStore.load_step_from): the skeleton whole, each data file in
    fmt.slice_bytes ranges (whole objects where a file is no longer than a slice, as with the default state)."""
    from respawn.ckpt import format as fmt

    data = {name: f["size"] for name, f in manifest["files"].items() if name != fmt.SKELETON}
    ranges = fmt.file_ranges(data, fmt.slice_bytes(manifest["total_bytes"], workers))
    return [(f"{prefix}/{fmt.SKELETON}", None, None)] + [(f"{prefix}/{r.name}", r.start, r.end) for r in ranges]


def raw_client(bucket, names: list[str], workers: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        n = sum(ex.map(lambda name: len(bucket.blob(name).download_as_bytes()), names))
    return n, time.perf_counter() - t0


def figures(nbytes: int, raw_s: list[float], restore_s: list[float], fresh_s: list[float]) -> dict:
    raw, restore, fresh = (statistics.median(x) for x in (raw_s, restore_s, fresh_s))
    return {"bytes": nbytes, "raw_read_s": round(raw, 4), "raw_read_MBps": round(nbytes / raw / 1e6, 1),
            "restore_s": round(restore, 4), "restore_MBps": round(nbytes / restore / 1e6, 1),
            "restore_vs_raw_read": round(raw / restore, 3),
            "restore_fresh_s": round(fresh, 4), "restore_fresh_MBps": round(nbytes / fresh / 1e6, 1),
            "raw_read_runs_s": [round(x, 4) for x in raw_s], "restore_runs_s": [round(x, 4) for x in restore_s],
            "restore_fresh_runs_s": [round(x, 4) for x in fresh_s]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.restore", description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mb", type=int, default=2048, help="state size in MiB (default 2048: the 24 GiB VM holds "
                   "the state, its restored copy and the emulator's copy)")
    p.add_argument("--quick", action="store_true", help="64 MiB, 1 repeat, the page cache kept: the CI smoke run")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--dir", default=None, help="directory on the disk to measure (default: system temp dir)")
    p.add_argument("--repeats", type=int, default=3, help="raw read / restore pairs per store (default 3)")
    p.add_argument("--warm", action="store_true", help="keep the page cache (--quick does): local reads from it")
    args = p.parse_args(argv)
    size = (64 if args.quick else args.size_mb) << 20
    repeats = 1 if args.quick else args.repeats
    drop = not (args.warm or args.quick)

    import torch
    from respawn.ckpt import CheckpointManager
    from respawn.ckpt import format as fmt
    from respawn.ckpt.storage import GCSStore

    from sim import emulators

    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="respawn-bench-restore-", dir=args.dir)
    emulator = None
    try:
        n = 8
        g = torch.Generator().manual_seed(0)
        state = {"model": {f"layer{i}.weight": torch.randn(size // n // 4, generator=g) for i in range(n)}, "step": 1}

        live = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}, "step": 0}

        def same(restored) -> bool:
            return restored["step"] == 1 and all(torch.equal(restored["model"][k], v)
                                                 for k, v in state["model"].items())

        def timed_restore(manager, into) -> float:
            """Seconds of manager.restore(like=into) (into: None or the zeroed live state), its result checked."""
            if into is not None:
                for t in into["model"].values():
                    t.zero_()
            t0 = time.perf_counter()
            step, restored = manager.restore(like=into)
            seconds = time.perf_counter() - t0
            checks.append(step == 1 and same(restored)
                          and (into is None or restored["model"]["layer0.weight"] is into["model"]["layer0.weight"]))
            return seconds

        checks = []
        local_dir = os.path.join(work, "local")
        CheckpointManager(local_dir=local_dir, keep=1).save(1, state, blocking=True)
        step_dir = os.path.join(local_dir, fmt.step_dirname(1))
        manifest = fmt.read_manifest(step_dir)
        files = sorted(manifest["files"])  # the data files and the skeleton: what restore reads
        dropped = True
        raw_s, restore_s, fresh_s = [], [], []
        for _ in range(repeats):
            dropped = drop and drop_caches() and dropped
            nbytes, dt = raw_local(step_dir, files)
            raw_s.append(dt)
            for into, runs in ((live, restore_s), (None, fresh_s)):
                if drop:
                    drop_caches()
                runs.append(timed_restore(CheckpointManager(local_dir=local_dir, keep=1), into))
        local = figures(nbytes, raw_s, restore_s, fresh_s)

        emulator = emulators.start_storage(BUCKET)
        os.environ["STORAGE_EMULATOR_HOST"] = emulator.url
        uri = f"gs://{BUCKET}/bench"
        saved = CheckpointManager(uri, os.path.join(work, "writer"), keep=1).save(1, state, blocking=True)
        if saved.durable != "remote":
            raise RuntimeError(f"the upload to the emulator failed: {saved}")
        store = GCSStore(uri)
        names = [f"bench/{fmt.step_dirname(1)}/{name}" for name in files]
        gets = gcs_requests(f"bench/{fmt.step_dirname(1)}", manifest, store.workers)  # the same layout remotely
        raw_s, client_s, restore_s, fresh_s = [], [], [], []
        for r in range(repeats):
            nbytes, dt = raw_gcs(emulator.url, gets, store.workers)
            raw_s.append(dt)
            client_s.append(raw_client(store.bucket, names, store.workers)[1])
            for into, runs in ((live, restore_s), (None, fresh_s)):
                node = os.path.join(work, f"node{r}")  # a new node: nothing on its disk
                runs.append(timed_restore(CheckpointManager(uri, node, keep=1), into))
                shutil.rmtree(node)
        gcs = figures(nbytes, raw_s, restore_s, fresh_s)
        client = statistics.median(client_s)
        gcs.update(raw_client_s=round(client, 4), raw_client_MBps=round(nbytes / client / 1e6, 1),
                   connections=store.workers, slice_mb=fmt.slice_bytes(nbytes, store.workers) >> 20)
        result = {"size_mb": size / (1 << 20), "repeats": repeats, "cache": "dropped" if dropped else "warm",
                  "range_mb": fmt.RANGE_BYTES >> 20, "local_workers": fmt.READ_WORKERS, "local": local, "gcs": gcs,
                  "restore_vs_raw_read": {"local": local["restore_vs_raw_read"], "gcs": gcs["restore_vs_raw_read"]},
                  "same_bytes": all(checks), "cpus": os.cpu_count(),
                  "load_average": [round(x, 2) for x in os.getloadavg()], "dir": work}
    finally:
        if emulator is not None:
            emulator.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
        return 0 if result["same_bytes"] else 1
    rows = [("state size", (f"{result['size_mb']:.0f} MiB, {local['bytes']} bytes of data files and skeleton; "
                           f"page cache {result['cache']}"))]
    for label, f in (("local disk", local), ("GCS emulator", gcs)):
        rows += [(f"{label}: raw read", f"{f['raw_read_s']:.3f} s, {f['raw_read_MBps']:.0f} MB/s"),
                 (f"{label}: restore into the live tensors", f"{f['restore_s']:.3f} s, {f['restore_MBps']:.0f} MB/s"),
                 (f"{label}: restore into new tensors", f"{f['restore_fresh_s']:.3f} s, "
                                                         f"{f['restore_fresh_MBps']:.0f} MB/s"),
                 (f"{label}: restore_vs_raw_read (goal >= 0.8)", f"{f['restore_vs_raw_read']:.2f}")]
    rows.insert(6, ("GCS emulator: google-cloud-storage GETs",
                    f"{gcs['raw_client_s']:.3f} s, {gcs['raw_client_MBps']:.0f} MB/s"))
    rows += [("restored tensors equal the saved ones", str(result["same_bytes"])),
             ("load average", str(result["load_average"]))]
    w = max(len(r[0]) for r in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    return 0 if result["same_bytes"] else 1


if __name__ == "__main__":
    sys.exit(main())
