"""Child process of the crash tests (run as `python crash_child.py SAVE MODE ...`, never forked).

Modes:
  kill_at K          publish util NEW_SPEC under "m", SIGKILLing itself right after OS step K
  big N_BYTES        publish a generation with an N_BYTES payload; print "writing" to stdout at
                     the first write step, so the parent can kill it mid-write
  loop WRITER N      publish N generations "w<WRITER>-<i>" under "m" (concurrency test)
"""

from __future__ import annotations

import sys
from pathlib import Path

from util import BIG_TAG, FINGERPRINT, NEW_SPEC, GenSpec, writer_spec

from kvswap.files import OsAdapter, Publisher
from kvswap.files.faults import KillAt
from kvswap.files.osio import Phase, StepName


def main() -> None:
    save, mode, args = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    osio = OsAdapter()
    with Publisher(save, osio) as pub:
        if mode == "kill_at":
            osio.hook = KillAt(int(args[0]))
            pub.publish("m", NEW_SPEC.files(), FINGERPRINT)
        elif mode == "big":
            spec = GenSpec(BIG_TAG, (".dft",), n_payload=int(args[0]))
            files = spec.files()
            announced = False

            def announce(phase: Phase, step: StepName, target: str) -> None:
                nonlocal announced
                if step == "write" and not announced:
                    announced = True
                    print("writing", flush=True)

            osio.hook = announce
            pub.publish("m", files, FINGERPRINT)
            print("done", flush=True)
        elif mode == "loop":
            writer, n = int(args[0]), int(args[1])
            for i in range(n):
                pub.publish("m", writer_spec(writer, i).files(), FINGERPRINT)
        else:
            raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
