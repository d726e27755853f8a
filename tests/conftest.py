import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

# Register the unified device before any test module imports PyTorch's
# device-generic test machinery (it fixes its list of device types on import).
import torch_direct  # noqa: E402,F401
