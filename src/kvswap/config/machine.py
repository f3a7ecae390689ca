"""Facts about the host that some defaults depend on: RAM and CPU counts.

Owns `MachineInfo` (probed once per parse, or injected by tests) and the formulas that turn it
into defaults: the page store ceiling and llama-server's thread counts. Reads `os.sysconf` and
`psutil`; no other side effects.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_GIB = 1 << 30
PAGE_RAM_CAP_BYTES = 8 * _GIB  # the page store default never exceeds this
PAGE_RAM_FRACTION_DIVISOR = 4  # ... nor 1/4 of physical RAM


@dataclass(frozen=True)
class MachineInfo:
    """What the defaults are computed from."""

    physical_ram_bytes: int  # total physical memory
    n_cpu_physical: int  # physical cores: llama-server's default -t (common_cpu_get_num_math)
    n_cpu_logical: int  # logical CPUs: what llama-server uses for -t <= 0 (hardware_concurrency)

    @classmethod
    def probe(cls) -> MachineInfo:
        """Measure this host (sysconf first, psutil as fallback)."""
        return cls(
            physical_ram_bytes=_physical_ram_bytes(),
            n_cpu_physical=_n_cpu_physical(),
            n_cpu_logical=max(1, os.cpu_count() or 1),
        )

    def default_page_ram_bytes(self) -> int:
        """`--page-ram-bytes` default: min(25% of physical RAM, 8 GiB)."""
        return min(self.physical_ram_bytes // PAGE_RAM_FRACTION_DIVISOR, PAGE_RAM_CAP_BYTES)


def _physical_ram_bytes() -> int:
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page_size = os.sysconf("SC_PAGE_SIZE")
        if pages > 0 and page_size > 0:
            return int(pages) * int(page_size)
    except (ValueError, OSError, AttributeError):
        pass
    import psutil  # only where sysconf cannot tell (macOS lacks SC_PHYS_PAGES on some builds)

    return int(psutil.virtual_memory().total)


def _n_cpu_physical() -> int:
    try:
        import psutil

        n_physical = psutil.cpu_count(logical=False)
    except ImportError:
        n_physical = None
    return max(1, n_physical or os.cpu_count() or 1)
