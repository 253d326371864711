"""The benchmark's outputs: one markdown table on stdout, the same rows (and every raw figure) as JSON, and a PNG
of commit latency against offered load when matplotlib is installed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

COLUMNS = ("section", "scenario", "rate", "p50 ms", "p99 ms", "server CPU ms/op", "loadgen CPU %", "notes")


@dataclass
class Row:
    section: str
    scenario: str
    rate: str = ""
    p50_ms: float | None = None
    p99_ms: float | None = None
    cpu_ms: float | None = None
    loadgen_pct: float | None = None
    notes: str = ""

    def cells(self) -> list[str]:
        return [self.section, self.scenario, self.rate, _num(self.p50_ms), _num(self.p99_ms), _num(self.cpu_ms, 3),
                _num(self.loadgen_pct, 0), self.notes]


def _num(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if digits == 0:
        return f"{value:.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.{digits}f}"


@dataclass
class Report:
    title: str
    rows: list[Row] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    def markdown(self) -> str:
        cells = [list(COLUMNS)] + [r.cells() for r in self.rows]
        widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
        numeric = {3, 4, 5, 6}

        def line(values: list[str]) -> str:
            out = []
            for i, v in enumerate(values):
                out.append(v.rjust(widths[i]) if i in numeric else v.ljust(widths[i]))
            return "| " + " | ".join(out) + " |"
        sep = "|" + "|".join(("-" * (w + 1) + ":") if i in numeric else ("-" * (w + 2))
                             for i, w in enumerate(widths)) + "|"
        return "\n".join([line(cells[0]), sep] + [line(c) for c in cells[1:]])

    def write_json(self, path: Path) -> None:
        doc = {"title": self.title, "columns": list(COLUMNS), "rows": [r.cells() for r in self.rows], "raw": self.raw}
        path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY,
                                      default=_default))


def _default(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")


def plot_latency_vs_load(curves: dict[str, list[dict]], path: Path, title: str) -> str | None:
    """One line per protocol and percentile: x = offered commits/s, y = commit latency (log). Returns None when
    written, else why not."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[loadtest]'); no PNG written"
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    colors = {"iceberg": "tab:blue", "delta": "tab:red", "lance": "tab:green"}
    for proto, points in curves.items():
        pts = sorted((p for p in points if p.get("offered_per_s")), key=lambda p: p["offered_per_s"])
        if not pts:
            continue
        x = [p["offered_per_s"] for p in pts]
        c = colors.get(proto)
        ax.plot(x, [p["p50_ms"] for p in pts], "--o", color=c, label=f"{proto} p50", markersize=4)
        ax.plot(x, [p["p99_ms"] for p in pts], "-o", color=c, label=f"{proto} p99", markersize=4)
    ax.axhline(25, color="grey", linewidth=0.8, linestyle=":", label="p99 target 25 ms")
    ax.set_yscale("log")
    from matplotlib.ticker import ScalarFormatter
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlabel("offered load (commits/s, Poisson arrivals)")
    ax.set_ylabel("commit latency, retries included (ms)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None
