"""The committed records under results/: each says what produced it (provenance), each backs a
figure the README or docs/ cite, the README's figures table is what the records give, and new
records get their provenance from the package's one JSON writer."""

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path
import unittest
from unittest import mock

from torch.testing._internal.common_utils import TestCase, run_tests

from torch_direct.gnn import outputs as _io

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results"
DOCS = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
FIGURES = REPO / "tools" / "readme_figures.py"
# Cited as where a command writes its record, which no run has committed yet.
# Records a build script writes: cited before a run has made them (and checked once it has).
WRITTEN_BY_A_COMMAND = {"results/fork_cpu_wheel.json": REPO / "build_scripts" / "record_fork_wheel",
                        "results/docker_experiments.json": REPO / "build_scripts" / "record_docker"}
HEX = re.compile(r"^[0-9a-f]{7,40}$")


def figures(*args):
    return subprocess.run([sys.executable, str(FIGURES), *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def citations(text):
    """The results/ paths a text cites, each as a list of glob patterns: ``a.json/.png`` cites
    a.json and a.png, ``{x,y}`` both, ``*`` any."""
    out = {}
    for token in re.findall(r"results/[A-Za-z0-9_.{},*+/-]*[A-Za-z0-9_*}]", text):
        first, *alternates = token.split("/.")
        patterns = [first]
        stem = first.rsplit(".", 1)[0]
        patterns += [f"{stem}.{ext}" for ext in alternates]
        expanded = []
        for p in patterns:
            m = re.search(r"\{([^}]*)\}", p)
            expanded += [p[:m.start()] + alt + p[m.end():] for alt in m.group(1).split(",")] if m else [p]
        out[token] = expanded
    return out


def cited_tokens():
    found = {}
    for doc in DOCS:
        for token, patterns in citations(doc.read_text()).items():
            found.setdefault(token, (doc.relative_to(REPO), patterns))
    return found


class TestRecords(TestCase):
    def test_every_record_says_what_produced_it(self):
        records = sorted(RESULTS.glob("*.json"))
        self.assertGreater(len(records), 10)
        for path in records:
            with self.subTest(record=path.name):
                rec = json.loads(path.read_text())
                prov = rec.get("provenance")
                self.assertIsInstance(prov, dict, "no provenance object")
                self.assertLessEqual({"commit", "machine", "command"}, set(prov))
                self.assertRegex(prov["commit"] or "", HEX)
                self.assertIsInstance(prov["machine"], dict)
                self.assertTrue(prov["machine"])
                if prov["command"] is None:  # only with the reason it is not known
                    self.assertTrue(prov.get("command_note"))
                else:
                    self.assertIsInstance(prov["command"], str)

    def test_readme_figures_table_is_what_the_records_give(self):
        r = figures("--check")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_every_record_is_cited_and_every_citation_exists(self):
        cited = cited_tokens()
        self.assertIn("results/train_products-like_pipelines-793ab2a.json", cited)  # the scan finds what it should
        files = sorted(p.name for p in RESULTS.iterdir() if not p.name.startswith("."))
        matched = set()
        for token, (doc, patterns) in cited.items():
            if token in WRITTEN_BY_A_COMMAND:
                script = WRITTEN_BY_A_COMMAND[token]
                self.assertIn(token.split("/", 1)[1], script.read_text(), f"{doc} cites {token} as {script}'s")
                matched.update(fnmatch.filter(files, token[len("results/"):]))
                continue
            for p in patterns:
                hits = fnmatch.filter(files, p[len("results/"):])
                self.assertTrue(hits, f"{doc} cites {p}, which is not in results/")
                matched.update(hits)
        orphans = [f for f in files if f not in matched]
        self.assertEqual(orphans, [], "in results/ but cited by neither README.md nor docs/*.md")

    def test_citation_forms(self):
        self.assertEqual(citations("`results/a.json/.png`, results/b-{x,y}_*.json).")["results/a.json/.png"],
                         ["results/a.json", "results/a.png"])
        self.assertEqual(citations("(results/b-{x,y}_*.json)")["results/b-{x,y}_*.json"],
                         ["results/b-x_*.json", "results/b-y_*.json"])
        self.assertEqual(list(citations("in `results/`, then")), [])


class TestFiguresCheck(TestCase):
    def copy(self, d):
        readme = Path(d) / "README.md"
        shutil.copy(REPO / "README.md", readme)
        return readme

    def test_check_fails_when_the_table_is_altered_and_a_rewrite_mends_it(self):
        original = (REPO / "README.md").read_text()
        begin, end = original.index("<!-- figures:begin -->"), original.index("<!-- figures:end -->")
        self.assertIn("| 30.8 s;", original[begin:end])
        with tempfile.TemporaryDirectory() as d:
            readme = self.copy(d)
            readme.write_text(original[:begin] + original[begin:end].replace("| 30.8 s;", "| 30.7 s;")
                              + original[end:])
            r = figures("--check", "--readme", str(readme))
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertEqual(len(r.stdout.strip().splitlines()), 1, r.stdout)
            self.assertIn("30.7 s", r.stdout)
            self.assertIn("30.8 s", r.stdout)
            r = figures("--readme", str(readme))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertEqual(readme.read_text(), original)
            self.assertEqual(sorted(p.name for p in Path(d).iterdir()), ["README.md"])  # no temporary left
            self.assertEqual(figures("--check", "--readme", str(readme)).returncode, 0)

    def test_a_dropped_row_and_missing_markers_are_errors(self):
        original = (REPO / "README.md").read_text()
        with tempfile.TemporaryDirectory() as d:
            readme = self.copy(d)
            lines = original.split("\n")
            end = lines.index("<!-- figures:end -->")
            readme.write_text("\n".join(lines[:end - 1] + lines[end:]))
            r = figures("--check", "--readme", str(readme))
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            readme.write_text(original.replace("<!-- figures:end -->", ""))
            r = figures("--check", "--readme", str(readme))
            self.assertEqual(r.returncode, 2)
            self.assertIn("figures:end", r.stderr)

    def test_help(self):
        r = figures("--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("--check", r.stdout)
        self.assertIn("figures:begin", r.stdout)


class TestWriteJson(TestCase):
    def setUp(self):
        _io.code_version.cache_clear()
        self.addCleanup(_io.code_version.cache_clear)

    def test_adds_provenance_and_keeps_the_record(self):
        record = {"benchmark": "x", "rows": [1, 2]}
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "sub" / "r.json"
            _io.write_json(out, record)
            rec = json.loads(out.read_text())
            self.assertEqual(sorted(p.name for p in out.parent.iterdir()), ["r.json"])  # no .tmp left
        self.assertEqual(record, {"benchmark": "x", "rows": [1, 2]})  # the caller's dict unchanged
        self.assertEqual(list(rec)[0], "provenance")
        self.assertEqual({k: v for k, v in rec.items() if k != "provenance"}, record)
        prov = rec["provenance"]
        self.assertLessEqual({"commit", "machine", "command"}, set(prov))
        if prov["commit"] is not None:  # this checkout
            self.assertRegex(prov["commit"], r"^[0-9a-f]{40}$")
            self.assertIsInstance(prov["dirty"], bool)
        self.assertEqual(prov["machine"]["cpus"], _io.machine_record()["cpus"])
        self.assertIn("torch", prov["machine"])
        self.assertIsInstance(prov["command"], str)

    def test_the_command_names_experimental_settings(self):
        with mock.patch.dict(os.environ, {"TORCH_DIRECT_EXPERIMENTAL": "sampler_relabel=hash"}):
            self.assertTrue(_io.command_line().startswith("TORCH_DIRECT_EXPERIMENTAL=sampler_relabel=hash "))
        with mock.patch.dict(os.environ):
            os.environ.pop("TORCH_DIRECT_EXPERIMENTAL", None)
            self.assertNotIn("TORCH_DIRECT_EXPERIMENTAL", _io.command_line())

    def test_an_existing_provenance_is_kept(self):
        given = {"commit": "abc1234", "machine": {"gpu": "g"}, "command": "c"}
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "r.json"
            _io.write_json(out, {"provenance": given, "a": 1})
            self.assertEqual(json.loads(out.read_text()), {"provenance": given, "a": 1})

    def test_a_failed_write_leaves_the_old_record_and_no_temporary(self):
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "r.json"
            _io.write_json(out, {"a": 1})
            before = out.read_text()
            with self.assertRaises(TypeError):
                _io.write_json(out, {"a": object()})
            self.assertEqual(out.read_text(), before)
            self.assertEqual(sorted(p.name for p in Path(d).iterdir()), ["r.json"])

    @unittest.skipUnless(shutil.which("git"), "git is not installed")
    def test_commit_and_dirty_of_a_checkout(self):
        with tempfile.TemporaryDirectory() as d:
            root = Path(d)
            git = ["git", "-C", d, "-c", "user.name=t", "-c", "user.email=t@t"]
            subprocess.run(git[:3] + ["init", "-q"], check=True)
            (root / "f").write_text("1")
            subprocess.run(git + ["add", "f"], check=True)
            subprocess.run(git + ["commit", "-qm", "f"], check=True)
            head = subprocess.run(git[:3] + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
            with mock.patch.object(_io, "_PACKAGE_ROOT", root):
                self.assertEqual(_io.code_version(), {"commit": head, "dirty": False})
                (root / "new").write_text("untracked files are not code that ran")
                _io.code_version.cache_clear()
                self.assertEqual(_io.code_version(), {"commit": head, "dirty": False})
                (root / "f").write_text("2")
                _io.code_version.cache_clear()
                self.assertEqual(_io.code_version(), {"commit": head, "dirty": True})

    def test_outside_a_checkout_the_installed_version(self):
        with tempfile.TemporaryDirectory() as d, mock.patch.object(_io, "_PACKAGE_ROOT", Path(d)):
            v = _io.code_version()
        self.assertIsNone(v["commit"])
        self.assertIn("version", v)

    def test_without_git_the_fields_are_none(self):
        with mock.patch.object(_io.subprocess, "run", side_effect=FileNotFoundError("git")), \
                mock.patch.object(_io, "machine_record", side_effect=RuntimeError("no machine")):
            prov = _io.provenance()
        self.assertIsNone(prov["commit"])
        self.assertIsNone(prov["machine"])
        self.assertIsInstance(prov["command"], str)

    def test_source_digest(self):
        # Over the source files only, by relative path and content: a copy of the tree elsewhere
        # gives the same digest; a changed source file or a renamed one another; a build's
        # outputs, caches, generated code and files outside the source paths none.
        with tempfile.TemporaryDirectory() as d:
            a, b = Path(d) / "a", Path(d) / "b"
            for root in (a, b):
                (root / "torch_direct" / "gnn").mkdir(parents=True)
                (root / "torch_direct" / "gnn" / "m.py").write_text("x = 1\n")
                (root / "csrc" / "extension" / "generated").mkdir(parents=True)
                (root / "csrc" / "k.cu").write_text("// k\n")
                (root / "setup.py").write_text("setup()\n")
            first = _io.source_digest(a)
            self.assertRegex(first, r"^[0-9a-f]{16}$")
            self.assertEqual(_io.source_digest(b), first)
            for extra in ("torch_direct/_C.so", "torch_direct/gnn/__pycache__/m.cpython-311.pyc",
                          "csrc/extension/generated/Reg.cpp", "README.md", "tests/test_x.py"):
                (a / extra).parent.mkdir(parents=True, exist_ok=True)
                (a / extra).write_text("anything")
                self.assertEqual(_io.source_digest(a), first, extra)
            (a / "csrc" / "k.cu").write_text("// k changed\n")
            self.assertNotEqual(_io.source_digest(a), first)
            (b / "csrc" / "k.cu").rename(b / "csrc" / "k2.cu")
            self.assertNotEqual(_io.source_digest(b), first)
            self.assertIsNone(_io.source_digest(Path(d) / "empty"))
        self.assertIn("source", _io.provenance())

    @unittest.skipUnless(shutil.which("git") and (REPO / ".git").exists(), "needs git and this checkout's history")
    def test_source_digest_of_a_commit(self):
        # tools/source_digest.py REV gives what source_digest gives on REV's checkout: here the
        # checkout's own files against HEAD, equal unless a source file differs from HEAD.
        changed = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", *_io.SOURCE_PATHS],
                                 capture_output=True, text=True).stdout.strip()
        tool = [sys.executable, str(REPO / "tools" / "source_digest.py")]
        head = subprocess.run(tool + ["HEAD"], capture_output=True, text=True)
        self.assertEqual(head.returncode, 0, head.stderr)
        digest = head.stdout.split()[0]
        if not changed:
            self.assertEqual(digest, _io.source_digest(REPO))
        else:
            self.assertNotEqual(digest, _io.source_digest(REPO))
        with tempfile.TemporaryDirectory() as d:
            rec = Path(d) / "r.json"
            rec.write_text(json.dumps({"provenance": {"source": digest}}))
            r = subprocess.run(tool + ["--record", str(rec), "HEAD"], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("<- the record's", r.stdout)
            rec.write_text(json.dumps({"provenance": {"source": "0" * 16}}))
            r = subprocess.run(tool + ["--record", str(rec), "HEAD"], capture_output=True, text=True)
            self.assertEqual(r.returncode, 1)
            self.assertIn("matches none", r.stderr)
        bad = subprocess.run(tool + ["no-such-commit"], capture_output=True, text=True)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("no-such-commit", bad.stderr)

    def test_command_line(self):
        main = types.ModuleType("__main__")
        main.__spec__ = types.SimpleNamespace(name="torch_direct.gnn.bench.__main__")
        with mock.patch.dict(sys.modules, {"__main__": main}), \
                mock.patch.object(sys, "argv", ["/x/bench/__main__.py", "train", "--out", "a b.json"]):
            self.assertEqual(_io.command_line(), "python -m torch_direct.gnn.bench train --out 'a b.json'")
        script = types.ModuleType("__main__")
        script.__spec__ = None
        with mock.patch.dict(sys.modules, {"__main__": script}), \
                mock.patch.object(sys, "argv", ["tools/probe.py", "--n", "3"]):
            self.assertEqual(_io.command_line(), "python tools/probe.py --n 3")


if __name__ == "__main__":
    run_tests()
