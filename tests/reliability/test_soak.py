"""Load: every kind of client at once (streams, hang-ups, timeouts, page verbs, slot files,
minds, reconfigures) with a sleep and a wake in the middle, against one real server (see
`soak.py`).

Checks: every request succeeded, was given up by its client on purpose, or failed with a typed
error; every mind turn found its mind holding exactly its last turn's tokens (through switches,
spills, reconfigures and the sleep); the server fell asleep, freeing memory, and woke for the
clients; no slot is left busy. Memory is checked by the OS's count, not the server's: the page
store is filled (its peak is at least `MIN_FILL` of a 64 MiB ceiling, or the bound below would
not bite), and resident memory never passes its size at start-up plus the page ceiling, the
checkpoint budget and `RSS_SLACK_BYTES`. A leak of one store's worth fails it.

CI runs `KVSWAP_SOAK_S` = 30 seconds; the long soak is
`KVSWAP_SOAK_S=300 pytest -s tests/reliability/test_soak.py`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from kvswap.tiny import tiny_model_path
from tests.reliability.soak import Soak
from tests.server.harness import ServerProcess

DURATION_S = float(os.environ.get("KVSWAP_SOAK_S", "30"))
pytestmark = [pytest.mark.model, pytest.mark.timeout(int(90 + 10 * DURATION_S))]

N_CTX = (8192, 6144)  # the reconfigurer alternates these (4 slots: windows of 2048 and 1536)
PAGE_CEILING = 64 << 20
CKPT_BUDGET = 8 << 20
MIN_FILL = 0.75
# What resident memory may hold beyond the model, the contexts, the page store and the
# checkpoints: copies the server makes outside the store by design (a save's capture, a restore's
# or a mind's read-back: about 3 MiB each for this model, one at a time per client), libllama's
# compute buffers at a new geometry, and malloc's arenas. 32 MiB: with the store filled, a leak
# of 48 MiB or more (less than one store) passes the bound.
RSS_SLACK_BYTES = 32 << 20


def test_soak(server_factory: Callable[..., ServerProcess], tmp_path: Path) -> None:
    save_dir = tmp_path / "slots"
    save_dir.mkdir()
    # A hybrid (checkpoints) with 3 KiB of KV per token, so that a few pages fill the store.
    model = tiny_model_path("lfm2", seed=11, n_embd=256, n_layer=6, n_head=4, n_head_kv=4)
    server = server_factory(
        "-m", str(model), "-c", str(N_CTX[0]), "-np", "4", "-t", "1", "-tb", "1",
        "-b", "256", "-ub", "256", "--checkpoint-min-step", "256", "--metrics",
        "--page-ram-bytes", str(PAGE_CEILING), "--ctx-checkpoints-bytes", str(CKPT_BUDGET),
        "--cache-ram", "8", "--sleep-idle-seconds", "1", "--slot-save-path", str(save_dir),
        fresh=True,
    )  # fmt: skip
    rss_base = psutil.Process(server.proc.pid).memory_info().rss
    soak = Soak(server, seed=int(os.environ.get("KVSWAP_SOAK_SEED", "7")), n_ctx=N_CTX)
    report = soak.run(DURATION_S)
    summary = report.summary(rss_base, PAGE_CEILING)
    print(f"\nsoak of {DURATION_S:.0f} s: {summary}")

    assert not report.failures, report.failures[:10]
    for kind in ("ok", "ok mind turn", "ok reconfigure", "ok slept"):
        assert report.outcomes[kind] > 0, (kind, summary)
    # Asleep, the model and the contexts were freed (and their memory given back to the OS).
    assert report.rss_asleep_bytes < rss_base, summary
    # All slots idle once the clients are gone (hung-up requests are cancelled, not leaked).
    deadline = time.monotonic() + 30
    while any(s["is_processing"] for s in server.client.get("/slots").json()):
        assert time.monotonic() < deadline, server.client.get("/slots").json()
        time.sleep(0.2)
    assert max(s.page_store_bytes for s in report.samples) >= MIN_FILL * PAGE_CEILING, summary
    bound = rss_base + PAGE_CEILING + CKPT_BUDGET + RSS_SLACK_BYTES
    worst = max(report.samples, key=lambda s: s.rss_bytes)
    assert worst.rss_bytes <= bound, (worst, bound, summary)
    assert server.proc.poll() is None
    server.stop()  # its memory is the rest of the suite's
