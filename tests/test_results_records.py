"""New records get their provenance (commit, machine, command) from the package's one JSON writer,
which writes atomically."""

import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from unittest import mock

from torch.testing._internal.common_utils import TestCase, run_tests

from torch_direct import _io


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

    def test_command_line(self):
        main = types.ModuleType("__main__")
        main.__spec__ = types.SimpleNamespace(name="torch_direct.bench.__main__")
        with mock.patch.dict(sys.modules, {"__main__": main}), \
                mock.patch.object(sys, "argv", ["/x/bench/__main__.py", "train", "--out", "a b.json"]):
            self.assertEqual(_io.command_line(), "python -m torch_direct.bench train --out 'a b.json'")
        script = types.ModuleType("__main__")
        script.__spec__ = None
        with mock.patch.dict(sys.modules, {"__main__": script}), \
                mock.patch.object(sys, "argv", ["tools/probe.py", "--n", "3"]):
            self.assertEqual(_io.command_line(), "python tools/probe.py --n 3")



if __name__ == "__main__":
    run_tests()
