"""The README documents every environment variable the package and its build read, and its
first screen's main-job command runs."""

import os
import re
import subprocess
import sys
from pathlib import Path

from torch.testing._internal.common_utils import TestCase, run_tests

ROOT = Path(__file__).resolve().parent.parent
# Names that look like variables but are not read from the environment.
NOT_ENVIRONMENT = {
    "TORCH_DIRECT_WITH_CUDA": "a compile definition of the CUDA build",
    "TORCH_DIRECT_ALLOCATOR_API": "the allocator's export macro (c10_allocator/Export.h)",
    "TORCH_DIRECT_ATEN_API": "csrc/aten's export macro (csrc/aten/Export.h)",
    "TORCH_DIRECT_ATEN_CUDA_API": "csrc/aten's export macro for torch_cuda (csrc/aten/Export.h)",
}


def names_in(paths):
    found = {}
    for path in paths:
        for name in re.findall(r"TORCH_DIRECT_[A-Z0-9_]*[A-Z0-9]", path.read_text(errors="replace")):
            found.setdefault(name, path.relative_to(ROOT))
    return found


class TestEnvironmentTable(TestCase):
    def test_every_variable_read_is_in_the_readme_table(self):
        sources = [ROOT / "setup.py"]
        for folder, patterns in (("torch_direct", ("*.py",)), ("csrc", ("*.cpp", "*.cu", "*.h")),
                                 ("c10_allocator", ("*.cpp", "*.h"))):
            for pattern in patterns:
                sources += sorted((ROOT / folder).rglob(pattern))
        read = {n: p for n, p in names_in(sources).items() if n not in NOT_ENVIRONMENT}
        self.assertIn("TORCH_DIRECT_EXPERIMENTAL", read)  # the scan finds what it should
        rows = set(re.findall(r"^\| `(TORCH_DIRECT_[A-Z0-9_]+)` \|", (ROOT / "README.md").read_text(), re.M))
        missing = {n: str(p) for n, p in read.items() if n not in rows}
        self.assertEqual(missing, {}, "read but not in the README's table of environment variables")
        stale = sorted(rows - set(read) - {"TORCH_DIRECT_CACHE"})  # CACHE: build_scripts/
        self.assertEqual(stale, [], "in the README's table but read nowhere")

    def test_every_experimental_setting_is_in_the_readme_table(self):
        # One list in the C++ core, the same in Python's helper and in the README's table.
        from torch_direct._experimental import SETTINGS
        header = (ROOT / "csrc" / "aten" / "Experimental.h").read_text()
        block = header[header.index("kSettings[] = {"):header.index("};", header.index("kSettings[] = {"))]
        core = re.findall(r'^\s*"([a-z_]+)",', block, re.M)
        self.assertIn("gather_kernel", core)   # the scan finds what it should
        self.assertEqual(core, list(SETTINGS))
        readme = (ROOT / "README.md").read_text()
        table = readme[readme.index("| setting | read by |"):]
        rows = re.findall(r"^\| `([a-z_]+)` \|", table.split("\n\n")[0], re.M)
        self.assertEqual(rows, core)


class TestFirstScreen(TestCase):
    def main_job(self) -> list[str]:
        """The README's first command block's main job (the part after the install's last ``&&``)."""
        readme = (ROOT / "README.md").read_text()
        block = readme[readme.index("```bash"):readme.index("```", readme.index("```bash") + 7)]
        line = next(ln for ln in block.splitlines() if "python -m torch_direct" in ln and not ln.startswith("#"))
        return line.split("&&")[-1].split()

    def run_module(self, argv):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        return subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=600)

    def test_the_main_job_runs_and_checks_its_gathers(self):
        argv = self.main_job()
        self.assertEqual(argv, ["python", "-m", "torch_direct", "demo"])   # the scan finds what it should
        r = self.run_module(argv)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("matches CPU gather: True", r.stdout)
        self.assertIn("allocated_bytes", r.stdout)

    def test_the_main_job_refuses_bad_sizes(self):
        r = self.run_module(self.main_job() + ["--rows", "0"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("demo: --rows, --dim, --batch and --repeats must be positive", r.stderr)


if __name__ == "__main__":
    run_tests()
