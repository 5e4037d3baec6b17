#!/usr/bin/env python3
"""tools/gpu/report.py against a run it has never seen: the decode kernel's lines are made from
kernels/check/flash_check.cu's own printf formats (so a format changed there and not in the
parser fails here, before a GPU run's log does), with numbers whose rows are known.

    python3 -m unittest discover -s tools/gpu -p 'test_*.py'

Standard library only.
"""
import json
import re
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402

FLASH_CHECK = report.REPO / "kernels" / "check" / "flash_check.cu"


def printf_format(starts, then=""):
    """The format of flash_check.cu's printf whose first literal starts with `starts` and whose
    first argument starts with `then`: its adjacent string literals joined, C escapes read (the
    conversions it uses, %d %.3f %-8s %%, are Python's %-formatting too)."""
    src = FLASH_CHECK.read_text()
    found = []
    for m in re.finditer(r'printf\(((?:\s*"(?:[^"\\]|\\.)*")+)\s*,\s*', src):
        text = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)))
        if text.startswith(starts) and src.startswith(then, m.end()):
            found.append(text.encode().decode("unicode_escape"))
    assert len(found) == 1, f"{len(found)} printfs in {FLASH_CHECK} start {starts!r}, then {then!r}"
    return found[0]


def line(starts, *values, then=""):
    return (printf_format(starts, then) % values).rstrip("\n")


def kernel_name(path):
    """flash_check.cu's name of a path's forward (`name(path, false)`), as its source says."""
    return re.search(rf'p == {path}\) return "([^"]+)"', FLASH_CHECK.read_text()).group(1)


# Qwen3-1.7B's heads at two of the issue's shapes: (B, past), then the pipelined kernel's ms,
# the bytes' ms at the copy rate, the copy GB/s and MB
SHAPES = [(64, 1024, 0.100, 0.0739, 3773.0, 278.9), (1, 8191, 0.0122, 0.0092, 3773.0, 34.6)]


def kvqo_bytes(b, past):
    """K and V once, Q and O of Qwen3-1.7B's heads in bf16 at b rows of past + 1 keys."""
    return b * 8 * (past + 1) * 128 * 2 * 2 + b * 16 * 128 * 2 * 2


def ms_at(b, past, percent, copy=3773.0):
    """The time at which K, V, Q and O move at `percent` of `copy` GB/s."""
    return kvqo_bytes(b, past) / (percent / 100 * copy * 1e6)


def flash_log(shapes=SHAPES):
    out = []
    for b, past, ms, pred, copy, mb in shapes:
        out.append(line("time %-8s", kernel_name("DECODE"), b, 16, 8, 1, past, 128, 0.341, 900.0, 0.5,
                        then="name(path"))
    out.append(line("copy %.0f GB/s", 3773.0))
    for b, past, ms, pred, copy, mb in shapes:
        out.append(line("time %-8s", "decode pipe", b, 16, 8, 1, past, 128, ms, 2800.0, 5.4, then='"decode pipe",'))
        out.append(line("predicted decode pipe B", b, 16, 8, past, 128, pred, copy, mb, 100.0 * pred / ms,
                        100.0 * kvqo_bytes(b, past) / ms / 1e6 / copy))
        out.append(line("decode pipe compiled for G", 2, b, past, ms, 1.25 * ms))
        out.append(line("decode pipe chunks a block", b, past, 2)
                   + "".join(line(" %d: ", n, t, then="n,") for n, t in ((1, 0.2), (2, 0.1), (4, 0.15))))
    for b, past, ms, pred, copy, mb in shapes:
        out.append(line("time %-8s", "decode pipe fp8", b, 16, 8, 1, past, 128, ms / 2, 2800.0,
                        then='"decode pipe fp8"'))
        out.append(line("predicted decode pipe fp8 B", b, 16, 8, past, 128, pred / 2, copy, mb / 2, 50.0))
    # a train shape's line, which the decode table must leave to the attention table
    out.append(line("time %-8s", "mma fwd", 2, 16, 8, 2048, 0, 128, 0.27, 100.0, 128.0, then="name(path"))
    return "\n".join(out) + "\n"


