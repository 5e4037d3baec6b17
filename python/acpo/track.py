"""`python -m acpo track RUN_DIR --to wandb|tensorboard|mlflow [--follow]`: an `acpo train` run
into an experiment tracker, through the tracker's own SDK (imported only when chosen).

What is logged is what the run directory holds, under the names it holds them, which are verl's
(`docs/VERL.md`): every number of each `metrics.jsonl` line at its `training/global_step`
(`actor/pg_loss`, `reward/acc/mean`, `timing_s/step`, ...), and every evaluation's `metrics`
(`val-core/<benchmark>/acc/mean@k`, `val-aux/<benchmark>/acc/pass@j`) at its `step`, as verl's
own `trainer.logger` logs them. The trackers are driven as verl drives them: W&B's `wandb.log(data,
step=step)`, TensorBoard's `SummaryWriter.add_scalar` (torch's, or tensorboardX's), MLflow's
`log_metrics` with each name made valid for MLflow as verl's adapter makes it (`@` -> `_at_`, other
characters MLflow refuses -> `_`).

Records go to the tracker in step order, never a step below one already sent (W&B drops those):
the trainer writes step s's evaluation before its metrics line, and `metrics.jsonl` is read before
`eval.jsonl`, so an evaluation is sent once the metrics of its step have been sent.

The last line of `metrics.jsonl` is not final while the run goes on: after a checkpoint the
trainer rewrites its step's line with `timing_s/save_checkpoint` added. So a run being followed has
its last metrics line (and the evaluations of that step) held back until a later line is there or
the run is finished; each step is sent once, with its final values.

`--follow` polls the files (every `--poll` seconds) until the run is finished: `provenance.json`
has its finish time and `SHA256SUMS` is written (what `acpo` itself takes as a finished run). It
gives up, exit 1, after `--idle-timeout` seconds in which the run showed no sign of life: no new
record, no change to `metrics.jsonl` or `eval.jsonl` (size, modification time), and the run's lock
(`.RUN_DIR.lock` beside it, which `acpo train` holds while it trains) not held (seen in Linux's
`/proc/locks`, without taking it). A run whose steps take longer than the timeout is followed for
as long as its trainer lives. Without `--follow` what is there is sent once.
"""
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

STEP = "training/global_step"
TRACKERS = ("wandb", "tensorboard", "mlflow")


class TrackError(Exception):
    """Bad input (a run directory, a line, a missing SDK): exit 2, naming it."""


Record = Tuple[int, str, Dict[str, float]]  # (step, "metrics" | "eval", name -> value)


