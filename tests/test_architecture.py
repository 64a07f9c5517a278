"""The house plan of docs/architecture.md, checked on the imports themselves (an AST walk, no import runs)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

ROOT = Path(__file__).resolve().parents[1]
# A room imports its own modules and rooms of a lower layer; the shell's rooms may import one another.
LAYERS: Final = {
    "monitor.settings": 0,
    "monitor.log_safe": 0,
    "monitor.store": 1,
    "monitor.ingest": 2,
    "monitor.drift": 2,
    "monitor.notify": 2,
    "monitor.alerts": 3,
    "monitor.api": 4,
    "monitor.proxy": 4,
    "monitor.scheduler": 4,
    "monitor.demo": 4,
    "monitor.config": 4,
    "monitor.commands": 5,
}
SHELL: Final = 4
COMMANDS: Final = ("monitor.commands", "decoder.cli", "dashboard.cli")
# Arrows that still run up, each with what removes it. A fixed one must leave this list too.
KNOWN_UPWARD: Final[set[tuple[str, str]]] = set()


def imports() -> list[tuple[str, str]]:
    """(importing module, imported module) for every absolute import of the project's packages."""
    found = []
    for package in ("decoder", "monitor", "dashboard"):
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                found += [(module, name) for name in names if name.split(".")[0] in ("decoder", "monitor", "dashboard")]
    return found


def room(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "monitor" else parts[0]


def is_command(module: str) -> bool:
    return any(module == c or module.startswith(c + ".") for c in COMMANDS)


def test_every_room_of_monitor_has_a_layer_and_at_most_two_modules_are_loose() -> None:
    rooms = {room(".".join(p.relative_to(ROOT).with_suffix("").parts)) for p in (ROOT / "monitor").glob("*")
             if p.suffix == ".py" or (p / "__init__.py").exists()} - {"monitor.__init__"}  # fmt: skip
    assert rooms == set(LAYERS)
    loose = sorted(p.name for p in (ROOT / "monitor").glob("*.py") if p.name != "__init__.py")
    assert loose == ["config.py", "log_safe.py"]


def test_arrows_point_down() -> None:
    upward = set()
    for importer, imported in imports():
        a, b = room(importer), room(imported)
        if a == b or not (a.startswith("monitor.") and b.startswith("monitor.")):
            continue
        if LAYERS[b] > LAYERS[a] or (LAYERS[b] == LAYERS[a] and LAYERS[a] != SHELL):
            upward.add((a, b))
    assert upward == KNOWN_UPWARD


def test_the_decoder_stands_alone_and_only_the_shell_imports_commands() -> None:
    for importer, imported in imports():
        if importer.startswith("decoder"):
            assert not imported.startswith(("monitor", "dashboard")), f"{importer} imports {imported}"
        if is_command(imported) and not is_command(importer):
            assert LAYERS.get(room(importer), -1) >= SHELL, f"{importer} imports the command module {imported}"