class Run(unittest.TestCase):
    """A results directory of one call, `1-suite/gpu-suite`, removed after the test."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)
        self.dir = self.root / "1-suite" / "gpu-suite"
        self.dir.mkdir(parents=True)

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, text):
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def target_rows(self, issue, words):
        return [r for r in report.targets(self.root).splitlines() if r.startswith(f"| {issue} |") and words in r]


class KernelsLoad(Run):
    """`acpo bench kernels-load`'s kernels-load.json (src/perf/kernels_load.rs: `ModuleLoad`)."""

    def test_the_slowest_modules_come_first_and_no_report_is_no_lines(self):
        self.assertEqual(report.kernels_load(self.root), [])
        mods = [{"module": f"kernels/m{i}.cu", "ptx_bytes": 1_000_000 * i, "seconds": float(i)} for i in range(7)]
        self.write("kernels-load/kernels-load.json",
                   json.dumps({"modules": mods, "total_seconds": 21.0, "cuda_cache_path": "/c"}))
        lines = report.kernels_load(self.root)
        self.assertIn("21.0 s in all", lines[0])
        rows = [l for l in lines if l.startswith("| `")]
        self.assertEqual([r.split("`")[1] for r in rows],
                         [f"kernels/m{i}.cu" for i in (6, 5, 4, 3, 2)])
        self.assertEqual(rows[0], "| `kernels/m6.cu` | 6,000 KB | 6.00 |")


class TrainPhases(Run):
    """`--trace`'s phases (src/perf/train_step.rs), of the autograd step and the by-hand one."""

    def test_the_by_hand_step_s_phases_stand_beside_the_autograd_step_s(self):
        def trace(layer_s):
            return [{"phase": "start", "seconds": None, "peak": 0},
                    {"phase": "layer 1: recomputed and backpropagated", "seconds": layer_s, "peak": 2**31},
                    {"phase": "layer 0: recomputed and backpropagated", "seconds": layer_s, "peak": 2**31},
                    {"phase": "embedding: backpropagated", "seconds": 0.05, "peak": 3 * 2**30}]
        self.write("paper-2048/train-step.json", json.dumps([{"trace": trace(0.5)}]))
        self.assertEqual([l for l in report.train_phases(self.root) if "by hand" in l], [])
        self.write("paper-2048-by-hand/train-step.json", json.dumps([{"trace": trace(0.25)}]))
        lines = report.train_phases(self.root)
        heads = [l for l in lines if l.startswith("| 2 × ")]
        self.assertEqual(heads, ["| 2 × 2048: phase | seconds | peak GiB |",
                                 "| 2 × 2048, each layer's backward by hand: phase | seconds | peak GiB |"])
        self.assertIn("| 2 layers: recompute and backward (summed) | 0.500 | 2.0 |", lines)
        self.assertIn("| 2 layers: recompute and backward (summed) | 1.000 | 2.0 |", lines)
        self.assertEqual(lines.count("| embedding: backpropagated | 0.050 | 3.0 |"), 2)


class CudaTests(Run):
    """The suite's CUDA tests log: the tests no GPU has passed, then the rest, each run with its
    own `test result` line, after a line saying how many runs the log holds."""

    RESULT = "test result: {}. {} passed; {} failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s"

    def test_both_runs_count_and_a_missing_run_is_cut(self):
        first = ["cuda test runs: 2", "test cuda::new ... ok", self.RESULT.format("ok", 14, 0)]
        again = ["test cuda::old ... ok", self.RESULT.format("ok", 13, 0)]
        self.assertEqual(report.test_results("\n".join(first + again)), (27, 0, "ok"))
        self.assertEqual(report.test_results("\n".join(first)), (14, 0, "cut"))
        self.assertIsNone(report.test_results("cuda test runs: 2\ntest cuda::new ... ok"))
        failed = ["test cuda::old ... FAILED", self.RESULT.format("FAILED", 12, 1)]
        self.assertEqual(report.test_results("\n".join(first + failed)), (26, 1, "FAILED"))
        # a log of one run, as before the suite split them (the H200's)
        self.assertEqual(report.test_results(self.RESULT.format("ok", 13, 0)), (13, 0, "ok"))
        # each run's exit once it ended: a crashed first run (no result line) fails the log,
        # though the second passed
        crashed = ["cuda test runs: 2", "test cuda::new ... ", "cuda test run exit: 134"]
        ended = again + ["cuda test run exit: 0"]
        self.assertEqual(report.test_results("\n".join(crashed + ended)), (13, 0, "FAILED"))
        self.assertEqual(report.test_results("\n".join(crashed)), (0, 0, "FAILED"))
        self.assertEqual(report.test_results("\n".join(first + ["cuda test run exit: 0"] + ended)), (27, 0, "ok"))
        self.write("cuda_tests.log", "\n".join(first))
        row = self.target_rows("#18", "CUDA tests")[0]
        self.assertTrue(row.endswith("| 14 passed, 0 failed, the rest cut | partly |"), row)
        self.assertIn("| 1-suite | cut | all pass |", report.tests_table(self.root)[0])
        self.write("cuda_tests.log", "\n".join(crashed + ended))
        row = self.target_rows("#18", "CUDA tests")[0]
        self.assertTrue(row.endswith("| 13 passed, 0 failed, a run ended without its result (a crash) | no |"), row)


