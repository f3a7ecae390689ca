"""The chaos soak's driver: minds chatting through a `kvswap cluster up` while its processes are
killed, frozen and restarted at random.

`Chatters` runs every mind index on a thread of its own until the deadline, one turn every
`pace_s`: conversations of `n_turns` turns, each under a new mind name (the conversation's
text depends on the index alone, so each is compared with one fault-free run), through the
OpenAI client with `max_retries` (it backs off and honours Retry-After, as applications do); a
turn that still fails after its retries is recorded as failed. `Chaos` strikes every
`every_s` with one fault drawn from a seeded random generator: SIGKILL of a replica (`cluster
up` restarts it), SIGSTOP of a replica for `stop_s` (past its lease) then SIGCONT, or SIGKILL of
redis-server (restarted on its append-only file). Both stop at a deadline.

`Report` compares every answered turn with the fault-free run of its conversation: its text,
and the tokens it prefilled again that the fault-free turn found cached (what a fault cost).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import psutil

from tests.cluster import workload
from tests.cluster.upcluster import ClusterUp
from tests.cluster.workload import ChatClient, Conversation, TurnResult


@dataclass
class Strike:
    t_s: float  # since the soak began
    what: str  # "kill r2", "stop r1", "kill redis"


class Chaos:
    """See the module docstring."""

    def __init__(self, up: ClusterUp, *, seed: int, every_s: float, stop_s: float) -> None:
        self.up = up
        self.rng = random.Random(seed)
        self.every_s = every_s
        self.stop_s = stop_s
        self.strikes: list[Strike] = []

    def run(self, t0: float, until: float, stop: threading.Event) -> None:
        while not stop.wait(
            max(0.0, t0 + self.every_s * (len(self.strikes) + 1) - time.monotonic())
        ):
            if time.monotonic() > until:
                return
            self.strike(t0)

    def strike(self, t0: float) -> None:
        state = self.up.state()
        up_replicas = [r for r in state["replicas"] if r["state"] == "up" and r["pid"]]
        kinds = ["kill", "stop", "redis"] if up_replicas else ["redis"]
        kind = self.rng.choice(kinds)
        if kind == "redis":
            pid, what = state["redis"]["pid"], "kill redis"
        else:
            victim = self.rng.choice(up_replicas)
            pid, what = victim["pid"], f"{kind} {victim['id']}"
        if pid is None:
            return
        self.strikes.append(Strike(round(time.monotonic() - t0, 1), what))
        proc = psutil.Process(pid)
        if kind == "stop":
            proc.send_signal(signal.SIGSTOP)
            time.sleep(self.stop_s)
            proc.send_signal(signal.SIGCONT)
        else:
            proc.send_signal(signal.SIGKILL)


@dataclass
class Chatters:
    """Every conversation chatting on its own thread until `until` (see the module docstring)."""

    url: str
    n_minds: int
    n_turns: int
    pace_s: float
    max_retries: int
    until: float  # monotonic: no conversation starts after it
    results: dict[tuple[int, int, int], TurnResult] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
        threads = [threading.Thread(target=self._one, args=(i,)) for i in range(self.n_minds)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _one(self, index: int) -> None:
        client = ChatClient(self.url, retries=self.max_retries)
        time.sleep(self.pace_s * index / self.n_minds)  # spread the minds' turns over the pace
        round_ = 0
        while time.monotonic() < self.until:
            conv = Conversation(index, f"chaos-{index}-{round_}")
            for turn in range(1, self.n_turns + 1):
                t0 = time.monotonic()
                try:
                    result = workload.chat_turn(client, conv, turn)
                except workload.BrokenTurn as err:
                    with self._lock:
                        self.failed.append(str(err))
                    break  # the conversation cannot go on without this turn's answer
                with self._lock:
                    self.results[(index, round_, turn)] = result
                time.sleep(max(0.0, self.pace_s - (time.monotonic() - t0)))
            round_ += 1


@dataclass(frozen=True)
class Report:
    n_turns: int
    n_failed: int
    differs: tuple[str, ...]  # answers that diverged from the fault-free run's (`agree`)
    n_after_near_tie: int  # turns not compared: their conversation diverged at a near tie
    n_retried: int  # turns whose client sent more than one request
    n_reprefilled_tokens: int  # prompt tokens prefilled again that the fault-free run had cached
    max_reprefilled_tokens: int  # ... in one turn
    strikes: tuple[Strike, ...]

    @classmethod
    def of(
        cls,
        chatters: Chatters,
        baseline: dict[tuple[int, int], TurnResult],
        strikes: Sequence[Strike],
    ) -> Report:
        def calm(key: tuple[int, int, int]) -> TurnResult:
            return baseline[(key[0], key[2])]

        lost = [max(0, calm(k).cache_n - r.cache_n) for k, r in chatters.results.items()]
        differs, n_after_tie = _compared(chatters.results, baseline)
        return cls(
            n_turns=len(chatters.results),
            n_failed=len(chatters.failed),
            differs=tuple(differs),
            n_after_near_tie=n_after_tie,
            n_retried=sum(r.n_attempts > 1 for r in chatters.results.values()),
            n_reprefilled_tokens=sum(lost),
            max_reprefilled_tokens=max(lost, default=0),
            strikes=tuple(strikes),
        )


def _compared(
    results: dict[tuple[int, int, int], TurnResult], baseline: dict[tuple[int, int], TurnResult]
) -> tuple[list[str], int]:
    """Each conversation's answers against the fault-free run's, in turn order (`agree`): the
    divergences, and how many turns were left uncompared after a near tie."""
    by_conversation: dict[tuple[int, int], list[tuple[int, TurnResult]]] = {}
    for (index, round_, turn), result in results.items():
        by_conversation.setdefault((index, round_), []).append((turn, result))
    differs: list[str] = []
    n_after_tie = 0
    for (index, _), turns in by_conversation.items():
        tied = False
        for turn, result in sorted(turns, key=lambda t: t[0]):
            if tied:
                n_after_tie += 1
                continue
            try:
                tied = not workload.agree(result, baseline[(index, turn)], prompt_may_differ=True)
            except AssertionError as err:
                differs.append(str(err))
    return differs, n_after_tie
