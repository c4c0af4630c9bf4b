# Apply the Thunder import shim before any test module imports thunder, even when
# the .pth is not installed (docs/ARCHITECTURE.md "Pinned stack").
import _thunder_memfuse_boot

_thunder_memfuse_boot.apply()
