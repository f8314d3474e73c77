"""Agreement: every process of a mesh checks that all of them passed the same settings to a call.

Each process gathers every other's settings (a JSON object, flattened to dotted names: ``batch.max_rows_per_device``)
or the refusal it met checking its own. A process whose settings were refused raises its own error; every other
one raises CONFIG_MISMATCH naming the refusing host domain, or each setting the processes disagree on with every
host domain's value. All of them compute the same answer from the same gathered bytes, so they fail together.
"""

from __future__ import annotations

import json

from ..errors import ErrorCode, UFormError
from .collectives import Collectives


def flattened(settings: dict, prefix: str = "") -> dict:
    """Nested settings as one level of dotted names."""
    flat = {}
    for name, value in settings.items():
        if isinstance(value, dict):
            flat.update(flattened(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def differences(by_host: list[tuple[int, dict]], names) -> list[str]:
    """Each of `names` whose value differs among the (host domain, values) pairs, with every host domain's value:
    ``"devices (host domain 0: 1, host domain 1: 2)"``."""
    differing = []
    for name in names:
        values = [(host, values.get(name)) for host, values in by_host]
        if any(value != values[0][1] for _, value in values):
            differing.append(f"{name} (" + ", ".join(f"host domain {host}: {value!r}" for host, value in values) + ")")
    return differing


def agree(collectives: Collectives, what: str, settings: dict | UFormError) -> None:
    """Gather `settings` (or this process's refusal of them) from every process, and raise CONFIG_MISMATCH
    where another process refused or the settings differ; return quietly on the process that refused."""
    refused = isinstance(settings, UFormError)
    mine = {"refused": f"{settings.code.name}: {settings.message}"} if refused else {"settings": flattened(settings)}
    everyone = [json.loads(data) for data in collectives.all_gather_bytes(json.dumps(mine, sort_keys=True).encode())]
    if refused:
        return
    refusals = [f"host domain {rank} refused its own: {entry['refused']}" for rank, entry in enumerate(everyone)
                if "refused" in entry]
    if refusals:
        raise UFormError(ErrorCode.CONFIG_MISMATCH, f"{what}: " + "; ".join(refusals))
    settings_by_host = [(rank, entry["settings"]) for rank, entry in enumerate(everyone)]
    differing = differences(settings_by_host, sorted(set().union(*(entry["settings"] for entry in everyone))))
    if differing:
        raise UFormError(ErrorCode.CONFIG_MISMATCH, f"{what}: the processes of the mesh differ on "
                                                    + "; ".join(differing))
