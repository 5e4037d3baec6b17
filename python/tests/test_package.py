"""The package as a typed library and a command: `_native.pyi` and `py.typed` ship in the
installed package, the stubs name exactly the native module's functions with its parameters
(and pass mypy's stubtest where mypy is installed), and `python -m acpo score FILE.jsonl`.
"""
import ast
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import acpo
from acpo import _native

PACKAGE = Path(acpo.__file__).resolve().parent


def stub_functions():
    tree = ast.parse((PACKAGE / "_native.pyi").read_text())
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    names = {t.id for n in tree.body if isinstance(n, ast.AnnAssign) for t in [n.target]}
    exported = next(ast.literal_eval(n.value) for n in tree.body
                    if isinstance(n, ast.Assign) and [t.id for t in n.targets] == ["__all__"])
    return funcs, names, exported


def stub_params(fn):
    a = fn.args
    defaults = [None] * (len(a.args) - len(a.defaults)) + [ast.literal_eval(d) for d in a.defaults]
    out = [(p.arg, "POSITIONAL_OR_KEYWORD", d) for p, d in zip(a.args, defaults)]
    out += [(p.arg, "KEYWORD_ONLY", None if d is None else ast.literal_eval(d)) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    return out


def runtime_params(fn):
    out = []
    for p in inspect.signature(fn).parameters.values():
        default = None if p.default is inspect.Parameter.empty else p.default
        out.append((p.name, p.kind.name, default))
    return out


class Typing(unittest.TestCase):
    def test_the_installed_package_is_typed(self):
        self.assertTrue((PACKAGE / "py.typed").is_file())
        self.assertTrue((PACKAGE / "_native.pyi").is_file())

    def test_the_stubs_match_the_native_module(self):
        funcs, names, exported = stub_functions()
        self.assertEqual(exported, _native.__all__)
        native = {n for n in dir(_native) if callable(getattr(_native, n)) and not n.startswith("__")}
        self.assertEqual(set(funcs), native)
        for name, fn in funcs.items():
            self.assertEqual(stub_params(fn), runtime_params(getattr(_native, name)), name)
        constants = {n for n in _native.__all__ if n not in native}
        self.assertEqual(names, constants)

    @unittest.skipUnless(importlib.util.find_spec("mypy"), "mypy is not installed")
    def test_mypys_stubtest_agrees(self):
        out = subprocess.run([sys.executable, "-m", "mypy.stubtest", "acpo._native"], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)


def run_cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "acpo", *args], capture_output=True, text=True, input=stdin)


class ScoreCommand(unittest.TestCase):
    def test_a_jsonl_file_is_judged_line_by_line(self):
        lines = [{"id": 1, "gold": "1/2", "answer": r"so \boxed{0.5}"}, {"id": 2, "gold": 4, "answer": "Answer: 5"},
                 {"id": 3, "gold": "1000", "answer": "\\boxed{1\u00a0000}"}]
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "in.jsonl"
            path.write_text("".join(json.dumps(x) + "\n" for x in lines) + "\n")
            out = run_cli("score", str(path))
            self.assertEqual(out.returncode, 0, out.stderr)
            got = [json.loads(x) for x in out.stdout.splitlines()]
            self.assertEqual([g["correct"] for g in got], [True, False, True])
            self.assertEqual([g["id"] for g in got], [1, 2, 3])
            self.assertEqual(got[0]["extracted"], "0.5")
            self.assertIn("2 of 3 correct", out.stderr)
            # other field names, and --output
            renamed = Path(d) / "renamed.jsonl"
            renamed.write_text(json.dumps({"solution": "7", "response": r"\boxed{7}"}) + "\n")
            target = Path(d) / "out.jsonl"
            out = run_cli("score", str(renamed), "--gold-key", "solution", "--answer-key", "response", "-o", str(target))
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(out.stdout, "")
            self.assertTrue(json.loads(target.read_text())["correct"])
            self.assertEqual(sorted(os.listdir(d)), ["in.jsonl", "out.jsonl", "renamed.jsonl"])
        out = run_cli("score", "-", stdin=json.dumps({"gold": "3", "answer": "Answer: 3"}) + "\n")
        self.assertEqual((out.returncode, json.loads(out.stdout)["correct"]), (0, True))

    def test_bad_input_is_one_clear_error_with_exit_2(self):
        with tempfile.TemporaryDirectory() as d:
            cases = {
                '{"gold": "1", "answer": "1"}\nnot json\n': "bad.jsonl:2: not JSON",
                '{"gold": "1"}\n': "bad.jsonl:1: no field 'answer'",
                '{"gold": null, "answer": "1"}\n': "bad.jsonl:1: field 'gold' must be str or a number, not NoneType",
                '{"gold": "1", "answer": 5}\n': "bad.jsonl:1: field 'answer' must be str, not int",
                '{"gold": NaN, "answer": "1"}\n': "bad.jsonl:1: field 'gold' is nan, which no answer can equal",
                '[1, 2]\n': "bad.jsonl:1: a JSON object is expected, not list",
            }
            for text, want in cases.items():
                path = Path(d) / "bad.jsonl"
                path.write_text(text)
                target = Path(d) / "out.jsonl"
                out = run_cli("score", str(path), "-o", str(target))
                self.assertEqual(out.returncode, 2, text)
                self.assertIn(want, out.stderr, text)
                self.assertNotIn("Traceback", out.stderr, text)
                self.assertFalse(target.exists(), text)
            out = run_cli("score", str(Path(d) / "missing.jsonl"))
            self.assertEqual(out.returncode, 2)
            self.assertIn("missing.jsonl: No such file", out.stderr)


if __name__ == "__main__":
    unittest.main()
