"""`respawn demo --job JOB.yaml` (or a scenario's `job_file`): a user's own job spec on the stand-ins.

The file is read and checked as `respawn jobs register` reads it: its trainer.workdir is a directory relative to the
file, which the runner packs and uploads to the storage emulator as register does (respawn.app.workdir,
respawn.app.codestore).
Its setup and command run as written. The scenario gives the zones (the job's own when the scenario names none) and
what to inject; what names real Google Cloud resources is pointed at the stand-ins (runner.job_spec says what).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from respawn.app.cli import CliError, _local_workdir, _parse_spec, _read_spec_data, _trainer_workdir
from sim.demo.scenario import Scenario, ScenarioError, Zone


@dataclass(frozen=True)
class JobFile:
    path: Path
    spec: dict[str, Any]  # as written, without trainer.workdir (the runner records the uploaded archive's URI)
    workdir: Path | None  # the directory to pack; None: the job runs no code of its own (a command on the image)

    @property
    def id(self) -> str:
        return str(self.spec["id"])


def read_job(path: Path) -> JobFile:
    """The job file, checked as `respawn jobs register` checks it before packing. Raises CliError (one line)."""
    data = _read_spec_data(path)
    trainer, written = _trainer_workdir(data)
    directory = _local_workdir(path, written)
    if written is not None and directory is None:
        raise CliError(f"{path}: trainer.workdir {written!r}: the demo packs and uploads a directory, as `respawn jobs "
                       "register` does; write the directory (relative to the job file) instead of an archive's URI",
                       code=2)
    if directory is not None and not directory.is_dir():
        raise CliError(f"{path}: trainer.workdir {written!r}: {directory} is not a directory", code=2)
    if trainer is not None:
        trainer.pop("workdir", None)
    _parse_spec(path, data)  # every other field
    return JobFile(path.resolve(), data, directory.resolve() if directory is not None else None)


def with_job_file(sc: Scenario, job: JobFile) -> Scenario:
    """The scenario running `job`: its accelerator the job's, its zones the job's when the scenario names none; its
    injections checked against the job's node count. Raises ScenarioError."""
    spec = {**job.spec, **sc.job}  # the scenario's own job fields are laid over the job's (runner.job_spec)
    accelerator = (spec.get("accelerator") or {}).get("kind", "gpu")
    try:
        sc.check_job_fits(spec.get("nodes", 1), accelerator)
    except ValueError as exc:
        raise ScenarioError(f"{sc.name} with {job.path}", [str(exc)]) from None
    zones = sc.zones if "zones" in sc.model_fields_set else [Zone(name=z) for z in spec["zones"]]
    return sc.model_copy(update={"job_file": str(job.path), "accelerator": accelerator, "zones": zones})
