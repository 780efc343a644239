"""Which ``kernels`` package Python imports, and a one-line refusal when it is not Carpool's.

Carpool's hot ops live in the top-level package ``kernels/``, beside ``engine/``. PyPI also has
a package named ``kernels`` (Hugging Face's kernel downloader, required by transformers 5.25
and later). Both cannot be imported under one name: with the foreign one first on the path the
engine breaks deep inside model loading; with ours first, transformers does. This module finds
either case before anything imports ``kernels`` and says, in one line, which file was found,
why it clashes and the fix. It imports nothing of Carpool's and no third-party package.
"""

from __future__ import annotations

import importlib.util
from importlib import metadata
from pathlib import Path

OWN_KERNELS = Path(__file__).resolve().parent.parent / "kernels" / "__init__.py"
FIX = ("fix: pip uninstall -y kernels, then install from the lock (make setup), which keeps "
       "transformers<5.25")


class ForeignKernelsError(ImportError):
    """A ``kernels`` package other than Carpool's is importable or installed (``name`` is
    ``"kernels"``, so a caller can tell it from other import errors)."""


def foreign_kernels() -> str | None:
    """The one-line explanation when a foreign ``kernels`` would be imported or is installed,
    else None. Looks only (``find_spec`` on the top-level name runs no package code)."""
    spec = importlib.util.find_spec("kernels")
    origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
    if origin is not None and origin != OWN_KERNELS:
        return (f"carpool: Python imports the package 'kernels' from {origin}, not Carpool's "
                f"{OWN_KERNELS}: another package of that name comes first on sys.path; {FIX}")
    try:
        dist = metadata.distribution("kernels")
    except metadata.PackageNotFoundError:
        return None
    where = dist.locate_file("")
    return (f"carpool: the distribution 'kernels' {dist.version} is installed in {where} "
            f"(Hugging Face's kernel downloader, pulled in by transformers>=5.25); it shares "
            f"its import name with Carpool's kernels/ package, so one of the two breaks; {FIX}")


def ensure_own_kernels() -> None:
    """Raise ForeignKernelsError (its message is one line) unless ``kernels`` is Carpool's."""
    problem = foreign_kernels()
    if problem is not None:
        raise ForeignKernelsError(problem, name="kernels")
