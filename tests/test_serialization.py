"""torch.save / torch.load (map_location included) and pickling."""

import io
import pickle

import torch
from torch.testing._internal.common_utils import TestCase, run_tests

import torch_direct  # noqa: F401


class TestSerialization(TestCase):
    def roundtrip(self, obj, **load_kwargs):
        buf = io.BytesIO()
        torch.save(obj, buf)
        buf.seek(0)
        return torch.load(buf, **load_kwargs)

    def test_save_load_stays_unified(self):
        src = torch.randn(5, 7)
        u = src.to("unified")
        back = self.roundtrip(u)
        self.assertTrue(back.is_unified)
        self.assertEqual(back.cpu(), src)

    def test_views_and_shared_storage(self):
        u = torch.arange(12.0).to("unified")
        a, b = u[2:6], u.view(3, 4)
        la, lb = self.roundtrip([a, b])
        self.assertTrue(la.is_unified and lb.is_unified)
        self.assertEqual(la.untyped_storage().data_ptr(), lb.untyped_storage().data_ptr())
        la.fill_(0)
        self.assertEqual(lb.cpu().view(-1)[2:6], torch.zeros(4))

    def test_map_location(self):
        src = torch.randn(4)
        self.assertFalse(self.roundtrip(src.to("unified"), map_location="cpu").is_unified)
        self.assertEqual(self.roundtrip(src.to("unified"), map_location="cpu"), src)
        back = self.roundtrip(src, map_location="unified")
        self.assertTrue(back.is_unified)
        self.assertEqual(back.cpu(), src)
        back = self.roundtrip(src, map_location=torch.device("unified"))
        self.assertTrue(back.is_unified)

    def test_state_dict(self):
        m = torch.nn.Linear(3, 2).unified()
        sd = self.roundtrip(m.state_dict())
        self.assertTrue(sd["weight"].is_unified)
        self.assertEqual(sd["weight"].cpu(), m.weight.detach().cpu())

    def test_pickle(self):
        src = torch.randn(3, 3)
        u = src.to("unified")
        back = pickle.loads(pickle.dumps(u))
        self.assertTrue(back.is_unified)
        self.assertEqual(back.cpu(), src)
        self.assertNotEqual(back.data_ptr(), u.data_ptr())  # a copy, as for CPU tensors


if __name__ == "__main__":
    run_tests()
