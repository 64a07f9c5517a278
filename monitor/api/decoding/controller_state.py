"""The service's speculation controller: one per sidecar, its state kept in the data directory across restarts."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from decoder.holdout import HoldoutPolicy
from decoder.speculation.controller import SpeculationController

log = logging.getLogger(__name__)

STATE_FILE = "controller-state.json"


def load_controller(path: Path, holdout: HoldoutPolicy, seed: int = 0) -> SpeculationController:
    """The controller saved at ``path`` (with today's holdout policy), or a fresh one when there is none."""
    try:
        data = json.loads(path.read_text())
        controller = SpeculationController.from_state(data, holdout)
        log.info("speculation controller resumed from %s (%d workloads)", path, len(data.get("workloads", {})))
        return controller
    except FileNotFoundError:
        return SpeculationController(holdout=holdout, seed=seed)
    except (OSError, ValueError, KeyError, TypeError) as error:
        log.warning("ignoring unreadable controller state %s (%s); starting afresh", path, error)
        return SpeculationController(holdout=holdout, seed=seed)


def save_controller(controller: SpeculationController, path: Path) -> None:
    """Write the state atomically, so that a crash mid-write leaves the previous state intact."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=path.name, dir=path.parent)
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(controller.state(), out)
        os.replace(temporary, path)
    except OSError as error:
        log.warning("could not save the controller state to %s: %s", path, error)
        Path(temporary).unlink(missing_ok=True)