class ByHandAccounting(Run):
    """The traced step with each layer's backward by hand, by kind of work from its parts
    (src/device.rs's names), beside the twin; nothing from a binary whose by-hand backward was
    one part."""

    SETTINGS = {"batch": 2, "seq_len": 9220, "prompt_len": 1024, "layers": 2, "vocab": 100, "hidden": 64,
                "heads": 4, "kv_heads": 2, "head_dim": 16, "intermediate": 128, "tied": True, "compute": "bf16"}

    def step(self, layer_parts):
        layer = lambda i: {"phase": f"layer {i}: recomputed and backpropagated", "seconds": 1.0,
                           "parts": [{"name": k, "seconds": v} for k, v in layer_parts.items()]}
        return json.dumps([{"seconds": 1.5, "tokens_per_second": 1.0, "mfu": 0.1, "settings": self.SETTINGS,
                            "trace": [{"phase": "before the step", "seconds": 0.0},
                                      {"phase": "forward without a graph: every layer's input kept", "seconds": 0.2,
                                       "parts": [{"name": "forward: matrix products", "seconds": 0.1},
                                                 {"name": "forward: attention", "seconds": 0.05}]},
                                      # an unchunked head's lm_head is a timed product too: counted
                                      # in the head's estimate, not again as the layers'
                                      {"phase": "head: the loss, its backward to the last layer", "seconds": 0.6,
                                       "parts": [{"name": "forward: matrix products", "seconds": 0.5}]},
                                      layer(1), layer(0),
                                      {"phase": "actor mini-batch 0: the optimizer step", "seconds": 0.1}]}])

    def test_the_part_names_are_the_binary_s(self):
        consts = dict(re.findall(r'pub const (\w+): &str = "([^"]+)";', (report.REPO / "src/device.rs").read_text()))
        self.assertEqual(report.PART_ATTENTION, (consts["FORWARD_ATTENTION"], consts["BACKWARD_ATTENTION"]))
        self.assertEqual(report.PART_PRODUCTS, (consts["FORWARD_MATMUL"], consts["BACKWARD_MATMUL"]))
        self.assertEqual(report.PART_SEED, consts["SEED"])
        self.assertEqual(report.PART_TO_MASTERS, consts["TO_MASTERS"])
        self.assertEqual(report.PART_ONE_REST, consts["BACKWARD_REST"])

    def test_each_kind_of_work_is_its_parts_and_the_rest_what_is_left(self):
        self.assertEqual(report.by_hand_accounting(self.root), [])
        # a binary whose backward by hand was one part has no accounting of its own
        self.write("paper-9220-by-hand/train-step.json",
                   self.step({"backward: matrix products and element-wise": 0.5, "backward: attention": 0.3}))
        self.assertEqual(report.by_hand_accounting(self.root), [])
        parts = {"forward: attention": 0.1, "forward: matrix products": 0.1, "forward: element-wise": 0.05,
                 "backward: element-wise": 0.1, "backward: matrix products": 0.2,
                 "backward: weight gradients to the masters": 0.05, "backward seed": 0.01,
                 "backward: attention": 0.3}
        self.write("paper-9220-by-hand/train-step.json", self.step(parts))
        self.write("torch-train-9220.json", json.dumps({"seconds": 3.0}))
        lines = report.by_hand_accounting(self.root, {9220: 3.75})
        row = lambda label: next(l for l in lines if l.startswith(f"| {label}"))
        ms = lambda l: [c.strip() for c in row(l).split("|")[2:-1]]
        # attention: the forward pass's 50 ms and each layer's 100 + 300
        self.assertEqual(ms("attention kernels"), ["850"])
        # products: 100 + 2 × 300 ms measured, and the head's 8·N_r·V·H FLOPs at their rate
        st = self.SETTINGS
        layer_flops = 8 * 2 * 9220 * report.layer_matmul_params(st) * 2
        head = 8 * 2 * (9220 - 1024) * 100 * 64 * 0.7 / layer_flops
        self.assertEqual(ms("matrix products"), [f"{1e3 * (0.7 + head):,.0f}"])
        self.assertEqual(ms("the seeds' values"), ["20"])
        self.assertEqual(ms("the layers' element-wise passes"), ["300"])
        self.assertEqual(ms("the layers' weight gradients to their fp32 masters"), ["100"])
        self.assertEqual(ms("AdamW"), ["100"])
        traced = 0.2 + 0.6 + 2 * 1.0 + 0.1
        self.assertEqual(ms("the traced step"), [f"{1e3 * traced:,.0f}"])
        rest = traced - 0.85 - (0.7 + head) - 0.02 - 0.3 - 0.1 - 0.1
        self.assertEqual(ms("the rest"), [f"{1e3 * rest:,.0f}"])
        self.assertEqual(ms("the step untraced"), ["1,500"])
        self.assertEqual(ms("the autograd step untraced"), ["3,750"])
        self.assertEqual(ms("the twin"), ["3,000"])
        self.assertIn("- 2 × 9,220: 2.00× the twin's speed (target ≥ 1.0), 2.50× the autograd step's.", lines)
        self.assertIn("| backward: weight gradients to the masters | 100 |", lines)
        # each layer's 1 s less its parts' 0.91 s, summed
        self.assertIn(f"| {report.AFTER_LAST_PART} | 180 |", lines)
        # in gpu-step-parts.md, which has no autograd accounting without flash_check's times
        lines = report.step_accounting(self.root).splitlines()
        self.assertIn("| attention kernels (forward, recompute, backward) | 850 |", lines)
        self.assertIn("| the autograd step untraced | — |", lines)


