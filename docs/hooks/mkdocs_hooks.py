"""MkDocs hooks (``hooks:`` in mkdocs.yml): pages that come from the code and from ``results/``.

- ``reference/observations.md`` and ``reference/actions.md``: written from the schemas and
  ``dynamix_gym/actions.py`` by :mod:`docs_reference` at every build, never copied by hand.
- ``api/<package>/<module>.md``: one mkdocstrings page per module of the four layers (``sim``,
  ``dynamix_gym``, ``adapters``, ``experiments``), listed in the nav under "API reference"; a new
  module gets its page without an edit here.
- ``results/**``: the committed reports (``*.md``), their figures (``*.png``) and the benchmarks'
  JSON as they are, so their numbers are never retyped; ``conf/README.md`` and the reference
  measurements' format (``sim/data/reference/README.md``) likewise.
- A docs page links a report as the repository lays it out (``../results/benchmark/README.md`` from
  ``docs/``), which also works when the page is read on its own; the link is pointed at the page's
  copy in the build.
"""

from __future__ import annotations

import posixpath
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File, Files, InclusionLevel

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

import docs_reference  # noqa: E402

#: The packages whose modules get an API page, in layer order.
PACKAGES = ("sim", "dynamix_gym", "adapters", "experiments")
#: Files outside ``docs/`` copied into the build at the same path (a glob per tree).
EXTERNAL = {
    "results": ("**/*.md", "**/*.png", "bench/*.json"),
    "conf": ("README.md",),
    "sim": ("data/reference/README.md",),
}
_LINK = re.compile(r"(\]\()([^)\s#]+)([^)]*\))")


def _modules(package: str) -> list[tuple[str, str]]:
    """(module, page) of every module of ``package``: ``a.b.c`` at ``api/a/b/c.md``, a package's own
    page at ``api/a/b/index.md``; generated protobuf code and ``__main__`` left out."""
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if path.name == "__main__.py" or path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            out.append((".".join(parts[:-1]), "/".join(["api", *parts[:-1], "index.md"])))
        else:
            out.append((".".join(parts), "/".join(["api", *parts]) + ".md"))
    return out


def _nav(package: str, pages: dict[str, str]) -> list:
    """The nav of ``package``: its own page, then each module, each subpackage as a section."""
    out: list = [{package: pages[package]}]
    for module, uri in pages.items():
        if module.rpartition(".")[0] != package:
            continue
        out.append({f"{module}/": _nav(module, pages)} if uri.endswith("/index.md") else {module: uri})
    return out


def on_config(config, **kwargs):
    """Append the API reference (one page per module, a section per package) to the nav."""
    api = [{f"{package}/": _nav(package, dict(_modules(package)))} for package in PACKAGES]
    config.nav.append({"API reference": api})
    return config


def on_files(files: Files, config, **kwargs) -> Files:
    """Add the generated reference pages, the API pages and the copied reports to the build."""
    files.append(
        File.generated(config, "reference/observations.md", content=docs_reference.observation_page())
    )
    files.append(File.generated(config, "reference/actions.md", content=docs_reference.action_page()))
    for package in PACKAGES:
        for module, uri in _modules(package):
            files.append(File.generated(config, uri, content=f"# `{module}`\n\n::: {module}\n"))
    for tree, patterns in EXTERNAL.items():
        for pattern in patterns:
            for path in sorted((ROOT / tree).glob(pattern)):
                uri = path.relative_to(ROOT).as_posix()
                file = File.generated(config, uri, abs_src_path=str(path))
                file.inclusion = InclusionLevel.NOT_IN_NAV  # in the nav or not: reached from results.md
                files.append(file)
    return files


def on_page_markdown(markdown: str, page, config, files: Files, **kwargs) -> str:
    """Point a docs page's links to ``../results/...`` (and ``../conf/README.md``) at their copies."""
    if page.file.generated_by:
        return markdown
    here = posixpath.dirname(page.file.src_uri)

    def relink(match: re.Match) -> str:
        target = match.group(2)
        if "://" in target or target.startswith("/"):
            return match.group(0)
        in_repo = posixpath.normpath(posixpath.join("docs", here, target))
        if in_repo.split("/", 1)[0] not in EXTERNAL or files.get_file_from_path(in_repo) is None:
            return match.group(0)
        return match.group(1) + posixpath.relpath(in_repo, here or ".") + match.group(3)

    return _LINK.sub(relink, markdown)
