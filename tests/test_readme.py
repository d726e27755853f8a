"""The README documents every environment variable the package and its build read."""

import re
from pathlib import Path

from torch.testing._internal.common_utils import TestCase, run_tests

ROOT = Path(__file__).resolve().parent.parent
# Names that look like variables but are not read from the environment.
NOT_ENVIRONMENT = {
    "TORCH_DIRECT_WITH_CUDA": "a compile definition of the CUDA build",
    "TORCH_DIRECT_ALLOCATOR_API": "the allocator's export macro (c10_allocator/Export.h)",
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
        self.assertIn("TORCH_DIRECT_GATHER_KERNEL", read)  # the scan finds what it should
        rows = set(re.findall(r"^\| `(TORCH_DIRECT_[A-Z0-9_]+)` \|", (ROOT / "README.md").read_text(), re.M))
        missing = {n: str(p) for n, p in read.items() if n not in rows}
        self.assertEqual(missing, {}, "read but not in the README's table of environment variables")
        stale = sorted(rows - set(read) - {"TORCH_DIRECT_CACHE"})  # CACHE: build_scripts/
        self.assertEqual(stale, [], "in the README's table but read nowhere")


if __name__ == "__main__":
    run_tests()