class PeaksBesidePrediction(Run):
    """The measured peaks of the traced steps beside results/cpu-memory's committed prediction:
    the autograd step's under issue #44, the by-hand step's under #59, each against its own."""

    def test_each_traced_step_is_set_beside_its_own_prediction(self):
        def step(peak_gib):
            return json.dumps([{"memory": {"peak": int(peak_gib * 2**30)}, "tokens_per_second": 9000.0, "mfu": 0.1,
                                "trace": [{"phase": "embedding: backpropagated", "seconds": 0.1,
                                           "peak": int(peak_gib * 2**30)}]}])
        self.assertEqual(report.memory_vs_prediction(self.root), [])
        self.write("paper-9220/train-step.json", step(36.6))
        self.write("paper-9220-by-hand/train-step.json", step(30.0))
        # an untraced step is not of the prediction's code
        self.write("paper-2048-by-hand/train-step.json",
                   json.dumps([{"memory": {"peak": 2**34}, "tokens_per_second": 9000.0, "mfu": 0.1}]))
        rows = [l for l in report.memory_vs_prediction(self.root) if l.startswith("| 2 × ")]
        self.assertEqual([r.split(" | ")[0] for r in rows],
                         ["| 2 × 9220", "| 2 × 9220, each layer's backward by hand"])
        for row, variant, got in zip(rows, ("all-savings", "layer-by-hand"), (36.6, 30.0)):
            peak, bound, _ = report.predicted_peaks(variant)[9220]
            self.assertIn(f"| {got:.1f} | embedding: backpropagated | {peak / 2**30:.1f} ({bound / 2**30:.1f}) |", row)
        self.assertNotEqual(report.predicted_peaks("all-savings")[9220], report.predicted_peaks("layer-by-hand")[9220])
        self.assertEqual(len(self.target_rows("#44", "the measured peak at 2 × 9220 beside")), 1)
        by_hand = self.target_rows("#59", "the measured peak at 2 × 9220, each layer's backward by hand beside")
        self.assertEqual(len(by_hand), 1)
        self.assertTrue(by_hand[0].endswith("| within the bound |"), by_hand[0])


