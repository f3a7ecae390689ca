"""The words every layer uses about a mind: where it lives, what a client may ask of it, and
where a resumed turn took its state from.

`StrEnum`s, so each compares and serializes as the string the HTTP API shows (`"slot"`,
`"page_out"`, `"tier"`) and a typo is a type error, not a branch never taken.

Pure data; the bottom of the tree (imports nothing of kvswap).
"""

from __future__ import annotations

from enum import StrEnum


class MindTier(StrEnum):
    """Where a mind's state is now (the fastest tier that holds it)."""

    SLOT = "slot"  # seated in a slot: its next turn costs nothing to start
    RAM = "ram"  # a page in the host-RAM page store
    DISK = "disk"  # only its spilled file under the save path


class MindSource(StrEnum):
    """Where a mind's turn found its state (the answer's `X-Kvswap-Mind-Tier`)."""

    SLOT = "slot"  # resident in its slot: nothing moved
    RAM = "ram"  # its RAM page, copied into a slot
    DISK = "disk"  # its spilled file, read and applied
    SHARED = "shared"  # the cluster's shared tier (another replica held it)
    NEW = "new"  # no tier held it: its first turn, or its state was dropped (re-prefilled)


class MindAction(StrEnum):
    """What `POST /minds/{name}?action=` may ask of one of the caller's minds."""

    PAGE_OUT = "page_out"  # out of its slot, to a RAM page
    PAGE_IN = "page_in"  # into a slot (from RAM or disk)
    SPILL = "spill"  # to RAM, then written to disk now
    DROP = "drop"  # out of every tier, its files and its shared-tier copy too


class MindMove(StrEnum):
    """What the engine does to a mind's live state (`commands.MindVerb`)."""

    TO_SLOT = "to_slot"  # seat it
    TO_RAM = "to_ram"  # capture its slot to its RAM page and free the slot
    ERASE = "erase"  # free its slot, keeping nothing


class ResumeSource(StrEnum):
    """Where a cluster turn's state came from when its replica made the mind its own."""

    HELD = "held"  # this replica held the mind already: nothing to do
    NEW = "new"  # no tier holds the mind: its first turn
    TIER = "tier"  # the shared tier's page, fetched and checked
    LOCAL = "local"  # after a miss in the tier: this replica's own copies
    NONE = "none"  # after a miss, and no copy here: its prompt is prefilled
