# Apply the Thunder import shim before any test module imports thunder, even when
# the .pth is not installed (docs/ARCHITECTURE.md "Pinned stack").
import os
import sys

import _thunder_memfuse_boot

_thunder_memfuse_boot.apply()

# The seed functions live with the seed job in benchmarks/seed.py (outside the package): tests import
# them as benchmarks.seed, from the repository root (appended, so it never shadows an installed package).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.append(_ROOT)