class DecodeKernelTimes(Run):
    def setUp(self):
        super().setUp()
        self.write("flash_kernels_check.log", flash_log())

    def test_every_line_of_a_shape_is_read(self):
        got = report.decode_kernel_times(self.root)
        self.assertEqual(list(got), [(64, 1025), (1, 8192)])
        big = got[(64, 1025)]
        self.assertAlmostEqual(big["pipe"], 0.100)
        self.assertAlmostEqual(big["predicted"], 0.0739)
        self.assertEqual(big["copy"], 3773.0)
        self.assertEqual(big["percent"], 73.9)
        self.assertAlmostEqual(big["split"], 0.341)
        self.assertEqual((big["g"], big["any_g"]), (2, 0.125))
        self.assertEqual(big["host"], 2)
        self.assertEqual(big["chunks"], {1: 0.2, 2: 0.1, 4: 0.15})
        self.assertAlmostEqual(big["fp8"], 0.05)
        self.assertEqual(big["fp8_percent"], 50.0)
        self.assertEqual(got[(1, 8192)]["percent"], 75.4)

    def test_the_kernel_targets_say_met_at_80_percent_not_below(self):
        # every byte at 82 % where K, V, Q and O alone are at 80.0 %, 85 % and 79.9 %
        shapes = [(64, 1024, ms_at(64, 1024, 80.0)), (1, 8191, ms_at(1, 8191, 79.9)), (64, 2047, ms_at(64, 2047, 85.0))]
        self.write("flash_kernels_check.log", flash_log([(b, past, ms, 0.82 * ms, 3773.0, 0.0) for b, past, ms in shapes]))
        rows = self.target_rows("#57", "decode attention kernel")
        self.assertEqual(len(rows), 3)
        self.assertIn("64 × 1,025 keys | 80.0 % (on K, V, Q and O; 82.0 % on every byte it moves; 89.2 µs where "
                      "every byte at 3,773 GB/s takes 73.1 µs) | yes |", rows[0])
        self.assertIn("64 × 2,048 keys | 85.0 %", rows[1])
        self.assertTrue(rows[1].endswith("| yes |"))
        self.assertIn("1 × 8,192 keys | 79.9 % (on K, V, Q and O; 82.0 % on every byte", rows[2])
        self.assertTrue(rows[2].endswith("| no |"))

    def test_a_shape_the_timing_did_not_reach_is_a_row_that_says_so(self):
        rows = self.target_rows("#57", "decode attention kernel")
        self.assertEqual(len(rows), 3)
        self.assertIn("64 × 2,048 keys | not timed", rows[1])
        self.assertTrue(rows[1].endswith("| no |"))

    def test_the_table_holds_each_shape_and_the_attention_table_none(self):
        text = "\n".join(report.decode_kernels(self.root))
        self.assertIn("| 64 × 1,025 | 100.0 µs | 73.9 µs | 73.9 % | 71.4 % | 125.0 µs | 341.0 µs | 50.0 µs | 50.0 % |",
                      text)
        self.assertIn("| 1 × 8,192 | 12.2 µs | 9.2 µs | 75.4 % | 72.9 % | 15.3 µs | 341.0 µs | 6.1 µs | 50.0 % |", text)
        self.assertIn("- 1 × 8,192: 1: 200.0 µs; 2 (host): 100.0 µs; 4: 150.0 µs", text)
        attention = "\n".join(report.flash_kernels(self.dir / "flash_kernels_check.log", self.root))
        self.assertNotIn("decode pipe", attention)
        self.assertIn("| mma fwd | B2 H16 KV8 T2048 past0 D128 |", attention)

    def test_a_run_before_the_pipelined_kernel_has_no_table_and_no_row(self):
        self.write("flash_kernels_check.log",
                   "\n".join(l for l in flash_log().splitlines() if "pipe" not in l and not l.startswith("copy")))
        self.assertEqual(report.decode_kernel_times(self.root), {})
        self.assertEqual(report.decode_kernels(self.root), [])
        self.assertEqual(self.target_rows("#57", "decode attention kernel"), [])


def sampling(shape, fraction=0.65, parameters=1_720_574_976, bytes_per_step=12.8e9, step_seconds=0.0132):
    return {"model": "qwen3-1.7b", "parameters": parameters, "what": "generate", "target": "cuda/bf16",
            "tokens": 65536, "seconds": 8.0, "tokens_per_second": 9000.0, "shape": shape,
            "roofline": {"bytes_per_step": bytes_per_step, "step_seconds": step_seconds, "prefill_seconds": 0.5,
                         "decode_tokens_per_second": 9500.0, "achieved_gb_per_s": 970.0,
                         "copy_gb_per_s": 3773.0, "fraction": fraction}}


def hf(cache, batch=64, prompt_len=1024, new_tokens=1024, decode=3000.0):
    return {"cache": cache, "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens,
            "tokens_per_second": 2000.0, "decode_tokens_per_second": decode}


