"""`python -m acpo track`: a run directory's metrics and evaluations into W&B, TensorBoard and
MLflow, read back through each tracker's own reader (TensorBoard's EventAccumulator, W&B's
offline run file, MLflow's client on a file store); each skipped where its SDK is not installed.
Following a run is tested with a stand-in clock and sleep (no real waiting)."""
import importlib.util
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from acpo import track

HAVE = {m: importlib.util.find_spec(m) is not None for m in ("wandb", "mlflow", "tensorboard", "torch", "tensorboardX")}
HAVE_TB_WRITER = HAVE["tensorboard"] and (HAVE["torch"] or HAVE["tensorboardX"])

STEPS = 4
EVAL_AT = (0, 2, 4)


def metrics_line(s):
    return {"actor/pg_loss": 0.5 / s, "reward/acc/mean": s / 8, "response_length/mean": 30 + s,
            "timing_s/step": 1.25, "training/global_step": float(s)}


def eval_line(s):
    return {"step": s, "benchmarks": [], "weighted_accuracy": s / 10,
            "metrics": {"val-core/math500/acc/mean@4": s / 10, "val-aux/math500/acc/pass@2": s / 5,
                        "val-core/weighted/acc/mean@4": s / 10}}


def write_lines(path, objs):
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))


def make_run(root, upto=STEPS, sealed=True):
    run = Path(root) / "tiny-grpo-0123456789ab"
    run.mkdir(parents=True, exist_ok=True)
    (run / "manifest.yaml").write_text("name: tiny-grpo\nseed: 1\n")
    write_lines(run / "metrics.jsonl", [metrics_line(s) for s in range(1, upto + 1)])
    write_lines(run / "eval.jsonl", [eval_line(s) for s in EVAL_AT if s <= upto])
    prov = {"started_unix": 1}
    if sealed:
        prov["finished_unix"] = 2
        (run / "SHA256SUMS").write_text("")
    (run / "provenance.json").write_text(json.dumps(prov))
    return run


def expected():
    """Every (name, step, value) the run holds."""
    out = set()
    for s in range(1, STEPS + 1):
        out |= {(k, s, float(v)) for k, v in metrics_line(s).items()}
    for s in EVAL_AT:
        out |= {(k, s, v) for k, v in eval_line(s)["metrics"].items()}
    return out


class Recorder(track.Sink):
    def __init__(self):
        self.logged, self.closed = [], False

    def log(self, data, step):
        self.logged.append((step, dict(data)))

    def close(self):
        self.closed = True


def flat(logged):
    return {(k, s, v) for s, d in logged for k, v in d.items()}


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "acpo", "track", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


