"""The house plan of docs/architecture.md, checked on the imports themselves (an AST walk, no import runs)."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
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
    "monitor.gateways": 2,
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
# Rooms cut into sub-rooms, one per concern, and the modules at the room's top that wire them in. A
# sub-room imports its room's top and the rooms below, never a sibling; of the top only the wiring
# imports a sub-room (none: the sub-rooms are imported from outside the room).
SUB_ROOMS: Final = {
    "monitor.api": ("monitor.api.ingest", "monitor.api.decoding", "monitor.api.reads"),
    "monitor.store": ("monitor.store.writes", "monitor.store.reads"),
    "monitor.drift": ("monitor.drift.detectors",),
    "monitor.ingest": ("monitor.ingest.capture", "monitor.ingest.scrape", "monitor.ingest.stacks"),
    "monitor.commands": ("monitor.commands.evaluate",),
    "monitor.proxy": ("monitor.proxy.forward",),
}
WIRING: Final = {
    "monitor.api": ("monitor.api.app", "monitor.api.state"),  # the routers; the decoder worker and /metrics held
    "monitor.store": (),
    "monitor.drift": ("monitor.drift.run",),  # runs every detector
    "monitor.ingest": ("monitor.ingest.settings",),  # parses scrape's targets
    "monitor.commands": (),  # main.py registers each sub-command group by its module's name
    "monitor.proxy": (),  # the API's app wires the pass-through in; the top is what it stands on
}
# The decoder's layers: the record's contract and the rules of a step (its top's base) import none of
# its sub-rooms; the models, drafters and CPU back end never import the loop; only the top's drivers
# (evaluate's candidates, the commands, the lazy public names in decoder/__init__.py) import it.
DECODER_LAYERS: Final = {
    **dict.fromkeys(("decoder.record", "decoder.holdout", "decoder.sampling", "decoder.verify"), 0),
    **dict.fromkeys(("decoder.workloads", "decoder.extras", "decoder.candidate", "decoder.causes"), 0),
    **dict.fromkeys(("decoder.cpu", "decoder.models", "decoder.drafters"), 1),
    "decoder.speculation": 2,
    **dict.fromkeys(("decoder.evaluation", "decoder.cli", "decoder"), 3),
}
# The API's shell (the modules at monitor/api/) is all that the rooms outside it import.
API: Final = "monitor.api"
API_SUB_ROOMS: Final = SUB_ROOMS[API]
# Outside the API room only its shell is imported, but: the demo seeds the controller state that the
# decoder's service resumes from (its file and format are that sub-room's).
API_REACHED_INTO: Final = {("monitor.demo.run", "monitor.api.decoding.controller_state")}


def modules() -> dict[str, Path]:
    """Every module of the project's packages, by its dotted name (a package by its own)."""
    return {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for package in ("decoder", "monitor", "dashboard")
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def _at_load(body: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run when their module loads: not a function's, nor those under ``if TYPE_CHECKING``."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                yield from _at_load(node.body)
            yield from _at_load(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(handler.body for handler in node.handlers), node.orelse, node.finalbody):
                yield from _at_load(block)
        elif isinstance(node, ast.With | ast.ClassDef):
            yield from _at_load(node.body)


def imports(at_load: bool = False) -> list[tuple[str, str]]:
    """(importing module, imported module) for every absolute import of the project's packages; with
    ``at_load`` only those that run when the importing module loads, the ones an import cycle breaks on."""
    found = []
    for module, path in modules().items():
        tree = ast.parse(path.read_text())
        for node in _at_load(tree.body) if at_load else ast.walk(tree):
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


def part(module: str) -> str | None:
    """The sub-room that ``module`` (or a name imported from it) is in, its room's top, or None if its room has none."""
    top = next((r for r in SUB_ROOMS if module == r or module.startswith(r + ".")), None)
    if top is None:
        return None
    return next((sub for sub in SUB_ROOMS[top] if module == sub or module.startswith(sub + ".")), top)


def api_part(module: str) -> str | None:
    """The sub-room of the API room that ``module`` is in, the shell, or None outside the API room."""
    found = part(module)
    return found if found is not None and room(found) == API else None


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


def test_sub_rooms_import_their_room_never_one_another() -> None:
    for importer, imported in imports():
        a, b = part(importer), part(imported)
        if a is None or b is None or room(a) != room(b):
            continue
        top, subs = room(a), SUB_ROOMS[room(a)]
        if a in subs and b in subs:
            assert a == b, f"{importer} imports {imported}: sub-rooms of {top} meet only at its top"
        if a == top and b in subs:
            assert importer in WIRING[top], f"{importer} imports {imported}: only {top}'s wiring imports sub-rooms"


def test_the_sub_rooms_listed_are_the_packages_of_their_room() -> None:
    for top, subs in SUB_ROOMS.items():
        folder = ROOT.joinpath(*top.split("."))
        assert sorted(f"{top}.{p.parent.name}" for p in folder.glob("*/__init__.py")) == sorted(subs)
        for module in (*subs, *WIRING[top]):
            assert module in modules(), f"{module} is named in the house plan but does not exist"


def decoder_layer(module: str) -> int:
    """The layer of ``module`` in the decoder, by the longest name of DECODER_LAYERS it is in."""
    return next(DECODER_LAYERS[name] for name in sorted(DECODER_LAYERS, key=len, reverse=True)
                if module == name or module.startswith(name + "."))  # fmt: skip


def test_the_decoder_s_layers_point_down() -> None:
    known = modules()
    assert all(name in known for name in DECODER_LAYERS)
    for importer, imported in imports():
        if importer.startswith("decoder") and imported.startswith("decoder"):
            assert decoder_layer(imported) <= decoder_layer(importer), f"{importer} imports {imported}"


def test_outside_the_api_room_only_its_shell_is_imported() -> None:
    known = modules()
    reached = {(i, m) for i, m in imports() if m in known and api_part(i) is None and api_part(m) in API_SUB_ROOMS}
    assert reached == API_REACHED_INTO


def test_no_module_imports_itself_back_when_loading() -> None:
    """No cycle among the imports that run when a module loads: every module loads, whichever is imported first."""
    graph: dict[str, set[str]] = {module: set() for module in modules()}
    for importer, imported in imports(at_load=True):
        if imported in graph and imported != importer:
            graph[importer].add(imported)
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError("an import cycle: " + " -> ".join([*path[path.index(module) :], module]))
        if module not in done:
            for imported in sorted(graph[module]):
                visit(imported, [*path, module])
            done.add(module)

    for module in sorted(graph):
        visit(module, [])