class PaperDecodeTargets(Run):
    def test_the_target_shape_is_judged_against_the_static_cache(self):
        acpo = sampling(report.PAPER_DECODE_SHAPE)
        rows = report.paper_decode_targets(acpo, [hf("static"), hf("dynamic", decode=1000.0)])
        self.assertEqual([r[3] for r in rows], ["yes", "yes"])
        self.assertEqual(rows[1][2], "3.17× (decode steps)")
        rows = report.paper_decode_targets(sampling(report.PAPER_DECODE_SHAPE, fraction=0.59), [hf("dynamic")])
        self.assertEqual([r[3] for r in rows], ["no", "not measured"])

    def test_another_shape_measures_nothing(self):
        rows = report.paper_decode_targets(sampling("64 prompts of 1024 + 512 new tokens"), [])
        self.assertEqual([r[3] for r in rows], ["not measured", "not measured"])

    def test_hf_runs_of_another_prompt_length_are_not_the_same_shape(self):
        for name, run in (("static", hf("static", prompt_len=512)), ("dynamic", hf("dynamic"))):
            self.write(f"torch-generate-{name}.json", json.dumps(run))
        same = report.hf_runs(self.root, sampling(report.PAPER_DECODE_SHAPE))
        self.assertEqual([t["cache"] for t in same], ["dynamic"])


class LongTail(Run):
    def test_the_kv_bound_counts_the_cache_alone(self):
        # 3.44 GB of bf16 weights and 6.0 GB of cache a step in 4 ms at 3,773 GB/s: the roofline
        # 62.6 %, the KV-bandwidth bound 39.8 %
        row = sampling("128 prompts of 1024, long-tailed lengths", parameters=1.72e9,
                       bytes_per_step=3.44e9 + 6.0e9, step_seconds=0.004)
        self.assertAlmostEqual(report.kv_fraction(row), 6.0e9 / 0.004 / 3773e9)
        row["target"] = "cuda/f32"
        self.assertAlmostEqual(report.kv_fraction(row), (9.44e9 - 6.88e9) / 0.004 / 3773e9)

    def test_the_evaluations_run_is_its_paged_row_against_the_kv_bound(self):
        shape = ("2048 prompts of 121 (128 distinct × 16 responses), long-tailed lengths ≤ 2048 (Σ 600000), "
                 "continuous batching over the paged KV cache, at most 1400 at once, the widest prefill 16335 "
                 "positions; decode 9500 tokens/s")
        # 3.44 GB of weights and 20 GB of cache a step: a ceiling of 85.3 %; at 8 ms a step 66.3 %
        paged = sampling(shape, parameters=1.72e9, bytes_per_step=3.44e9 + 20e9, step_seconds=0.008)
        self.write("generate-eval/generate.json", json.dumps([paged]))
        rows = self.target_rows("#57", "evaluations' own shape")
        self.assertEqual(len(rows), 1)
        self.assertIn(f"| 9,000.0 tokens/s, {100 * 20e9 / 0.008 / 3773e9:.1f} % (65.0 % of the roofline with the "
                      f"weights; this shape's ceiling 85.3 %; {shape}) | no |", rows[0])
        text = "\n".join(report.generate(self.root, []))
        self.assertIn("At the evaluations' shape (`generate-eval`, 2048 prompts of 121 (128 distinct × 16 "
                      "responses), long-tailed lengths ≤ 2048 (Σ 600000); at most 1400 at once", text)
        self.assertIn("of at most 85.3 % at this shape", text)

    def test_a_shape_whose_ceiling_is_below_the_target_measures_nothing(self):
        def run(kv, seconds):
            return sampling("x, continuous batching over the paged KV cache, y", parameters=1.72e9,
                            bytes_per_step=3.44e9 + kv, step_seconds=seconds)
        # a ceiling of 63.6 % (6 GB of cache beside 3.44 of weights): not measured, even at the copy rate
        words, met = report.kv_target(run(6.0e9, 9.44e9 / 3773e9))
        self.assertEqual(met, "not measured")
        self.assertIn("this shape's ceiling 63.6 %", words)
        self.assertTrue(words.endswith("this shape cannot show it (the weights are too much of a step's bytes)"), words)
        # a ceiling of 85.3 %: below 70 % of the bound is a miss, at it a hit
        self.assertEqual(report.kv_target(run(20e9, 20e9 / 3773e9 / 0.69))[1], "no")
        self.assertEqual(report.kv_target(run(20e9, 20e9 / 3773e9 / 0.70))[1], "yes")

    def test_a_paged_run_alone_is_the_paged_row_and_no_dense_rows(self):
        paged = sampling("128 prompts of 1024, continuous batching over the paged KV cache, at most 9 at once",
                         parameters=1.72e9, bytes_per_step=3.44e9 + 20e9, step_seconds=0.008)
        for name in ("generate-long-tail-paged", "generate-long-tail-paged-fp8"):
            self.write(f"{name}/generate.json", json.dumps([paged]))
        self.assertIsNone(report.long_tail_dense(self.root))
        self.assertEqual(report.long_tail_paged(self.root)["shape"], paged["shape"])
        text = "\n".join(report.generate(self.root, []))
        self.assertIn("The same over an FP8 KV cache (`--kv-cache fp8`, E4M3 bytes): over the paged pool (at most 9 "
                      "at once)", text)
        self.assertEqual(len(self.target_rows("#57", "over the paged KV cache")), 1)

