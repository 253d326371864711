"""Locate the Iceberg Spark runtime jars built by tests/spark/build_runtime.sh.

The build script caches the jars in ``$SPARK_ICEBERG_JARS`` (default
``~/.cache/coordinator/spark-iceberg-jars``) together with ``build-info.json``,
which lists them. Use them as::

    SparkSession.builder.config("spark.jars", ",".join(jars()))
        .config("spark.sql.extensions",
                "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
"""

from __future__ import annotations

import json
import os
from pathlib import Path

BUILD_SCRIPT = Path(__file__).resolve().with_name("build_runtime.sh")
MARKER = "build-info.json"
ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"


class SparkJarsMissing(RuntimeError):
    """The jar set has not been built (or is incomplete)."""


def _default_dir() -> Path:
    env = os.environ.get("SPARK_ICEBERG_JARS")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "coordinator" / "spark-iceberg-jars"


def _missing(why: str) -> SparkJarsMissing:
    return SparkJarsMissing(
        f"Iceberg Spark jars not available: {why}. "
        f"Build them with: bash {BUILD_SCRIPT} "
        "(needs PyPI + Debian mirror access; honours $SPARK_ICEBERG_JARS)"
    )


def jar_dir() -> Path:
    """Directory holding the built jars; raises SparkJarsMissing if not built."""
    d = _default_dir()
    if not (d / MARKER).is_file():
        raise _missing(f"{d / MARKER} does not exist")
    return d


def jars() -> list[str]:
    """Absolute paths of the jars to put in ``spark.jars`` (runtime first)."""
    d = jar_dir()
    try:
        names = [j["name"] for j in json.loads((d / MARKER).read_text())["jars"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise _missing(f"{d / MARKER} is unreadable ({e})") from e
    paths = [d / n for n in names]
    absent = [str(p) for p in paths if not p.is_file()]
    if not names or absent:
        raise _missing(f"jars listed in {d / MARKER} are missing: {absent or 'none listed'}")
    return [str(p) for p in paths]
