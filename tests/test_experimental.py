"""The experimental switch: TORCH_DIRECT_EXPERIMENTAL and torch_direct.experimental()."""

import os
from unittest import mock

from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct
from torch_direct._experimental import VARIABLE, parse


class TestExperimental(TestCase):
    def test_parse(self):
        self.assertEqual(parse(None), {})
        self.assertEqual(parse(""), {})
        self.assertEqual(parse("gather_kernel=grid,,gather_window_rows=64"),
                         {"gather_kernel": "grid", "gather_window_rows": "64"})
        for bad, msg in (("gather_kernel", "not name=value"), ("=grid", "not name=value"),
                         ("gather_kernal=grid", "unknown setting 'gather_kernal'"),
                         ("gather_kernel=grid,gather_kernel=rowblock", "given twice")):
            with self.assertRaisesRegex(ValueError, msg):
                parse(bad)

    def test_setting_reads_the_variable_now(self):
        with mock.patch.dict(os.environ, {VARIABLE: "feature_pages=huge"}):
            self.assertEqual(torch_direct.experimental_setting("feature_pages"), "huge")
            self.assertIsNone(torch_direct.experimental_setting("sampler_relabel"))
            with torch_direct.experimental(feature_pages=None, sampler_relabel="hash"):
                self.assertIsNone(torch_direct.experimental_setting("feature_pages"))
                self.assertEqual(torch_direct.experimental_setting("sampler_relabel"), "hash")
        with self.assertRaisesRegex(ValueError, "unknown setting 'feature_page'"):
            torch_direct.experimental_setting("feature_page")
        # one of a setting's values, its default where it is unset or empty
        pages = ("small", "huge", "driver")
        for env, want in (("", "small"), ("feature_pages=", "small"), ("feature_pages=huge", "huge")):
            with mock.patch.dict(os.environ, {VARIABLE: env}):
                self.assertEqual(torch_direct.experimental_setting("feature_pages", choices=pages, default="small"), want)
        with mock.patch.dict(os.environ, {VARIABLE: "feature_pages=big"}):
            with self.assertRaisesRegex(ValueError, "^TORCH_DIRECT_EXPERIMENTAL: feature_pages must be small, huge or "
                                                    "driver, not 'big'$"):
                torch_direct.experimental_setting("feature_pages", choices=pages, default="small")
            self.assertEqual(torch_direct.experimental_setting("feature_pages"), "big")  # no choices: as given

    def test_context_sets_merges_and_restores(self):
        with mock.patch.dict(os.environ, {VARIABLE: "gather_max_unit=4"}):
            with torch_direct.experimental(gather_kernel="grid", gather_own_pool=True):
                self.assertEqual(parse(os.environ[VARIABLE]),
                                 {"gather_max_unit": "4", "gather_kernel": "grid", "gather_own_pool": "1"})
                with torch_direct.experimental(gather_max_unit=None, gather_kernel="rowblock"):
                    self.assertEqual(parse(os.environ[VARIABLE]),
                                     {"gather_kernel": "rowblock", "gather_own_pool": "1"})
                self.assertEqual(parse(os.environ[VARIABLE])["gather_kernel"], "grid")
            self.assertEqual(os.environ[VARIABLE], "gather_max_unit=4")
        with mock.patch.dict(os.environ, {}, clear=False):
            os.environ.pop(VARIABLE, None)
            with torch_direct.experimental(sampler_waits="fewer"):
                self.assertEqual(os.environ[VARIABLE], "sampler_waits=fewer")
            self.assertNotIn(VARIABLE, os.environ)

    def test_bad_settings_leave_the_environment_alone(self):
        with mock.patch.dict(os.environ, {VARIABLE: "gather_max_unit=4"}):
            for kw, msg in (({"gather_kernal": "grid"}, "unknown setting"),
                            ({"gather_kernel": "a,b"}, "without ','"),
                            ({"gather_kernel": ""}, "non-empty")):
                with self.assertRaisesRegex(ValueError, msg):
                    with torch_direct.experimental(**kw):
                        pass
                self.assertEqual(os.environ[VARIABLE], "gather_max_unit=4")


if __name__ == "__main__":
    run_tests()