def _numbers(obj: dict) -> Dict[str, float]:
    return {k: float(v) for k, v in obj.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _lines(path: Path) -> List[Tuple[int, dict]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as e:
        raise TrackError(f"{path}: {e}") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TrackError(f"{path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise TrackError(f"{path}:{n}: a JSON object is expected")
        out.append((n, obj))
    return out


def _step(path: Path, n: int, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0 \
            or value != int(value):
        raise TrackError(f"{path}:{n}: the step must be a whole number >= 0, not {value!r}")
    return int(value)


class RunReader:
    """The records of a run directory not yet returned, in step order."""

    def __init__(self, run_dir):
        self.root = Path(run_dir)
        if not self.root.is_dir():
            raise TrackError(f"{self.root}: not a directory")
        if not (self.root / "manifest.yaml").is_file():
            raise TrackError(f"{self.root}: not a run directory (no manifest.yaml; acpo train writes one)")
        self.metrics_sent = -1
        self.eval_sent = -1

    @property
    def name(self) -> str:
        return self.root.resolve().name

    def finished(self) -> bool:
        """Sealed after its last step: provenance's finish time, then SHA256SUMS."""
        try:
            prov = json.loads((self.root / "provenance.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return isinstance(prov, dict) and prov.get("finished_unix") is not None and (self.root / "SHA256SUMS").is_file()

    def lock_held(self) -> bool:
        """Whether a process holds the run's lock (`acpo train` does while it trains), read from
        `/proc/locks` without taking the lock (taking it, even briefly, could turn away a trainer
        starting or resuming at that moment). False where that cannot be told."""
        lock = self.root.resolve()
        lock = lock.with_name(f".{lock.name}.lock")
        try:
            st = lock.stat()
            table = Path("/proc/locks").read_text()
        except OSError:
            return False
        ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        return any(ident in line.split() for line in table.splitlines())

    def signature(self) -> tuple:
        """What changes while the run is alive: its files' sizes and modification times."""
        sig = []
        for name in ("metrics.jsonl", "eval.jsonl"):
            try:
                st = (self.root / name).stat()
                sig.append((st.st_size, st.st_mtime_ns))
            except OSError:
                sig.append(None)
        return tuple(sig)

    def poll(self, final: bool = False) -> List[Record]:
        """New records: metrics lines past the last sent but the last line (which the trainer
        may still rewrite), evaluations up to the last metrics step sent; all of them when
        `final`."""
        metrics_path, eval_path = self.root / "metrics.jsonl", self.root / "eval.jsonl"
        metrics = [(_step(metrics_path, n, o.get(STEP)), o) for n, o in _lines(metrics_path)]
        evals = [(_step(eval_path, n, o.get("step")), o) for n, o in _lines(eval_path)]
        if not final:
            metrics = metrics[:-1]
        out: List[Record] = []
        for s, o in metrics:
            if s > self.metrics_sent:
                out.append((s, "metrics", _numbers(o)))
        horizon = max([s for s, _, _ in out] + [self.metrics_sent, 0])
        for s, o in evals:
            if s > self.eval_sent and (final or s <= horizon):
                m = o.get("metrics")
                if not isinstance(m, dict):
                    raise TrackError(f"{eval_path}: the evaluation of step {s} has no metrics object")
                out.append((s, "eval", _numbers(m)))
        # a step's metrics before its evaluation; the sort is stable
        out.sort(key=lambda r: (r[0], r[1] != "metrics"))
        for s, kind, _ in out:
            if kind == "metrics":
                self.metrics_sent = max(self.metrics_sent, s)
            else:
                self.eval_sent = max(self.eval_sent, s)
        return out


def mlflow_key(key: str) -> str:
    """A metric name MLflow accepts, as verl's MLflow adapter makes it."""
    key = re.sub(r"/+", "/", key.replace("@", "_at_"))
    return re.sub(r"[^/\w.\- :]", "_", key)


class Sink:
    """A tracker: `log(data, step)`, then `close()`."""

    def log(self, data: Dict[str, float], step: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _need(module: str, tracker: str, install: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise TrackError(f"--to {tracker} needs {module} ({e}): pip install {install}") from None


def _manifest(run: RunReader) -> dict:
    config = {"acpo_run": run.name}
    try:
        import yaml

        loaded = yaml.safe_load((run.root / "manifest.yaml").read_text(encoding="utf-8"))
        if isinstance(loaded, dict):
            config.update(loaded)
    except Exception:  # the config is a courtesy to the tracker's UI; the metrics do not need it
        pass
    return config


class WandbSink(Sink):
    def __init__(self, run: RunReader, project: str, name: str):
        wandb = _need("wandb", "wandb", "wandb")
        self.run = wandb.init(project=project, name=name, config=_manifest(run))

    def log(self, data, step):
        self.run.log(data, step=step)

    def close(self):
        self.run.finish()


class TensorBoardSink(Sink):
    def __init__(self, logdir: str):
        try:
            from torch.utils import tensorboard as writers
        except ImportError:
            writers = _need("tensorboardX", "tensorboard", "tensorboard torch (or tensorboardX)")
        os.makedirs(logdir, exist_ok=True)
        self.writer = writers.SummaryWriter(logdir)

    def log(self, data, step):
        for k, v in data.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self):
        self.writer.close()


class MlflowSink(Sink):
    def __init__(self, run: RunReader, project: str, name: str):
        self.mlflow = _need("mlflow", "mlflow", "mlflow")
        self.mlflow.set_experiment(project)
        self.active = self.mlflow.start_run(run_name=name)
        self.mlflow.set_tag("acpo_run", run.name)

    def log(self, data, step):
        self.mlflow.log_metrics({mlflow_key(k): v for k, v in data.items()}, step=step)

    def close(self):
        self.mlflow.end_run()


def sink_for(to: str, run: RunReader, project: str, name: str, logdir: Optional[str]) -> Sink:
    if to == "wandb":
        return WandbSink(run, project, name)
    if to == "tensorboard":
        return TensorBoardSink(logdir or os.environ.get("TENSORBOARD_DIR") or os.path.join("tensorboard_log", project, name))
    if to == "mlflow":
        return MlflowSink(run, project, name)
    raise TrackError(f"--to must be one of {', '.join(TRACKERS)}, not {to!r}")


def track(run: RunReader, sink: Sink, follow: bool = False, poll: float = 10.0, idle_timeout: float = 3600.0,
          sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
          say: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> int:
    """Sends the run's records to `sink`; with `follow`, until the run is finished. Returns the
    exit code: 0, or 1 when following gave up after `idle_timeout` seconds without a sign of
    life from the run (see the module's doc)."""
    sent = 0

    def send(records: List[Record]) -> None:
        nonlocal sent
        for step, _, data in records:
            if data:
                sink.log(data, step)
        sent += len(records)

    try:
        if not follow:
            send(run.poll(final=True))
            state = "finished" if run.finished() else "not finished (--follow waits for it)"
            say(f"acpo track: {sent} records of {run.name} sent; the run is {state}")
            return 0
        last_news = clock()
        seen = run.signature()
        while True:
            finished = run.finished()  # before reading: a run sealed now has all its lines written
            records = run.poll(final=finished)
            send(records)
            if finished:
                say(f"acpo track: {sent} records of {run.name} sent; the run is finished")
                return 0
            now = clock()
            sig = run.signature()
            # a step may take longer than the timeout: the run is alive while its trainer holds
            # its lock or its files change
            alive = bool(records) or sig != seen or run.lock_held()
            seen = sig
            if alive:
                last_news = now
            elif now - last_news >= idle_timeout:
                say(f"acpo track: no sign of life from {run.name} for {idle_timeout:g} s (no new record, no "
                    f"change to its files, its lock not held) and the run is not finished "
                    f"({sent} records sent); track it again once it resumes")
                return 1
            sleep(poll)
    finally:
        sink.close()


def _seconds(what: str, low: float, high: float):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = float("nan")
        if not (low <= v <= high):
            import argparse

            raise argparse.ArgumentTypeError(f"{what} must be a number of seconds in [{low:g}, {high:g}], not {text!r}")
        return v

    return parse


def add_parser(sub) -> None:
    p = sub.add_parser("track", help="send an acpo train run's metrics and evaluations to W&B, TensorBoard or MLflow")
    p.add_argument("run_dir", help="the run directory (what acpo train writes: metrics.jsonl, eval.jsonl)")
    p.add_argument("--to", required=True, choices=TRACKERS, help="the tracker (its SDK must be installed)")
    p.add_argument("--follow", action="store_true", help="keep sending new steps until the run is finished")
    p.add_argument("--project", default="acpo", help="W&B project / MLflow experiment / TensorBoard folder (acpo)")
    p.add_argument("--name", help="the tracker's run name (default: the run directory's name)")
    p.add_argument("--logdir", help="TensorBoard's folder (default: $TENSORBOARD_DIR, else "
                                    "tensorboard_log/PROJECT/NAME, as verl)")
    p.add_argument("--poll", type=_seconds("--poll", 0.01, 3600), default=10.0,
                   help="seconds between reads with --follow (default 10)")
    p.add_argument("--idle-timeout", type=_seconds("--idle-timeout", 0, 7 * 24 * 3600), default=3600.0,
                   help="with --follow, give up (exit 1) after this many seconds in which the run shows no sign "
                        "of life: no new record, no change to its files, its lock not held (default 3600)")


def main(args) -> int:
    run = RunReader(args.run_dir)
    name = args.name or run.name
    # read (and check) the files before a tracker run is opened for them
    RunReader(args.run_dir).poll(final=True)
    try:
        sink = sink_for(args.to, run, args.project, name, args.logdir)
        return track(run, sink, follow=args.follow, poll=args.poll, idle_timeout=args.idle_timeout)
    except TrackError:
        raise
    except Exception as e:  # the tracker's SDK refused (its configuration, its server): say so in one line
        raise TrackError(f"--to {args.to}: {type(e).__name__}: {e}") from None


def iter_records(run_dir) -> Iterator[Record]:
    """Every record of a run directory, in the order `track` sends them."""
    yield from RunReader(run_dir).poll(final=True)
