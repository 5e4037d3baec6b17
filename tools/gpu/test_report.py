#!/usr/bin/env python3
"""tools/gpu/report.py against a run it has never seen: the decode kernel's lines are made from
kernels/check/flash_check.cu's own printf formats (so a format changed there and not in the
parser fails here, before a GPU run's log does), with numbers whose rows are known.

    python3 -m unittest discover -s tools/gpu -p 'test_*.py'

Standard library only.
"""
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


# Qwen3-1.7B's heads at the shapes: (B, past) and (pipe ms, predicted ms, copy GB/s, MB)
SHAPES = [(64, 1024, 0.100, 0.0739, 3773.0, 278.9), (1, 8191, 0.0122, 0.0092, 3773.0, 34.6)]


def flash_log():
    out = []
    for b, past, ms, pred, copy, mb in SHAPES:
        out.append(line("time %-8s", "decode", b, 16, 8, 1, past, 128, 0.341, 900.0, 0.5, then="name(path"))
    out.append("copy 3773 GB/s (1 GiB device to device, read + write)")
    for b, past, ms, pred, copy, mb in SHAPES:
        out.append(line("time %-8s", "decode pipe", b, 16, 8, 1, past, 128, ms, 2800.0, 5.4, then='"decode pipe",'))
        out.append(line("predicted decode pipe B", b, 16, 8, past, 128, pred, copy, mb, 100.0 * pred / ms))
        out.append(line("decode pipe compiled for G", 2, b, past, ms, 1.25 * ms))
        out.append(line("decode pipe chunks a block", b, past, 2) + " 1: 0.200 ms; 2: 0.100 ms; 4: 0.150 ms;")
    for b, past, ms, pred, copy, mb in SHAPES:
        out.append(line("time %-8s", "decode pipe fp8", b, 16, 8, 1, past, 128, ms / 2, 2800.0,
                        then='"decode pipe fp8"'))
        out.append(line("predicted decode pipe fp8 B", b, 16, 8, past, 128, pred / 2, copy, mb / 2, 50.0))
    # a train shape's line, which the decode table must leave to the attention table
    out.append(line("time %-8s", "mma fwd", 2, 16, 8, 2048, 0, 128, 0.27, 100.0, 128.0, then="name(path"))
    return "\n".join(out) + "\n"


class DecodeKernelTimes(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)
        log = self.root / "1-suite" / "gpu-suite" / "flash_kernels_check.log"
        log.parent.mkdir(parents=True)
        log.write_text(flash_log())

    def tearDown(self):
        self.tmp.cleanup()

    def test_every_line_of_a_shape_is_read(self):
        got = report.decode_kernel_times(self.root)
        self.assertEqual(list(got), [(64, 1025), (1, 8192)])
        big = got[(64, 1025)]
        self.assertAlmostEqual(big["pipe"], 0.100)
        self.assertAlmostEqual(big["predicted"], 0.0739)
        self.assertEqual(big["copy"], 3773.0)
        self.assertEqual(big["percent"], 74.0)  # 73.9 printed %.0f
        self.assertAlmostEqual(big["split"], 0.341)
        self.assertEqual((big["g"], big["any_g"]), (2, 0.125))
        self.assertEqual(big["host"], 2)
        self.assertEqual(big["chunks"], {1: 0.2, 2: 0.1, 4: 0.15})
        self.assertAlmostEqual(big["fp8"], 0.05)
        self.assertEqual(big["fp8_percent"], 50.0)
        self.assertEqual(got[(1, 8192)]["percent"], 75.0)

    def test_the_kernel_targets_say_met_only_at_80_percent(self):
        log = self.root / "1-suite" / "gpu-suite" / "flash_kernels_check.log"
        log.write_text(log.read_text().replace("measured at 74 %", "measured at 80 %"))
        rows = [r for r in report.targets(self.root).splitlines() if "decode attention kernel" in r]
        self.assertEqual(len(rows), 2)
        self.assertIn("64 × 1,025 keys | 80 % (100.0 µs; its bytes take 73.9 µs at 3,773 GB/s)", rows[0])
        self.assertTrue(rows[0].endswith("| yes |"))
        self.assertIn("1 × 8,192 keys | 75 %", rows[1])
        self.assertTrue(rows[1].endswith("| no |"))

    def test_the_table_holds_each_shape_and_the_attention_table_none(self):
        text = "\n".join(report.decode_kernels(self.root))
        self.assertIn("| 64 × 1,025 | 100.0 µs | 73.9 µs | 74 % | 125.0 µs | 341.0 µs | 50.0 µs | 50 % |", text)
        self.assertIn("| 1 × 8,192 | 12.2 µs | 9.2 µs | 75 % | 15.3 µs | 341.0 µs | 6.1 µs | 50 % |", text)
        self.assertIn("- 1 × 8,192: 1: 200.0 µs; 2 (host): 100.0 µs; 4: 150.0 µs", text)
        check = self.root / "1-suite" / "gpu-suite" / "flash_kernels_check.log"
        attention = "\n".join(report.flash_kernels(check, self.root))
        self.assertNotIn("decode pipe", attention)
        self.assertIn("| mma fwd | B2 H16 KV8 T2048 past0 D128 |", attention)

    def test_a_run_without_the_pipelined_kernel_has_no_table(self):
        log = self.root / "1-suite" / "gpu-suite" / "flash_kernels_check.log"
        log.write_text("\n".join(l for l in flash_log().splitlines() if "pipe" not in l))
        self.assertEqual(report.decode_kernel_times(self.root), {})
        self.assertEqual(report.decode_kernels(self.root), [])


class PaperDecodeTargets(unittest.TestCase):
    def run_at(self, shape, fraction=0.65, hf=None):
        acpo = {"shape": shape, "tokens": 65536, "tokens_per_second": 9000.0,
                "roofline": {"fraction": fraction, "decode_tokens_per_second": 9500.0}}
        return report.paper_decode_targets(acpo, hf or [])

    def test_the_target_shape_is_judged(self):
        hf = [{"cache": "static", "tokens_per_second": 2000.0, "decode_tokens_per_second": 3000.0}]
        rows = self.run_at(report.PAPER_DECODE_SHAPE, hf=hf)
        self.assertEqual([r[3] for r in rows], ["yes", "yes"])
        self.assertEqual(rows[1][2], "3.17× (decode steps; HF with its static cache)")
        rows = self.run_at(report.PAPER_DECODE_SHAPE, fraction=0.59)
        self.assertEqual([r[3] for r in rows], ["no", "no"])
        self.assertEqual(rows[1][2], "HF generate not run at that shape")

    def test_another_shape_measures_nothing(self):
        rows = self.run_at("64 prompts of 1024 + 512 new tokens")
        self.assertEqual([r[3] for r in rows], ["not measured", "not measured"])


if __name__ == "__main__":
    unittest.main()
