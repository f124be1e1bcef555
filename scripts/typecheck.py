"""Run mypy over the gateway, its backends and the scripts, each module under its import name.

The source folders are not named like the packages they install as (``[tool.setuptools] package-dir``:
``gateway`` is ``openengine_gateway``, ``backends`` is ``openengine_backends``), and the editable install
maps them with an import hook, which no static checker can follow. Plain ``mypy`` names a module after its
folder, so it would check ``gateway.spi`` while the backends import ``openengine_gateway.spi``, which it
cannot find. This script reads mypy's options and targets from ``[tool.mypy]`` as mypy does, renames each
source module by the package-dir mapping, and runs one build: every file is checked once, under the name
the code imports it by, and a new file is checked without reinstalling. Arguments go to mypy:
``python scripts/typecheck.py --no-incremental``. Exit status as mypy's: 0 clean, 1 errors, 2 blocking errors.
"""

import sys
import time
import tomllib
from pathlib import Path

from mypy import util
from mypy.fscache import FileSystemCache
from mypy.main import process_options, run_build
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parent.parent


def import_names() -> dict[str, str]:
    """Source folder → import package, from pyproject's package-dir (``gateway`` → ``openengine_gateway``)."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        package_dir: dict[str, str] = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {folder: package for package, folder in package_dir.items()}


def renamed(source: BuildSource, names: dict[str, str]) -> BuildSource:
    """``source`` with its module named as it is imported (``gateway.spi.backend`` → ``openengine_gateway...``)."""
    top, dot, rest = source.module.partition(".")
    if top not in names:
        return source
    return BuildSource(source.path, names[top] + dot + rest, source.text, source.base_dir, source.followed)


def main(args: list[str]) -> int:
    """Type-check like ``mypy ARGS`` would, with the package-dir mapping applied; return mypy's exit status."""
    started = time.time()
    fscache = FileSystemCache()
    sources, options = process_options(args, fscache=fscache)
    names = import_names()
    sources = [renamed(source, names) for source in sources]
    _, messages, blockers = run_build(sources, options, fscache, started, sys.stdout, sys.stderr)
    formatter = util.FancyFormatter(sys.stdout, sys.stderr, options.hide_error_codes)
    n_errors, _, n_files = util.count_stats(messages)
    if n_errors:
        print(
            formatter.format_error(n_errors, n_files, len(sources), blockers=blockers, use_color=options.color_output)
        )
        return 2 if blockers else 1
    print(formatter.format_success(len(sources), options.color_output))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