class Variants(Run):
    def test_a_variant_out_of_memory_or_unfinished_is_a_row_that_says_so(self):
        self.write("torch-train-9220.json", json.dumps({"tokens_per_second": 19000.0, "mfu": 0.26,
                                                        "peak_bytes": 67.7 * 2**30}))
        self.write("acpo-train-9220-by-hand.log", "... CUDA_ERROR_OUT_OF_MEMORY ...")
        self.write("acpo-train-9220-five.log", "started\n")
        rows = self.target_rows("#59", "2 × 9220")
        self.assertIn("each layer's backward by hand | out of memory | no |", rows[0])
        self.assertIn("attention backward in 5 products | did not finish (failed or cut; acpo-train-9220-five.log) | no |",
                      rows[1])
        peaks = self.target_rows("#59", "peak ≤ 40 GiB")
        self.assertEqual([r.split(" | ")[2] for r in peaks], ["out of memory", "did not finish (failed or cut; "
                                                              "acpo-train-9220-five.log)"])


class PlanTargets(Run):
    def plan(self, call, kv, hours, at_bound=52.6, at_fp8_bound=35.0, carried=None):
        row = {"run": "qwen3-1.7b-grpo", "gpu_hours": hours, "gpu_hours_at_kv_bound": at_bound,
               "gpu_hours_at_fp8_kv_bound": at_fp8_bound, "gpu_hours_at_paper_contexts": carried}
        path = self.root / call / kv / "paper-plan.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps([row]))

    def test_the_plan_is_judged_on_its_gpu_with_the_bounds_and_the_fp8_plan_beside(self):
        self.write("summary.txt", "== suite on NVIDIA H100 80GB HBM3, 580.1, 81559 MiB\n")
        self.plan("2-plan", "measured", 47.0)
        self.plan("2-plan", "fp8-kv", 40.0)
        self.plan("10-plan", "measured", 46.0)
        rows = self.target_rows("#57", "plan ≤ 48")
        self.assertEqual(rows, ["| #57 | qwen3-1.7b-grpo's plan ≤ 48 GPU-hours on one H100 from measured rates | 46 GPU-hours "
                                "on one NVIDIA H100 80GB HBM3 (at the KV-bandwidth bound 53; with an FP8 KV cache at its "
                                "bound 35) | yes |"])
        self.plan("10-plan", "fp8-kv", 30.0)
        self.assertIn("with an FP8 KV cache at its bound 35, from its measured rate 30) | yes |",
                      self.target_rows("#43", "plan")[0])
        # the plan with each layer's backward by hand, an option a run takes, beside the default's
        self.plan("10-plan", "by-hand", 44.0)
        self.assertIn("from its measured rate 30); 44 with each layer's backward by hand | yes |",
                      self.target_rows("#57", "plan ≤ 48")[0])
        for kv in ("measured", "by-hand"):
            (self.root / "10-plan" / kv / "paper-plan.md").write_text(f"the {kv} plan\n")
        text = report.report(self.root)
        self.assertIn("backward by hand** (`model.layer_backward: by-hand`; the same sampling rates):\n\n"
                      "the by-hand plan\n", text)

    def test_the_hours_at_the_paper_contexts_count_where_they_are_more(self):
        self.write("summary.txt", "== suite on NVIDIA H100 80GB HBM3, 580.1, 81559 MiB\n")
        self.plan("2-plan", "measured", 40.0, carried=50.0)
        row = self.target_rows("#57", "plan")[0]
        self.assertIn("40 GPU-hours on one NVIDIA H100 80GB HBM3, 50 at the paper's contexts", row)
        self.assertTrue(row.endswith("| no |"))

    def test_rates_without_a_plan_say_so(self):
        self.write("rates/train-step.json", "[]")
        self.write("rates/generate.json", "[]")
        self.assertEqual(self.target_rows("#57", "plan"),
                         ["| #57 | qwen3-1.7b-grpo's plan ≤ 48 GPU-hours on one H100 from measured rates | no plan made "
                          "from this run's rates yet (`just gpu-plan DIR`) | no |"])

    def test_a_plan_on_another_gpu_does_not_meet_the_h100_target(self):
        self.write("summary.txt", "== suite on NVIDIA H200, 580.1, 143771 MiB\n")
        self.plan("2-plan", "measured", 40.0)
        self.assertTrue(self.target_rows("#43", "plan")[0].endswith("| yes |"))
        row = self.target_rows("#57", "plan")[0]
        self.assertIn("(the issue's GPU is an H100; this run's: NVIDIA H200)", row)
        self.assertTrue(row.endswith("| no |"))


