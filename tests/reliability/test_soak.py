"""Load: streaming clients (some hanging up), impatient clients, page verbs and slot files at once,
on loopback, against one real server (see `soak.py`).

Checks: every request succeeded, was given up by its client on purpose, or failed with a typed
error; no slot is left busy; page and checkpoint bytes stay under their budgets at every sample;
resident memory is flat after warm-up. Prints the figures (docs/RELIABILITY.md keeps the last).
CI runs `KVSWAP_SOAK_S` = 20 seconds; the long soak is
`KVSWAP_SOAK_S=300 pytest -s tests/reliability/test_soak.py`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kvswap.tiny import tiny_model_path
from tests.reliability.soak import Soak
from tests.server.harness import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.timeout(3600)]

DURATION_S = float(os.environ.get("KVSWAP_SOAK_S", "20"))
N_SLOTS = 4
PAGE_CEILING = 256 << 10
CKPT_BUDGET = 16 << 10
# Growth of resident memory allowed between the end of warm-up and the end of the soak: the
# allocator keeps freed arenas, so "flat" means no growth with the number of requests.
RSS_SLACK_BYTES = 48 << 20


def test_soak(server_factory: Callable[..., ServerProcess], tmp_path: Path) -> None:
    save_dir = tmp_path / "slots"
    save_dir.mkdir()
    model = tiny_model_path("lfm2", seed=11)
    server = server_factory(
        "-m", str(model), "-c", "8192", "-np", str(N_SLOTS), "-t", "1", "-tb", "1",
        "-b", "64", "-ub", "64", "--checkpoint-min-step", "64", "--metrics",
        "--page-ram-bytes", str(PAGE_CEILING), "--ctx-checkpoints-bytes", str(CKPT_BUDGET),
        "--slot-save-path", str(save_dir), fresh=True,
    )  # fmt: skip
    soak = Soak(server.url, server.proc.pid, seed=int(os.environ.get("KVSWAP_SOAK_SEED", "7")),
                n_slots=N_SLOTS)  # fmt: skip
    report = soak.run(DURATION_S)
    print(f"\nsoak of {DURATION_S:.0f} s on {N_SLOTS} slots:")
    print(report.summary(PAGE_CEILING, CKPT_BUDGET))

    assert not report.failures, report.failures[:10]
    assert report.served() > 0
    # All slots idle once the clients are gone (hung-up requests are cancelled, not leaked).
    deadline = time.monotonic() + 30
    while any(s["is_processing"] for s in server.client.get("/slots").json()):
        assert time.monotonic() < deadline, server.client.get("/slots").json()
        time.sleep(0.2)
    for s in report.samples:
        assert s.page_store_bytes <= PAGE_CEILING, s
        assert s.ctx_checkpoint_bytes <= CKPT_BUDGET, s
    warm = report.samples[len(report.samples) // 4 :]
    assert max(s.rss_bytes for s in warm[len(warm) // 2 :]) <= (
        max(s.rss_bytes for s in warm[: len(warm) // 2]) + RSS_SLACK_BYTES
    ), report.summary(PAGE_CEILING, CKPT_BUDGET)
    assert server.proc.poll() is None