class Reading(unittest.TestCase):
    def test_every_metric_and_evaluation_in_step_order_under_its_own_name(self):
        with tempfile.TemporaryDirectory() as tmp:
            sink = Recorder()
            self.assertEqual(track.track(track.RunReader(make_run(tmp)), sink, say=lambda s: None), 0)
            self.assertEqual(flat(sink.logged), expected())
            steps = [s for s, _ in sink.logged]
            self.assertEqual(steps, sorted(steps))
            # a step's metrics line, then its evaluation
            self.assertEqual([("val-core/math500/acc/mean@4" in d) for s, d in sink.logged if s == 2], [False, True])
            self.assertTrue(sink.closed)

    def test_an_evaluation_waits_for_the_metrics_of_its_step(self):
        # the trainer writes step s's evaluation before its metrics line
        with tempfile.TemporaryDirectory() as tmp:
            run = make_run(tmp, upto=1, sealed=False)
            write_lines(run / "eval.jsonl", [eval_line(0), eval_line(2)])
            reader = track.RunReader(run)
            # the last metrics line (step 1) is held back: the trainer may still rewrite it
            self.assertEqual([(s, k) for s, k, _ in reader.poll()], [(0, "eval")])
            write_lines(run / "metrics.jsonl", [metrics_line(1), metrics_line(2)])
            self.assertEqual([(s, k) for s, k, _ in reader.poll()], [(1, "metrics")])
            write_lines(run / "metrics.jsonl", [metrics_line(1), metrics_line(2), metrics_line(3)])
            self.assertEqual([(s, k) for s, k, _ in reader.poll()], [(2, "metrics"), (2, "eval")])
            self.assertEqual(reader.poll(), [])
            self.assertEqual([(s, k) for s, k, _ in reader.poll(final=True)], [(3, "metrics")])

    def test_a_line_rewritten_after_its_checkpoint_reaches_the_tracker_with_its_final_values(self):
        # the trainer writes step s's line, saves the checkpoint, then rewrites the line with
        # the checkpoint's time; a poll may fall between the two writes
        with tempfile.TemporaryDirectory() as tmp:
            run = make_run(tmp, upto=0, sealed=False)
            final = lambda t: {**metrics_line(t), "timing_s/save_checkpoint": 0.5 + t}
            writes = [0]

            def trainer(_seconds):  # one write per poll: step s's first line, then its rewrite
                writes[0] += 1
                s, rewritten = (writes[0] + 1) // 2, writes[0] % 2 == 0
                if s in EVAL_AT:
                    write_lines(run / "eval.jsonl", [eval_line(t) for t in EVAL_AT if t <= s])
                lines = [final(t) for t in range(1, s)] + [final(s) if rewritten else metrics_line(s)]
                write_lines(run / "metrics.jsonl", lines)
                if s == STEPS and rewritten:
                    make_run(tmp, upto=STEPS, sealed=True)
                    write_lines(run / "metrics.jsonl", lines)

            sink = Recorder()
            code = track.track(track.RunReader(run), sink, follow=True, poll=0.01, idle_timeout=60,
                               sleep=trainer, clock=lambda: 0.0, say=lambda s: None)
            self.assertEqual(code, 0)
            self.assertEqual(writes[0], 2 * STEPS)
            sent = {s: d for s, d in sink.logged if "training/global_step" in d}
            self.assertEqual(sorted(sent), list(range(1, STEPS + 1)))
            for s, d in sent.items():
                self.assertEqual(d, final(s), f"step {s}")
            self.assertEqual(len(sink.logged), STEPS + len(EVAL_AT))  # nothing sent twice
            steps = [s for s, _ in sink.logged]
            self.assertEqual(steps, sorted(steps))

    def test_follow_sends_each_step_once_until_the_run_is_finished(self):
        with tempfile.TemporaryDirectory() as tmp:
            run = make_run(tmp, upto=0, sealed=False)
            written = [0]

            def trainer_step(_seconds):  # stands in for the wait between polls: one step written
                s = written[0] = written[0] + 1
                if s in EVAL_AT:
                    write_lines(run / "eval.jsonl", [eval_line(t) for t in EVAL_AT if t <= s])
                write_lines(run / "metrics.jsonl", [metrics_line(t) for t in range(1, s + 1)])
                if s == STEPS:
                    make_run(tmp, upto=STEPS, sealed=True)

            sink = Recorder()
            code = track.track(track.RunReader(run), sink, follow=True, poll=0.01, idle_timeout=60,
                               sleep=trainer_step, clock=lambda: 0.0, say=lambda s: None)
            self.assertEqual(code, 0)
            self.assertEqual(written[0], STEPS)
            self.assertEqual(flat(sink.logged), expected())
            self.assertEqual(len(sink.logged), STEPS + len(EVAL_AT))  # nothing sent twice
            steps = [s for s, _ in sink.logged]
            self.assertEqual(steps, sorted(steps))

    def test_follow_gives_up_after_the_idle_timeout(self):
        with tempfile.TemporaryDirectory() as tmp:
            run = make_run(tmp, upto=2, sealed=False)
            now, said = [0.0], []

            def sleep(seconds):
                now[0] += seconds

            code = track.track(track.RunReader(run), Recorder(), follow=True, poll=5, idle_timeout=30,
                               sleep=sleep, clock=lambda: now[0], say=said.append)
            self.assertEqual(code, 1)
            self.assertEqual(now[0], 30)
            self.assertIn("not finished", said[-1])

    def test_a_run_whose_files_change_is_alive_past_the_idle_timeout(self):
        # a step longer than the timeout: no new record, but the trainer rewrites its last line
        with tempfile.TemporaryDirectory() as tmp:
            run = make_run(tmp, upto=2, sealed=False)
            now, said = [0.0], []

            def sleep(seconds):
                now[0] += seconds
                if now[0] >= 100:
                    make_run(tmp, upto=2, sealed=True)
                else:
                    line = {**metrics_line(2), "timing_s/save_checkpoint": now[0]}
                    write_lines(run / "metrics.jsonl", [metrics_line(1), line])

            sink = Recorder()
            code = track.track(track.RunReader(run), sink, follow=True, poll=5, idle_timeout=30,
                               sleep=sleep, clock=lambda: now[0], say=said.append)
            self.assertEqual(code, 0, said)
            self.assertEqual(now[0], 100)
            self.assertIn("finished", said[-1])

    @unittest.skipUnless(os.path.exists("/proc/locks"), "the lock is read from Linux's /proc/locks")
    def test_a_run_whose_lock_is_held_is_alive_past_the_idle_timeout(self):
        import fcntl

        with tempfile.TemporaryDirectory() as tmp:
            run = make_run(tmp, upto=2, sealed=False)
            now, said = [0.0], []
            with open(run.parent / f".{run.name}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as `acpo train` holds it

                def sleep(seconds):
                    now[0] += seconds
                    if now[0] == 100:
                        fcntl.flock(lock, fcntl.LOCK_UN)  # the trainer died, the run unfinished

                code = track.track(track.RunReader(run), Recorder(), follow=True, poll=5, idle_timeout=30,
                                   sleep=sleep, clock=lambda: now[0], say=said.append)
            self.assertEqual(code, 1)
            # last seen held at 95 (the poll before it was let go at 100): given up 30 s after
            self.assertEqual(now[0], 125)
            self.assertIn("not finished", said[-1])

    def test_mlflow_names_are_made_valid_as_verl_makes_them(self):
        self.assertEqual(track.mlflow_key("val-core/math500/acc/mean@4"), "val-core/math500/acc/mean_at_4")
        self.assertEqual(track.mlflow_key("a//b#c"), "a/b_c")
        self.assertEqual(track.mlflow_key("actor/pg_loss"), "actor/pg_loss")


class Command(unittest.TestCase):
    def test_bad_input_is_one_error_naming_it(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = cli(Path(tmp) / "nope", "--to", "tensorboard")
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertIn("nope: not a directory", out.stderr)
            out = cli(tmp, "--to", "tensorboard")
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertIn("not a run directory", out.stderr)
            run = make_run(tmp)
            with open(run / "metrics.jsonl", "a") as f:
                f.write('{"training/global_step": 5, "x": 1\n')
            out = cli(run, "--to", "tensorboard", "--logdir", Path(tmp) / "tb")
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertIn("metrics.jsonl:5: not JSON", out.stderr)
            self.assertFalse((Path(tmp) / "tb").exists())
            out = cli(make_run(Path(tmp) / "b"), "--to", "tensorboard", "--poll", "0")
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertIn("--poll must be", out.stderr)
            missing = next((t for t in ("wandb", "mlflow") if not HAVE[t]), None)
            if missing:
                out = cli(make_run(Path(tmp) / "c"), "--to", missing)
                self.assertEqual(out.returncode, 2, out.stderr)
                self.assertIn(f"pip install {missing}", out.stderr)


@unittest.skipUnless(HAVE_TB_WRITER, "tensorboard (with torch or tensorboardX) is not installed")
class TensorBoard(unittest.TestCase):
    def test_event_files_read_back_through_tensorboards_event_accumulator(self):
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        with tempfile.TemporaryDirectory() as tmp:
            out = cli(make_run(tmp), "--to", "tensorboard", "--logdir", Path(tmp) / "tb")
            self.assertEqual(out.returncode, 0, out.stderr)
            acc = EventAccumulator(str(Path(tmp) / "tb"))
            acc.Reload()
            got = {(tag, e.step, e.value) for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}
            self.assertEqual({(k, s) for k, s, _ in got}, {(k, s) for k, s, _ in expected()})
            want = {(k, s): v for k, s, v in expected()}
            for k, s, v in got:  # stored as float32
                self.assertAlmostEqual(v, want[(k, s)], delta=1e-6 * max(1.0, abs(v)), msg=(k, s))


def wandb_history(run_file):
    """The history rows of a W&B offline run file (LevelDB log blocks of Record protos)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, buf, rows = Path(run_file).read_bytes(), 7, b"", {}
    assert data[:4] == b":W&B", data[:7]
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(buf)
            buf = b""
            if record.WhichOneof("record_type") == "history":
                items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
                rows[record.history.step.num] = items
    return rows


@unittest.skipUnless(HAVE["wandb"], "wandb is not installed")
class WandbOffline(unittest.TestCase):
    def test_the_offline_run_holds_every_value_at_its_step(self):
        with tempfile.TemporaryDirectory() as tmp:
            env = {"WANDB_MODE": "offline", "WANDB_DIR": tmp, "WANDB_SILENT": "true", "WANDB_CONSOLE": "off"}
            out = cli(make_run(tmp), "--to", "wandb", "--project", "acpo-test", env=env)
            self.assertEqual(out.returncode, 0, out.stderr)
            files = list(Path(tmp).glob("wandb/offline-run-*/run-*.wandb"))
            self.assertEqual(len(files), 1, list(Path(tmp).rglob("*")))
            rows = wandb_history(files[0])
            got = {(k, s, v) for s, row in rows.items() for k, v in row.items() if not k.startswith("_")}
            self.assertEqual(got, expected())


@unittest.skipUnless(HAVE["mlflow"], "mlflow is not installed")
class Mlflow(unittest.TestCase):
    def test_a_file_store_run_holds_every_value_under_verls_mlflow_names(self):
        with tempfile.TemporaryDirectory() as tmp:
            # a file store (MLflow 3 keeps it in maintenance, behind this switch): no server, no database
            env = {"MLFLOW_TRACKING_URI": Path(tmp, "mlruns").as_uri(), "MLFLOW_ALLOW_FILE_STORE": "true"}
            uri = env["MLFLOW_TRACKING_URI"]
            out = cli(make_run(tmp), "--to", "mlflow", "--project", "acpo-test", env=env)
            self.assertEqual(out.returncode, 0, out.stderr)
            from unittest import mock

            from mlflow.tracking import MlflowClient

            with mock.patch.dict(os.environ, {"MLFLOW_ALLOW_FILE_STORE": "true"}):
                client = MlflowClient(tracking_uri=uri)
                exp = client.get_experiment_by_name("acpo-test")
                (run,) = client.search_runs([exp.experiment_id])
                got = set()
                for key in run.data.metrics:
                    got |= {(key, m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)}
            self.assertEqual(run.info.run_name, "tiny-grpo-0123456789ab")
            self.assertEqual(got, {(track.mlflow_key(k), s, v) for k, s, v in expected()})


if __name__ == "__main__":
    unittest.main()
