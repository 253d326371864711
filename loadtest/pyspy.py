"""py-spy profiles of the service under load, summarised: top functions by own and by cumulative samples,
and own samples per package. The project's own frames (api/, coordinator/, storage/) are marked with `*`.

    py-spy record -p PID -d 10 --gil -f raw -o profile.txt      # what the benchmark runs (`--profile`)
    python -m loadtest.pyspy profile.txt                          # summarise any raw py-spy file

`--gil` samples only the thread holding the GIL, so the samples are where Python CPU goes; idle waiting is not
in them, and samples / (rate x seconds) is the share of the time the GIL was busy.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

PROJECT_PACKAGES = ("api/", "coordinator/", "storage/")


def py_spy() -> str | None:
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else None


def record(pid: int, seconds: int, out: Path, rate: int = 100, threads: bool = False) -> subprocess.Popen:
    """`threads`: each stack starts with its thread, `thread (TID): NAME` (loadtest/stages.py reads them)."""
    exe = py_spy()
    if exe is None:
        raise FileNotFoundError("py-spy is not installed: pip install py-spy (or pip install -e '.[loadtest]')")
    return subprocess.Popen([exe, "record", "-p", str(pid), "-d", str(seconds), "--gil", "-f", "raw",
                             "-r", str(rate), "-o", str(out), "--nonblocking"] + (["--threads"] if threads else []),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _frame(raw: str) -> tuple[str, str]:
    """'Class.method (pkg/mod.py:123)' -> ('Class.method', 'pkg/mod.py')."""
    name, _, where = raw.rpartition(" (")
    if not name:
        return raw, ""
    return name, where.rstrip(")").rsplit(":", 1)[0]


def is_project(filename: str) -> bool:
    if "site-packages" in filename:
        return False
    return filename.startswith(PROJECT_PACKAGES) or any(f"/{p}" in filename for p in PROJECT_PACKAGES)


def _package(filename: str) -> str:
    if is_project(filename):
        parts = filename.split("/")
        for i, p in enumerate(parts):
            if p + "/" in PROJECT_PACKAGES:
                return "/".join(parts[i:i + 2])   # project code: by module
    head = filename.split("/", 1)[0]
    return head.removesuffix(".py") or "?"


# Frames that run other code: everything above the last of them in a stack is the same for every sample (the
# process's entry point, the event loop), so cumulative figures start below it.
LOOP_FRAMES = ("unrolled_run", "run_forever", "_run_once", "Thread.run")


def summarize(path: Path, top: int = 20) -> dict:
    own: Counter[str] = Counter()
    cum: Counter[str] = Counter()
    tasks: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    project_own = 0
    project_cum = 0
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        total += count
        frames = [_frame(f) for f in stack.split(";") if not f.startswith("thread (")]   # (`threads=True`)
        if not frames:
            continue
        keys = [f"{n} ({f})" for n, f in frames]
        own[keys[-1]] += count
        packages[_package(frames[-1][1])] += count
        cut = max((i for i, (n, _) in enumerate(frames) if n in LOOP_FRAMES), default=None)
        below = frames[cut + 1:] if cut is not None else frames
        if cut is None:
            task = f"(partial stack) {keys[0]}"
        elif below:
            task = keys[cut + 1]
        else:
            task = f"{keys[cut]} itself (scheduler)"
        tasks[task] += count
        for k in {f"{n} ({f})" for n, f in below}:
            cum[k] += count
        if is_project(frames[-1][1]):
            project_own += count
        if any(is_project(f) for _, f in below):
            project_cum += count
    return {"samples": total, "own": own.most_common(top), "cumulative": cum.most_common(top + 10),
            "tasks": tasks.most_common(12), "packages": packages.most_common(15), "project_own": project_own,
            "project_cumulative": project_cum}


def format_summary(s: dict, seconds: float | None = None, rate: int = 100, title: str = "") -> str:
    total = max(s["samples"], 1)
    out = [f"### py-spy --gil profile{': ' + title if title else ''}", ""]
    busy = f"; GIL busy {100 * s['samples'] / (rate * seconds):.0f}% of the time" if seconds else ""
    out.append(f"{s['samples']} samples{busy}. Project code (`*`): {100 * s['project_own'] / total:.1f}% own, "
               f"{100 * s['project_cumulative'] / total:.1f}% cumulative (stacks passing through it below the "
               f"event loop).")
    out += ["", "By task (the first frame under the event loop / thread):", "", "| % | task |", "|---:|---|"]
    for key, n in s.get("tasks", []):
        out.append(f"| {100 * n / total:.1f} | {_mark(key)} |")
    out += ["", "Top functions by own time:", "", "| own % | function |", "|---:|---|"]
    for key, n in s["own"]:
        out.append(f"| {100 * n / total:.1f} | {_mark(key)} |")
    out += ["", "Top functions by cumulative time (below the event loop):", "",
            "| cum % | function |", "|---:|---|"]
    for key, n in s["cumulative"]:
        out.append(f"| {100 * n / total:.1f} | {_mark(key)} |")
    out += ["", "Own time by package (project code by module):", "", "| own % | package |", "|---:|---|"]
    for pkg, n in s["packages"]:
        out.append(f"| {100 * n / total:.1f} | {'*' if pkg.split('/')[0] + '/' in PROJECT_PACKAGES else ''}{pkg} |")
    return "\n".join(out)


def _mark(key: str) -> str:
    _, filename = _frame(key)
    return f"**\\*{key}**" if is_project(filename) else key


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw", type=Path, help="a py-spy `-f raw` output file")
    ap.add_argument("--seconds", type=float, help="the recording's duration, to report how busy the GIL was")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    print(format_summary(summarize(args.raw, args.top), args.seconds))


if __name__ == "__main__":
    main()
