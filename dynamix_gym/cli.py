"""The ``dynamix-gym`` console command: one subcommand per Hydra entry point of ``experiments/``.

    dynamix-gym evaluate controller=dlb scenario=throttle     # == python -m experiments.evaluate ...
    dynamix-gym train experiment=train_quick
    dynamix-gym evaluate -m controller=static,dlb seed=0,1    # a grid: Hydra's flags pass through
    dynamix-gym deploy --help                                 # the app's Hydra help
    dynamix-gym --help                                        # the subcommands

Everything after the subcommand goes to the app unchanged (Hydra overrides and flags); the app runs
in this process as ``python -m experiments.<app>`` would run it, from the current directory
(relative paths in the configs, ``outputs/``, ``results/``, are relative to it, as there). The apps
live in the repository's ``experiments`` package and read ``conf/`` beside it: the command is for
a checkout installed with ``pip install -e .``.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

#: The package whose Hydra apps are the subcommands.
APPS_PACKAGE = "experiments"
#: An app whose entry point ``experiments.common.hydra_app`` builds.
_APP_MAIN = re.compile(r"^main = hydra_app\(", re.MULTILINE)


def discover_apps(package: str = APPS_PACKAGE) -> dict[str, tuple[str, str]]:
    """Every Hydra app of ``package``: subcommand -> (module it runs, the first line of its docstring).

    An app is a module directly in the package with a ``@hydra.main`` entry point, or one built by
    ``main = hydra_app(...)`` (read from the
    source, not imported: importing every app would load torch and the simulator for ``--help``).
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return {}
    apps = {}
    for location in spec.submodule_search_locations:
        for path in sorted(Path(location).glob("*.py")):
            source = path.read_text()
            if "@hydra.main(" not in source and not _APP_MAIN.search(source):
                continue
            doc = ast.get_docstring(ast.parse(source)) or ""
            first = " ".join(doc.strip().split("\n\n")[0].split())  # the first paragraph, one line
            apps[path.stem] = (f"{package}.{path.stem}", first.split(". ")[0].rstrip("."))
    return dict(sorted(apps.items()))


#: subcommand -> (module it runs, one line of help): every app of ``experiments``.
COMMANDS: dict[str, tuple[str, str]] = discover_apps()


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {text}  [python -m {module}]" for name, (module, text) in COMMANDS.items()]
    return (
        "usage: dynamix-gym <command> [hydra overrides and flags ...]\n\ncommands:\n"
        + "\n".join(lines)
        + "\n\n`dynamix-gym <command> --help` shows that app's configuration."
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the subcommand named by ``argv[0]`` with the rest as its command line; the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"dynamix-gym: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = COMMANDS[name][0]
    saved = sys.argv
    sys.argv = [f"dynamix-gym {name}", *rest]  # what Hydra parses (argv[1:]) as `python -m` would get
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:  # Hydra exits on --help, --cfg and errors
        code = stop.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