class TwinMissing(Run):
    def test_a_variant_without_its_twin_is_not_measured(self):
        self.write("paper-2048-by-hand/train-step.json", json.dumps([{"tokens_per_second": 12000.0, "mfu": 0.2}]))
        rows = self.target_rows("#59", "2 × 2048, each layer's backward by hand")
        self.assertEqual(len(rows), 1)
        self.assertTrue(rows[0].endswith("| 12,000.0 tokens/s; the twin did not run | not measured |"), rows[0])


class AttentionWithoutItsTwin(Run):
    def test_acpo_s_attention_stands_without_the_sdpa_twin(self):
        shape = ("2×9220, 16 heads over 8 KV heads of 128; forward 0.0050 s (120.0 TFLOP/s), "
                 "forward + backward 0.0186 s (131.0 TFLOP/s)")
        self.write("attention-9220/attention.json", json.dumps([{"shape": shape}]))
        table = report.attention(self.root)
        row = next(l for l in table if l.startswith("| 2 × 9220 |"))
        self.assertEqual(row, "| 2 × 9220 | 0.0050 (120.0) | not run | 0.0186 (131.0) | not run | — |")
        self.assertIn("| 2 × 2048 | not run | not run | | | |", table)
        rows = self.target_rows("#33", "within 2×")
        self.assertEqual(rows, ["| #33 | one layer's attention forward + backward at 2 × 9,220 within 2× of torch's sdpa "
                                "| 131 TFLOP/s; torch's sdpa not run in this call | not measured |"])


class Unfinished(unittest.TestCase):
    def test_cut_failed_and_not_run_steps_are_listed_in_either_wording(self):
        lines = ["== suite on NVIDIA H200, 580.1, 143771 MiB",
                 "== section decode: 320 s",
                 "== acpo pipeline qwen3-1.7b-grpo (2 steps): exit 124 in 257 s (cut at 257 s)",
                 "== flash kernels check: exit 124 in 49 s (cut: its section's time ran out at 49 s)",
                 "== torch generate (static cache) x: exit 124 in 120 s (its own limit at 120 s)",
                 "== acpo train-step y: exit 101 in 3 s",
                 "== acpo train-step z: exit 2 in 30 s",
                 "== ops check: cut, not run (its section's time is spent)",
                 "== acpo generate w: exit 0 in 22 s",
                 "== acpo generate v: exit 1 in 5 s",
                 "== acpo generate v: exit 0 in 9 s",
                 "== torch step u: skipped (no torch with a GPU here)"]
        got = report.unfinished(lines)
        self.assertEqual(got, [
            "- acpo pipeline qwen3-1.7b-grpo (2 steps): exit 124 in 257 s (cut at 257 s)",
            "- acpo train-step y: exit 101 in 3 s",
            "- acpo train-step z: exit 2 in 30 s",
            "- flash kernels check: exit 124 in 49 s (cut: its section's time ran out at 49 s)",
            "- ops check: cut, not run (its section's time is spent)",
            "- torch generate (static cache) x: exit 124 in 120 s (its own limit at 120 s)"])
        self.assertEqual(report.unfinished(lines[:2] + lines[8:9]), ["- none"])
        # a step whose name holds ': ', cut in one call and run to the end in a later one
        ncu = "ncu: the launches of a decode step (64 prompts of 64, 4 new tokens)"
        self.assertEqual(report.unfinished([f"== {ncu}: cut, not run (its section's time is spent)",
                                            f"== {ncu}: exit 0 in 30 s"]), ["- none"])
        self.assertEqual(report.unfinished([f"== {ncu}: not run (the call's time is spent)"]),
                         [f"- {ncu}: not run (the call's time is spent)"])


class CallOrder(unittest.TestCase):
    def test_call_ten_comes_after_call_two(self):
        paths = [Path("r/10-decode/x.json"), Path("r/2-suite/x.json"), Path("r/1-suite/x.json")]
        self.assertEqual([p.parts[1] for p in sorted(paths, key=report.call_order)], ["1-suite", "2-suite", "10-decode"])


if __name__ == "__main__":
    unittest.main()
