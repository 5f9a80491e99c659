"""The one pyplot every study draws with: matplotlib (the ``plot`` extra), imported only when a study draws and
drawn off-screen (Agg); figures are written atomically."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from fullband.config import install_hint
from fullband.files import write_file


def have_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, imported only when a study draws (it is an optional dependency)."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError(f"the study plots need matplotlib: {install_hint('plot')}") from None
    matplotlib.use("Agg")  # files only: no display needed (CI, servers)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int = 120) -> None:
    """Lay out, write and close a finished figure (closed, so a long study does not keep every figure open)."""
    fig.tight_layout()
    write_file(path, lambda f: fig.savefig(f, dpi=dpi, format=Path(path).suffix[1:]))  # atomically
    pyplot().close(fig)


def line_style(variant: str) -> dict[str, Any]:
    # The baseline is drawn wide and pale underneath, so it stays visible where a fullband line covers it.
    return {"linewidth": 5, "alpha": 0.35, "zorder": 1} if variant == "baseline" else {"linewidth": 1.5, "zorder": 2}
